"""The Cerebras adapter against the fake upstream (real HTTP on loopback): every wire scenario maps
to the right chunks or BackendError; retries follow the SDK rules; cancellation hangs up."""

from __future__ import annotations

import json
import socket

import pytest

from tests.fakes import chat_server as fk
from tests.fakes.cerebras_v2 import ROSTER, FakeCerebrasV2
from tests.fakes.items import request
from tether.backends.base import BackendError, Finish, ReasoningDelta, TextDelta, ToolCallDelta
from tether.backends.cerebras import CerebrasBackend
from tether.backends.registry import build_backend

FAST_RETRY = {"retry_initial_delay_s": 0.01, "retry_max_delay_s": 0.02}


@pytest.fixture
def fake_chat_server():
    """Cerebras as it answers today: API version 2, the current roster (tests/fakes/cerebras_v2)."""
    with FakeCerebrasV2(api_key="test-key", lifetime_s=60) as server:
        yield server


@pytest.fixture
async def make(fake_chat_server):
    made: list[CerebrasBackend] = []

    def factory(**options) -> CerebrasBackend:
        opts = {"base_url": fake_chat_server.base_url, "api_key": "test-key", **FAST_RETRY, **options}
        b = build_backend("cerebras-test", "cerebras", opts)
        made.append(b)
        return b

    yield factory
    for b in made:
        await b.aclose()


async def run(backend, *items, **kw):
    return [c async for c in backend.stream(request(*items, **kw))]


async def fails(backend, *items, **kw) -> tuple[BackendError, list]:
    got = []
    with pytest.raises(BackendError) as ei:
        async for c in backend.stream(request(*items, **kw)):
            got.append(c)
    return ei.value, got


def text_of(chunks, kind=TextDelta) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))


async def test_text_and_reasoning_with_usage_and_time_info(make, fake_chat_server):
    chunks = await run(make(), "scenario: reasoning", input_tokens=99)
    kinds = [type(c).__name__ for c in chunks]
    assert kinds.index("TextDelta") > kinds.index("ReasoningDelta")
    assert text_of(chunks, ReasoningDelta) == "Let me think about it step by step."
    assert text_of(chunks) == "The answer is 42."
    fin = chunks[-1]
    assert isinstance(fin, Finish) and fin.reason == "stop"
    assert fin.usage.input_tokens == 2  # the upstream's prompt_tokens (the fake counts words)
    assert fin.usage.reasoning_tokens == 8 and fin.usage.output_tokens == 8 + 4
    assert fin.timing.total_time == pytest.approx(0.0125) and fin.timing.queue_time == pytest.approx(0.0001)
    req = fake_chat_server.chat_requests[-1]
    assert req.headers["authorization"] == "Bearer test-key" and req.headers["accept"] == "text/event-stream"


@pytest.mark.parametrize("scenario", ["tools", "tools_interleaved"])
async def test_parallel_tool_calls_in_fragments(make, scenario):
    chunks = await run(make(), f"scenario: {scenario}")
    deltas = [c for c in chunks if isinstance(c, ToolCallDelta)]
    firsts = [d for d in deltas if d.call_id is not None]
    assert [(d.index, d.call_id, d.name) for d in firsts] == [
        (0, "call_weather_1", "get_weather"),
        (1, "call_time_2", "get_time"),
    ]
    args = {i: "".join(d.arguments for d in deltas if d.index == i) for i in (0, 1)}
    assert json.loads(args[0]) == {"city": "Paris", "unit": "celsius"}
    assert json.loads(args[1]) == {"timezone": "Europe/Paris"}
    assert (
        sum(1 for d in deltas if d.index == 0 and d.arguments) == 3
    )  # three fragments arrive as three deltas
    assert chunks[-1].reason == "tool_calls"


async def test_connection_is_reused_after_a_complete_stream(make, fake_chat_server):
    b = make()
    await run(b, "one")
    await run(b, "scenario: tools")
    peers = [r.peer for r in fake_chat_server.chat_requests]
    assert peers[0] == peers[1]  # the body was read to its end, so the connection went back to the pool


