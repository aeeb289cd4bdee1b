"""Regressions for what an outside red-team run broke (issue 11), one test per finding, each
against the real bridge (or the real post-inference worker over a real store). No wall-clock
assertions: deadlines bound the waits, the assertions are on replies, counts and sizes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import grpc
import pytest
from websockets.exceptions import ConnectionClosed

from tests.bridge.helpers import wait_for
from tether import render
from tether.backends.base import BackendBase, BackendRequest, Finish, TextDelta, Usage
from tether.bridge.ws_transport import GuardedWebSocketProtocol
from tether.core.postinference import PostInference, PostJob
from tether.responses.v1 import service_pb2, service_pb2_grpc
from tether.store.base import ResponseRecord, UsageRecord
from tether.store.memory import MemoryStore

from .support import (
    CREATE,
    KEY_A,
    KEY_B,
    full_stack,
    instant_config,
    local_adapter,
    metric,
    recv_json,
    recv_response,
    send_json,
    slow_reader,
    with_backend,
    with_models,
)


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes; a deadline, not a measurement."""
    try:
        return await asyncio.wait_for(reader.read(), 30)
    except ConnectionResetError:
        return b""


def _ws_sockets(stack: Any) -> list[GuardedWebSocketProtocol]:
    return [p for p in stack.bridge._server.server_state.connections if isinstance(p, GuardedWebSocketProtocol)]


UPGRADE = (
    b"GET /v1/responses HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
    b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n"
)


# -- 1. an upgrade the WebSocket parser refuses is answered ------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(b"x-big: " + b"a" * 9000 + b"\r\n", id="one-line-over-8KiB"),
        pytest.param(b"".join(b"x-h%d: v\r\n" % i for i in range(130)), id="130-headers"),
    ],
)
async def test_ws_upgrade_with_an_oversized_header_gets_431_and_closes(extra: bytes) -> None:
    """Within `http_max_header_bytes` (so h11 and the app's check pass it on) but past the
    `websockets` parser's limits: before the fix the upgrade got no reply and the socket stayed
    open forever (the head deadline had already stopped). Now: 431 with the JSON error, then EOF."""
    async with full_stack() as stack:
        reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
        writer.write(UPGRADE + extra + b"\r\n")
        reply = await _read_all(reader)  # EOF: the server closed the socket
        writer.close()
        assert reply.startswith(b"HTTP/1.1 431 "), reply[:200]
        assert b'"code":"request_header_fields_too_large"' in reply
        await wait_for(lambda: not _ws_sockets(stack), 10)


# -- 2. a client that stops reading --------------------------------------------------------------------


async def _stalled_client(stack: Any, key: str = KEY_A) -> Any:
    """A WebSocket client that reads nothing after the handshake (small buffers both ends)."""
    conn, proto = await slow_reader(stack, key)
    conn.transport.pause_reading()
    return conn, proto


async def test_client_that_stops_reading_is_aborted_and_frees_its_slot() -> None:
    """One connection allowed per key. The client asks for 800 KiB and reads none of it. Before
    the fix the socket and the key's slot were held forever (the close frame could never be
    flushed). Now the write deadline (`ws_send_timeout_s`) aborts the transport, the session
    closes with it, and the key's one slot is free for a new connection that completes a turn."""
    config = instant_config(max_connections_per_key=1, outbound_buffer_events=8)
    config.server.ws_send_timeout_s = 0.3
    with_backend(config, "hose", "hardening_firehose", chunks=800, chunk_bytes=1024)
    with_models(config, {"hose": {"backend": "hose"}, "*": {"backend": "sim"}})
    async with full_stack(config) as stack:
        conn, proto = await _stalled_client(stack)
        await send_json(conn, {**CREATE, "model": "hose"})
        await wait_for(lambda: proto not in _ws_sockets(stack), 30)
        await wait_for(lambda: not stack.engine.sessions, 10)
        async with stack.ws(KEY_A) as again:  # the slot is free: no 429
            await send_json(again, CREATE)
            assert (await recv_response(again))[-1]["type"] == "response.completed"
        conn.transport.abort()


