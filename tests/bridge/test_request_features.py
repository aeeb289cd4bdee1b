"""Request fields the core now honours instead of ignoring: `truncation: "auto"`,
`max_tool_calls`, `reasoning.summary`, and foreign compaction items refused (HTTP and WebSocket
drive the same session core; gRPC shares it too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from .conftest import Stack
from .helpers import KEY_B, WEATHER_TOOL, check_sse_events, recv_response, send_json


def _history(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in range(turns):
        out.append({"role": "user", "content": f"question {n} " + "words " * 60})
        out.append({"role": "assistant", "content": f"answer {n} " + "words " * 60})
    out.append({"role": "user", "content": "the last question"})
    return out


async def test_truncation_auto_drops_the_oldest_items(make_stack: Any) -> None:
    async with make_stack(max_input_tokens=600) as stack, stack.client() as client:
        history = _history(6)
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", input=history)
        assert info.value.body["code"] == "context_length_exceeded"
        r = await client.responses.create(model="sim-model", input=history, truncation="auto", store=True)
        assert r.status == "completed" and r.truncation == "auto"
        assert 0 < r.usage.input_tokens <= 600
        kept = await client.responses.input_items.list(r.id, order="asc", limit=100)
        texts = [i.content if isinstance(i.content, str) else i.content[0].text for i in kept.data]
        assert texts[-1] == "the last question" and len(texts) < len(history)
        assert not texts[0].startswith("question 0")
        # An input whose last item alone is over the window is still refused.
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", input="words " * 2000, truncation="auto")
        assert info.value.body["code"] == "context_length_exceeded"


async def test_truncation_auto_on_a_websocket_chain(make_stack: Any) -> None:
    async with make_stack(max_input_tokens=600) as stack, stack.ws() as conn:
        previous = None
        for n in range(8):
            body = {"type": "response.create", "model": "sim-model", "input": f"turn {n} " + "words " * 60,
                    "truncation": "auto", "store": False}  # fmt: skip
            if previous:
                body["previous_response_id"] = previous
            await send_json(conn, body)
            done = (await recv_response(conn))[-1]
            assert done["type"] == "response.completed", done
            assert done["response"]["usage"]["input_tokens"] <= 600
            previous = done["response"]["id"]


def _script(tmp_path: Path, step: dict) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"steps": [step], "after": step}))
    return str(path)


async def test_max_tool_calls_caps_the_calls(make_stack: Any, tmp_path: Path) -> None:
    step = {"tool_calls": [{"name": "get_weather", "arguments": {"city": c}} for c in ("Paris", "Rome", "Oslo")]}
    async with make_stack(backend={"script": _script(tmp_path, step)}) as stack, stack.client() as client:
        uncapped = await client.responses.create(model="sim-model", input="weather?", tools=[WEATHER_TOOL])
        assert [o.type for o in uncapped.output] == ["function_call"] * 3
        capped = await client.responses.create(
            model="sim-model", input="weather?", tools=[WEATHER_TOOL], max_tool_calls=1
        )
        assert capped.status == "completed" and capped.max_tool_calls == 1
        assert [o.type for o in capped.output] == ["function_call"]
        assert json.loads(capped.output[0].arguments) == {"city": "Paris"}


async def test_reasoning_summary_streams_the_reasoning_as_summary(make_stack: Any, tmp_path: Path) -> None:
    step = {"reasoning": "Think about the weather first.", "text": "Sunny."}
    async with make_stack(backend={"script": _script(tmp_path, step)}) as stack, stack.client() as client:
        plain = await client.responses.create(model="sim-model", input="hi")
        assert plain.output[0].type == "reasoning" and plain.output[0].summary == []
        stream = await client.responses.create(
            model="sim-model", input="hi", reasoning={"effort": "low", "summary": "auto"}, stream=True
        )
        events = [ev async for ev in stream]
    check_sse_events(ev.to_dict() for ev in events)
    types = [ev.type for ev in events]
    assert "response.reasoning_summary_part.added" in types and "response.reasoning_text.delta" not in types
    final = events[-1].response
    assert final.output[0].summary[0].text == "Think about the weather first." and not final.output[0].content


async def test_foreign_compaction_items_are_refused(stack: Stack) -> None:
    async with stack.client() as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(
                model="sim-model",
                input=[{"type": "compaction", "encrypted_content": "gAAAAABn-openai-blob"},
                       {"role": "user", "content": "go on"}],  # fmt: skip
            )
    assert (info.value.body["code"], info.value.body["param"]) == ("invalid_item", "input[0].encrypted_content")


async def test_reasoning_encrypted_content_round_trips_for_stateless_clients(make_stack: Any, tmp_path: Path) -> None:
    step = {"reasoning": "The user wants the weather; I should check the forecast for Paris.", "text": "Sunny."}
    async with make_stack(backend={"script": _script(tmp_path, step)}) as stack:
        async with stack.client() as client, stack.client(KEY_B) as other:
            question = {"role": "user", "content": "weather?"}
            first = await client.responses.create(
                model="sim-model", input=[question], store=False, include=["reasoning.encrypted_content"]
            )
            reasoning = first.output[0]
            assert reasoning.type == "reasoning" and reasoning.encrypted_content.startswith("tether.r1.")
            # Codex resends the reasoning item with only its id and encrypted_content.
            sent = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content}
            answer = first.output[1].to_dict()
            follow = {"role": "user", "content": "and tomorrow?"}
            with_reasoning = await client.responses.create(
                model="sim-model", input=[question, sent, answer, follow], store=False
            )
            without = await client.responses.create(model="sim-model", input=[question, answer, follow], store=False)
            restored = with_reasoning.usage.input_tokens - without.usage.input_tokens
            assert restored >= 10  # the reasoning's text is back in the model's context

            tampered = {**sent, "encrypted_content": reasoning.encrypted_content[:-4] + "AAAA"}
            for c, item in ((client, tampered), (other, sent)):  # altered, or another tenant's
                with pytest.raises(openai.BadRequestError) as info:
                    await c.responses.create(model="sim-model", input=[question, item, follow], store=False)
                assert (info.value.body["code"], info.value.body["param"]) == ("invalid_item", "input[1].encrypted_content")


async def test_refusal_is_refusal_content_with_its_events(make_stack: Any, tmp_path: Path) -> None:
    step = {"refusal": "I can't help with that."}
    async with make_stack(backend={"script": _script(tmp_path, step)}) as stack, stack.client() as client:
        stream = await client.responses.create(model="sim-model", input="do something bad", stream=True)
        events = [ev async for ev in stream]
    check_sse_events(ev.to_dict() for ev in events)
    types = [ev.type for ev in events]
    assert "response.refusal.delta" in types and "response.refusal.done" in types
    assert "response.output_text.delta" not in types
    done = next(ev for ev in events if ev.type == "response.refusal.done")
    assert done.refusal == "I can't help with that."
    assert events[-1].response.output[0].content[0].type == "refusal"
