"""The Responses -> Chat Completions mapping (asserted on what the fake upstream recorded), the SSE
decoder, the chunk parser, error mapping and the retry-delay rules."""

from __future__ import annotations

import time

import orjson
import pytest

from tests.fakes import Reply
from tests.fakes.items import (
    assistant,
    compaction,
    function_call,
    function_output,
    function_tool,
    message,
    other_tool,
    reasoning,
    request,
    user,
    user_parts,
)
from tether.backends.base import BackendError, Finish, ReasoningDelta, TextDelta, ToolCallDelta
from tether.backends.chat.dialects import DIALECTS
from tether.backends.chat.mapping import MappingOptions, to_chat_request
from tether.backends.chat.sse import SSEDecoder
from tether.backends.chat.stream import StreamParser
from tether.backends.chat.upstream_errors import (
    error_from_status,
    parse_error_body,
    retry_after_seconds,
    retry_delay,
    should_retry,
)
from tether.backends.chat_completions import ChatCompletionsBackend
from tether.backends.registry import build_backend
from tether.errors import TetherError
from tether.responses.v1 import items_pb2, request_pb2

NEVER_SENT = {
    "store",
    "metadata",
    "previous_response_id",
    "include",
    "truncation",
    "background",
    "hints",
    "input",
}


def rich_request(**kw):
    items = [
        message("developer", "Prefer short answers."),
        user_parts("What's the weather", "in Paris and the time?"),
        reasoning("I should call both tools."),
        assistant("Let me check."),
        function_call("call_w", "get_weather", {"city": "Paris"}),
        function_call("call_t", "get_time", {"tz": "Europe/Paris"}),
        function_output("call_w", "18C, cloudy"),
        function_output("call_t", "14:05"),
        assistant("It is 18C and 14:05."),
        items_pb2.Item(item_reference=items_pb2.ItemReference(id="msg_x")),
        user("thanks"),
    ]
    tools = [
        function_tool(
            "get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}, "Weather"
        ),
        function_tool("get_time"),
        other_tool({"type": "web_search"}),
    ]
    params = dict(
        instructions="You are terse.",
        tools=tools,
        tool_choice=request_pb2.ToolChoice(mode="auto"),
        max_output_tokens=256,
        temperature=0.5,
        top_p=0.9,
        reasoning_effort="minimal",
        user="u-1",
        prompt_cache_key="pck",
        hints={"script": "never-sent"},
        input_tokens=42,
    )
    params.update(kw)
    return request(*items, **params)


async def test_mapping_on_the_wire(fake_chat_server):
    b = build_backend("c", "cerebras", {"base_url": fake_chat_server.base_url, "api_key": "test-key"})
    try:
        chunks = [c async for c in b.stream(rich_request())]
    finally:
        await b.aclose()
    assert isinstance(chunks[-1], Finish)  # the strict fake accepted every field
    body = fake_chat_server.last_body
    assert not NEVER_SENT & set(body)
    assert body["model"] == "gpt-oss-120b" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] == 256 and "max_tokens" not in body
    assert body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert body["reasoning_effort"] == "low"  # minimal -> low
    assert body["user"] == "u-1" and body["prompt_cache_key"] == "pck"
    assert body["tool_choice"] == "auto" and "parallel_tool_calls" not in body
    # Tools nested under "function"; the hosted web_search tool dropped.
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        {
            "type": "function",
            "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
        },
    ]
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
    ]
    assert msgs[0] == {"role": "system", "content": "You are terse."}  # instructions first
    assert msgs[1]["content"] == "Prefer short answers."  # developer -> system
    assert msgs[2]["content"] == "What's the weather\nin Paris and the time?"
    # Assistant text + both calls merged into one message, carrying the earlier reasoning.
    merged = msgs[3]
    assert merged["content"] == "Let me check."
    assert merged["reasoning"] == "I should call both tools."
    assert [tc["id"] for tc in merged["tool_calls"]] == ["call_w", "call_t"]
    assert merged["tool_calls"][0] == {
        "id": "call_w",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    assert msgs[4] == {"role": "tool", "tool_call_id": "call_w", "content": "18C, cloudy"}
    assert msgs[5] == {"role": "tool", "tool_call_id": "call_t", "content": "14:05"}
    assert msgs[6] == {"role": "assistant", "content": "It is 18C and 14:05."}
    assert fake_chat_server.chat_requests[-1].headers["authorization"] == "Bearer test-key"


def generic(**kw) -> MappingOptions:
    return MappingOptions(dialect=DIALECTS["openai"], **kw)


def test_calls_without_text_and_reasoning_dropped_when_configured():
    opts = generic()
    body = to_chat_request(
        request(
            user("hi"),
            reasoning("think"),
            function_call("c1", "f"),
            function_call("c2", "g"),
            function_output("c1", "1"),
            function_output("c2", "2"),
        ),
        opts,
    )
    a = body["messages"][1]
    assert a == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ],
    }
    assert [m.get("tool_call_id") for m in body["messages"][2:]] == ["c1", "c2"]


