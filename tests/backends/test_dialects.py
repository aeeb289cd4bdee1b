"""Dialects: each server family's declared differences, asserted on what the fake upstream
recorded (the body on the wire), detection from `GET /models`, and the 400s for what a server
cannot do, raised by `prepare` (before `response.created`)."""

from __future__ import annotations

import orjson
import pytest

from tests.fakes import chat_server as fk
from tests.fakes.items import (
    assistant,
    function_call,
    function_output,
    function_tool,
    other_tool,
    reasoning,
)
from tests.support.dialects import call, dialect_server  # noqa: F401  (the `server` fixture)
from tether.backends.base import TextDelta
from tether.backends.chat.dialects import DIALECTS
from tether.backends.registry import build_backend
from tether.errors import TetherError
from tether.responses.v1 import request_pb2

TOOL_ROUND = (
    "hi",
    reasoning("r1"),
    function_call("c1", "f"),
    function_output("c1", "o"),
)




# (dialect, output-cap field, content of a tool-call-only assistant message, stream_options sent)
WIRE = [
    ("openai", "max_completion_tokens", None, True),
    ("vllm", "max_completion_tokens", None, True),
    ("sglang", "max_completion_tokens", None, True),
    ("llamacpp", "max_tokens", "", True),
    ("llama-cpp-python", "max_tokens", "", False),
    ("ollama", "max_tokens", "", True),
    ("lmstudio", "max_tokens", "", True),
]


@pytest.mark.parametrize(("dialect", "cap_field", "content", "usage_asked"), WIRE)
async def test_output_cap_tool_call_content_and_usage_request(server, dialect, cap_field, content, usage_asked):
    await call(server, dialect, *TOOL_ROUND, max_output_tokens=50)
    body = server.last_body
    assert body[cap_field] == 50
    other = {"max_tokens", "max_completion_tokens"} - {cap_field}
    assert not other & set(body)  # the field the server ignores is never the only cap sent
    calls_msg = body["messages"][1]
    assert calls_msg["role"] == "assistant" and calls_msg["tool_calls"][0]["id"] == "c1"
    assert calls_msg["content"] == content
    assert ("stream_options" in body) is usage_asked
    assert "reasoning" not in calls_msg and "reasoning_content" not in calls_msg  # not sent back


async def test_detection_from_the_model_list(server):
    seen = {}
    for owned_by, expected in [("vllm", "vllm"), ("me", "llama-cpp-python"), ("library", "ollama"),
                               ("llamacpp", "llamacpp"), ("organization_owner", "lmstudio"),
                               ("sglang", "sglang"), ("Cerebras", "cerebras"), ("someone", "openai")]:  # fmt: skip
        server.owned_by = owned_by
        b = build_backend("x", "openai", {"base_url": server.base_url})
        try:
            assert b.dialect is None  # "auto": unknown until the server says
            assert await b.discover() == server.models
            seen[owned_by] = b.dialect.name
        finally:
            await b.aclose()
        assert seen[owned_by] == expected


async def test_unreachable_server_leaves_auto_generic():
    b = build_backend("x", "openai", {"base_url": "http://127.0.0.1:9/v1", "connect_timeout_s": 1})
    try:
        assert await b.discover() == [] and b.dialect is DIALECTS["openai"]
    finally:
        await b.aclose()


async def test_required_tool_choice_on_a_server_that_ignores_it(server):
    one = [function_tool("get_time")]
    server.push(fk.tool_calls(fk.Call("get_time", "{}", "c9")))
    await call(server, "llama-cpp-python", "x", tools=one, tool_choice=request_pb2.ToolChoice(mode="required"))
    assert server.last_body["tool_choice"] == {"type": "function", "function": {"name": "get_time"}}
    two = [function_tool("a"), function_tool("b")]
    with pytest.raises(TetherError) as ei:
        await call(server, "ollama", "x", tools=two, tool_choice=request_pb2.ToolChoice(mode="required"))
    assert ei.value.status == 400 and ei.value.param == "tool_choice" and "name the function" in ei.value.message
    n = len(server.chat_requests)
    server.push(fk.tool_calls())
    await call(server, "vllm", "x", tools=two, tool_choice=request_pb2.ToolChoice(mode="required"))
    assert server.last_body["tool_choice"] == "required" and len(server.chat_requests) == n + 1


async def test_forced_tool_choice_answered_with_text_fails(server):
    from tether.backends.base import BackendError

    server.push(fk.text("I will not call it."))
    with pytest.raises(BackendError) as ei:
        await call(server, "llama-cpp-python", "x", tools=[function_tool("f")],
                   tool_choice=request_pb2.ToolChoice(mode="required"))  # fmt: skip
    assert "without the tool call" in ei.value.message


