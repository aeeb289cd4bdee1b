"""The session core through a real grpc.aio server and a real channel."""

from __future__ import annotations

import grpc
import pytest

from tests.fakes.chat_server import FakeChatServer, text
from tests.support.configs import make_config
from tests.support.grpc_client import RawSession
from tests.support.validator import validate_events
from tether import errors
from tether.config import TetherConfig
from tether.responses.v1 import items_pb2, request_pb2, service_pb2, service_pb2_grpc
from tether.server import start as start_server


def read_file_tool() -> request_pb2.Tool:
    tool = request_pb2.Tool()
    tool.function.name = "read_file"
    tool.function.parameters_json = '{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}'
    return tool


def tool_output(call_id: str, output: str) -> items_pb2.Item:
    item = items_pb2.Item()
    item.function_call_output.call_id = call_id
    item.function_call_output.output_text = output
    return item


def user(text_: str) -> items_pb2.Item:
    item = items_pb2.Item()
    item.message.role = "user"
    item.message.content.add().input_text.text = text_
    return item


async def tool_loop(session: RawSession, *, store: bool):
    """Turn 1 asks -> function call; turn 2 sends only the tool output -> text answer."""
    await session.create(model="m", input="fix the bug", tools=[read_file_tool()], store=store)
    first = (await session.until_terminal()).completed.response
    assert first.status == "completed"
    [call] = [o.function_call for o in first.output]
    assert call.name == "read_file"
    await session.create(
        model="m", previous_response_id=first.id, input=[tool_output(call.call_id, "def f(): pass")],
        tools=[read_file_tool()], store=store,
    )
    second = (await session.until_terminal()).completed.response
    assert second.status == "completed"
    assert second.output[0].message.content[0].output_text.text
    return first, second


async def test_tool_loop_store_false_writes_nothing(channel, engine):
    session = RawSession(channel)
    first, second = await tool_loop(session, store=False)
    # The continuation reused the cached prefix: cached tokens are the whole first turn's context.
    assert second.usage.cached_tokens > 0
    assert second.usage.input_tokens > first.usage.input_tokens
    validate_events(session.json_events())
    await session.close()
    await engine.post.flush()
    # store=false: nothing at all reached the store.
    assert await engine.store.get_response("", first.id) is None
    assert await engine.store.get_response("", second.id) is None
    assert await engine.store.usage_records() == []


async def test_tool_loop_store_true_and_reconnect(channel, engine):
    session = RawSession(channel)
    first, second = await tool_loop(session, store=True)
    await session.close()
    # A new connection continues from the store (one hydration read), with only new input.
    other = RawSession(channel)
    await other.create(model="m", previous_response_id=second.id, input="and now?", store=True)
    third = (await other.until_terminal()).completed.response
    assert third.status == "completed"
    assert third.usage.cached_tokens == 0  # hydrated, not cached on this connection
    assert third.usage.input_tokens > second.usage.input_tokens
    validate_events(other.json_events())
    await other.close()
    await engine.post.flush()
    assert [r.response_id for r in await engine.store.usage_records()] == [first.id, second.id, third.id]
    # store=false after a reconnect: the new connection has nothing to continue from.
    loose = RawSession(channel)
    await loose.create(model="m", input="hi", store=False)
    gone = (await loose.until_terminal()).completed.response
    await loose.close()
    again = RawSession(channel)
    await again.create(model="m", previous_response_id=gone.id, input="more", store=False)
    err = (await again.until_terminal()).error.error
    assert (err.code, err.param, err.status) == (errors.PREVIOUS_RESPONSE_NOT_FOUND, "previous_response_id", 400)
    await again.close()


@pytest.fixture
def fake_upstream():
    with FakeChatServer(api_key="upstream-key") as server:
        yield server


@pytest.fixture
def upstream_config(tmp_path, fake_upstream) -> TetherConfig:
    return make_config(
        f"sqlite:///{tmp_path}/t.db",
        backends={"up": {"kind": "openai", "base_url": fake_upstream.base_url, "api_key": "upstream-key"}},
        models={"*": {"backend": "up"}},
    )