async def test_the_per_key_slot_is_the_sessions_even_while_its_socket_lingers() -> None:
    """One count of connections per key, the engine's. A client asks for 100 KiB and reads
    none of it; the answer is generated (it fits in the outbox and the socket buffers), the idle
    timeout ends the session, and the socket lingers (its close frame cannot be flushed; the
    write deadline is set far off here). Before, the bridge kept its own count, held until the
    socket went: a new connection got 429 while `tether_connections` read 0. Now the slot went
    with the session, and a new connection completes a turn while the old socket is still open."""
    config = instant_config(max_connections_per_key=1, idle_timeout_s=0.5)
    config.server.ws_send_timeout_s = 600
    with_backend(config, "hose", "hardening_firehose", chunks=100, chunk_bytes=1024)
    with_models(config, {"hose": {"backend": "hose"}, "*": {"backend": "sim"}})
    async with full_stack(config) as stack:
        conn, proto = await _stalled_client(stack)
        await send_json(conn, {**CREATE, "model": "hose"})
        await wait_for(lambda: not stack.engine.sessions, 30)  # the idle timeout ended it
        assert metric(stack.engine, "tether_connections", transport="websocket") == 0
        async with stack.ws(KEY_A) as again:
            await send_json(again, CREATE)
            assert (await recv_response(again))[-1]["type"] == "response.completed"
            assert proto in _ws_sockets(stack)  # the first socket is still there
        conn.transport.abort()


# -- 3. ping flood -------------------------------------------------------------------------------------

PING = b"\x89\x80" + os.urandom(4)  # a masked ping frame, empty payload


async def test_ping_flood_memory_is_bounded_and_the_connection_closed() -> None:
    """The client sends up to 2 MiB of pings and reads no pong. Before the fix the server read
    them all and queued every pong in its transport (RSS grew without bound). Now it stops
    reading while its writes are paused: its unsent bytes stay below a small bound, the client's
    own sends back up instead, and the write deadline closes the connection."""
    config = instant_config()
    config.server.ws_send_timeout_s = 0.3
    async with full_stack(config) as stack:
        conn, proto = await _stalled_client(stack, KEY_B)
        peak = 0
        batch = PING * 1000
        for _ in range(350):  # at most 2 MiB of pings (~350,000)
            if conn.transport.is_closing() or conn.transport.get_write_buffer_size() > 256 * 1024:
                break  # the server stopped reading
            conn.transport.write(batch)
            await asyncio.sleep(0)
            peak = max(peak, proto.transport.get_write_buffer_size())
        await wait_for(lambda: proto not in _ws_sockets(stack), 30)
        peak = max(peak, proto.transport.get_write_buffer_size())
        assert peak < 512 * 1024, peak  # one read's worth of pongs at most
        conn.transport.abort()


# -- 4. dense text ---------------------------------------------------------------------------------------

DENSE = {
    "cjk": ("中", 600_000),
    "emoji": ("\U0001f600", 1_000_000),
    "combining": ("a\u0301", 200_000),
}


@pytest.mark.parametrize("name", list(DENSE))
def test_dense_text_is_counted_exactly(name: str) -> None:
    """The tokenizer refuses one call of more than 200,000 tokens; these texts have up to a
    million. `render.encode` cuts by what the tokenizer accepts (bytes), and the count is exact:
    the per-unit count the tokenizer gives on a short sample, times the repetitions."""
    unit, n = DENSE[name]
    per_unit = len(render.encode(unit * 1000)) // 1000
    assert len(render.encode(unit * n)) == per_unit * n