async def test_auto_tool_choice_not_streamed_where_the_server_cannot(server):
    tools = [function_tool("f")]
    await call(server, "llama-cpp-python", "x", tools=tools)
    assert server.last_body["stream"] is False  # the JSON reply path
    server.push(fk.tool_calls(fk.Call("f")))
    await call(server, "llama-cpp-python", "x", tools=tools, tool_choice=request_pb2.ToolChoice(function_name="f"))
    assert server.last_body["stream"] is True
    await call(server, "vllm", "x", tools=tools)
    assert server.last_body["stream"] is True


async def test_reasoning_effort_per_dialect(server):
    await call(server, "vllm", "x", options={"reasoning": True}, reasoning_effort="minimal")
    assert server.last_body["reasoning_effort"] == "low"
    for dialect, options in [("llama-cpp-python", {"reasoning": True}), ("vllm", {})]:
        with pytest.raises(TetherError) as ei:
            await call(server, dialect, "x", options=options, reasoning_effort="high")
        assert ei.value.status == 400 and ei.value.param == "reasoning.effort"


async def test_rejected_fields_dropped_when_advisory_refused_when_needed(server):
    await call(server, "llama-cpp-python", "x", prompt_cache_key="k", user="u", service_tier="default")
    body = server.last_body
    assert "prompt_cache_key" not in body and body["user"] == "u" and "service_tier" not in body
    with pytest.raises(TetherError) as ei:
        await call(server, "vllm", "x", service_tier="priority")
    assert ei.value.status == 400 and ei.value.param == "service_tier"


async def test_stream_upstream_false_gets_the_servers_usage(server):
    chunks = await call(server, "llama-cpp-python", "one two", options={"stream_upstream": False})
    assert server.last_body["stream"] is False and "stream_options" not in server.last_body
    finish = chunks[-1]
    assert finish.usage.input_tokens == 2 and finish.usage.output_tokens == 5  # the fake's own counts


def test_unknown_dialect_is_a_config_error():
    with pytest.raises(ValueError, match="unknown dialect 'vllm2'"):
        build_backend("x", "openai", {"base_url": "http://127.0.0.1:9/v1", "dialect": "vllm2"})


async def test_assistant_history_roles(server):
    await call(server, "openai", "hi", assistant("a"), "again")
    assert server.last_body["messages"][1] == {"role": "assistant", "content": "a"}


async def test_output_a_stream_did_not_count_is_counted_by_the_models_tokenizer(server):
    server.push(fk.completion(content="one two three four", usage_mode="none"))
    finish = (await call(server, "llama-cpp-python", "hi"))[-1]
    assert finish.usage.output_tokens == 4 and finish.usage.model_counted == {"output"}
    assert server.requests[-1].path == "/extras/tokenize/count"
    assert server.requests[-1].body == {"input": "one two three four"}
    server.push(fk.completion(content="one two", usage_mode="none"))
    finish = (await call(server, "vllm", "hi"))[-1]  # no tokenizer endpoint declared: Tether counts later
    assert finish.usage is None


async def test_verbosity_is_sent_where_the_dialect_takes_it_and_refused_elsewhere(server):
    await call(server, "openai", "x", verbosity="low")
    assert server.last_body["verbosity"] == "low"
    await call(server, "openai", "x")
    assert "verbosity" not in server.last_body
    for dialect in sorted(set(DIALECTS) - {"openai"}):
        with pytest.raises(TetherError) as ei:
            await call(server, dialect, "x", verbosity="high")
        assert (ei.value.status, ei.value.param) == (400, "text.verbosity"), dialect


async def test_tool_options_of_the_backend_are_honoured(server):
    tools = [function_tool("f")]
    await call(server, "openai", "x", tools=tools, options={"parallel_tool_calls": False})
    assert server.last_body["parallel_tool_calls"] is False
    await call(server, "openai", "x", tools=tools)
    assert "parallel_tool_calls" not in server.last_body
    with pytest.raises(TetherError) as ei:
        await call(server, "openai", "x", tools=tools, options={"tools": False})
    assert (ei.value.status, ei.value.param) == (400, "tools")
    await call(server, "openai", "x", options={"tools": False})  # no tools: nothing to refuse