@pytest.mark.parametrize("store", [False, True])
async def test_backend_receives_whole_history(upstream_config, fake_upstream, store):
    """By content, not by status: each continuation feeds the whole chain to the backend."""
    running = await start_server(upstream_config, authenticator=_open_auth())
    server = running.grpc
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            session = RawSession(ch)
            fake_upstream.push(text("I will read it."))
            await session.create(model="m", input="first question", instructions="be terse", store=store)
            r1 = (await session.until_terminal()).completed.response
            fake_upstream.push(text("Second answer."))
            await session.create(model="m", input="second question", previous_response_id=r1.id, store=store)
            r2 = (await session.until_terminal()).completed.response
            if store:  # reconnect: the chain comes back from the store
                await session.close()
                session = RawSession(ch)
            fake_upstream.push(text("Third answer."))
            await session.create(model="m", input="third question", previous_response_id=r2.id, store=store)
            ev = await session.until_terminal()
            await session.close()
        if not store:
            assert ev.WhichOneof("event") == "completed"
        messages = fake_upstream.chat_requests[-1].body["messages"]
        assert [(m["role"], m.get("content")) for m in messages] == [
            ("user", "first question"),
            ("assistant", "I will read it."),
            ("user", "second question"),
            ("assistant", "Second answer."),
            ("user", "third question"),
        ]  # and no system message: instructions are not inherited
    finally:
        await running.stop(0)


def _open_auth():
    from tether.auth import Authenticator

    return Authenticator({})


async def test_warmup_is_chainable(channel):
    session = RawSession(channel)
    await session.create(model="m", input="system prompt and tools", tools=[read_file_tool()], generate=False, store=False)
    warm = (await session.until_terminal()).completed.response
    assert warm.status == "completed" and len(warm.output) == 0
    assert warm.usage.output_tokens == 0
    await session.create(model="m", previous_response_id=warm.id, input="go", tools=[read_file_tool()], store=False)
    turn = (await session.until_terminal()).completed.response
    assert turn.status == "completed"
    assert turn.usage.cached_tokens >= warm.usage.input_tokens
    types = [ev.WhichOneof("event") for ev in session.events if ev.response_id == warm.id]
    assert types == ["created", "in_progress", "completed"]
    validate_events(session.json_events())
    await session.close()


BAD_CREATES = [
    (dict(model="", input="x"), errors.MISSING_REQUIRED_PARAMETER, "model"),
    (dict(model="m", input="x", background=True), errors.BACKGROUND_NOT_SUPPORTED, "background"),
    (dict(model="m", input="x", stream_id="bad lane!"), errors.INVALID_STREAM_ID, "stream_id"),
    (dict(model="m", input="x", previous_response_id="resp_nope"), errors.PREVIOUS_RESPONSE_NOT_FOUND, "previous_response_id"),
    (dict(model="m", input=[tool_output("call_unknown", "x")]), errors.UNKNOWN_CALL_ID, "input[0].call_id"),
    (dict(model="m", input=[user("x")] * 9), errors.TOO_MANY_ITEMS, "input"),
    (dict(model="m", input=[user("x" * 5000)]), errors.ITEM_TOO_LARGE, "input[0]"),
    (dict(model="m", input="x", temperature=7.0), errors.INVALID_REQUEST, "temperature"),
    (dict(model="nope", input="x"), errors.MODEL_NOT_FOUND, "model"),
]


@pytest.fixture
def config(tmp_path):
    return make_config(
        f"sqlite:///{tmp_path}/t.db",
        limits={"max_input_items": 8, "max_item_bytes": 4096},
        models={"m": {"backend": "sim"}, "other": {"backend": "sim"}},
    )


async def test_bad_input_gets_stable_codes_and_session_survives(channel):
    session = RawSession(channel)
    await session.create(model="m", input="hello", store=False)
    good = (await session.until_terminal()).completed.response
    bad_item = items_pb2.Item()
    bad_item.message.role = "robot"
    cases = [*BAD_CREATES, (dict(model="m", input=[bad_item]), errors.INVALID_ITEM, "input[0].role")]
    for fields, code, param in cases:
        await session.create(**fields)
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "error", (fields, ev)
        assert (ev.error.error.code, ev.error.error.param) == (code, param)
        assert ev.error.error.status in (400, 404, 429)
    # The connection's cached state survived every error: the good response still continues.
    await session.create(model="m", previous_response_id=good.id, input="still there?", store=False)
    after = (await session.until_terminal()).completed.response
    assert after.usage.cached_tokens > 0
    validate_events(session.json_events())
    await session.close()