def test_separate_call_rounds_are_separate_messages():
    body = to_chat_request(
        request(
            user("hi"),
            function_call("c1", "f"),
            function_output("c1", "1"),
            function_call("c2", "g"),
            function_output("c2", "2"),
        ),
        generic(),
    )
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "assistant", "tool"]


def test_compaction_item_becomes_system_summary():
    body = to_chat_request(request(compaction("We fixed the parser ✓."), user("next")), generic())
    assert body["messages"][0]["role"] == "system"
    assert body["messages"][0]["content"].endswith("We fixed the parser ✓.")
    # A blob that is not Tether's (e.g. another provider's) carries no summary: dropped.
    foreign = items_pb2.Item(compaction=items_pb2.CompactionItem(encrypted_content="gAAAAB-opaque"))
    assert to_chat_request(request(foreign, user("next")), generic())["messages"] == [
        {"role": "user", "content": "next"}
    ]


def test_images_need_the_capability():
    req = request(user_parts("look", image_url="https://x/img.png"))
    with pytest.raises(TetherError) as ei:
        to_chat_request(req, generic(images=False))
    assert ei.value.status == 400
    body = to_chat_request(req, generic(images=True))
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://x/img.png"}},
    ]


def test_tool_choice_text_format_and_parallel():
    tools = [function_tool("a"), function_tool("b")]
    fmt = request_pb2.TextFormat(type="json_schema", name="out", schema_json='{"type":"object"}', strict=True)
    body = to_chat_request(
        request(
            "x",
            tools=tools,
            tool_choice=request_pb2.ToolChoice(function_name="b"),
            parallel_tool_calls=False,
            text_format=fmt,
        ),
        generic(),
    )
    assert body["tool_choice"] == {"type": "function", "function": {"name": "b"}}
    assert body["parallel_tool_calls"] is False
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
    }
    allowed = request_pb2.ToolChoice(
        other_json=orjson.dumps(
            {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "a"}]}
        ).decode()
    )
    body = to_chat_request(request("x", tools=tools, tool_choice=allowed), generic())
    assert body["tool_choice"] == {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "a"}}]},
    }
    assert [t["function"]["name"] for t in body["tools"]] == ["a", "b"]  # the list stays whole
    # A dialect without the allowed_tools form gets the list narrowed instead.
    body = to_chat_request(request("x", tools=tools, tool_choice=allowed), MappingOptions(dialect=DIALECTS["vllm"]))
    assert body["tool_choice"] == "required" and [t["function"]["name"] for t in body["tools"]] == ["a"]
    # No tools -> no tool_choice; a reasoning effort without the capability is refused, not dropped.
    body = to_chat_request(request("x", tool_choice=request_pb2.ToolChoice(mode="required")), generic())
    assert "tool_choice" not in body and "tools" not in body and "reasoning_effort" not in body
    with pytest.raises(TetherError) as ei:
        to_chat_request(request("x", reasoning_effort="high"), generic())
    assert ei.value.status == 400 and ei.value.param == "reasoning.effort"
    body = to_chat_request(request("x", reasoning_effort="none"), generic(reasoning=True))
    assert body["reasoning_effort"] == "none"
    body = to_chat_request(
        request("x", text_format=request_pb2.TextFormat(type="json_object")), generic()
    )
    assert body["response_format"] == {"type": "json_object"}


