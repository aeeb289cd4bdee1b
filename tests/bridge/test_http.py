"""The HTTP endpoints through the official SDK (and httpx where the SDK hides the wire)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from .helpers import KEY_A, WEATHER_TOOL, check_sse_events, collapse_deltas, sse_frames, wait_for

AUTH = {"Authorization": f"Bearer {KEY_A}"}


def http(stack: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=10.0)


async def test_create_without_stream(client: AsyncOpenAI) -> None:
    first = await client.responses.create(model="sim-model", input="Hello there")
    assert first.status == "completed" and first.output_text
    assert first.usage is not None and first.usage.output_tokens > 0


async def test_http_create_is_stored_and_continuable(client: AsyncOpenAI) -> None:
    first = await client.responses.create(model="sim-model", input="Hello there")
    assert (await client.responses.retrieve(first.id)).id == first.id
    # Stored by default: a stateless continuation hydrates it.
    second = await client.responses.create(model="sim-model", input="More", previous_response_id=first.id)
    assert second.status == "completed"
    assert second.previous_response_id == first.id


async def test_create_with_stream(client: AsyncOpenAI) -> None:
    stream = await client.responses.create(
        model="sim-model", input="Weather?", tools=[WEATHER_TOOL], stream=True
    )
    events = [ev async for ev in stream]
    check_sse_events(ev.to_dict() for ev in events)
    types = collapse_deltas(ev.type for ev in events)
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [ev.sequence_number for ev in events] == list(range(len(events)))
    assert events[-1].response.output[0].name == "get_weather"


async def test_sse_wire_format(stack: Any) -> None:
    async with http(stack) as h:
        r = await h.post(
            "/v1/responses", headers=AUTH, json={"model": "sim-model", "input": "hi", "stream": True}
        )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(r.text)
    assert all(name == data["type"] for name, data in frames)
    assert frames[0][0] == "response.created" and frames[-1][0] == "response.completed"
    assert all("stream_id" not in data for _, data in frames)
    check_sse_events(data for _, data in frames)


async def test_a_paced_sse_streams_deltas_are_not_held_by_the_widened_window(make_stack: Any) -> None:
    """An SSE stream that keeps up is written in its producer's step (`tether.core.outbox`: one
    pass per token): each paced token its own frame however wide the coalescing window has grown,
    the wire format unchanged (`data: [DONE]` after the terminal event only)."""
    backend = {"ttft_ms": 0, "tokens_per_s": 25, "tick_ms": 40, "output_tokens": 8}  # a token every 40 ms
    async with make_stack(backend=backend, coalesce_ms=1, coalesce_max_ms=1000,
                          coalesce_batches_per_s=1) as stack, http(stack) as h:  # fmt: skip
        r = await h.post("/v1/responses", headers=AUTH, json={"model": "sim-model", "input": "hi", "stream": True})
    frames = sse_frames(r.text)
    check_sse_events(data for _, data in frames)
    deltas = [data["delta"] for name, data in frames if name == "response.output_text.delta"]
    assert len(deltas) >= 6, deltas  # merged into 1-2 frames when held by the 1 s window
    assert [data["sequence_number"] for _, data in frames] == list(range(len(frames)))
    assert frames[-1][0] == "response.completed"

async def test_failed_response_is_http_200(make_stack: Any, tmp_path: Path) -> None:
    script = tmp_path / "fail.json"
    script.write_text(
        json.dumps({"steps": [{"error": {"code": "server_error", "message": "boom", "status": 500}}]})
    )
    async with make_stack(backend={"script": str(script)}) as stack, stack.client() as client:
        failed = await client.responses.create(model="sim-model", input="hi")
        assert failed.status == "failed"
        assert failed.error is not None and failed.error.code == "server_error"
        stream = await client.responses.create(model="sim-model", input="hi", stream=True)
        events = [ev async for ev in stream]
        assert events[-1].type == "response.failed"


async def test_request_errors_are_http_errors(client: AsyncOpenAI, stack: Any) -> None:
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(
                model="sim-model", input="x", previous_response_id="resp_missing", stream=stream
            )
        assert info.value.status_code == 400
        assert info.value.code == "previous_response_not_found"
        assert info.value.param == "previous_response_id"
        assert set(info.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]

    async with http(stack) as h:
        cases = [
            (b'{"model": ', 400, "invalid_json"),
            (b"[]", 400, "invalid_type"),
            (b'{"model": "m", "input": "x", "temperature": "warm"}', 400, "invalid_type"),
            (b"[" * 100 + b"]" * 100, 400, "invalid_json"),
        ]
        for body, status, code in cases:
            r = await h.post("/v1/responses", headers=AUTH, content=body)
            assert r.status_code == status, r.text
            assert r.json()["error"]["code"] == code
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}


async def test_oversize_body_is_413(make_stack: Any) -> None:
    async with make_stack(max_request_bytes=4096) as stack, http(stack) as h:
        r = await h.post("/v1/responses", headers=AUTH, json={"model": "m", "input": "x" * 10_000})
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "request_too_large"


def text_of(item: Any) -> str:
    """A message item's text (input items keep the string form the client sent)."""
    return item.content if isinstance(item.content, str) else item.content[0].text


