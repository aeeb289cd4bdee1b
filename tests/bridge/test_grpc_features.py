"""The request features the WebSocket and HTTP suites check, on the gRPC session stream (raw stub):
`event_id` echoed on error events, `truncation: "auto"`, `max_tool_calls`, refusal events and the
steering outcomes (pending for a response waiting on tool output, failed with its input back).
Log probabilities and prompt templates on gRPC are in test_logprobs_and_prompts.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tether.protocol import json_codec

from ..support.grpc_client import RawSession, raw_session_on
from .helpers import KEY_A, WEATHER_TOOL


@asynccontextmanager
async def grpc_session(make_stack: Any, authenticator: Any, backend: dict | None = None,
                       **limits: Any) -> AsyncIterator[RawSession]:  # fmt: skip
    async with make_stack(backend=backend, **limits) as stack, raw_session_on(
        stack.engine, stack.config, authenticator, KEY_A
    ) as session:
        yield session


def _script(tmp_path: Path, step: dict, after: dict | None = None) -> dict:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"steps": [step], "after": after or step}))
    return {"script": str(path)}


def _event(body: dict[str, Any]):
    return json_codec.client_event_from_json(body)


async def test_error_events_echo_the_event_id(make_stack: Any, authenticator: Any) -> None:
    async with grpc_session(make_stack, authenticator) as session:
        req = _event({"type": "response.create", "model": "sim-model", "input": "hi", "moderation": {"x": 1}})
        req.event_id = "evt_grpc_1"
        await session.send(req)
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "error"
        assert (ev.error.event_id, ev.error.error.param) == ("evt_grpc_1", "moderation")
        steer = _event({"type": "response.steer", "previous_response_id": "resp_x",
                        "input": [{"type": "x_not_an_input_item", "id": "x1"}]})  # fmt: skip
        steer.event_id = "evt_grpc_2"
        await session.send(steer)
        ev = await session.next_event()
        assert ev.WhichOneof("event") == "error"
        assert (ev.error.event_id, ev.error.error.param) == ("evt_grpc_2", "input[0]")
        # The session goes on.
        await session.create(model="sim-model", input="hi")
        assert (await session.until_terminal()).WhichOneof("event") == "completed"


async def test_truncation_auto(make_stack: Any, authenticator: Any) -> None:
    history = []
    for n in range(6):
        history += [{"role": "user", "content": f"question {n} " + "words " * 60},
                    {"role": "assistant", "content": f"answer {n} " + "words " * 60}]  # fmt: skip
    history.append({"role": "user", "content": "the last question"})
    async with grpc_session(make_stack, authenticator, max_input_tokens=600) as session:
        await session.send(_event({"type": "response.create", "model": "sim-model", "input": history}))
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "error" and ev.error.error.code == "context_length_exceeded"
        await session.send(_event({"type": "response.create", "model": "sim-model", "input": history,
                                   "truncation": "auto"}))  # fmt: skip
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "completed"
        r = ev.completed.response
        assert r.truncation == "auto" and 0 < r.usage.input_tokens <= 600


async def test_max_tool_calls(make_stack: Any, authenticator: Any, tmp_path: Path) -> None:
    step = {"tool_calls": [{"name": "get_weather", "arguments": {"city": c}} for c in ("Paris", "Rome", "Oslo")]}
    async with grpc_session(make_stack, authenticator, _script(tmp_path, step)) as session:
        body = {"type": "response.create", "model": "sim-model", "input": "weather?", "tools": [WEATHER_TOOL]}
        await session.send(_event({**body, "max_tool_calls": 2}))
        ev = await session.until_terminal()
        r = ev.completed.response
        assert r.max_tool_calls == 2 and [o.WhichOneof("item") for o in r.output] == ["function_call"] * 2


async def test_refusal_events(make_stack: Any, authenticator: Any, tmp_path: Path) -> None:
    async with grpc_session(make_stack, authenticator, _script(tmp_path, {"refusal": "I can't help with that."})) as s:
        await s.create(model="sim-model", input="do something bad")
        ev = await s.until_terminal()
        arms = [e.WhichOneof("event") for e in s.events]
        assert "refusal_delta" in arms and "refusal_done" in arms and "output_text_delta" not in arms
        (done,) = [e.refusal_done for e in s.events if e.WhichOneof("event") == "refusal_done"]
        assert done.text == "I can't help with that."
        assert ev.completed.response.output[0].message.content[0].refusal.refusal == done.text


async def test_steer_pending_for_tool_output_then_joined(make_stack: Any, authenticator: Any, tmp_path: Path) -> None:
    step = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris" * 40}}], "tokens_per_s": 40}
    backend = {**_script(tmp_path, step, {"text": "It is sunny."}), "ttft_ms": 0}
    async with grpc_session(make_stack, authenticator, backend) as session:
        body = {"type": "response.create", "model": "sim-model", "input": "weather?", "tools": [WEATHER_TOOL]}
        await session.send(_event(body))
        while (ev := await session.next_event()).WhichOneof("event") != "function_call_arguments_delta":
            pass
        target = ev.response_id
        await session.send(_event({"type": "response.steer", "previous_response_id": target, "input": "in Celsius"}))
        arms = []
        while not arms or arms[-1] != "steer_pending":
            ev = await session.next_event()
            arms.append(ev.WhichOneof("event"))
        assert arms.index("steer_accepted") < arms.index("completed")
        call = next(e for e in session.events if e.WhichOneof("event") == "completed").completed.response.output[0]
        required = json.loads(ev.steer_pending.required_input_json)
        assert ev.steer_pending.reason == "waiting_for_required_input"
        assert required == [{"type": "function_call_output", "call_id": call.function_call.call_id, "name": "get_weather"}]
        await session.send(_event({**body, "previous_response_id": target,
                                   "input": [{"type": "function_call_output", "call_id": call.function_call.call_id,
                                              "output": "sunny"}]}))  # fmt: skip
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "completed"
        assert ev.completed.response.output[0].WhichOneof("item") == "message"


async def test_refused_steer_returns_its_input(make_stack: Any, authenticator: Any) -> None:
    async with grpc_session(make_stack, authenticator) as session:
        await session.send(_event({"type": "response.steer", "previous_response_id": "resp_gone", "input": "go left"}))
        ev = await session.next_event()
        assert ev.WhichOneof("event") == "steer_failed"
        failed = ev.steer_failed
        assert failed.input_text == "go left" and failed.error.code == "response_not_found"
        items = [{"type": "message", "role": "user", "content": "right"}]
        await session.send(_event({"type": "response.steer", "previous_response_id": "resp_gone", "input": items}))
        ev = await session.next_event()
        assert [json_codec.item_to_json(i) for i in ev.steer_failed.input] == items