async def test_logprobs_are_asked_for_and_carried_on_text_deltas(server):
    chunks = await call(server, "openai", "x", logprobs=2)
    assert (server.last_body["logprobs"], server.last_body["top_logprobs"]) == (True, 2)
    texts = [c for c in chunks if isinstance(c, TextDelta)]
    assert texts and all(len(c.logprobs) == 1 and c.logprobs[0]["token"] == c.text for c in texts)
    first = texts[0].logprobs[0]
    assert first["bytes"] == list(texts[0].text.encode()) and first["logprob"] == -0.25
    assert [(t["token"], t["logprob"]) for t in first["top_logprobs"]] == [(texts[0].text, -0.25), ("alt1", -1.25)]
    chunks = await call(server, "vllm", "x", logprobs=0, options={"stream_upstream": False})  # the JSON reply
    assert server.last_body["logprobs"] is True and "top_logprobs" not in server.last_body
    (text,) = [c for c in chunks if isinstance(c, TextDelta)]
    assert "".join(lp["token"] for lp in text.logprobs) == text.text
    assert all(lp["top_logprobs"] == [] for lp in text.logprobs)
    chunks = await call(server, "openai", "x")
    assert "logprobs" not in server.last_body
    assert all(c.logprobs is None for c in chunks if isinstance(c, TextDelta))
    for dialect in sorted(set(DIALECTS) - {"ollama", "lmstudio"}):  # every dialect that takes them
        chunks = await call(server, dialect, "x", logprobs=1)
        assert (server.last_body["logprobs"], server.last_body["top_logprobs"]) == (True, 1), dialect
        assert all(c.logprobs for c in chunks if isinstance(c, TextDelta)), dialect


async def test_logprobs_are_refused_where_the_dialect_has_none(server):
    for dialect in ("ollama", "lmstudio"):
        with pytest.raises(TetherError) as ei:
            await call(server, dialect, "x", logprobs=0)
        assert (ei.value.status, ei.value.param) == (400, "include"), dialect
        with pytest.raises(TetherError) as ei:
            await call(server, dialect, "x", logprobs=3)
        assert ei.value.status == 400 and ei.value.param in ("include", "top_logprobs"), dialect


def _choice(obj):
    return request_pb2.ToolChoice(other_json=orjson.dumps(obj).decode())


HOSTED_CHOICES = ["mcp", "web_search_preview", "file_search", "code_interpreter", "image_generation",
                  "computer_use_preview", "local_shell"]  # fmt: skip


async def test_tool_choice_object_types_mapped_or_refused_per_dialect(server):
    tools = [function_tool("f"), function_tool("g")]
    server.push(fk.tool_calls(fk.Call("g")))
    await call(server, "openai", "x", tools=tools, tool_choice=_choice({"type": "function", "name": "g"}))
    assert server.last_body["tool_choice"] == {"type": "function", "function": {"name": "g"}}
    for dialect in sorted(DIALECTS):
        assert DIALECTS[dialect].tool_choice_types == {"function", "custom", "allowed_tools"}
        for kind in HOSTED_CHOICES:
            for offered in (tools, []):  # refused whether or not tools are offered
                with pytest.raises(TetherError) as ei:
                    await call(server, dialect, "x", tools=offered, tool_choice=_choice({"type": kind, "name": "f"}))
                assert (ei.value.status, ei.value.param) == (400, "tool_choice"), (dialect, kind)
                assert repr(kind) in ei.value.message
    with pytest.raises(TetherError) as ei:  # a function that is not offered
        await call(server, "openai", "x", tools=tools, tool_choice=_choice({"type": "function", "name": "h"}))
    assert (ei.value.status, ei.value.param) == (400, "tool_choice") and "'h'" in ei.value.message


async def test_hosted_tool_choice_forwarded_with_hosted_tools(server):
    tools = [function_tool("f"), other_tool({"type": "web_search_preview"})]
    server.push(fk.tool_calls(fk.Call("f")))
    await call(server, "openai", "x", tools=tools, tool_choice=_choice({"type": "web_search_preview"}),
               options={"hosted_tools": True})  # fmt: skip
    assert server.last_body["tool_choice"] == {"type": "web_search_preview"}
    assert {"type": "web_search_preview"} in server.last_body["tools"]
    with pytest.raises(TetherError) as ei:  # a custom tool that is not offered, hosted_tools or not
        await call(server, "openai", "x", tools=tools, tool_choice=_choice({"type": "custom", "name": "p"}),
                   options={"hosted_tools": True})  # fmt: skip
    assert ei.value.param == "tool_choice"


async def test_vllm_gets_a_cache_salt_per_tenant_and_other_dialects_none(server):
    """vLLM shares prefix-cache blocks only between requests with the same `cache_salt`: each
    tenant gets its own, so one tenant cannot time another's cached prompt."""
    salts = []
    for tenant in ("a", "b", "a", ""):
        await call(server, "vllm", "the same prompt", tenant=tenant, prompt_cache_key="k")
        salts.append(server.last_body.get("cache_salt"))
        if tenant:
            assert server.last_body["prompt_cache_key"] not in ("k", None)
        else:
            assert server.last_body["prompt_cache_key"] == "k"  # an open server is one tenant
    assert salts[0] == salts[2] and salts[0] != salts[1] and all(salts[:3]) and salts[3] is None
    for dialect in ("openai", "sglang"):
        await call(server, dialect, "the same prompt", tenant="a")
        assert "cache_salt" not in server.last_body
