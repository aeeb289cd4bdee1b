"""Custom (freeform) tools end to end against the simulated model: the model's call is a
`custom_tool_call` item streamed with `response.custom_tool_call_input.*`, the client's
`custom_tool_call_output` continues it, on HTTP (the openai SDK, JSON and SSE), WebSocket and
gRPC; `tool_choice: {"type": "custom"}`, `max_tool_calls` and the 400s for what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from openai import AsyncOpenAI, BadRequestError

from tether.backends.simulated import CUSTOM_INPUT
from tether.protocol import json_codec
from tether.responses.v1 import items_pb2, request_pb2

from ..support.grpc_client import raw_session_on
from ..support.stacks import Stack
from .helpers import KEY_A, WEATHER_TOOL, check_sse_events, recv_response, recv_until, send_json, sse_frames

APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch to the workspace.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
}
HEADERS = {"Authorization": f"Bearer {KEY_A}"}


def _script(tmp_path: Path, steps: list[dict], after: dict | None = None) -> dict:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"steps": steps, "after": after or {"text": "Patched."}}))
    return {"script": str(path)}


def _grpc(stack: Stack, authenticator: Any):
    """A raw gRPC session stream on the stack's engine."""
    return raw_session_on(stack.engine, stack.config, authenticator, KEY_A)


def _output(call_id: str, text: str = "Done!") -> dict:
    return {"type": "custom_tool_call_output", "call_id": call_id, "output": text}


async def test_http_sdk_two_turn_loop(client: AsyncOpenAI) -> None:
    r1 = await client.responses.create(model="sim-model", input="fix the bug", tools=[APPLY_PATCH])
    assert r1.status == "completed"
    (call,) = r1.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == CUSTOM_INPUT
    assert call.id.startswith("ctc_") and call.call_id
    assert call.to_dict()["status"] == "completed"
    r2 = await client.responses.create(
        model="sim-model", previous_response_id=r1.id, input=[_output(call.call_id)], tools=[APPLY_PATCH]
    )
    assert r2.status == "completed" and [o.type for o in r2.output] == ["message"]
    items = await client.responses.input_items.list(r2.id)
    assert [i.type for i in items.data][:2] == ["custom_tool_call_output", "custom_tool_call"]  # newest first


async def test_http_sse_events_validate_against_the_sdk(stack: Stack) -> None:
    body = {"model": "sim-model", "input": "fix the bug", "tools": [APPLY_PATCH], "stream": True}
    async with httpx.AsyncClient(timeout=30) as c:
        async with c.stream("POST", f"{stack.base_url}/responses", headers=HEADERS, json=body) as resp:
            events = [event for _, event in sse_frames((await resp.aread()).decode())]
    check_sse_events(events)  # strict SDK types and the event-sequence oracle
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[2] == "response.output_item.added" and events[2]["item"]["type"] == "custom_tool_call"
    assert events[2]["item"]["status"] == "in_progress" and events[2]["item"]["input"] == ""
    deltas = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    (done,) = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert "".join(deltas) == done["input"] == CUSTOM_INPUT
    assert types[-2:] == ["response.output_item.done", "response.completed"]
    assert "response.function_call_arguments.delta" not in types


async def test_stateless_resend_with_call_and_output_in_the_input(client: AsyncOpenAI) -> None:
    """Codex over HTTP with store=false: the whole history, the custom call and its output, resent."""
    r = await client.responses.create(
        model="sim-model", store=False, tools=[APPLY_PATCH],
        input=[{"role": "user", "content": "fix it"},
               {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": "*** Begin Patch"},
               _output("call_1")],
    )  # fmt: skip
    assert r.status == "completed" and r.output[0].type == "message"


async def test_websocket_two_turn_loop(stack: Stack) -> None:
    async with stack.ws() as ws:
        await send_json(
            ws, {"type": "response.create", "model": "sim-model", "input": "fix it", "tools": [APPLY_PATCH]}
        )
        events = await recv_response(ws)  # strict SDK types and the oracle
        final = events[-1]["response"]
        assert final["status"] == "completed"
        (call,) = final["output"]
        assert (call["type"], call["name"], call["input"]) == (
            "custom_tool_call",
            "apply_patch",
            CUSTOM_INPUT,
        )
        assert any(e["type"] == "response.custom_tool_call_input.delta" for e in events)
        await send_json(ws, {"type": "response.create", "model": "sim-model", "previous_response_id": final["id"],
                             "input": [_output(call["call_id"])], "tools": [APPLY_PATCH]})  # fmt: skip
        events = await recv_response(ws)
        assert events[-1]["type"] == "response.completed"
        assert [o["type"] for o in events[-1]["response"]["output"]] == ["message"]


async def test_grpc_two_turn_loop(stack: Stack, authenticator: Any) -> None:
    async with _grpc(stack, authenticator) as session:
        body = {"type": "response.create", "model": "sim-model", "input": "fix it", "tools": [APPLY_PATCH]}
        await session.send(json_codec.client_event_from_json(body))
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "completed"
        (call,) = ev.completed.response.output
        assert call.WhichOneof("item") == "other" and call.other.type == "custom_tool_call"
        obj = orjson.loads(call.other.json)
        arms = [e.WhichOneof("event") for e in session.events]
        assert "custom_tool_call_input_delta" in arms
        (done,) = [e.custom_tool_call_input_done for e in session.events
                   if e.WhichOneof("event") == "custom_tool_call_input_done"]  # fmt: skip
        assert done.input == obj["input"] == CUSTOM_INPUT and done.item_id == obj["id"]
        follow = {
            **body,
            "previous_response_id": ev.completed.response.id,
            "input": [_output(obj["call_id"])],
        }
        await session.send(json_codec.client_event_from_json(follow))
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "completed"
        assert ev.completed.response.output[0].WhichOneof("item") == "message"


async def test_tool_choice_custom_forces_that_tool(client: AsyncOpenAI) -> None:
    tools = [WEATHER_TOOL, APPLY_PATCH]
    r = await client.responses.create(model="sim-model", input="hi", tools=tools)
    assert r.output[0].type == "function_call"  # unforced: the first tool
    r = await client.responses.create(
        model="sim-model", input="hi", tools=tools, tool_choice={"type": "custom", "name": "apply_patch"}
    )
    assert r.output[0].type == "custom_tool_call" and r.tool_choice.type == "custom"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "custom", "name": "apply_patch"}}, "tool_choice"),
        (
            {"tools": [{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "peg", "definition": "x"}}]},
            "tools[0].format",
        ),
        ({"tools": [APPLY_PATCH, {**APPLY_PATCH, "description": "again"}]}, "tools[1].name"),
        ({"input": [_output("call_nowhere")]}, "input[0].call_id"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch"}]}, "input[0]"),
    ],
)
async def test_bad_custom_tool_requests_are_400(client: AsyncOpenAI, extra: dict, param: str) -> None:
    with pytest.raises(BadRequestError) as ei:
        await client.responses.create(
            **{"model": "sim-model", "input": "hi", "tools": [APPLY_PATCH], **extra}
        )
    assert ei.value.status_code == 400 and ei.value.body["param"] == param


