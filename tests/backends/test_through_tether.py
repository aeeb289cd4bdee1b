"""A Chat Completions upstream behind the whole server (engine + bridge), driven by the openai SDK and
raw HTTP: what the upstream cannot do is a 400 before `response.created`, upstream failures keep
their meaning without the server's insides and are not retried when deterministic, rate-limit
hints reach the client, usage says where it came from, model names come from the upstream."""

from __future__ import annotations

import logging
import time

import httpx
import pytest
from openai import AsyncOpenAI

from tests.fakes import chat_server as fk
from tests.support.served import loopback, served
from tether import render
from tether.config import BackendSpec, Route, TetherConfig, from_dict

KEY = "sk-t"
AUTH = {"authorization": f"Bearer {KEY}"}


def config(server: fk.FakeChatServer, **options) -> TetherConfig:
    cfg = TetherConfig()
    cfg.store = "memory://"
    cfg.backends = {
        "cb": BackendSpec(
            kind="cerebras",
            options={"base_url": server.base_url, "api_key": "test-key", "retry_initial_delay_s": 0.01, **options},
        )
    }
    cfg.models = {"alias-model": Route(backend="cb", upstream_model="gpt-oss-120b")}
    return loopback(cfg)


@pytest.fixture
async def upstream():
    with fk.FakeChatServer(api_key="test-key", lifetime_s=60) as s:
        yield s