@pytest.mark.parametrize(("scenario", "reason"), [("length", "length"), ("content_filter", "content_filter")])
async def test_finish_reasons(make, scenario, reason):
    chunks = await run(make(), f"scenario: {scenario}")
    assert chunks[-1].reason == reason and text_of(chunks)


async def test_usage_in_a_separate_chunk(make):
    chunks = await run(make(), "scenario: usage_separate")
    fin = chunks[-1]
    assert (
        fin.reason == "stop"
        and fin.usage is not None
        and fin.usage.output_tokens > 0
        and fin.timing is not None
    )


@pytest.mark.parametrize("scenario", ["split", "keepalive"])
async def test_split_frames_and_keepalive_comments(make, scenario):
    chunks = await run(make(), f"scenario: {scenario}")
    expected = {"split": "Split frames arrive in pieces.", "keepalive": "Kept alive."}[scenario]
    assert text_of(chunks) == expected and chunks[-1].reason == "stop"


@pytest.mark.parametrize("scenario", ["mid_stream_error", "event_error"])
async def test_mid_stream_error(make, fake_chat_server, scenario):
    b = make()
    err, got = await fails(b, f"scenario: {scenario}")
    assert err.code == "backend_error" and err.status == 502 and "Internal server error" in err.message
    assert text_of(got) == "Partial answer"  # the deltas before the error were delivered
    assert b.retries == 0 and len(fake_chat_server.chat_requests) == 1  # never retried mid-stream


async def test_400_wrong_api_format_not_retried(make, fake_chat_server):
    b = make()
    err, got = await fails(b, "scenario: bad_request")
    assert err.status == 400 and err.code == "invalid_request" and "store" in err.message
    assert got == [] and b.retries == 0 and len(fake_chat_server.chat_requests) == 1


async def test_wrong_key_is_backend_auth_failed(make):
    err, _ = await fails(make(api_key="wrong"), "hi")
    assert err.code == "backend_auth_failed" and err.status == 502


async def test_unknown_model_is_model_not_found(make, fake_chat_server):
    fake_chat_server.check_model = True
    err, _ = await fails(make(), "hi", model="no-such-model")
    assert err.code == "model_not_found" and err.status == 400


async def test_429_once_is_retried_and_counted(make, fake_chat_server):
    b = make()
    seen = []
    b.on_retry = lambda n, delay, reason: seen.append((n, delay, reason))
    fake_chat_server.push(fk.rate_limited(retry_after_ms=20), fk.text("after the retry"))
    chunks = await run(b, "hi")
    assert text_of(chunks) == "after the retry"
    assert b.retries == 1 and seen == [(1, 0.02, "HTTP 429")]
    assert len(fake_chat_server.chat_requests) == 2
    assert fake_chat_server.chat_requests[0].body == fake_chat_server.chat_requests[1].body
    assert b.ratelimit["x-ratelimit-remaining-requests-day"] == "14399"  # the last response's headers


async def test_429_exhausted_carries_retry_after_and_headers(make, fake_chat_server):
    b = make(max_retries=1)
    fake_chat_server.push(fk.rate_limited(retry_after_ms=10), fk.rate_limited(retry_after_ms=10))
    err, _ = await fails(b, "hi")
    assert err.code == "rate_limit_exceeded" and err.status == 429 and err.retry_after == pytest.approx(0.01)
    assert b.retries == 1 and len(fake_chat_server.chat_requests) == 2
    assert b.ratelimit["x-ratelimit-remaining-tokens-minute"] == "0"
    assert b.ratelimit["x-ratelimit-reset-tokens-minute"] == "12.25"


async def test_503_then_success(make, fake_chat_server):
    b = make()
    chunks = await run(b, "scenario: unavailable_once")
    assert chunks[-1].reason == "stop" and b.retries == 1


async def test_5xx_exhausts_max_retries(make, fake_chat_server):
    b = make(max_retries=2)
    err, _ = await fails(b, "scenario: unavailable")
    assert err.code == "backend_unavailable" and err.status == 503 and err.retryable
    assert b.retries == 2 and len(fake_chat_server.chat_requests) == 3


async def test_x_should_retry_false_wins(make, fake_chat_server):
    b = make()
    fake_chat_server.push(fk.http_error(503, headers={"x-should-retry": "false"}))
    err, _ = await fails(b, "hi")
    assert err.status == 503 and b.retries == 0