@pytest.mark.parametrize("name", list(DENSE))
async def test_dense_text_over_http_is_counted_or_refused_never_500(name: str) -> None:
    unit, n = DENSE[name]
    text = unit * n
    expected = len(render.encode(text))
    async with full_stack() as stack, stack.http() as http:
        r = await http.post("/v1/responses/input_tokens", json={"model": "sim-model", "input": text})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["input_tokens"] >= expected
        r = await http.post("/v1/responses", json={"model": "sim-model", "input": text, "store": False})
        if expected < stack.config.limits.max_input_tokens:
            assert r.status_code == 200 and r.json()["status"] == "completed", r.text[:300]
        else:
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]


# -- 5. deleting a response while a continuation of it runs ---------------------------------------


@dataclasses.dataclass
class GateConfig:
    pass


class Gate(BackendBase):
    """A backend that answers only when the test opens the gate (`Gate.open`)."""

    kind: ClassVar[str] = "hardening_gate"
    Config: ClassVar[type] = GateConfig
    started: ClassVar[asyncio.Event]
    open: ClassVar[asyncio.Event]

    def __init__(self, name: str, config: Any = None) -> None:
        self.name = name
        Gate.started, Gate.open = asyncio.Event(), asyncio.Event()

    async def stream(self, request: BackendRequest) -> AsyncIterator[Any]:
        Gate.started.set()
        await Gate.open.wait()
        yield TextDelta("the answer")
        yield Finish("stop", Usage(input_tokens=request.input_tokens, output_tokens=2))


local_adapter(Gate)


async def test_deleting_a_parent_while_its_continuation_runs_loses_nothing() -> None:
    """P is stored; C (store=true) continues it; P is deleted while C generates; G continues C
    right after. Before the fix C and G got `response.completed` but were never stored or billed
    (`MissingItemError`, retried for seconds on the shared workers). Now C is written again with
    every item it references (from the chain in memory), G after it; both are retrievable, C's
    input still holds P's, both are in the ledger, and the repair is counted, with no retry."""
    config = with_models(with_backend(instant_config(), "gate", "hardening_gate"), {"gate": {"backend": "gate"}, "*": {"backend": "sim"}})
    async with full_stack(config) as stack, stack.ws() as conn, stack.http() as http:
        engine = stack.engine
        await send_json(conn, {**CREATE, "store": True, "input": "the parent's question"})
        parent = (await recv_response(conn))[-1]["response"]
        await engine.post.flush()
        await send_json(conn, {**CREATE, "model": "gate", "store": True, "previous_response_id": parent["id"], "input": "go on"})
        await asyncio.wait_for(Gate.started.wait(), 10)
        assert (await http.delete(f"/v1/responses/{parent['id']}")).status_code == 200
        Gate.open.set()
        child = (await recv_response(conn))[-1]["response"]
        assert child["status"] == "completed"
        await send_json(conn, {**CREATE, "store": True, "previous_response_id": child["id"], "input": "and then"})
        grandchild = (await recv_response(conn))[-1]["response"]
        await engine.post.flush()
        for rid in (child["id"], grandchild["id"]):
            assert (await http.get(f"/v1/responses/{rid}")).status_code == 200, rid
        items = (await http.get(f"/v1/responses/{child['id']}/input_items", params={"order": "asc"})).json()["data"]
        assert items[0]["content"][0]["text"] == "the parent's question"
        billed = {u.response_id for u in await engine.store.usage_records("a")}
        assert {child["id"], grandchild["id"]} <= billed
        assert metric(engine, "tether_post_inference_failures_total", reason="repaired") == 1
        assert metric(engine, "tether_post_inference_failures_total", reason="retried") == 0
        assert metric(engine, "tether_post_inference_failures_total", reason="permanent") == 0