async def test_max_tool_calls_counts_custom_calls(make_stack: Any, tmp_path: Path) -> None:
    step = {"tool_calls": [{"name": "apply_patch", "input": "*** Begin Patch 1"},
                           {"name": "get_weather", "arguments": {"city": "Rome"}},
                           {"name": "apply_patch", "input": "*** Begin Patch 2"}]}  # fmt: skip
    async with make_stack(backend=_script(tmp_path, [step])) as stack, stack.client() as client:
        tools = [WEATHER_TOOL, APPLY_PATCH]
        r = await client.responses.create(model="sim-model", input="go", tools=tools, max_tool_calls=2)
        assert [o.type for o in r.output] == ["custom_tool_call", "function_call"]
        assert r.output[0].input == "*** Begin Patch 1"
        r = await client.responses.create(model="sim-model", input="go", tools=tools)
        assert [o.type for o in r.output] == ["custom_tool_call", "function_call", "custom_tool_call"]


async def test_websocket_steer_waits_for_the_custom_tool_output(make_stack: Any, tmp_path: Path) -> None:
    step = {"tool_calls": [{"name": "apply_patch", "input": "*** Begin Patch " * 20}], "tokens_per_s": 40}
    async with make_stack(backend={**_script(tmp_path, [step]), "ttft_ms": 0}) as stack, stack.ws() as ws:
        body = {"type": "response.create", "model": "sim-model", "input": "fix it", "tools": [APPLY_PATCH]}
        await send_json(ws, body)
        first = await recv_until(ws, lambda e: e["type"] == "response.custom_tool_call_input.delta")
        target = first[0]["response"]["id"]
        await send_json(
            ws, {"type": "response.steer", "previous_response_id": target, "input": "and add tests"}
        )
        events = await recv_until(ws, lambda e: e["type"] == "response.steer.pending", 30)
        types = [e["type"] for e in events]
        assert "response.incomplete" not in types  # a response making a call finishes it
        call = events[types.index("response.completed")]["response"]["output"][0]
        assert events[-1]["required_input"] == [
            {"type": "custom_tool_call_output", "call_id": call["call_id"], "name": "apply_patch"}
        ]
        await send_json(ws, {**body, "previous_response_id": target, "input": [_output(call["call_id"])]})
        done = (await recv_until(ws, lambda e: e["type"] == "response.completed", 30))[-1]
        assert done["response"]["output"][0]["type"] == "message"


async def test_grpc_custom_tool_that_is_not_a_json_object_is_a_400(stack: Stack, authenticator: Any) -> None:
    async with _grpc(stack, authenticator) as session:
        tool = request_pb2.Tool(other=items_pb2.OtherJson(type="custom", json="not json"))
        await session.create(model="sim-model", input="hi", tools=[tool])
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "error"
        assert (ev.error.error.code, ev.error.error.param) == ("invalid_request", "tools[0]")


async def test_truncation_auto_drops_a_custom_output_with_its_call(make_stack: Any) -> None:
    history = [
        {"type": "custom_tool_call", "call_id": "call_big", "name": "apply_patch", "input": "words " * 560},
        _output("call_big", "ok"),
        {"role": "user", "content": "question " + "words " * 40},
        {"role": "user", "content": "the last question"},
    ]
    async with make_stack(max_input_tokens=600) as stack, stack.client() as client:
        r = await client.responses.create(
            model="sim-model", input=history, tools=[APPLY_PATCH], truncation="auto", store=True
        )
        assert r.status == "completed" and 0 < r.usage.input_tokens <= 600
        kept = await client.responses.input_items.list(r.id, order="asc", limit=100)
    assert [i.type for i in kept.data] == ["message", "message"]  # not an output whose call went