async def test_eof_without_done(make):
    err, got = await fails(make(), "scenario: no_done")
    assert err.code == "backend_error" and "without [DONE]" in err.message
    assert text_of(got)


async def test_socket_dropped_mid_body(make):
    err, _ = await fails(make(), "scenario: abort")
    assert err.code == "backend_error"


async def test_stalled_stream_times_out(make, fake_chat_server):
    b = make(stream_idle_timeout_s=0.3)
    fake_chat_server.push(fk.stall(after_chunks=1, seconds=5))
    err, got = await fails(b, "hi")
    assert err.code == "backend_timeout" and err.status == 504
    assert text_of(got) == "tok0 " and b.retries == 0


async def test_aclose_mid_stream_hangs_up_upstream(make, fake_chat_server):
    b = make()
    fake_chat_server.push(fk.stall(after_chunks=2, seconds=10))
    gen = b.stream(request("hi"))
    first = await gen.__anext__()
    assert first == TextDelta("tok0 ")
    await gen.aclose()
    assert await fake_chat_server.disconnected(within=5)


async def test_connection_refused_is_retried_then_backend_error(make):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = make(base_url=f"http://127.0.0.1:{port}/v1", max_retries=1)
    err, _ = await fails(b, "hi")
    assert err.code == "backend_error" and err.retryable and b.retries == 1


async def test_json_reply_when_upstream_ignores_stream(make, fake_chat_server):
    render = fk.tool_calls(content="Calling.")
    fake_chat_server.push(
        lambda req: render(
            fk.RecordedRequest("POST", req.path, req.headers, b"", {**req.body, "stream": False})
        )
    )
    chunks = await run(make(), "hi")
    assert text_of(chunks) == "Calling."
    assert [(c.index, c.name) for c in chunks if isinstance(c, ToolCallDelta)] == [
        (0, "get_weather"),
        (1, "get_time"),
    ]
    assert chunks[-1].reason == "tool_calls" and chunks[-1].timing is not None


async def test_reasoning_effort_and_list_models(make, fake_chat_server):
    b = make()
    assert b.config.reasoning and b.config.json_schema and b.config.images
    await run(b, "hi", reasoning_effort="high")
    assert fake_chat_server.last_body["reasoning_effort"] == "high"
    assert await b.list_models() == [m.id for m in ROSTER]


def test_api_key_from_env(monkeypatch):
    monkeypatch.delenv("CEREBRAS_API_KEY", raising=False)
    with pytest.raises(ValueError, match="CEREBRAS_API_KEY"):
        build_backend("c", "cerebras", {})
    monkeypatch.setenv("CEREBRAS_API_KEY", "k-env")
    b = build_backend("c", "cerebras", {})
    assert b.api_key == "k-env" and b.base_url == "https://api.cerebras.ai/v1" and b.config.max_retries == 2


# --- the gaps read against Cerebras's documentation ---------------------------------------------------


@pytest.mark.parametrize(
    ("model", "effort", "sent"),
    [
        ("gpt-oss-120b", None, {"reasoning_format": "parsed"}),
        ("gpt-oss-120b", "minimal", {"reasoning_format": "parsed", "reasoning_effort": "low"}),
        ("gpt-oss-120b", "high", {"reasoning_format": "parsed", "reasoning_effort": "high"}),
        ("zai-glm-4.7", "none", {"reasoning_format": "parsed", "reasoning_effort": "none"}),
        ("zai-glm-4.7", "medium", {"reasoning_format": "parsed", "reasoning_effort": "medium"}),
        ("qwen-3-235b-a22b-thinking-2507", None, {"reasoning_format": "parsed"}),
        ("llama3.1-8b", None, {}),
        ("llama3.1-8b", "none", {}),
    ],
)  # fmt: skip
async def test_reasoning_controls_per_model_family(make, fake_chat_server, model, effort, sent):
    await run(make(), "hi", model=model, reasoning_effort=effort)
    body = fake_chat_server.last_body  # the strict fake accepted every field
    keys = ("reasoning_format", "reasoning_effort", "disable_reasoning")
    assert {k: body[k] for k in keys if k in body} == sent


