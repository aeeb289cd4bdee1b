"""The generic OpenAI-compatible adapter (vLLM, llama.cpp, Ollama) against the fake upstream."""

from __future__ import annotations

import json

import pytest

from tests.fakes import chat_server as fk
from tests.fakes.items import request
from tether.backends.base import BackendError, ReasoningDelta, TextDelta, ToolCallDelta
from tether.backends.openai_compat import OpenAICompatBackend
from tether.backends.registry import build_backend


@pytest.fixture
async def server():
    # vLLM/llama.cpp style: no key, lenient validation.
    with fk.FakeChatServer(api_key=None, strict=False, lifetime_s=60, owned_by="vllm") as s:
        yield s


@pytest.fixture
async def backend(server):
    b = build_backend("local", "openai", {"base_url": server.base_url, "retry_initial_delay_s": 0.01})
    yield b
    await b.aclose()


async def run(b, *items, **kw):
    return [c async for c in b.stream(request(*items, **kw))]


async def test_reasoning_content_deltas_and_no_auth_header(backend, server):
    server.push(
        fk.Reply(
            sse=[
                fk.chunk({"role": "assistant", "content": ""}),
                fk.chunk({"reasoning_content": "think "}),
                fk.chunk({"reasoning_content": "more"}),
                fk.chunk({"content": "answer"}),
                fk.chunk({}, "stop"),
                fk.chunk(None, usage=fk.usage(4, 3)),
                "data: [DONE]\n\n",
            ]
        )
    )
    chunks = await run(backend, "hi")
    assert chunks[:3] == [ReasoningDelta("think "), ReasoningDelta("more"), TextDelta("answer")]
    assert chunks[-1].reason == "stop" and chunks[-1].usage.input_tokens == 4
    assert "authorization" not in server.chat_requests[-1].headers


async def test_delta_reasoning_also_understood(backend, server):
    server.push(fk.text("ok", reasoning="via delta.reasoning"))
    chunks = await run(backend, "hi")
    assert chunks[0] == ReasoningDelta("via")


async def test_ollama_style_tool_calls_without_index_and_stop_reason(backend, server):
    whole = {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    server.push(
        fk.Reply(
            sse=[
                fk.chunk({"role": "assistant", "tool_calls": [whole]}),
                fk.chunk({}, "stop"),
                "data: [DONE]\n\n",
            ]
        )
    )
    chunks = await run(backend, "hi")
    deltas = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert deltas == [ToolCallDelta(0, '{"x": 1}', "call_a", "f")]
    assert json.loads(deltas[0].arguments) == {"x": 1}
    assert chunks[-1].reason == "tool_calls"  # "stop" with tool calls is normalised


async def test_nested_error_body(backend, server):
    server.push(
        fk.http_error(400, {"error": {"message": "bad temperature", "type": "BadRequestError", "code": 400}})
    )
    with pytest.raises(BackendError) as ei:
        await run(backend, "hi")
    assert ei.value.status == 400 and "bad temperature" in ei.value.message


async def test_extra_body_and_headers_are_operator_controlled(server):
    b = build_backend(
        "x",
        "openai",
        {"base_url": server.base_url, "extra_body": {"top_k": 20}, "headers": {"X-Route": "gpu-1"}},
    )
    try:
        await run(b, "hi")
    finally:
        await b.aclose()
    assert server.last_body["top_k"] == 20
    assert server.chat_requests[-1].headers["x-route"] == "gpu-1"


def test_config_errors(monkeypatch):
    with pytest.raises(ValueError, match="base_url"):
        build_backend("x", "openai", {})
    monkeypatch.delenv("MY_LOCAL_KEY", raising=False)
    with pytest.raises(ValueError, match="MY_LOCAL_KEY"):
        build_backend("x", "openai", {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "MY_LOCAL_KEY"})
    monkeypatch.setenv("MY_LOCAL_KEY", "k")
    b = build_backend("x", "openai", {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "MY_LOCAL_KEY"})
    assert isinstance(b, OpenAICompatBackend) and b.api_key == "k"
