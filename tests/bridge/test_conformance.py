"""Conformance: every Response body, SSE event and WebSocket event Tether emits validates strictly
(pydantic strict mode) against the openai SDK's own types, across scenarios: text, tool call,
reasoning, refusal, a custom (freeform) tool call, log probabilities, a prompt template, output cap
(incomplete), content filter, backend failures (with Tether's own codes too), cancellation,
request error, compaction (the `/v1/responses/compact` body and the in-stream compaction item) and
conversations.
The raw JSON is read off the wire (httpx, websockets), never through the SDK's lenient parsers.
Where the Open Responses schema and OpenAI differ, Tether follows OpenAI (docs/fields.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.conversations import Conversation, ConversationDeletedResource, ConversationItemList
from openai.types.responses import (
    CompactedResponse,
    Response,
    ResponseInputMessageItem,
    ResponseOutputMessage,
    ResponseStreamEvent,
)
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from tether.prompts import PromptLibrary

from ..support.validator import validate_events
from .helpers import KEY_A, WEATHER_TOOL, recv_until, send_json, sse_frames

WS_EVENT = TypeAdapter(ResponsesServerEvent)
SSE_EVENT = TypeAdapter(ResponseStreamEvent)
HEADERS = {"Authorization": f"Bearer {KEY_A}"}
TERMINAL = ("response.completed", "response.failed", "response.incomplete")


def strict(adapter_or_model: Any, obj: dict) -> None:
    if isinstance(adapter_or_model, TypeAdapter):
        adapter_or_model.validate_python(obj, strict=True)
    else:
        adapter_or_model.model_validate(obj, strict=True)


APPLY_PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
}

# name -> (script step, create body extras, expected terminal status, check of the final Response)
SCENARIOS: dict[str, tuple[dict, dict, str, Callable[[dict], None]]] = {
    "text": ({"text": "Hello there."}, {}, "completed", lambda r: None),
    "tool": (
        {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
        {"tools": [WEATHER_TOOL]},
        "completed",
        lambda r: _check(r["output"][0]["type"] == "function_call" and r["tools"][0]["strict"] is None),
    ),
    "custom_tool": (
        {"tool_calls": [{"name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"}]},
        {"tools": [WEATHER_TOOL, APPLY_PATCH_TOOL], "tool_choice": {"type": "custom", "name": "apply_patch"}},
        "completed",
        lambda r: _check(
            r["output"][0]["type"] == "custom_tool_call"
            and r["output"][0]["input"] == "*** Begin Patch\n*** End Patch"
            and r["tools"][1] == APPLY_PATCH_TOOL
        ),
    ),
    "reasoning": (
        {"reasoning_tokens": 6, "text": "Done."},
        {"reasoning": {"effort": "low"}},
        "completed",
        lambda r: _check([o["type"] for o in r["output"]] == ["reasoning", "message"]),
    ),
    "refusal": (
        {"refusal": "I can't help with that."},
        {},
        "completed",
        lambda r: _check(r["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't help with that."}]),
    ),
    "output_cap": (
        {"text_tokens": 50},
        {"max_output_tokens": 5},
        "incomplete",
        lambda r: _check(
            r["incomplete_details"] == {"reason": "max_output_tokens"} and r["output"][-1]["status"] == "incomplete"
        ),
    ),
    "content_filter": (
        {"text": "I will not", "finish": "content_filter"},
        {},
        "incomplete",
        lambda r: _check(r["incomplete_details"] == {"reason": "content_filter"}),
    ),
    "backend_failure": (
        {"error": {"code": "server_error", "message": "boom", "status": 500}},
        {},
        "failed",
        lambda r: _check(r["error"]["code"] == "server_error"),
    ),
    # Tether's precise codes: `error.code` within the SDK's closed list, the precise one kept.
    "backend_error": (
        {"error": {"code": "backend_timeout", "message": "slow", "status": 504}},
        {},
        "failed",
        lambda r: _check((r["error"]["code"], r["error"]["tether_code"]) == ("server_error", "backend_timeout")),
    ),
    "refused_prompt": (
        {"error": {"code": "context_length_exceeded", "message": "too long", "status": 400}},
        {},
        "failed",
        lambda r: _check(
            (r["error"]["code"], r["error"]["tether_code"]) == ("invalid_prompt", "context_length_exceeded")
        ),
    ),
    "logprobs": (
        {"text": "Hello there, with log probabilities."},
        {"include": ["message.output_text.logprobs"], "top_logprobs": 2},
        "completed",
        lambda r: _check(
            r["top_logprobs"] == 2 and len(r["output"][0]["content"][0]["logprobs"][0]["top_logprobs"]) == 2
        ),
    ),
    "prompt": (
        {"text": "Hi Ada."},
        {"prompt": {"id": "greet", "variables": {"name": "Ada"}}},
        "completed",
        lambda r: _check(r["prompt"]["id"] == "greet" and r["instructions"] == "Greet Ada."),
    ),
    "compaction": (
        {"text": "ok"},
        {"input": "compact me " * 1000, "context_management": [{"type": "compaction", "compact_threshold": 1000}]},
        "completed",
        lambda r: _check(r["output"][-1]["type"] == "compaction"),
    ),
}


def _check(ok: bool) -> None:
    assert ok


@pytest.fixture(params=list(SCENARIOS))
async def scenario(request: pytest.FixtureRequest, make_stack: Any, tmp_path: Path):
    step, extra, status, check = SCENARIOS[request.param]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"steps": [step], "after": step}))
    body = {"model": "sim-model", "input": "What is the weather in Paris?", **extra}
    async with make_stack(backend={"script": str(script)}) as stack:
        stack.config.prompts = PromptLibrary.from_config({"greet": {"instructions": "Greet {{name}}."}})
        yield stack, body, status, check


async def test_http_json_body(scenario) -> None:
    stack, body, status, check = scenario
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{stack.base_url}/responses", json=body, headers=HEADERS)
    assert reply.status_code == 200
    final = reply.json()
    strict(Response, final)
    assert final["status"] == status
    check(final)


async def test_sse_events(scenario) -> None:
    stack, body, status, check = scenario
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", f"{stack.base_url}/responses", json={**body, "stream": True}, headers=HEADERS) as reply,
    ):
        events = [event for _, event in sse_frames((await reply.aread()).decode())]
    for ev in events:
        strict(SSE_EVENT, ev)
    validate_events(events)
    assert events[-1]["response"]["status"] == status
    check(events[-1]["response"])


async def test_websocket_events(scenario) -> None:
    stack, body, status, check = scenario
    async with stack.ws() as conn:
        await send_json(conn, {"type": "response.create", **body})
        events = await recv_until(conn, lambda e: e["type"] in TERMINAL or e["type"] == "error", 30)
    for ev in events:
        strict(WS_EVENT, ev)
    validate_events(events)
    assert events[-1]["response"]["status"] == status
    check(events[-1]["response"])


async def test_error_events_and_bodies(stack) -> None:
    async with stack.ws() as conn:
        # A create the core refuses, an undecodable frame and an unknown event: each error echoes
        # the frame's event_id.
        await send_json(conn, {"type": "response.create", "event_id": "evt_1", "model": "sim-model", "moderation": {"x": 1}})
        await conn.send('{"type": "response.create", "event_id": "evt_2", "model": 5}')
        await send_json(conn, {"type": "response.explode", "event_id": "evt_3"})
        errors = [await recv_until(conn, lambda e: True) for _ in range(3)]
    for (err,) in errors:
        strict(WS_EVENT, err)
        assert err["type"] == "error"
    # The bridge answers an undecodable frame at once, the core the others: order may differ.
    codes = {e[0]["event_id"]: e[0]["error"]["code"] for e in errors}
    assert codes == {"evt_1": "unsupported_parameter", "evt_2": "invalid_type", "evt_3": "unknown_event_type"}


async def test_cancelled_response(make_stack: Any) -> None:
    async with make_stack(backend={"ttft_ms": 0, "tokens_per_s": 50, "output_tokens": 500}) as stack:
        async with stack.ws() as conn:
            await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "long"})
            created = (await recv_until(conn, lambda e: e["type"] == "response.created"))[-1]
            await send_json(conn, {"type": "response.cancel", "response_id": created["response"]["id"]})
            events = await recv_until(conn, lambda e: e["type"] in TERMINAL, 30)
    for ev in events:
        strict(WS_EVENT, ev)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["status"] == "cancelled" and events[-1]["response"]["incomplete_details"] is None


async def test_compact_and_conversation_bodies(stack) -> None:
    history = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
    ]
    async with httpx.AsyncClient(timeout=30, headers=HEADERS) as http:
        compacted = (await http.post(f"{stack.base_url}/responses/compact", json={"model": "sim-model", "input": history})).json()
        # The SDK types `output` as output items, whose only message is the assistant's; OpenAI
        # (and Tether) also return the kept user messages there, which validate as input items.
        strict(CompactedResponse, {**compacted, "output": compacted["output"][-1:]})
        kept = compacted["output"][:-1]
        for item in kept:
            strict(ResponseInputMessageItem if item["role"] != "assistant" else ResponseOutputMessage, item)
        assert kept and all(i["id"] and i["status"] == "completed" and isinstance(i["content"], list) for i in kept)
        conv = (await http.post(f"{stack.base_url}/conversations", json={"items": history})).json()
        strict(Conversation, conv)
        items = (await http.get(f"{stack.base_url}/conversations/{conv['id']}/items")).json()
        strict(ConversationItemList, items)
        gone = (await http.delete(f"{stack.base_url}/conversations/{conv['id']}")).json()
        strict(ConversationDeletedResource, gone)