def test_hosted_tools_forwarded_only_with_capability():
    tools = [other_tool({"type": "web_search"})]
    assert "tools" not in to_chat_request(request("x", tools=tools), generic())
    assert to_chat_request(request("x", tools=tools), generic(hosted_tools=True))["tools"] == [
        {"type": "web_search"}
    ]


# --- SSE + chunk parsing ---------------------------------------------------------------------------


def _sse(*objs) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


def test_sse_decoder_any_split():
    stream = b": keep-alive\r\n\r\n" + _sse({"a": 1}, {"b": "x\ny"}) + b'event: error\ndata: {"error":{}}\n\n'
    expected = SSEDecoder().feed(stream)
    assert expected == [
        (None, b'{"a":1}'),
        (None, b'{"b":"x\\ny"}'),
        (None, b"[DONE]"),
        ("error", b'{"error":{}}'),
    ]
    for size in (1, 2, 3, 7, 13):
        dec = SSEDecoder()
        got = []
        for i in range(0, len(stream), size):
            got += dec.feed(stream[i : i + size])
        got += dec.flush()
        assert got == expected, size
    # A last frame without its blank line still counts at EOF.
    dec = SSEDecoder()
    assert dec.feed(b"data: [DONE]") == [] and dec.flush() == [(None, b"[DONE]")]


def test_sse_decoder_reads_of_one_whole_event_decode_as_lines_do():
    """A read that is one whole `data:` event (the common one, decoded without the line loop)
    gives what the same bytes give a byte at a time, whatever came before it."""
    reads = [b'data: {"a":1}\n\n', b"data: \n\n", b"data:  two spaces\n\n", b"data: cr\r\n\n",
             b"event: error\n", b'data: {"error":{}}\n\n', b"data: pa", b"rt\n\n", b": ping\n\n",
             b"data: a\ndata: b\n\n", b"data: x\n", b"data: y\n\n", b"data: [DONE]\n\n"]
    whole, bytewise = SSEDecoder(), SSEDecoder()
    for read in reads:
        expected = [event for i in range(len(read)) for event in bytewise.feed(read[i : i + 1])]
        assert whole.feed(read) == expected, read
    limit = 100
    at_edge = b"data: " + b"z" * (limit - 6) + b"\n\n"  # a line of exactly `limit` bytes
    assert SSEDecoder(max_event_bytes=limit).feed(at_edge) == [(None, at_edge[6:-2])]
    with pytest.raises(BackendError):
        SSEDecoder(max_event_bytes=limit).feed(b"data: " + b"z" * (limit - 5) + b"\n\n")


def test_sse_decoder_is_linear_in_a_long_line():
    """A 16 MiB line fed in 4 KiB reads: the old decoder joined the whole pending line to every
    read (tens of GB copied, many seconds); this one keeps the pieces and joins them once."""
    line = b"data: " + b"x" * (16 * 1024 * 1024) + b"\n\n"
    dec = SSEDecoder(max_event_bytes=32 * 1024 * 1024)
    got = []
    started = time.perf_counter()
    for i in range(0, len(line), 4096):
        got += dec.feed(line[i : i + 4096])
    elapsed = time.perf_counter() - started
    assert got == [(None, line[6:-2])]
    assert elapsed < 2.0, f"{elapsed:.2f} s for one 16 MiB line"