class FailingStore(MemoryStore):
    """A memory store whose writes for one tenant fail: with a transient error (the server is
    unreachable) or a permanent one (a bad value). Counts the calls per tenant."""

    def __init__(self, failures: dict[str, Exception]) -> None:
        super().__init__()
        self.failures = failures
        self.calls: dict[str, int] = {}

    async def put_response(self, record: ResponseRecord) -> None:
        self.calls[record.tenant] = self.calls.get(record.tenant, 0) + 1
        if record.tenant in self.failures:
            raise self.failures[record.tenant]
        await super().put_response(record)


def _job(tenant: str, store: MemoryStore) -> PostJob:
    from tether.responses.v1 import response_pb2

    rid = f"resp_{tenant}"
    response = response_pb2.Response(id=rid, model="m", status="completed")
    usage = UsageRecord(tenant, rid, "m", "b", 1, 0, 1, 0, "completed", 0.0)
    return PostJob(usage=usage, record=ResponseRecord(tenant, response, [], [], []))


async def test_one_tenants_failing_writes_do_not_delay_anothers_and_permanent_ones_are_not_retried() -> None:
    """One worker. Tenant "down"'s store is unreachable (retried with backoff), tenant "bad"'s
    write is refused for good (ValueError), tenant "ok" writes normally. Before the fix the one
    worker slept through every retry of "down" before "ok"'s write, and "bad"'s was retried 8
    times. Now "ok" is durable while "down" still waits for its next attempt, "bad" was tried
    once, and every failed attempt is counted by reason."""
    reasons: list[str] = []
    store = FailingStore({"down": ConnectionRefusedError("store unreachable"), "bad": ValueError("bad value")})
    post = PostInference(store, workers=1, max_attempts=50, on_failure=reasons.append)
    try:
        for tenant in ("down", "bad", "ok"):
            post.submit(_job(tenant, store))
        await asyncio.wait_for(post.wait_durable("ok", "resp_ok"), 10)
        assert await store.get_response("ok", "resp_ok") is not None
        assert ("down", "resp_down") in post._pending  # still waiting for a later attempt
        assert store.calls["bad"] == 1 and reasons.count("permanent") == 1
        assert reasons.count("retried") == store.calls["down"] >= 1
    finally:
        store.failures.pop("down")  # let it succeed, so the worker can be flushed and closed
        await asyncio.wait_for(post.aclose(), 30)
    assert await store.get_response("down", "resp_down") is not None
    assert post.failed == 1 and post.completed == 2


# -- also found: counting, duplicate keys, log noise ------------------------------------------------


async def test_grpc_turn_past_its_deadline_is_counted() -> None:
    """A gRPC `Session` call whose deadline passes mid-generation: the turn ends without a
    terminal event and is counted (`tether_turns_total{outcome="client_gone"}`, and in
    `tether_errors_total`), which it was not before."""
    async with full_stack(instant_config({"tokens_per_s": 200, "output_tokens": 5000})) as stack:
        engine = stack.engine
        async with stack.channel() as channel:
            stub = service_pb2_grpc.ResponsesServiceStub(channel)
            call = stub.Session(metadata=(("authorization", f"Bearer {KEY_A}"),), timeout=1.0)
            request = service_pb2.SessionRequest()
            request.create.model, request.create.input_text = "sim-model", "x"
            request.create.store = False  # a stored response would run on (docs/background.md)
            await call.write(request)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_for(lambda: not engine.sessions, 10)
        assert metric(engine, "tether_turns_total", transport="grpc", outcome="client_gone") == 1
        assert metric(engine, "tether_errors_total", code="client_gone") == 1


async def test_connection_level_ws_errors_are_counted() -> None:
    """Frames that never reach the session (bad JSON, an unknown event type, a binary frame) are
    answered by the bridge; they are now counted in `tether_errors_total` like any other error."""
    async with full_stack() as stack, stack.ws() as conn:
        engine = stack.engine
        await conn.send("{not json")
        assert (await recv_json(conn))["error"]["code"] == "invalid_json"
        await send_json(conn, {"type": "response.nonsense"})
        assert (await recv_json(conn))["error"]["code"] == "unknown_event_type"
        await conn.send(b"\x00binary")
        assert (await recv_json(conn))["error"]["code"] == "invalid_request"
        assert metric(engine, "tether_errors_total", code="invalid_json") == 1
        assert metric(engine, "tether_errors_total", code="unknown_event_type") == 1
        assert metric(engine, "tether_errors_total", code="invalid_request") == 1