async def post(port: int, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as c:
        return await c.post(f"http://127.0.0.1:{port}/v1/responses", headers=AUTH, json=body)


@pytest.mark.parametrize("stream", [False, True])
async def test_capability_problems_are_400_before_response_created(upstream, stream):
    image = {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/cat.png"}]}
    bad_schema = {"type": "function", "name": "f", "parameters": {"allOf": [{"type": "object"}]}}
    async with served(config(upstream), {KEY: "t"}) as s:
        r1 = await post(s.port, {"model": "gpt-oss-120b", "input": [image], "stream": stream})
        r2 = await post(s.port, {"model": "gpt-oss-120b", "input": "x", "tools": [bad_schema], "stream": stream})
    for resp, param in ((r1, "input[0].content"), (r2, "tools[0].parameters")):
        assert resp.status_code == 400 and resp.headers["content-type"].startswith("application/json")
        err = resp.json()["error"]
        assert err["code"] == "unsupported_feature" and err["param"] == param
    assert not upstream.chat_requests  # nothing was sent upstream


async def test_deterministic_upstream_500_is_not_retried_and_is_sanitised(upstream):
    body = {
        "error": {
            "message": "7 validation errors for ChatCompletionRequestAssistantMessage\ncontent\n  Input should be "
            "a valid string [type=string_type]\n    For further information visit https://errors.pydantic.dev/2.9/v/"
            'string_type\nTraceback (most recent call last):\n  File "/srv/app/llama_cpp/server/app.py", line 512, '
            "in create\n    raise ValueError\nValueError: bad",
            "type": "internal_server_error",
            "code": None,
        }
    }
    upstream.push(fk.http_error(500, body))
    async with served(config(upstream), {KEY: "t"}) as s, AsyncOpenAI(base_url=s.base_url, api_key=KEY) as client:
        r = await client.responses.create(model="gpt-oss-120b", input="hi")
    assert len(upstream.chat_requests) == 1  # no retry of a failure that would repeat
    assert r.status == "failed" and (r.error.code, r.error.tether_code) == ("server_error", "backend_error")
    msg = r.error.message
    assert "7 validation errors" in msg and "Input should be a valid string" in msg  # the meaning stays
    assert "/srv/app" not in msg and "Traceback" not in msg and "pydantic.dev" not in msg and ".py" not in msg


async def test_transient_500_is_retried(upstream):
    upstream.push(fk.http_error(500), fk.text("fine"))
    async with served(config(upstream), {KEY: "t"}) as s, AsyncOpenAI(base_url=s.base_url, api_key=KEY) as client:
        r = await client.responses.create(model="gpt-oss-120b", input="hi")
    assert r.status == "completed" and r.output_text == "fine" and len(upstream.chat_requests) == 2


async def test_rate_limit_hint_reaches_the_client(upstream):
    upstream.push(fk.rate_limited(retry_after_ms=None))
    async with served(config(upstream, max_retries=0), {KEY: "t"}) as s:
        resp = await post(s.port, {"model": "gpt-oss-120b", "input": "hi"})
    r = resp.json()
    assert r["status"] == "failed" and r["error"]["code"] == "rate_limit_exceeded"
    assert r["error"]["tether_code"] == "rate_limit_exceeded"
    assert r["error"]["retry_after_s"] == pytest.approx(12.25)  # x-ratelimit-reset-tokens-minute
    assert resp.headers["retry-after"] == "13"


async def test_an_upstream_ignoring_the_output_cap_is_cut_at_it(upstream):
    """The cap is sent upstream; an upstream that ignores it is read only until the output passes
    it: the response is incomplete (`max_output_tokens`) and billed at most the cap."""
    upstream.push(fk.runaway(5000))
    async with served(config(upstream), {KEY: "t"}) as s, AsyncOpenAI(base_url=s.base_url, api_key=KEY) as client:
        r = await client.responses.create(model="gpt-oss-120b", input="hi", max_output_tokens=50)
        assert await upstream.disconnected(within=5)  # the stream was closed, not read to its end
        stored = await client.responses.retrieve(r.id)
    assert upstream.chat_requests[-1].body["max_completion_tokens"] == 50
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert 0 < r.usage.output_tokens <= 50
    assert len(render.encode(r.output_text)) > 50  # read until past the cap (within one wake-up's chunks)
    assert len(r.output_text.split()) < 500
    assert stored.status == "incomplete" and stored.usage.output_tokens == r.usage.output_tokens


async def test_an_upstream_reporting_more_than_the_cap_is_billed_the_cap(upstream):
    upstream.push(fk.runaway(10, completion_tokens=156_601), fk.runaway(10, completion_tokens=156_601))
    async with served(config(upstream), {KEY: "t"}) as s, AsyncOpenAI(base_url=s.base_url, api_key=KEY) as client:
        at_edge = await client.responses.create(model="gpt-oss-120b", input="hi", max_output_tokens=10)
        past = await client.responses.create(model="gpt-oss-120b", input="hi", max_output_tokens=9)
    assert at_edge.status == "completed" and at_edge.usage.output_tokens == 10  # ten words fit a cap of 10
    assert past.status == "incomplete" and past.incomplete_details.reason == "max_output_tokens"
    assert past.usage.output_tokens == 9


async def test_a_turn_past_its_deadline_fails_even_while_the_upstream_sends_keep_alives(upstream):
    upstream.push(fk.slow(count=5, interval=0.02), fk.keepalive_forever(seconds=20))
    cfg = config(upstream)
    cfg.limits.max_turn_s = 1.0
    async with served(cfg, {KEY: "t"}) as s, AsyncOpenAI(base_url=s.base_url, api_key=KEY) as client:
        within = await client.responses.create(model="gpt-oss-120b", input="hi")  # ~0.1 s: inside it
        started = time.monotonic()
        stuck = await client.responses.create(model="gpt-oss-120b", input="hi")
        elapsed = time.monotonic() - started
        assert await upstream.disconnected(within=5)
    assert within.status == "completed"
    assert stuck.status == "failed" and stuck.error.model_extra["tether_code"] == "backend_timeout"
    assert "limits.max_turn_s" in stuck.error.message and 1.0 <= elapsed < 5


@pytest.mark.parametrize("seconds", [0, -1])
def test_a_turn_deadline_must_be_positive(seconds):
    with pytest.raises(ValueError, match="limits.max_turn_s"):
        from_dict({"limits": {"max_turn_s": seconds}})


async def test_usage_from_the_upstream_else_counted_with_the_source(upstream):
    upstream.push(fk.text("one two three"), fk.completion(content="one two three", usage_mode="none"))
    timing = ["tether:server_timing"]
    async with served(config(upstream), {KEY: "t"}) as s, AsyncOpenAI(base_url=s.base_url, api_key=KEY) as client:
        reported = await client.responses.create(model="gpt-oss-120b", input="a b c d", include=timing)
        counted = await client.responses.create(model="gpt-oss-120b", input="a b c d", include=timing)
        async with httpx.AsyncClient() as c:
            metrics = (await c.get(f"http://127.0.0.1:{s.port}/metrics")).text
    # The fake counts words: 4 prompt words, 3 pieces; Tether's o200k count differs.
    assert reported.usage.input_tokens == 4 and reported.usage.output_tokens == 3
    assert reported.model_extra["server_timing"]["usage_sources"] == {
        "input": "upstream", "cached": "upstream", "output": "upstream", "reasoning": "upstream"
    }  # fmt: skip
    assert counted.usage.output_tokens > 0  # never 0 for a non-empty answer
    assert counted.model_extra["server_timing"]["usage_sources"]["output"] == "tether"
    assert 'tether_usage_source_total{kind="output",source="upstream"} 1.0' in metrics
    assert 'tether_usage_source_total{kind="output",source="tether"} 1.0' in metrics


async def test_models_merged_from_the_upstream_and_unknown_names_refused(upstream):
    async with served(config(upstream), {KEY: "t"}) as s, AsyncOpenAI(base_url=s.base_url, api_key=KEY) as client:
        listed = {m.id async for m in client.models.list()}
        resp = await post(s.port, {"model": "gpt-5", "input": "x"})
        routed = await client.responses.create(model="zai-glm-4.7", input="hi")
    assert listed == {"alias-model", "gpt-oss-120b", "llama3.1-8b", "zai-glm-4.7"}
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "model_not_found"
    assert routed.status == "completed" and upstream.last_body["model"] == "zai-glm-4.7"


async def test_a_wildcard_route_set_on_purpose_still_routes(upstream):
    cfg = config(upstream)
    cfg.models["*"] = Route(backend="cb", upstream_model="llama3.1-8b")
    async with served(cfg, {KEY: "t"}) as s, AsyncOpenAI(base_url=s.base_url, api_key=KEY) as client:
        r = await client.responses.create(model="anything", input="hi")
    assert r.status == "completed" and upstream.last_body["model"] == "llama3.1-8b"


def test_a_real_backend_without_models_has_no_simulated_catch_all():
    cfg = from_dict({"backends": {"local": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}}})
    assert cfg.models == {}
    assert "*" in from_dict({}).models  # the embedded default keeps its simulated catch-all


async def test_the_simulated_catch_all_is_announced_at_startup(caplog):
    cfg = loopback(TetherConfig())
    cfg.store = "memory://"
    with caplog.at_level(logging.INFO, logger="tether.server"):
        async with served(cfg, {KEY: "t"}):
            pass
    assert any("'*' route" in r.getMessage() and "simulated" in r.getMessage() for r in caplog.records)


async def test_hosted_tool_items_reach_the_upstream_from_input_and_from_the_chain(upstream):
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed",
              "action": {"type": "search", "query": "tether"}}  # fmt: skip
    image = {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": "aGk="}
    async with served(config(upstream), {KEY: "t"}) as s:
        first = await post(s.port, {"model": "gpt-oss-120b", "store": True,
                                    "input": [{"role": "user", "content": "find tether"}, search]})  # fmt: skip
        assert first.status_code == 200, first.text
        sent = upstream.last_body["messages"]
        assert sent[1]["tool_calls"][0]["function"]["name"] == "web_search"
        assert sent[2] == {"role": "tool", "tool_call_id": "ws_1", "content": '{"status":"completed"}'}
        follow = {"model": "gpt-oss-120b", "previous_response_id": first.json()["id"], "input": "and then?"}
        assert (await post(s.port, follow)).status_code == 200
        assert upstream.last_body["messages"][1:3] == sent[1:3]  # the chain carries it too
        n = len(upstream.chat_requests)
        bad = await post(s.port, {"model": "gpt-oss-120b", "input": [{"role": "user", "content": "x"}, image]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]"
    assert len(upstream.chat_requests) == n  # refused before anything went upstream


async def test_each_tenant_gets_its_own_cache_salt_and_cache_key_on_vllm():
    """The turn hands the caller's tenant to the backend: the same prompt and `prompt_cache_key`
    from two tenants reach vLLM with different `cache_salt`s and keys, so neither can time the
    other's cached prefix; one tenant's turns share theirs."""
    with fk.FakeChatServer(api_key=None, strict=False, lifetime_s=60, owned_by="vllm") as vllm:
        cfg = TetherConfig()
        cfg.store = "memory://"
        cfg.backends = {"v": BackendSpec(kind="openai", options={"base_url": vllm.base_url, "dialect": "vllm"})}
        cfg.models = {"m": Route(backend="v")}
        body = {"model": "m", "input": "the same long shared prompt", "prompt_cache_key": "k", "store": False}
        async with served(loopback(cfg), {"sk-a": "a", "sk-b": "b"}) as s:
            async with httpx.AsyncClient(timeout=30) as c:
                for key in ("sk-a", "sk-b", "sk-a"):
                    r = await c.post(f"http://127.0.0.1:{s.port}/v1/responses", json=body,
                                     headers={"authorization": f"Bearer {key}"})  # fmt: skip
                    assert r.status_code == 200, r.text
        sent = [r.body for r in vllm.chat_requests]
        salts, keys = [b["cache_salt"] for b in sent], [b["prompt_cache_key"] for b in sent]
        assert salts[0] == salts[2] != salts[1] and keys[0] == keys[2] != keys[1] and "k" not in keys