def test_sse_decoder_caps_a_line_and_an_event():
    limit = 1000
    # At the edge: a line of exactly `limit` bytes (data and its name) passes.
    dec = SSEDecoder(max_event_bytes=limit)
    edge = b"data: " + b"y" * (limit - 6)
    assert dec.feed(edge[:10]) == [] and dec.feed(edge[10:] + b"\n\n") == [(None, edge[6:])]
    # One byte past, arriving in pieces and never ending: refused as soon as it passes.
    dec = SSEDecoder(max_event_bytes=limit)
    dec.feed(b"data: " + b"y" * (limit - 6))
    with pytest.raises(BackendError) as info:
        dec.feed(b"y")
    assert info.value.code == "backend_error" and "max_event_bytes" in info.value.message
    # Many short data lines adding up past the limit in one event: refused too.
    dec = SSEDecoder(max_event_bytes=limit)
    with pytest.raises(BackendError):
        dec.feed(b"data: 0123456789\n" * 100)


async def test_an_upstream_line_over_the_cap_fails_the_call(fake_chat_server):
    huge = "data: " + "z" * 300_000  # no line end: the upstream never finishes the line
    fake_chat_server.push(Reply(200, {"content-type": "text/event-stream"}, sse=[huge[:100_000], huge[100_000:]]))
    b = build_backend("c", "cerebras", {"base_url": fake_chat_server.base_url, "api_key": "test-key",
                                        "max_event_bytes": 200_000, "max_retries": 0})  # fmt: skip
    try:
        with pytest.raises(BackendError) as info:
            [c async for c in b.stream(rich_request())]
    finally:
        await b.aclose()
    assert info.value.code == "backend_error" and "200000" in info.value.message


def test_a_text_only_delta_reads_as_any_delta_does():
    """A token's usual chunk (a delta that is its text alone) skips the checks for reasoning,
    refusals and tool calls; its log probabilities and finish reason are still read, and a delta
    with anything beside its text goes the whole way."""
    p = StreamParser(reasoning_fields=("reasoning_content",))
    lp = {"content": [{"token": "Hi", "logprob": -0.5, "top_logprobs": []}]}
    frames = [
        {"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": lp, "finish_reason": None}]},
        {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
        {"choices": [{"index": 0, "delta": {"content": "!", "reasoning_content": "hm"}}]},
        {"choices": [{"index": 0, "delta": {"content": "", "refusal": "no"}}]},
        {"choices": [{"index": 0, "delta": {"content": "."}, "finish_reason": "length"}]},
    ]
    out = []
    for f in frames:
        out += p.feed(None, orjson.dumps(f))
    assert [type(c).__name__ for c in out] == ["TextDelta", "ReasoningDelta", "TextDelta", "RefusalDelta", "TextDelta"]
    assert [getattr(c, "text", None) for c in out] == ["Hi", "hm", "!", "no", "."]
    assert out[0].logprobs == [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}]
    assert out[2].logprobs is None
    assert p.finish().reason == "length"


def test_stream_parser_tool_fragments_and_usage_chunk():
    p = StreamParser()
    frames = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "id": "c0", "function": {"name": "f", "arguments": ""}}]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 1, "id": "c1", "function": {"name": "g", "arguments": "{"}}]
                    },
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 5,
                "completion_tokens": 9,
                "prompt_tokens_details": {"cached_tokens": 2},
            },
        },
    ]
    out = []
    for f in frames:
        out += p.feed(None, orjson.dumps(f))
    assert out == [
        ToolCallDelta(0, "", "c0", "f"),
        ToolCallDelta(1, "{", "c1", "g"),
        ToolCallDelta(0, "{}"),
        ToolCallDelta(1, "}"),
    ]
    p.feed(None, b"[DONE]")
    assert p.done
    fin = p.finish()
    assert fin.reason == "tool_calls" and fin.usage.input_tokens == 5 and fin.usage.cached_tokens == 2
    assert fin.usage.output_tokens == 9 and fin.timing is None


