"""`response.inject` (beta) answered by its contract (docs/fields.md "Inject") for responses that
are not multi-agent (those take injected items: tests/bridge/test_multi_agent.py), so no response
here takes injected items; an inject for a finished response of
the connection is `response.inject.failed` `response_already_completed` with the items back (at
once, or when an active response ends), any other id `response_not_found`, and the items go on in
a new create continuing the response. A malformed inject is an `error` (400), the socket stays
open. Driven with openai-python's beta WebSocket client (`client.beta.responses.connect()`,
`conn.response.inject`), raw frames where the SDK cannot send them, and gRPC (one session core).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from openai.types.beta.beta_responses_server_event import BetaResponsesServerEvent
from pydantic import TypeAdapter

from tether.protocol import json_codec
from tether.responses.v1 import service_pb2

from ..support.grpc_client import RawSession
from .helpers import KEY_A, WEATHER_TOOL, recv_json, recv_until, send_json, wait_for

BETA_EVENT = TypeAdapter(BetaResponsesServerEvent)
SLOW_TEXT = {"ttft_ms": 0, "tokens_per_s": 100, "output_tokens": 100}  # 1 s of text
MULTI_AGENT = {"OpenAI-Beta": "responses_multi_agent=v1"}  # a beta client's upgrade header


def _weather_script(tmp_path: Path) -> str:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({
        "steps": [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}],
        "after": {"text": "It is sunny."},
    }))  # fmt: skip
    return str(script)


async def _until(conn: Any, *types: str) -> list[Any]:
    events = []
    async for ev in conn:
        events.append(ev)
        if ev.type in types:
            return events
    raise AssertionError(f"the connection ended before {types}")


async def test_inject_after_the_response_ended_comes_back_and_continues_in_a_create(
    make_stack: Any, tmp_path: Path
) -> None:
    async with make_stack(backend={"script": _weather_script(tmp_path), "ttft_ms": 0}) as stack, stack.client() as client:
        async with client.beta.responses.connect(extra_headers=MULTI_AGENT) as conn:
            await conn.response.create(model="sim-model", input="weather?", tools=[WEATHER_TOOL])
            done = (await _until(conn, "response.completed"))[-1]
            call = done.response.output[0]
            assert call.type == "function_call"
            output = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]

            await conn.response.inject(response_id=done.response.id, input=output)
            failed = (await _until(conn, "response.inject.failed", "response.inject.created", "error"))[-1]
            assert failed.type == "response.inject.failed", failed
            assert failed.response_id == done.response.id
            assert failed.error.code == "response_already_completed"
            assert [item.model_dump(exclude_none=True) for item in failed.input] == output  # echoed as sent

            # As the contract says: the items go on in a new create continuing the response.
            resend = [item.model_dump(exclude_none=True) for item in failed.input]
            await conn.response.create(model="sim-model", previous_response_id=done.response.id, input=resend,
                                       tools=[WEATHER_TOOL])  # fmt: skip
            answer = (await _until(conn, "response.completed", "error"))[-1]
            assert answer.type == "response.completed", answer
            assert answer.response.previous_response_id == done.response.id
            assert answer.response.output[0].content[0].text == "It is sunny."
        items = await client.responses.input_items.list(answer.response.id, order="asc")
        assert [i.type for i in items.data][-1] == "function_call_output"


async def test_inject_for_an_unknown_response_is_not_found(stack: Any) -> None:
    async with stack.client() as client, client.beta.responses.connect(extra_headers=MULTI_AGENT) as conn:
        items = [{"type": "function_call_output", "call_id": "call_1", "output": "x"}]
        await conn.response.inject(response_id="resp_nope", input=items)
        failed = (await _until(conn, "response.inject.failed", "error"))[-1]
        assert failed.type == "response.inject.failed"
        assert (failed.response_id, failed.error.code) == ("resp_nope", "response_not_found")
        assert [i.model_dump(exclude_none=True) for i in failed.input] == items
        # The connection goes on.
        await conn.response.create(model="sim-model", input="hi")
        assert (await _until(conn, "response.completed"))[-1].response.status == "completed"


async def test_inject_into_an_active_response_is_answered_when_it_ends(make_stack: Any) -> None:
    async with make_stack(backend=SLOW_TEXT) as stack, stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "write", "stream_id": "agent_1"})
        first = await recv_until(conn, lambda e: e["type"] == "response.output_text.delta")
        target = first[0]["response"]["id"]
        items = [{"type": "message", "role": "user", "content": "also this"}]
        await send_json(conn, {"type": "response.inject", "response_id": target, "input": items})
        events = await recv_until(conn, lambda e: e["type"].startswith("response.inject."), 30)
    for ev in first + events:
        BETA_EVENT.validate_python(ev)
    types = [e["type"] for e in events]
    # Nothing took the items while the response generated; the answer follows its end, on its lane.
    assert types[-2:] == ["response.completed", "response.inject.failed"], types[-3:]
    failed = events[-1]
    assert failed["response_id"] == target and failed["stream_id"] == "agent_1"
    assert failed["error"]["code"] == "response_already_completed"
    assert failed["input"] == items


async def test_injects_waiting_for_a_running_response_are_bounded(make_stack: Any) -> None:
    async with make_stack(backend=SLOW_TEXT, max_pending_injects=2) as stack, stack.ws() as conn:
        queued = stack.engine.services.queued
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "write"})
        target = (await recv_until(conn, lambda e: e["type"] == "response.output_text.delta"))[0]["response"]["id"]
        held = queued.total
        inject = {"type": "response.inject", "response_id": target, "input": [{"type": "message", "role": "user", "content": "x"}]}
        for i in range(3):  # two wait (the edge), the third is refused
            await send_json(conn, {**inject, "event_id": f"evt_{i}"})
        refused = await recv_until(conn, lambda e: e["type"] == "error", 30)
        assert refused[-1]["status"] == 429 and refused[-1]["event_id"] == "evt_2"
        assert refused[-1]["error"]["code"] == "too_many_pending_injects"
        assert queued.total > held  # the two waiting injects count as queued bytes
        events = await recv_until(conn, lambda e: e["type"] == "response.inject.failed", 30)
        events += await recv_until(conn, lambda e: e["type"] == "response.inject.failed")
        assert [e["type"] for e in events][-2:] == ["response.inject.failed"] * 2
        assert "response.completed" in [e["type"] for e in events]
        await wait_for(lambda: queued.total == 0)  # answered: their bytes came back (the response's too)
        # The bound is per waiting inject: with the two answered, injects wait again.
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "again"})
        second = (await recv_until(conn, lambda e: e["type"] == "response.output_text.delta"))[0]["response"]["id"]
        await send_json(conn, {**inject, "response_id": second})
        assert (await recv_until(conn, lambda e: e["type"] == "response.inject.failed", 30))[-1]["response_id"] == second


async def test_injects_waiting_count_against_the_queued_bytes_budget(make_stack: Any) -> None:
    async with make_stack(backend=SLOW_TEXT, max_queued_bytes_per_connection=8192) as stack, stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "write"})
        target = (await recv_until(conn, lambda e: e["type"] == "response.output_text.delta"))[0]["response"]["id"]
        inject = {"type": "response.inject", "response_id": target,
                  "input": [{"type": "message", "role": "user", "content": "x" * 3000}]}  # fmt: skip
        for i in range(3):  # 2 x ~3 KB wait within 8 KiB with the create; the third would pass it
            await send_json(conn, {**inject, "event_id": f"evt_{i}"})
        refused = (await recv_until(conn, lambda e: e["type"] == "error", 30))[-1]
        assert (refused["status"], refused["error"]["code"], refused["event_id"]) == (429, "too_many_queued_bytes", "evt_2")
        answers = await recv_until(conn, lambda e: e["type"] == "response.inject.failed", 30)
        answers += await recv_until(conn, lambda e: e["type"] == "response.inject.failed")
        assert [e["error"]["code"] for e in answers if e["type"] == "response.inject.failed"] == [
            "response_already_completed"
        ] * 2


@pytest.mark.parametrize(
    ("frame", "param"),
    [
        ({"type": "response.inject", "input": [{"type": "message", "role": "user", "content": "x"}]}, "response_id"),
        ({"type": "response.inject", "response_id": "resp_1"}, "input"),
        ({"type": "response.inject", "response_id": "resp_1", "input": []}, "input"),
        ({"type": "response.inject", "response_id": "resp_1", "input": "not items"}, "input"),
        ({"type": "response.inject", "response_id": 7, "input": []}, "response_id"),
        ({"type": "response.inject", "response_id": "resp_1", "input": [{"type": "message", "role": 3}]}, "input[0].role"),
    ],
)
async def test_malformed_inject_is_an_error(stack: Any, frame: dict, param: str) -> None:
    async with stack.ws() as conn:
        await send_json(conn, {**frame, "event_id": "evt_1"})
        err = await recv_json(conn)
        assert err["type"] == "error" and err["status"] == 400, err
        assert err["error"]["param"] == param and err["event_id"] == "evt_1"
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "still open"})
        assert (await recv_until(conn, lambda e: e["type"] == "response.completed"))[-1]["response"]["status"] == "completed"


async def test_grpc_inject_is_answered_by_the_same_core(make_stack: Any) -> None:
    async with make_stack() as stack, grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        session = RawSession(channel, KEY_A)
        await session.create(model="sim-model", input="hi", store=False)
        done = await session.until_terminal()
        target = done.completed.response.id
        for rid, code in ((target, "response_already_completed"), ("resp_other", "response_not_found")):
            inject = json_codec.client_event_from_json(
                {"type": "response.inject", "response_id": rid, "input": [{"type": "message", "role": "user", "content": "x"}]}
            )
            assert isinstance(inject, service_pb2.SessionRequest) and inject.WhichOneof("event") == "inject"
            await session.send(inject)
            ev = await session.next_event()
            assert ev.WhichOneof("event") == "inject_failed", ev
            assert (ev.inject_failed.response_id, ev.inject_failed.error.code) == (rid, code)
            assert ev.inject_failed.input[0].message.role == "user"
        session.call.cancel()
