"""The Cerebras adapter against Cerebras as it answers today (API version 2, the current roster:
tests/fakes/cerebras_v2): the version is pinned and its rules are kept before sending, each
model's capabilities come from GET /v1/models/{id}, usage and the tier used come back, connections
are warmed, large bodies go compressed, tenants can be kept apart, 402/503 have codes of their own."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.fakes import cerebras_v2 as v2
from tests.fakes import chat_server as fk
from tests.fakes.items import (
    assistant,
    compaction,
    function_call,
    function_output,
    function_tool,
    reasoning,
    request,
    user,
    user_parts,
)
from tether.backends.base import BackendError, Finish
from tether.backends.registry import build_backend
from tether.errors import TetherError
from tether.responses.v1 import request_pb2

FAST = {"retry_initial_delay_s": 0.01, "retry_max_delay_s": 0.02}


@pytest.fixture
def cerebras():
    with v2.FakeCerebrasV2(api_key="test-key", lifetime_s=60) as server:
        yield server


@pytest.fixture
async def make(cerebras):
    made = []

    def factory(**options):
        b = build_backend("cb", "cerebras", {"base_url": cerebras.base_url, "api_key": "test-key", **FAST, **options})
        made.append(b)
        return b

    yield factory
    for b in made:
        await b.aclose()


async def call(backend, *items, **kw) -> list:
    return [c async for c in backend.stream(request(*items, **kw))]


async def refused(backend, *items, **kw) -> TetherError:
    with pytest.raises(TetherError) as ei:
        await call(backend, *items, **kw)
    return ei.value


def json_format(schema: dict, strict: bool | None = None) -> request_pb2.TextFormat:
    import orjson

    fmt = request_pb2.TextFormat(type="json_schema", name="answer", schema_json=orjson.dumps(schema).decode())
    if strict is not None:
        fmt.strict = strict
    return fmt


def strict_tool(name: str, schema: dict) -> request_pb2.Tool:
    tool = function_tool(name, schema)
    tool.function.strict = True
    return tool


# --- the version and its rules --------------------------------------------------------------------


async def test_every_request_pins_api_version_2(make, cerebras):
    b = make()
    await b.discover()
    await call(b, "hi")
    paths = {r.path.split("?")[0] for r in cerebras.requests}
    assert {"/v1/models", "/v1/models/gpt-oss-120b", "/v1/chat/completions"} <= paths
    assert all(r.headers.get("x-cerebras-version-patch") == "2" for r in cerebras.requests)


async def test_definitions_become_defs_with_their_refs(make, cerebras):
    schema = {
        "type": "object",
        "properties": {"where": {"$ref": "#/definitions/Place"}},
        "required": ["where"],
        "definitions": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }
    await call(make(), "hi", tools=[function_tool("go", schema)], text_format=json_format(schema))
    body = cerebras.last_body  # version 2 accepted it
    for sent in (body["tools"][0]["function"]["parameters"], body["response_format"]["json_schema"]["schema"]):
        assert "definitions" not in sent and sent["properties"]["where"] == {"$ref": "#/$defs/Place"}
        assert sent["$defs"]["Place"]["properties"] == {"city": {"type": "string"}}


async def test_strict_schemas_are_closed_at_every_object(make, cerebras):
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "c": {"type": ["object", "null"], "properties": {"d": {"type": "integer"}}},
            "e": {"type": "array", "items": {"$ref": "#/$defs/E"}},
        },
        "$defs": {"E": {"type": "object", "properties": {"f": {"type": "boolean"}}}},
    }
    await call(make(), "hi", tools=[strict_tool("t", schema)], text_format=json_format(schema, strict=True))
    body = cerebras.last_body
    for sent in (body["tools"][0]["function"]["parameters"], body["response_format"]["json_schema"]["schema"]):
        assert sent["additionalProperties"] is False
        assert sent["properties"]["a"]["additionalProperties"] is False
        assert sent["properties"]["c"]["anyOf"][0]["additionalProperties"] is False
        assert sent["$defs"]["E"]["additionalProperties"] is False
        assert "required" not in sent["properties"]["a"]  # optional stays optional (version 2 allows it)


async def test_a_strict_schema_that_allows_extra_keys_is_400_naming_the_path(make, cerebras):
    schema = {"type": "object", "properties": {"tags": {"type": "object", "additionalProperties": {"type": "string"}}}}
    err = await refused(make(), "hi", tools=[strict_tool("label", schema)])
    assert err.status == 400 and err.param == "tools[0].parameters"
    assert "'label'" in err.message and "#/properties/tags/additionalProperties" in err.message
    err = await refused(make(), "hi", text_format=json_format({"type": "object", "additionalProperties": True}, True))
    assert err.param == "text.format.schema" and "#/additionalProperties" in err.message
    assert not cerebras.chat_requests
    await call(make(), "hi", tools=[function_tool("label", schema)])  # not strict: sent as it is
    assert cerebras.last_body["tools"][0]["function"]["parameters"]["properties"]["tags"]["additionalProperties"]


@pytest.mark.parametrize(
    ("items", "where", "words"),
    [
        # a call whose output never came, then the user spoke again
        ([user("hi"), function_call("c1", "f"), user("never mind")], "input[1]", "no tool output right after it"),
        # an output kept past a compaction that summarised its call away
        ([compaction("we called f"), function_output("c1", "42"), user("go on")], "input[1]", "answers no call"),
        # the same call id twice
        ([function_call("c1", "f"), function_output("c1", "1"), function_call("c1", "f"), function_output("c1", "2")],
         "input[2]", "used by an earlier call"),
        # the history ends with a call and no output
        ([user("hi"), function_call("c9", "f")], "input[1]", "no tool output right after it"),
    ],
)  # fmt: skip
async def test_tool_messages_out_of_order_are_tethers_400_naming_the_item(make, cerebras, items, where, words):
    err = await refused(make(), *items)
    assert err.status == 400 and err.code == "invalid_item" and err.param == where and words in err.message
    assert not cerebras.chat_requests


async def test_tool_messages_in_order_pass(make, cerebras):
    items = [user("hi"), function_call("a", "f"), function_call("b", "g"), function_output("b", "2"),
             function_output("a", "1"), assistant("done"), user("again")]  # fmt: skip
    await call(make(), *items, tools=[function_tool("f"), function_tool("g")])
    assert [m["role"] for m in cerebras.last_body["messages"]] == ["user", "assistant", "tool", "tool", "assistant", "user"]


async def test_tool_choice_goes_only_with_tools(make, cerebras):
    await call(make(), "hi", tool_choice=request_pb2.ToolChoice(mode="required"))
    assert "tool_choice" not in cerebras.last_body and "tools" not in cerebras.last_body


# --- models: capabilities from GET /v1/models/{id}, the family table for the rest ---------------------


async def test_discovery_reads_each_models_capabilities(make, cerebras):
    b = make()
    assert await b.discover() == [m.id for m in v2.ROSTER]
    asked = sorted(r.path for r in cerebras.requests if r.path.startswith("/v1/models/"))
    assert asked == sorted(f"/v1/models/{m.id}" for m in v2.ROSTER)
    assert (await b.model_caps("gemma-4-31b")).vision is True


async def test_vision_and_reasoning_per_model(make, cerebras):
    b = make()
    picture = user_parts("what is this?", image_url="https://example.test/cat.png")
    await call(b, picture, model="gemma-4-31b")
    body = cerebras.last_body
    assert body["messages"][0]["content"][1] == {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}}
    assert body["reasoning_format"] == "parsed" and "reasoning_effort" not in body  # thinks; no effort parameter
    err = await refused(b, picture, model="gpt-oss-120b")
    assert err.status == 400 and "does not accept images" in err.message
    err = await refused(b, "hi", model="gemma-4-31b", reasoning_effort="high")
    assert err.param == "reasoning.effort" and "no reasoning effort control" in err.message


@pytest.mark.parametrize(
    ("model", "effort", "sent"),
    [
        ("qwen-3.8-27b", "none", {"reasoning_format": "parsed", "reasoning_effort": "none"}),
        ("qwen-3.8-27b", "high", {"reasoning_format": "parsed", "reasoning_effort": "high"}),
        ("zai-glm-4.7", "none", {"reasoning_format": "parsed", "reasoning_effort": "none"}),
        ("gpt-oss-120b", "xhigh", {"reasoning_format": "parsed", "reasoning_effort": "high"}),
        ("llama3.1-8b", None, {}),
    ],
)
async def test_reasoning_controls_of_the_current_roster(make, cerebras, model, effort, sent):
    await call(make(), "hi", model=model, reasoning_effort=effort)
    body = cerebras.last_body
    assert {k: body[k] for k in ("reasoning_format", "reasoning_effort", "disable_reasoning") if k in body} == sent


async def test_the_servers_word_wins_over_the_family_table(cerebras, make):
    # A model the family table does not know: the server says it reasons and sees.
    cerebras.roster["nova-2"] = v2.FakeModel("nova-2", True, vision=True, max_completion_tokens=4096)
    cerebras.models.append("nova-2")
    b = make()
    await call(b, user_parts("look", image_url="https://example.test/a.png"), model="nova-2")
    body = cerebras.last_body
    assert body["reasoning_format"] == "parsed" and body["max_completion_tokens"] == 4096  # the model's own cap
    err = await refused(b, "hi", model="nova-2", max_output_tokens=5000)
    assert err.status == 400 and err.param == "max_output_tokens" and "4096" in err.message
    # ... and one that says "no": a gpt-oss id without structured outputs refuses a JSON schema here.
    cerebras.roster["gpt-oss-mini"] = v2.FakeModel("gpt-oss-mini", True, structured_outputs=False)
    cerebras.models.append("gpt-oss-mini")
    err = await refused(b, "hi", model="gpt-oss-mini", text_format=json_format({"type": "object"}))
    assert err.status == 400 and err.param == "text.format" and not any(
        r.body.get("model") == "gpt-oss-mini" for r in cerebras.chat_requests
    )


async def test_capabilities_are_read_again_once_stale(make, cerebras):
    b = make(model_info_refresh_s=0.0)
    await call(b, "hi", model="zai-glm-4.7")
    await call(b, "hi", model="zai-glm-4.7")
    await asyncio.sleep(0.2)  # the refresh runs beside the call
    reads = [r for r in cerebras.requests if r.path == "/v1/models/zai-glm-4.7"]
    assert len(reads) >= 2


# --- usage and tiers ----------------------------------------------------------------------------


async def test_usage_image_prediction_and_reasoning_tokens(make, cerebras):
    details = {"completion_tokens_details": {"accepted_prediction_tokens": 7, "rejected_prediction_tokens": 2}}
    cerebras.push(fk.text("a cat", reasoning="looks furry", usage_extra=details))
    chunks = await call(make(), user_parts("what?", image_url="https://example.test/c.png"), model="gemma-4-31b")
    usage = chunks[-1].usage
    assert usage.image_tokens == 85 and usage.reasoning_tokens == 2
    assert (usage.accepted_prediction_tokens, usage.rejected_prediction_tokens) == (7, 2)


async def test_the_tier_cerebras_used_is_reported(make, cerebras):
    chunks = await call(make(), "hi", service_tier="auto")
    fin = chunks[-1]
    assert isinstance(fin, Finish) and cerebras.last_body["service_tier"] == "auto" and fin.service_tier == "default"


# --- latency: warming, compressed bodies, thinking kept ------------------------------------------


async def test_warming_at_start_and_through_idle_gaps(make, cerebras):
    b = make(keepalive_timeout_s=0.25, warm_for_s=0.6)
    await b.discover()
    await asyncio.sleep(0.05)
    assert cerebras.warmings == 1  # at start
    await call(b, "hi")
    await asyncio.sleep(0.5)  # idle: re-warmed before the kept-alive connection would close
    warmed = cerebras.warmings
    assert warmed >= 2
    await call(b, "hi again")
    last_warm = [r for r in cerebras.requests if r.path == "/v1/tcp_warming"][-1]
    assert cerebras.chat_requests[-1].peer == last_warm.peer  # the call found the warmed connection
    await asyncio.sleep(1.0)  # past warm_for_s since the last call: warming stops
    settled = cerebras.warmings
    await asyncio.sleep(0.4)
    assert cerebras.warmings == settled


async def test_large_bodies_go_gzip_compressed(make, cerebras):
    history = [user(f"turn {i}: " + "the quick brown fox jumps over the lazy dog " * 20) for i in range(30)]
    await call(make(), *history)
    sent = cerebras.chat_requests[-1]
    assert sent.headers["content-encoding"] == "gzip" and sent.body["messages"][0]["content"].startswith("turn 0")
    assert sent.wire_bytes * 5 < len(sent.raw)
    await call(make(), "short")
    assert "content-encoding" not in cerebras.chat_requests[-1].headers  # under gzip_min_bytes
    await call(make(gzip_min_bytes=0), *history)
    assert "content-encoding" not in cerebras.chat_requests[-1].headers


async def test_clear_thinking_follows_what_tether_sends_back(make, cerebras):
    b = make()
    await call(b, user("q"), reasoning("first I thought"), assistant("a"), user("and?"), model="zai-glm-4.7")
    body = cerebras.last_body
    assert body["clear_thinking"] is False and body["messages"][1]["reasoning"] == "first I thought"
    await call(b, user("q"), assistant("a"), user("and?"), model="zai-glm-4.7")
    assert "clear_thinking" not in cerebras.last_body  # nothing sent back: the default is right
    await call(b, user("q"), reasoning("x"), assistant("a"), user("and?"), model="llama3.1-8b")
    assert "clear_thinking" not in cerebras.last_body  # a model that does not think


# --- tenants and the shared prompt cache ---------------------------------------------------------


async def test_tenants_with_keys_of_their_own(make, cerebras, monkeypatch):
    monkeypatch.setenv("CB_KEY_ACME", "acme-key")
    cerebras.api_key = None  # the fake takes any key; the test reads which one came
    b = make(tenant_api_key_envs={"acme": "CB_KEY_ACME"}, isolate_tenants=True)
    await call(b, "hi", tenant="acme")
    assert cerebras.chat_requests[-1].headers["authorization"] == "Bearer acme-key"
    err = await refused(b, "hi", tenant="globex")
    assert err.code == "permission_denied" and "isolate_tenants" in err.message
    await call(b, "hi")  # an open server's single tenant: the backend's own key
    assert cerebras.chat_requests[-1].headers["authorization"] == "Bearer test-key"
    assert make().tenants_sharing_cache(["acme", "globex"]) == ["acme", "globex"]
    assert make(tenant_api_key_envs={"acme": "CB_KEY_ACME"}).tenants_sharing_cache(["acme", "globex"]) == []


async def test_startup_warns_when_tenants_share_one_key(cerebras, caplog):
    from tests.backends.test_through_tether import config
    from tests.support.served import served

    with caplog.at_level(logging.WARNING, logger="tether.server"):
        async with served(config(cerebras), {"k1": "acme", "k2": "globex"}):
            pass
    assert any("acme, globex share one upstream key" in r.getMessage() for r in caplog.records)


# --- errors --------------------------------------------------------------------------------------


async def test_402_and_503_have_codes_of_their_own(make, cerebras):
    cerebras.push(v2.payment_required())
    with pytest.raises(BackendError) as ei:
        await call(make(), "hi")
    assert ei.value.code == "backend_payment_required" and ei.value.status == 502 and len(cerebras.chat_requests) == 1
    cerebras.push(v2.unavailable(), v2.unavailable())
    with pytest.raises(BackendError) as ei:
        await call(make(max_retries=1), "hi")
    assert ei.value.code == "backend_unavailable" and ei.value.status == 503 and ei.value.retryable


async def test_the_response_carries_the_tier_used_and_the_extra_usage(cerebras):
    import httpx

    from tests.backends.test_through_tether import config
    from tests.support.served import served

    details = {"completion_tokens_details": {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 1}}
    cerebras.push(fk.text("a cat", usage_extra=details), fk.text("plain"))
    picture = {"role": "user", "content": [{"type": "input_text", "text": "what?"},
                                           {"type": "input_image", "image_url": "https://example.test/c.png"}]}  # fmt: skip
    async with served(config(cerebras), {"k": "t"}) as s, httpx.AsyncClient(timeout=30) as c:
        url, auth = f"http://127.0.0.1:{s.port}/v1/responses", {"authorization": "Bearer k"}
        r = (await c.post(url, headers=auth, json={"model": "gemma-4-31b", "input": [picture], "service_tier": "auto"})).json()
        plain = (await c.post(url, headers=auth, json={"model": "gpt-oss-120b", "input": "hi"})).json()
    assert r["status"] == "completed" and r["service_tier"] == "default"  # what Cerebras used, not "auto"
    assert r["usage"]["input_tokens_details"]["image_tokens"] == 85
    assert r["usage"]["output_tokens_details"]["accepted_prediction_tokens"] == 3
    assert r["usage"]["output_tokens_details"]["rejected_prediction_tokens"] == 1
    assert "image_tokens" not in plain["usage"]["input_tokens_details"]  # only when reported
    assert plain["service_tier"] == "default"


async def test_gzip_threshold_at_and_below_its_edge(make, cerebras):
    import orjson

    b = make()
    req = request(user("x" * 5000))
    await b.prepare(req)
    size = len(orjson.dumps(req.prepared))
    at, below = make(gzip_min_bytes=size), make(gzip_min_bytes=size + 1)
    assert (await at._encode(req.prepared, ""))[1] == {"content-encoding": "gzip"}
    assert (await below._encode(req.prepared, ""))[1] == {}
    for bad in ({"gzip_min_bytes": -1}, {"gzip_level": 0}, {"gzip_level": 10}):
        with pytest.raises(ValueError, match="gzip"):
            make(**bad)