def test_stream_parser_errors():
    with pytest.raises(BackendError) as ei:
        StreamParser().feed(None, b'{"error":{"message":"boom","type":"server_error"},"status_code":500}')
    assert ei.value.code == "backend_error" and ei.value.status == 502 and not ei.value.retryable
    with pytest.raises(BackendError) as ei:
        StreamParser().feed("error", b'{"message":"slow down","code":"queue_exceeded","status_code":429}')
    assert ei.value.code == "rate_limit_exceeded" and ei.value.status == 429
    with pytest.raises(BackendError):
        StreamParser().feed(None, b"{not json")


def test_reasoning_fields_order():
    p = StreamParser(("reasoning_content", "reasoning"))
    assert p.feed(None, b'{"choices":[{"index":0,"delta":{"reasoning_content":"r","content":"c"}}]}') == [
        ReasoningDelta("r"),
        TextDelta("c"),
    ]


# --- errors and retries ----------------------------------------------------------------------------


def test_error_bodies_both_shapes():
    top = b'{"message":"store: property \'store\' is unsupported","type":"invalid_request_error","param":"validation_error","code":"wrong_api_format"}'
    nested = b'{"error":{"message":"bad","type":"invalid_request_error","code":null}}'
    assert parse_error_body(top) == (
        "store: property 'store' is unsupported",
        "invalid_request_error",
        "wrong_api_format",
    )
    assert parse_error_body(nested) == ("bad", "invalid_request_error", None)
    assert parse_error_body(b'{"error":"model not found"}')[0] == "model not found"
    assert parse_error_body(b"<html>bad gateway</html>")[0] == "<html>bad gateway</html>"


@pytest.mark.parametrize(
    ("status", "code", "mapped"),
    [
        (400, "invalid_request", 400),
        (422, "invalid_request", 400),
        (401, "backend_auth_failed", 502),
        (403, "backend_auth_failed", 502),
        (404, "model_not_found", 400),
        (429, "rate_limit_exceeded", 429),
        (500, "backend_error", 502),
        (402, "backend_payment_required", 502),
        (503, "backend_unavailable", 503),
    ],
)
def test_status_mapping(status, code, mapped):
    err = error_from_status(status, "m", retry_after=1.5)
    assert (err.code, err.status) == (code, mapped)
    if status in (429, 503):
        assert err.retry_after == 1.5 and err.retryable
    if status == 402:
        assert not err.retryable  # paying is the operator's move; a retry fails the same way


def test_context_length_400():
    assert (
        error_from_status(400, "This model's maximum context length is 8192 tokens").code
        == "context_length_exceeded"
    )


def test_retry_rules():
    def retries(status, headers=None, message="boom"):
        return should_retry(error_from_status(status, message), headers or {})

    assert retries(429) and retries(503) and retries(408) and retries(409) and retries(500)
    assert not retries(400) and not retries(401)
    assert retries(400, {"x-should-retry": "true"}) and not retries(503, {"x-should-retry": "false"})
    # A 500 whose body explains a property of the request fails the same way again: not retried.
    assert not retries(500, message="7 validation errors for ChatCompletionRequestAssistantMessage")
    assert not retries(500, message="Automatic streaming tool choice is not supported")
    assert retry_delay(0, {"retry-after-ms": "50"}) == 0.05
    assert retry_delay(0, {"retry-after": "2"}) == 2.0
    assert retry_after_seconds(
        {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=1445412470.0
    ) == pytest.approx(10.0)
    for n in range(6):
        d = retry_delay(n, {"retry-after": "120"})  # > 60 s: ignored, exponential instead
        base = min(0.5 * 2**n, 8.0)
        assert 0.75 * base <= d <= base


def test_sanitize_keeps_meaning_drops_insides():
    from tether.backends.chat.upstream_errors import MAX_MESSAGE_CHARS, sanitize

    raw = (
        'Traceback (most recent call last):\n  File "/usr/lib/python3/site-packages/x.py", line 3, in f\n'
        "ValueError: boom"
    )
    assert sanitize(raw) == "no error message"  # only a stack trace: nothing of meaning left
    assert sanitize("Automatic streaming tool choice is not supported") == (
        "Automatic streaming tool choice is not supported"
    )
    assert sanitize("could not open /opt/models/smol.gguf: denied") == "could not open <path>: denied"
    assert sanitize("bad\n\n  input   here") == "bad input here"
    assert len(sanitize("x" * 5000)) == MAX_MESSAGE_CHARS
    # FastAPI/pydantic `detail` lists keep their locations and messages.
    body = b'{"detail":[{"loc":["body","messages",1,"content"],"msg":"Input should be a valid string"}]}'
    assert parse_error_body(body)[0] == "messages.1.content: Input should be a valid string"


def test_rate_limit_wait_from_headers():
    from tether.backends.chat.upstream_errors import rate_limit_wait

    assert rate_limit_wait({"retry-after-ms": "1500", "x-ratelimit-reset-tokens-minute": "30"}) == 1.5
    exhausted_day = {
        "x-ratelimit-remaining-tokens-minute": "500", "x-ratelimit-reset-tokens-minute": "20.5",
        "x-ratelimit-remaining-requests-day": "0", "x-ratelimit-reset-requests-day": "3600",
    }  # fmt: skip
    assert rate_limit_wait(exhausted_day) == 3600.0
    assert rate_limit_wait({"x-ratelimit-reset-tokens-minute": "20.5", "x-ratelimit-reset-requests-day": "9"}) == 9.0
    assert rate_limit_wait({}) is None


def test_schema_type_list_with_object_keeps_its_keywords_on_its_branch():
    from tether.backends.chat.schema import reduce_schema

    schema = {"type": ["object", "null"], "properties": {"a": {"type": "string"}}, "required": ["a"]}
    assert reduce_schema(schema, "cerebras", "p", "t") == {
        "anyOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"type": "null"},
        ]
    }