@pytest.mark.parametrize(
    ("model", "effort", "why"),
    [
        ("gpt-oss-120b", "none", "cannot turn reasoning off"),
        ("llama3.1-8b", "high", "does not reason"),
        ("qwen-3-235b-a22b-thinking-2507", "low", "no reasoning effort control"),
    ],
)
async def test_reasoning_efforts_cerebras_cannot_honour_are_400(make, fake_chat_server, model, effort, why):
    from tether.errors import TetherError

    with pytest.raises(TetherError) as ei:
        await run(make(), "hi", model=model, reasoning_effort=effort)
    assert ei.value.status == 400 and ei.value.param == "reasoning.effort" and why in ei.value.message
    assert not fake_chat_server.chat_requests  # refused before any call


async def test_qwen_think_text_never_lands_in_output_text(make, fake_chat_server):
    # With reasoning_format "parsed" Cerebras sends Qwen's thinking in delta.reasoning.
    fake_chat_server.push(fk.text("42.", reasoning="Thinking it over."))
    chunks = await run(make(), "hi", model="qwen-3-235b-a22b-thinking-2507")
    assert fake_chat_server.last_body["reasoning_format"] == "parsed"
    assert text_of(chunks) == "42." and text_of(chunks, ReasoningDelta) == "Thinking it over."


async def test_service_tier_is_sent_and_scale_refused(make, fake_chat_server):
    from tether.errors import TetherError

    b = make()
    await run(b, "hi", service_tier="flex")
    assert fake_chat_server.last_body["service_tier"] == "flex"
    with pytest.raises(TetherError) as ei:
        await run(b, "hi", service_tier="scale")
    assert ei.value.param == "service_tier" and "flex" in ei.value.message


async def test_default_output_cap_is_sent_and_configurable(make, fake_chat_server):
    await run(make(), "hi")
    assert fake_chat_server.last_body["max_completion_tokens"] == 16_384
    await run(make(default_max_output_tokens=2048), "hi")
    assert fake_chat_server.last_body["max_completion_tokens"] == 2048
    await run(make(default_max_output_tokens=2048), "hi", max_output_tokens=100)
    assert fake_chat_server.last_body["max_completion_tokens"] == 100


async def test_429_without_retry_after_waits_for_the_exhausted_bucket(make, fake_chat_server):
    fake_chat_server.push(fk.rate_limited(retry_after_ms=None))
    err, _ = await fails(make(max_retries=0), "hi")
    assert err.code == "rate_limit_exceeded" and err.status == 429
    assert err.retry_after == pytest.approx(12.25)  # x-ratelimit-reset-tokens-minute (remaining 0)


async def test_tool_schemas_reduced_to_the_cerebras_subset(make, fake_chat_server):
    from tests.fakes.items import function_tool

    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "title": "Args",
        "properties": {
            "path": {"type": "string", "format": "uri", "minLength": 1, "pattern": "^/"},
            "limit": {"type": ["integer", "null"], "minimum": 0, "default": 10},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        },
        "required": ["path", "limit", "tags"],
        "additionalProperties": False,
    }
    await run(make(), "hi", tools=[function_tool("read", schema)])
    sent = fake_chat_server.last_body["tools"][0]["function"]["parameters"]
    assert sent == {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["path", "limit", "tags"],
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"allOf": [{"type": "object"}]}, "#/allOf"),
        ({"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}]}}}, "#/properties/x/oneOf"),
        ({"type": "array", "items": True}, "#/items"),
        ({"anyOf": [{"type": "string"}] * 6}, "#/anyOf"),
    ],
)
async def test_schemas_that_cannot_be_reduced_are_400_before_the_call(make, fake_chat_server, schema, where):
    from tests.fakes.items import function_tool
    from tether.errors import TetherError

    with pytest.raises(TetherError) as ei:
        await run(make(), "hi", tools=[function_tool("bad", schema)])
    assert ei.value.status == 400 and ei.value.param == "tools[0].parameters"
    assert "'bad'" in ei.value.message and where in ei.value.message
    assert not fake_chat_server.chat_requests
