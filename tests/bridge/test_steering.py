"""`response.steer` as the ws-mode contract (sections 2.2 and 3.5) describes it, on WebSocket and
gRPC (one session core): a generating response is interrupted (`incomplete`, reason `steered`)
and its successor starts with the steer input; a response making tool calls finishes and
`response.steer.pending` names the outputs it waits for, the input joining the create that
brings them; a refused steer returns its input. Every WS event validates strictly against the
SDK types. Also `prompt_cache_options.prewarm` as a warm-up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from tether.protocol import json_codec

from ..support.grpc_client import RawSession
from .helpers import KEY_A, WEATHER_TOOL, recv_json, recv_until, send_json

WS_EVENT = TypeAdapter(ResponsesServerEvent)
SLOW_TEXT = {"ttft_ms": 0, "tokens_per_s": 40, "output_tokens": 400}


def strict_all(events: list[dict[str, Any]]) -> None:
    for ev in events:
        WS_EVENT.validate_python(ev, strict=True)


async def test_websocket_steer_interrupts_and_succeeds(make_stack: Any) -> None:
    async with make_stack(backend=SLOW_TEXT) as stack, stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "write a lot", "store": False})
        first = await recv_until(conn, lambda e: e["type"] == "response.output_text.delta")
        target = first[0]["response"]["id"]
        await send_json(conn, {"type": "response.steer", "previous_response_id": target, "input": "stop, go left"})
        events = await recv_until(conn, lambda e: e["type"] == "response.completed", 30)
    strict_all(first + events)
    types = [e["type"] for e in events]
    accepted = types.index("response.steer.accepted")
    ended = types.index("response.incomplete")
    created = types.index("response.created")
    assert accepted < ended < created
    steered = events[ended]["response"]
    assert steered["id"] == target and steered["incomplete_details"] == {"reason": "steered"}
    assert steered["output"][0]["status"] == "incomplete"  # the text so far is kept, marked cut
    successor = events[-1]["response"]
    assert successor["previous_response_id"] == target and successor["status"] == "completed"
    assert events[accepted]["steer"]["previous_response_id"] == target


async def test_websocket_steer_waits_for_tool_output(make_stack: Any, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({
        "steps": [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris" * 40}}], "tokens_per_s": 40}],
        "after": {"text": "It is sunny."},
    }))  # fmt: skip
    async with make_stack(backend={"script": str(script), "ttft_ms": 0}) as stack, stack.ws() as conn:
        body = {"type": "response.create", "model": "sim-model", "input": "weather?", "tools": [WEATHER_TOOL]}
        await send_json(conn, body)
        first = await recv_until(conn, lambda e: e["type"] == "response.function_call_arguments.delta")
        target = first[0]["response"]["id"]
        await send_json(conn, {"type": "response.steer", "previous_response_id": target, "input": "in Celsius"})
        events = await recv_until(conn, lambda e: e["type"] == "response.steer.pending", 30)
        strict_all(first + events)
        types = [e["type"] for e in events]
        assert types.index("response.steer.accepted") < types.index("response.completed")
        call = events[types.index("response.completed")]["response"]["output"][0]
        pending = events[-1]
        assert pending["reason"] == "waiting_for_required_input"
        assert pending["required_input"] == [{"type": "function_call_output", "call_id": call["call_id"], "name": "get_weather"}]
        # The tool output continues the response; the steer's input joins it.
        await send_json(conn, {
            "type": "response.create", "model": "sim-model", "previous_response_id": target, "tools": [WEATHER_TOOL],
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}],
        })  # fmt: skip
        done = (await recv_until(conn, lambda e: e["type"] == "response.completed", 30))[-1]
        strict_all([done])
        assert done["response"]["output"][0]["type"] == "message"
        async with stack.client() as client:
            inputs = await client.responses.input_items.list(done["response"]["id"], order="asc", limit=100)
    texts = [i.content[0].text for i in inputs.data if i.type == "message" and not isinstance(i.content, str)]
    assert texts[-1] == "in Celsius"
    assert [i.type for i in inputs.data][-2:] == ["function_call_output", "message"]


async def test_websocket_refused_steer_returns_its_input(make_stack: Any) -> None:
    async with make_stack() as stack, stack.ws() as conn:
        await send_json(conn, {"type": "response.steer", "previous_response_id": "resp_gone", "input": "go left"})
        failed = await recv_json(conn)
        items = [{"type": "message", "role": "user", "content": "right"}]
        await send_json(conn, {"type": "response.steer", "previous_response_id": "resp_gone", "input": items})
        failed_items = await recv_json(conn)
    strict_all([failed, failed_items])
    assert failed["type"] == "response.steer.failed" and failed["steer"]["input"] == "go left"
    assert failed_items["steer"]["input"] == items
    assert failed["error"]["code"] == "response_not_found"


async def test_grpc_steer_interrupts_and_succeeds(make_stack: Any, authenticator: Any) -> None:
    async with make_stack(backend=SLOW_TEXT) as stack:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
            session = RawSession(channel, KEY_A)
            await session.create(model="sim-model", input="write a lot", store=False)
            while True:
                ev = await session.next_event()
                if ev.WhichOneof("event") == "output_text_delta":
                    break
            target = ev.response_id
            steer = json_codec.client_event_from_json(
                {"type": "response.steer", "previous_response_id": target, "input": "go left"}
            )
            await session.send(steer)
            arms = []
            while not arms or arms[-1] != "completed":
                ev = await session.next_event()
                arms.append(ev.WhichOneof("event"))
                if arms[-1] == "incomplete":
                    assert ev.incomplete.response.incomplete_details.reason == "steered"
            assert arms.index("steer_accepted") < arms.index("incomplete") < arms.index("created")
            assert ev.completed.response.previous_response_id == target
            session.call.cancel()


async def test_prewarm_is_a_warm_up(make_stack: Any) -> None:
    async with make_stack() as stack, stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "context",
                               "prompt_cache_options": {"prewarm": True}})  # fmt: skip
        events = await recv_until(conn, lambda e: e["type"] == "response.completed")
        strict_all(events)
        assert events[-1]["response"]["output"] == []
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "go",
                               "previous_response_id": events[-1]["response"]["id"]})  # fmt: skip
        done = (await recv_until(conn, lambda e: e["type"] == "response.completed"))[-1]
        assert done["response"]["output"] and done["response"]["usage"]["input_tokens_details"]["cached_tokens"] > 0


async def test_websocket_steer_with_items_that_are_not_input_items_is_an_error(make_stack: Any) -> None:
    async with make_stack() as stack, stack.ws() as conn:
        bad = [{"role": "user", "content": "ok"}, {"k": {"k": [[1e-320]]}}]
        await send_json(conn, {"type": "response.steer", "event_id": "ev1", "previous_response_id": "resp_gone", "input": bad})
        error = await recv_json(conn)
    strict_all([error])
    assert error["type"] == "error" and error["error"]["code"] == "invalid_item"
    assert error["error"]["param"] == "input[1]" and error["event_id"] == "ev1"


@pytest.mark.parametrize(
    "item",
    [
        {"type": "message", "role": "developer", "content": "be brief"},
        {"type": "message", "role": "assistant", "content": "done"},
        {"type": "message", "role": "user", "content": [{"type": "output_text", "text": "x"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ],
    ids=["developer", "assistant", "output_text_part", "function_call"],
)
async def test_websocket_steer_input_a_steer_cannot_carry_is_an_error_not_an_unparseable_echo(
    make_stack: Any, item: dict
) -> None:
    """`response.steer.failed` echoes the input in the SDK's `ResponseSteerInput` type, which holds
    only user messages with input parts and function_call_output items (fuzz seed 16 found an echo
    of a developer message that the SDK could not parse). Anything else is a malformed event."""
    good = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}
    async with make_stack() as stack, stack.ws() as conn:
        await send_json(conn, {"type": "response.steer", "previous_response_id": "resp_gone", "input": [good, item]})
        error = await recv_json(conn)
        await send_json(conn, {"type": "response.steer", "previous_response_id": "resp_gone", "input": [good]})
        failed = await recv_json(conn)
    strict_all([error, failed])
    assert error["type"] == "error" and error["error"]["code"] == "invalid_item"
    assert error["error"]["param"] == "input[1]"
    assert failed["type"] == "response.steer.failed" and failed["steer"]["input"] == [good]