def test_custom_tool_and_shell_items_are_carried_as_calls_and_outputs():
    """Codex's freeform `apply_patch` (a custom tool) and shell calls reach the model's history
    (the custom call as its emulating function where the dialect has no custom tools)."""
    from tether.protocol.json_codec import item_from_json

    items = [
        user("fix it"),
        item_from_json({"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"}),
        item_from_json({"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"}),
        item_from_json({"type": "local_shell_call", "id": "ls1", "call_id": "c2", "status": "completed",
                        "action": {"type": "exec", "command": ["ls"], "env": {}}}),
        item_from_json({"type": "local_shell_call_output", "id": "c2", "output": "a.py"}),
    ]  # fmt: skip
    # A dialect that emulates custom tools (vLLM); OpenAI's native form: tests/backends/test_custom_tools.py.
    msgs = to_chat_request(request(*items), MappingOptions(dialect=DIALECTS["vllm"]))["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "tool"]
    patch = msgs[1]["tool_calls"][0]
    assert (patch["id"], patch["function"]["name"]) == ("c1", "apply_patch")
    assert orjson.loads(patch["function"]["arguments"]) == {"input": "*** Begin Patch"}
    assert msgs[2] == {"role": "tool", "tool_call_id": "c1", "content": "Done!"}
    shell = msgs[3]["tool_calls"][0]
    assert (shell["id"], shell["function"]["name"]) == ("c2", "local_shell")
    assert orjson.loads(shell["function"]["arguments"])["command"] == ["ls"]
    assert msgs[4] == {"role": "tool", "tool_call_id": "c2", "content": "a.py"}


def test_hosted_tool_items_are_carried_as_calls_with_their_results():
    """Hosted-tool items in the context (input or chain) reach the model as a tool call and its
    result, never dropped: what was searched or run, and what came back."""
    from tether.protocol.json_codec import item_from_json

    items = [
        user("look it up"),
        item_from_json({"type": "web_search_call", "id": "ws_1", "status": "completed",
                        "action": {"type": "search", "query": "tether grpc"}}),
        item_from_json({"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "gh",
                        "tools": [{"name": "search", "input_schema": {"type": "object"}}]}),
        item_from_json({"type": "mcp_call", "id": "mcp_1", "server_label": "gh", "name": "search",
                        "arguments": '{"q": "x"}', "output": "3 results"}),
        item_from_json({"type": "file_search_call", "id": "fs_1", "status": "completed", "queries": ["q1"],
                        "results": [{"file_id": "f1", "text": "hit"}]}),
        item_from_json({"type": "code_interpreter_call", "id": "ci_1", "status": "completed", "code": "print(1)",
                        "container_id": "cnt", "outputs": [{"type": "logs", "logs": "1"}]}),
        item_from_json({"type": "mcp_approval_request", "id": "apr_1", "server_label": "gh", "name": "push",
                        "arguments": "{}"}),
        item_from_json({"type": "mcp_approval_response", "approval_request_id": "apr_1", "approve": False,
                        "reason": "not now"}),
    ]  # fmt: skip
    msgs = to_chat_request(request(*items), generic())["messages"]
    assert [m["role"] for m in msgs] == ["user"] + ["assistant", "tool"] * 6
    calls = [(m["tool_calls"][0]["id"], m["tool_calls"][0]["function"]["name"],
              orjson.loads(m["tool_calls"][0]["function"]["arguments"])) for m in msgs[1::2]]  # fmt: skip
    assert calls == [
        ("ws_1", "web_search", {"action": {"type": "search", "query": "tether grpc"}}),
        ("mcpl_1", "mcp_list_tools", {"server_label": "gh"}),
        ("mcp_1", "search", {"q": "x"}),  # the call as the model made it (Tether ran it)
        ("fs_1", "file_search", {"queries": ["q1"]}),
        ("ci_1", "code_interpreter", {"code": "print(1)", "container_id": "cnt"}),
        ("apr_1", "mcp_approval_request", {"server_label": "gh", "tool": "push", "arguments": "{}"}),
    ]
    results = [(m["tool_call_id"], m["content"]) for m in msgs[2::2]]
    assert [r[0] for r in results] == [c[0] for c in calls]  # each result answers its own call
    assert orjson.loads(results[0][1]) == {"status": "completed"}
    assert orjson.loads(results[1][1])["tools"][0]["name"] == "search"
    assert results[2][1] == "3 results"
    assert orjson.loads(results[3][1]) == {"results": [{"file_id": "f1", "text": "hit"}], "status": "completed"}
    assert orjson.loads(results[4][1]) == {"outputs": [{"type": "logs", "logs": "1"}], "status": "completed"}
    assert results[5][1] == "denied: not now"


@pytest.mark.parametrize(
    "obj",
    [
        {"type": "computer_call_output", "call_id": "c1", "output": {"type": "computer_screenshot", "image_url": "x"}},
        {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": "aGk="},
        {"type": "x_future_item", "id": "x1"},
    ],
)
def test_items_that_cannot_be_represented_are_refused_naming_them(obj):
    from tether.protocol.json_codec import item_from_json

    with pytest.raises(TetherError) as ei:
        to_chat_request(request(user("hi"), item_from_json(obj)), generic())
    assert (ei.value.status, ei.value.param) == (400, "input[1]") and obj["type"] in ei.value.message


def test_one_read_of_many_sse_events_is_one_run_and_an_error_in_it_follows_the_chunks_before_it():
    def frame(delta: dict) -> bytes:
        return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"

    read = frame({"role": "assistant"}) + b"".join(frame({"content": t}) for t in ("a", "b", "c")) + b"data: [DONE]\n\n"
    parser, generated = StreamParser(), []
    run, failure = ChatCompletionsBackend._parse(SSEDecoder().feed(read), parser, generated)
    assert run == [TextDelta("a"), TextDelta("b"), TextDelta("c")] and failure is None
    assert parser.done and generated == ["a", "b", "c"]
    broken = frame({"content": "x"}) + b'data: {"error":{"message":"boom"},"status_code":500}\n\n' + frame({"content": "y"})
    run, failure = ChatCompletionsBackend._parse(SSEDecoder().feed(broken), StreamParser(), [])
    assert run == [TextDelta("x")]
    assert isinstance(failure, BackendError) and failure.status == 502