async def stored_over_ws(client: AsyncOpenAI, items: list[Any]) -> Any:
    async with client.responses.connect() as conn:
        await conn.response.create(model="sim-model", input=items, store=True)
        async for ev in conn:
            if ev.type == "response.completed":
                return ev.response


async def test_retrieve_delete_and_input_items(client: AsyncOpenAI, stack: Any) -> None:
    items = [{"role": "user", "content": f"message {i}", "type": "message"} for i in range(3)]
    created = await stored_over_ws(client, items)

    got = await client.responses.retrieve(created.id)
    assert got.id == created.id and got.output_text == created.output_text
    # `include` is accepted and ignored; `stream=true` replays the events after `starting_after`.
    async with http(stack) as h:
        r = await h.get(f"/v1/responses/{created.id}", headers=AUTH, params={"include[]": "reasoning.encrypted_content"})
        assert r.status_code == 200 and r.json()["id"] == created.id
        r = await h.get(
            f"/v1/responses/{created.id}",
            headers=AUTH,
            params={"stream": "true", "include[]": "reasoning.encrypted_content", "starting_after": "3"},
        )
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [event for _, event in sse_frames(r.text)]
        assert events[0]["sequence_number"] == 4 and events[-1]["type"] == "response.completed"
        assert [e["sequence_number"] for e in events] == list(range(4, 4 + len(events)))

    page = await client.responses.input_items.list(created.id, order="asc")
    assert [text_of(item) for item in page.data] == ["message 0", "message 1", "message 2"]
    first = await client.responses.input_items.list(created.id, order="asc", limit=2)
    assert len(first.data) == 2 and first.has_more
    rest = await client.responses.input_items.list(created.id, order="asc", after=first.last_id)
    assert [text_of(i) for i in rest.data] == ["message 2"]
    desc = await client.responses.input_items.list(created.id)
    assert [text_of(i) for i in desc.data] == ["message 2", "message 1", "message 0"]
    with pytest.raises(openai.BadRequestError):
        await client.responses.input_items.list(created.id, limit=1000)

    async with http(stack) as h:
        r = await h.delete(f"/v1/responses/{created.id}", headers=AUTH)
        assert r.status_code == 200
        assert r.json() == {"id": created.id, "object": "response", "deleted": True}
        r = await h.get(f"/v1/responses/{created.id}/input_items", headers=AUTH, params={"limit": "many"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
    with pytest.raises(openai.NotFoundError) as info:
        await client.responses.retrieve(created.id)
    assert info.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(created.id)


async def test_input_tokens_and_compact(client: AsyncOpenAI) -> None:
    count = await client.responses.input_tokens.count(model="sim-model", input="How many tokens is this?")
    assert count.object == "response.input_tokens" and count.input_tokens > 0

    history: list[Any] = [
        {"type": "message", "role": "user", "content": "Please refactor the parser."},
        {"type": "message", "role": "assistant", "content": "Done: I split it into three functions."},
        {"type": "message", "role": "user", "content": "Now add tests."},
    ]
    compacted = await client.responses.compact(model="sim-model", input=history)
    assert compacted.object == "response.compaction"
    assert compacted.output[-1].type == "compaction"
    # The compacted window starts a new chain.
    follow = await client.responses.create(
        model="sim-model",
        input=[
            *[item.to_dict(warnings=False) for item in compacted.output],
            {"role": "user", "content": "Go on."},
        ],  # type: ignore[list-item]
    )
    assert follow.status == "completed"


async def test_models(client: AsyncOpenAI) -> None:
    models = await client.models.list()
    assert models.data and all(m.object == "model" and m.owned_by for m in models.data)


async def test_health_and_readiness(stack: Any) -> None:
    async with http(stack) as h:
        assert (await h.get("/healthz")).status_code == 200
        assert (await h.get("/readyz")).status_code == 200
        metrics = await h.get("/metrics")
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
        await stack.engine.shutdown(grace=0)
        assert (await h.get("/healthz")).status_code == 200
        r = await h.get("/readyz")
        assert r.status_code == 503


async def test_routing_errors(stack: Any) -> None:
    async with http(stack) as h:
        r = await h.get("/v1/responses", headers=AUTH)  # a plain GET: the WebSocket endpoint
        assert r.status_code == 426
        assert r.json()["error"]["code"] == "upgrade_required"
        assert r.headers["upgrade"] == "websocket"

        r = await h.get("/v1/nothing-here", headers=AUTH)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"

        r = await h.put("/v1/responses", headers=AUTH, json={})
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        assert set(r.headers["allow"].split(", ")) == {"GET", "POST"}

        r = await h.post("/v1/models", headers=AUTH)
        assert r.status_code == 405

        r = await h.get("/v1/responses/compact", headers=AUTH)
        assert r.status_code == 405


async def test_unexpected_errors_do_not_leak(stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(stack.engine, "list_models", broken)
    async with http(stack) as h:
        r = await h.get("/v1/models", headers=AUTH)
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "server_error"
    assert "secret" not in r.text and "Traceback" not in r.text


async def test_client_disconnect_cancels_a_streamed_create_that_is_not_stored(make_stack: Any) -> None:
    # (A stored one runs on: tests/bridge/test_background.py.)
    async with make_stack(backend={"tokens_per_s": 200, "output_tokens": 5000}) as stack, http(stack) as h:
        body = {"model": "sim-model", "input": "long story", "stream": True, "store": False}
        async with h.stream("POST", "/v1/responses", headers=AUTH, json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("event: response.output_text.delta"):
                    break
            assert len(stack.engine.sessions) == 1
        await wait_for(lambda: not stack.engine.sessions)


async def test_shutdown_mid_stream_fails_the_response_in_band(make_stack: Any) -> None:
    async with make_stack(backend={"tokens_per_s": 200, "output_tokens": 5000}) as stack, http(stack) as h:
        body = {"model": "sim-model", "input": "long story", "stream": True}
        async with h.stream("POST", "/v1/responses", headers=AUTH, json=body) as r:
            chunks = r.aiter_text()
            text = ""
            async for chunk in chunks:
                text += chunk
                if "response.output_text.delta" in text:
                    break
            await stack.engine.shutdown(grace=0)  # cuts the turn: it still ends with a terminal event
            async for chunk in chunks:
                text += chunk
        frames = sse_frames(text)
        name, failed = frames[-1]
        assert name == "response.failed"
        assert failed["response"]["status"] == "failed"
        error = failed["response"]["error"]
        assert (error["code"], error["tether_code"]) == ("server_error", "server_shutting_down")
        check_sse_events(event for _, event in frames)  # strict SDK parse and the sequence oracle