async def test_failed_continuation_evicts_its_parent(channel):
    session = RawSession(channel)
    await session.create(model="m", input="hello", store=False)
    parent = (await session.until_terminal()).completed.response
    await session.create(model="m", previous_response_id=parent.id, input=[tool_output("call_x", "?")], store=False)
    assert (await session.until_terminal()).error.error.code == errors.UNKNOWN_CALL_ID
    await session.create(model="m", previous_response_id=parent.id, input="retry", store=False)
    assert (await session.until_terminal()).error.error.code == errors.PREVIOUS_RESPONSE_NOT_FOUND
    await session.close()


async def test_creates_on_one_lane_run_fifo_and_lanes_interleave(channel):
    session = RawSession(channel)
    for i in range(3):
        await session.create(model="m", input=f"q{i}", store=False)
    await session.create(model="m", input="lane a", store=False, stream_id="a")
    await session.create(model="m", input="lane b", store=False, stream_id="b")
    done = []
    while len(done) < 5:
        ev = await session.until_terminal()
        done.append((ev.stream_id, ev.completed.response.created_at, ev.response_id))
    default = [rid for lane, _, rid in done if lane == ""]
    created = [ev.response_id for ev in session.events if ev.WhichOneof("event") == "created" and not ev.stream_id]
    assert default == created  # FIFO: completion order equals creation order on the default lane
    assert {lane for lane, _, _ in done} == {"", "a", "b"}
    validate_events(session.json_events())
    await session.close()


async def test_lane_limit(channel, engine):
    engine.config.limits.max_lanes = 2
    session = RawSession(channel)
    for lane in ("a", "b"):
        await session.create(model="m", input="x", store=False, stream_id=lane)
        await session.until_terminal()
    await session.create(model="m", input="x", store=False, stream_id="c")
    ev = await session.until_terminal()
    assert ev.error.error.code == errors.STREAM_LIMIT_REACHED and ev.stream_id == "c"
    await session.create(model="m", input="x", store=False, stream_id="a")  # an existing lane still works
    assert (await session.until_terminal()).WhichOneof("event") == "completed"
    await session.close()


async def test_unary_rpcs(channel, engine):
    session = RawSession(channel)
    await session.create(model="m", input="remember this", store=True, metadata={"k": "v"})
    r = (await session.until_terminal()).completed.response
    await session.close()
    stub = service_pb2_grpc.ResponsesServiceStub(channel)
    got = (await stub.GetResponse(service_pb2.GetResponseRequest(response_id=r.id))).response
    assert got.id == r.id and got.output == r.output and got.metadata["k"] == "v"
    items = await stub.ListInputItems(service_pb2.ListInputItemsRequest(response_id=r.id))
    assert items.data[0].message.content[0].input_text.text == "remember this"
    count = await stub.CountInputTokens(
        service_pb2.CountInputTokensRequest(params=request_pb2.ResponseCreateParams(model="m", input_text="remember this"))
    )
    assert count.input_tokens > 0
    models = await stub.ListModels(service_pb2.ListModelsRequest())
    assert {m.id for m in models.data} == {"m", "other"}
    deleted = await stub.DeleteResponse(service_pb2.DeleteResponseRequest(response_id=r.id))
    assert deleted.deleted
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetResponse(service_pb2.GetResponseRequest(response_id=r.id))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert dict(info.value.trailing_metadata())["tether-error-code"] == errors.RESPONSE_NOT_FOUND


async def test_health_and_reflection(grpc_server, channel):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="tether.responses.v1.ResponsesService"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    async for answer in call:
        names = {s.name for s in answer.list_services_response.service}
        assert "tether.responses.v1.ResponsesService" in names
        break


@pytest.mark.parametrize("durability", ["overlap", "before_terminal"])
async def test_store_durability_modes_both_persist_every_completed_response(tmp_path, durability):
    config = make_config(f"sqlite:///{tmp_path}/d.db", store_durability=durability)
    running = await start_server(config, authenticator=_open_auth())
    engine, server = running.engine, running.grpc
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            session = RawSession(ch)
            await session.create(model="m", input="one", store=True)
            r1 = (await session.until_terminal()).completed.response
            if durability == "before_terminal":
                # Durable by the time the client saw completion: no flush needed.
                assert (await engine.store.get_response("", r1.id)).id == r1.id
            await session.close()
        await engine.post.flush()
        assert [u.response_id for u in await engine.store.usage_records()] == [r1.id]
    finally:
        await running.stop(0)
