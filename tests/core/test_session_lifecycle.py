"""Lifetime, idle timeout, cancellation, disconnects, compaction, safety, stateless create."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tests.fakes.chat_server import FakeChatServer, slow, text
from tests.support.configs import make_config
from tests.support.grpc_client import RawSession
from tests.support.validator import validate_events
from tether import errors
from tether.auth import Authenticator
from tether.compaction_codec import decode_payload
from tether.responses.v1 import items_pb2, request_pb2, service_pb2, service_pb2_grpc
from tether.server import start as start_server


async def serve(config):
    config.server.bridge = False
    running = await start_server(config, authenticator=Authenticator({}))
    engine = running.engine
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}")

    async def stop():
        await channel.close()
        await running.stop(0)

    return engine, channel, stop


async def test_lifetime_limit_sends_the_error_then_ends_the_stream():
    engine, channel, stop = await serve(make_config(limits={"connection_lifetime_s": 0.3}))
    try:
        session = RawSession(channel)
        await session.create(model="m", input="hi", store=False)
        assert (await session.until_terminal()).WhichOneof("event") == "completed"
        last = await session.until_terminal(timeout=10)
        assert last.error.error.code == errors.CONNECTION_LIMIT_REACHED
        assert "connection limit reached" in last.error.error.message
        assert await session.next_event() is None  # the stream ended after the error
        assert not engine.sessions
    finally:
        await stop()


async def test_idle_timeout_closes_an_idle_connection():
    engine, channel, stop = await serve(make_config(limits={"idle_timeout_s": 0.2}))
    try:
        session = RawSession(channel)
        last = await session.until_terminal(timeout=10)
        assert last.error.error.code == errors.IDLE_TIMEOUT
        assert await session.next_event() is None
    finally:
        await stop()


@pytest.fixture
def upstream():
    with FakeChatServer(api_key="k") as server:
        yield server


def upstream_config(server, **limits):
    return make_config(
        backends={"up": {"kind": "openai", "base_url": server.base_url, "api_key": "k"}},
        models={"*": {"backend": "up"}},
        limits=limits or None,
    )


async def test_client_disconnect_cancels_the_upstream_generation(upstream):
    engine, channel, stop = await serve(upstream_config(upstream))
    try:
        upstream.push(slow(count=500, interval=0.02))
        session = RawSession(channel)
        await session.create(model="m", input="write a lot", store=False)
        while (await session.next_event()).WhichOneof("event") != "output_text_delta":
            pass
        session.call.cancel()  # the client vanishes mid-stream
        assert await upstream.disconnected(within=10)
        for _ in range(100):
            if not engine.sessions:
                break
            await asyncio.sleep(0.02)
        assert not engine.sessions  # state freed
    finally:
        await stop()


async def test_cancel_event_stops_one_response_and_the_session_goes_on(upstream):
    engine, channel, stop = await serve(upstream_config(upstream))
    try:
        upstream.push(slow(count=500, interval=0.02), text("after cancel"))
        session = RawSession(channel)
        await session.create(model="m", input="write a lot", store=False)
        first = await session.next_event()
        rid = first.response_id
        while (await session.next_event()).WhichOneof("event") != "output_text_delta":
            pass
        req = service_pb2.SessionRequest()
        req.cancel.response_id = rid
        await session.send(req)
        end = await session.until_terminal()
        assert end.WhichOneof("event") == "incomplete"
        assert end.incomplete.response.status == "cancelled"
        assert not end.incomplete.response.HasField("incomplete_details")
        assert await upstream.disconnected(within=10)
        await session.create(model="m", input="next", store=False)
        assert (await session.until_terminal()).WhichOneof("event") == "completed"
        validate_events(session.json_events())
        await session.close()
    finally:
        await stop()


async def test_upstream_failure_mid_stream_fails_the_response_and_keeps_the_session(upstream):
    from tests.fakes.chat_server import mid_stream_error

    engine, channel, stop = await serve(upstream_config(upstream))
    try:
        upstream.push(text("first"), mid_stream_error())
        session = RawSession(channel)
        await session.create(model="m", input="hello", store=False)
        parent = (await session.until_terminal()).completed.response
        await session.create(model="m", input="go on", previous_response_id=parent.id, store=False)
        failed = await session.until_terminal()
        assert failed.WhichOneof("event") == "failed"
        assert failed.failed.response.error.code
        # The failed continuation evicted its parent (same lane), as the contract says.
        await session.create(model="m", input="again", previous_response_id=parent.id, store=False)
        assert (await session.until_terminal()).error.error.code == errors.PREVIOUS_RESPONSE_NOT_FOUND
        validate_events(session.json_events())
        await session.close()
    finally:
        await stop()


async def test_automatic_compaction_and_continuation():
    engine, channel, stop = await serve(make_config())
    try:
        session = RawSession(channel)
        cm = request_pb2.ContextManagement(type="compaction", compact_threshold=1000)
        big = "lorem ipsum dolor sit amet " * 300
        await session.create(model="m", input="first " + big, store=False)
        r1 = (await session.until_terminal()).completed.response
        await session.create(model="m", input="second", previous_response_id=r1.id, store=False,
                             context_management=[cm])
        r2 = (await session.until_terminal()).completed.response
        kinds = [o.WhichOneof("item") for o in r2.output]
        assert kinds == ["message", "compaction"]
        types = [ev.WhichOneof("event") for ev in session.events if ev.response_id == r2.id]
        assert "compaction_compacting" in types
        payload = decode_payload(r2.output[1].compaction.encrypted_content)
        assert payload.summary and payload.keep >= 1
        # The next turn continues from the compacted window: far fewer input tokens.
        await session.create(model="m", input="third", previous_response_id=r2.id, store=False)
        r3 = (await session.until_terminal()).completed.response
        assert r3.usage.input_tokens < r2.usage.input_tokens
        validate_events(session.json_events())
        # The standalone Compact RPC returns a window usable as the input of a new chain.
        stub = service_pb2_grpc.ResponsesServiceStub(channel)
        params = request_pb2.ResponseCreateParams(model="m")
        params.input.add().message.CopyFrom(items_pb2.Message(role="user", content_text="old " + big))
        params.input.add().message.CopyFrom(items_pb2.Message(role="user", content_text="recent question"))
        window = await stub.CompactResponse(service_pb2.CompactResponseRequest(params=params))
        assert window.output[-1].WhichOneof("item") == "compaction"
        await session.create(model="m", input=list(window.output), store=False)
        fresh = (await session.until_terminal()).completed.response
        assert fresh.status == "completed" and fresh.usage.input_tokens < window.usage.input_tokens
        await session.close()
    finally:
        await stop()


async def test_safety_block_mode_rejects_credentials_and_flag_mode_lets_them_through():
    secret = "here is my key AKIAABCDEFGHIJKLMNOP do not share"
    engine, channel, stop = await serve(make_config(safety={"mode": "block"}))
    try:
        session = RawSession(channel)
        await session.create(model="m", input=secret, store=False)
        err = (await session.until_terminal()).error.error
        assert (err.code, err.param) == (errors.CONTENT_BLOCKED, "input[0]")
        assert "AKIA" not in err.message  # the secret is not echoed back
        await session.close()
    finally:
        await stop()
    engine, channel, stop = await serve(make_config(safety={"mode": "flag"}))
    try:
        session = RawSession(channel)
        await session.create(model="m", input=secret, store=False)
        assert (await session.until_terminal()).WhichOneof("event") == "completed"
        assert b'tether_safety_findings_total{kind="aws_access_key"} 1.0' in engine.telemetry.render()
        await session.close()
    finally:
        await stop()


async def test_stateless_create_rpc_streams_one_response(channel):
    stub = service_pb2_grpc.ResponsesServiceStub(channel)
    params = request_pb2.ResponseCreateParams(model="m", input_text="hello", store=True)
    events = [ev async for batch in stub.CreateResponse(service_pb2.CreateResponseRequest(params=params)) for ev in batch.events]
    assert events[0].WhichOneof("event") == "created" and events[-1].WhichOneof("event") == "completed"
    rid = events[-1].completed.response.id
    # HTTP-style continuation: previous_response_id hydrates from the store.
    params = request_pb2.ResponseCreateParams(model="m", input_text="again", previous_response_id=rid)
    events = [ev async for batch in stub.CreateResponse(service_pb2.CreateResponseRequest(params=params)) for ev in batch.events]
    assert events[-1].completed.response.usage.input_tokens > 0
    bad = request_pb2.ResponseCreateParams(model="m", input_text="x", previous_response_id="resp_missing")
    events = [ev async for batch in stub.CreateResponse(service_pb2.CreateResponseRequest(params=bad)) for ev in batch.events]
    assert [ev.error.error.code for ev in events] == [errors.PREVIOUS_RESPONSE_NOT_FOUND]


async def test_stateless_create_rpc_sends_a_message_per_batch_not_per_event(channel):
    """A create streams batches, as every stream does (`ResponsesAPI.create`): what is ready
    together (`created`, `in_progress`, the first item...) is one message, not one each."""
    stub = service_pb2_grpc.ResponsesServiceStub(channel)
    params = request_pb2.ResponseCreateParams(model="m", input_text="hello", store=False)
    messages = [list(m.events) async for m in stub.CreateResponse(service_pb2.CreateResponseRequest(params=params))]
    events = [ev for m in messages for ev in m]
    assert events[0].WhichOneof("event") == "created" and events[-1].WhichOneof("event") == "completed"
    assert [ev.sequence_number for ev in events] == list(range(len(events)))
    assert len(messages) < len(events)


async def test_rate_limits_per_key_answer_429_with_a_retry_hint():
    engine, channel, stop = await serve(make_config(limits={"requests_per_minute": 2}))
    try:
        session = RawSession(channel)
        for _ in range(2):
            await session.create(model="m", input="hi", store=False)
            assert (await session.until_terminal()).WhichOneof("event") == "completed"
        await session.create(model="m", input="hi", store=False)
        err = (await session.until_terminal()).error.error
        assert (err.code, err.status) == (errors.RATE_LIMIT_EXCEEDED, 429)
        assert 0 < err.retry_after_s <= 30
        await session.close()
    finally:
        await stop()