async def test_two_authorization_headers_are_refused_on_http_ws_and_grpc() -> None:
    """HTTP used the first of two `Authorization` headers and gRPC the last, so the same request
    meant different keys on different transports. Now both refuse it (401 / UNAUTHENTICATED),
    whichever order the keys come in, even when one of them is valid."""
    async with full_stack() as stack:
        for first, second in ((KEY_A, "sk-wrong"), ("sk-wrong", KEY_A), (KEY_A, KEY_B)):
            pair = [(b"authorization", f"Bearer {first}".encode()), (b"authorization", f"Bearer {second}".encode())]
            reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
            head = b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in pair)
            writer.write(head + b"connection: close\r\n\r\n")
            reply = await _read_all(reader)
            writer.close()
            assert reply.startswith(b"HTTP/1.1 401 ") and b'"code":"invalid_api_key"' in reply, reply[:200]
            reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
            writer.write(UPGRADE + b"".join(k + b": " + v + b"\r\n" for k, v in pair) + b"\r\n")
            reply = await _read_all(reader)
            writer.close()
            assert reply.startswith(b"HTTP/1.1 401 "), reply[:200]
            async with stack.channel() as channel:
                stub = service_pb2_grpc.ResponsesServiceStub(channel)
                metadata = (("authorization", f"Bearer {first}"), ("authorization", f"Bearer {second}"))
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.ListModels(service_pb2.ListModelsRequest(), metadata=metadata)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_invalid_utf8_frames_log_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    async with full_stack() as stack:
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
            writer.write(UPGRADE + f"authorization: Bearer {KEY_A}\r\n\r\n".encode())
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"\x81\x82" + b"\x00\x00\x00\x00" + b"\xff\xfe")  # a text frame, not UTF-8
            reply = await _read_all(reader)
            writer.close()
            assert reply[:2] == b"\x88\x02" and reply[2:4] == (1007).to_bytes(2, "big"), reply  # close 1007
    lines = [r for r in caplog.records if "UTF-8" in r.getMessage()]
    assert len(lines) == 3
    assert all(r.exc_info is None and r.levelname == "WARNING" for r in lines)


# -- degraded: permessage-deflate inflation ----------------------------------------------------------


async def test_inflation_is_capped_by_the_process_budget_during_decompression() -> None:
    """`ws_receive_budget_bytes` (here 2 MiB) caps what a message may inflate to, below the
    transport cap (4 x 1 MiB): a 3 MiB deflate bomb (a few KB on the wire) is refused with 1009
    while inflating, never held whole; within the budget an oversize message is still the
    in-band `request_too_large`; messages the budget holds are given back when the app takes
    them (the budget reads 0 after), so ordinary traffic goes on."""
    limit = 1024 * 1024
    config = instant_config(max_request_bytes=limit)
    config.server.ws_receive_budget_bytes = 2 * limit
    async with full_stack(config) as stack:
        async with stack.ws(compression="deflate") as conn:
            [proto] = _ws_sockets(stack)
            await conn.send("x" * (limit + limit // 2))  # within the budget: the app refuses it in-band
            assert (await recv_json(conn))["error"]["code"] == "request_too_large"
            await conn.send("x" * (3 * limit))  # past the budget, under the 4 MiB transport cap
            with pytest.raises(ConnectionClosed):
                await recv_json(conn)
            assert conn.close_code == 1009
        assert proto.budget.held == 0
        async with stack.ws(compression="deflate") as conn:
            await send_json(conn, CREATE)
            assert (await recv_response(conn))[-1]["type"] == "response.completed"
