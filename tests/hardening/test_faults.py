"""Faults, end to end: a misbehaving upstream, a vanishing or slow client, `kill -9` and SIGTERM
of a real `tether serve` process. Each row of the fault matrix in docs/reliability.md is a check
here. No wall-clock assertions: upstream timeouts are short, but every assertion is on events,
codes and counts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from openai.types.responses import Response
from pydantic import TypeAdapter
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.bridge.helpers import check_sse_events, is_terminal, recv_until, sse_frames, wait_for
from tests.fakes.chat_server import (
    ABORT,
    FakeChatServer,
    completion,
    http_error,
    mid_stream_error,
    no_done,
    paced,
    rate_limited,
    slow,
    stall,
    text,
)
from tests.support.grpc_client import RawSession
from tests.support.validator import validate_events
from tether.errors import response_code
from tether.responses.v1 import service_pb2, service_pb2_grpc
from tether_lab.load import write_config
from tether_lab.processes import ServerProcess

from .support import (
    CREATE,
    KEY_A,
    Firehose,
    full_stack,
    instant_config,
    metric,
    recv_json,
    recv_response,
    recv_turn,
    send_json,
    slow_reader,
    with_backend,
    with_models,
    ws_error,
)

UPSTREAM_KEY = "upstream-key"


def upstream_config(fake: FakeChatServer, **limits: Any):
    config = instant_config(**limits)
    with_backend(
        config, "up", "openai", base_url=fake.base_url, api_key=UPSTREAM_KEY, max_retries=2,
        retry_initial_delay_s=0.01, retry_max_delay_s=0.05, stream_idle_timeout_s=0.5,
    )  # fmt: skip
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    with_backend(
        config, "down", "openai", base_url=f"http://127.0.0.1:{dead}/v1", max_retries=1,
        retry_initial_delay_s=0.01, retry_max_delay_s=0.05,
    )  # fmt: skip
    return with_models(config, {"down": {"backend": "down"}, "*": {"backend": "up"}})


@pytest.fixture
def fake():
    with FakeChatServer(api_key=UPSTREAM_KEY, lifetime_s=120) as server:
        yield server


# (name, scenarios pushed for the failing turn, model, terminal type, error code, upstream calls)
FAULTS: list[tuple[str, list[Any], str, str, str | None, int]] = [
    ("500 before the stream, then ok", [http_error(500), text("recovered")], "m", "response.completed", None, 2),
    ("503 before the stream, then ok", [http_error(503), text("recovered")], "m", "response.completed", None, 2),
    ("429 + retry-after-ms, then ok", [rate_limited(retry_after_ms=20), text("ok")], "m", "response.completed", None, 2),
    ("429 + retry-after (s), then ok", [rate_limited(None, "0"), text("ok")], "m", "response.completed", None, 2),
    ("500 on every attempt", [http_error(500)] * 3, "m", "response.failed", "backend_error", 3),
    ("429 on every attempt", [rate_limited()] * 3, "m", "response.failed", "rate_limit_exceeded", 3),
    ("400 from upstream (not retried)", [http_error(400)], "m", "response.failed", "invalid_request", 1),
    ("error mid-stream", [mid_stream_error()], "m", "response.failed", "backend_error", 1),
    ("stalled stream", [stall(after_chunks=1, seconds=10)], "m", "response.failed", "backend_timeout", 1),
    ("EOF without [DONE]", [no_done()], "m", "response.failed", "backend_error", 1),
    ("socket dropped mid-body", [completion(done=False, usage_mode="none", tail=[ABORT])], "m",
     "response.failed", "backend_error", 1),
    ("upstream unreachable", [], "down", "response.failed", "backend_error", 0),
]  # fmt: skip


async def test_upstream_fault_matrix_over_websocket(fake: FakeChatServer) -> None:
    """Each fault hits a continuation of a store=false parent and of a store=true parent on one
    connection. Then: the failed turn's code is right; the session goes on; a store=false parent
    is evicted (continuing from it is `previous_response_not_found`), a stored one is hydrated
    again from the store; nothing is left running."""
    async with full_stack(upstream_config(fake)) as stack, stack.ws() as conn:
        engine = stack.engine

        async def turn(**extra: Any) -> dict[str, Any]:
            await send_json(conn, {**CREATE, **extra})
            return (await recv_turn(conn))[-1]

        for name, scenarios, model, terminal, code, calls in FAULTS:
            for store in (False, True):
                fake.push(text("parent"))
                parent = await turn(input="parent", store=store)
                assert parent["type"] == "response.completed", name
                pid = parent["response"]["id"]
                before = len(fake.chat_requests)
                disconnects = fake.disconnects
                fake.push(*scenarios)
                got = await turn(model=model, input="the faulty turn", previous_response_id=pid, store=store)
                assert got["type"] == terminal, (name, store, got)
                assert len(fake.chat_requests) - before == calls, name
                if code is None:
                    assert got["response"]["status"] == "completed", name
                    continue
                error = got["response"]["error"]
                assert (error["code"], error["tether_code"]) == (response_code(code), code), (name, error)
                if name == "stalled stream":  # we hung up on the stalled upstream
                    assert await fake.disconnected(within=10, count=disconnects + 1)
                # The failed turn evicted its parent from the connection cache.
                if store:
                    fake.push(text("again"))
                again = await turn(input="retry", previous_response_id=pid, store=store)
                if store:
                    assert again["type"] == "response.completed", name  # hydrated from the store
                else:
                    ws_error(again, "previous_response_not_found")
                    fake.push(text("fresh"))
                    assert (await turn(input="fresh start"))["type"] == "response.completed", name
            assert not fake._queue, name  # every scripted reply was consumed as planned
        assert metric(engine, "tether_backend_retries_total", backend="up") >= 8
        assert metric(engine, "tether_active_responses") == 0
    await wait_for(lambda: not engine.sessions)


async def test_pre_stream_faults_over_http_and_grpc(fake: FakeChatServer) -> None:
    """The same upstream faults through the stateless HTTP create (SSE and JSON) and a gRPC
    session: a retried success, or an HTTP 200 carrying `response.failed` with the code."""
    async with full_stack(upstream_config(fake)) as stack, stack.http() as h, stack.channel() as channel:
        fake.push(rate_limited(retry_after_ms=10), text("ok"))
        r = await h.post("/v1/responses", json={"model": "m", "input": "x", "store": False})
        assert r.status_code == 200 and r.json()["status"] == "completed"
        fake.push(http_error(500), http_error(500), http_error(500))
        r = await h.post("/v1/responses", json={"model": "m", "input": "x", "stream": True, "store": False})
        assert r.status_code == 200
        assert '"type":"response.failed"' in r.text and '"tether_code":"backend_error"' in r.text
        fake.push(mid_stream_error())
        r = await h.post("/v1/responses", json={"model": "m", "input": "x", "store": False})
        assert r.status_code == 200 and r.json()["status"] == "failed"
        session = RawSession(channel, api_key=KEY_A)
        fake.push(stall(after_chunks=1, seconds=10), text("ok"))
        await session.create(model="m", input="x", store=False)
        end = await session.until_terminal()
        assert end.WhichOneof("event") == "failed" and end.failed.response.error.code == "backend_timeout"
        await session.create(model="m", input="x", store=False)
        assert (await session.until_terminal()).WhichOneof("event") == "completed"
        validate_events(session.json_events())
        session.call.cancel()


def _no_tether_tasks() -> bool:
    names = [t.get_name() for t in asyncio.all_tasks()]
    return not any(n.startswith(("tether-lane", "tether-watch", "ws-")) for n in names)


async def test_client_vanishing_mid_stream_cancels_upstream_and_frees_everything(
    fake: FakeChatServer,
) -> None:
    # Responses that are not stored (store=false) go with their client; a stored one runs on or is
    # cancelled per `on_client_gone` (below, and tests/bridge/test_background.py).
    async with full_stack(upstream_config(fake)) as stack:
        engine = stack.engine
        # WebSocket: the TCP connection is dropped (no close frame) after the first delta.
        fake.push(slow(count=500, interval=0.02))
        conn = await connect(stack.ws_url, additional_headers={"Authorization": f"Bearer {KEY_A}"})
        await send_json(conn, {**CREATE, "store": False})
        await recv_until(conn, lambda e: e["type"] == "response.output_text.delta")
        conn.transport.abort()
        assert await fake.disconnected(within=10, count=1)
        # HTTP SSE: the client closes the stream after the first delta.
        fake.push(slow(count=500, interval=0.02))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=10) as h:
            body = {"model": "m", "input": "x", "stream": True, "store": False}
            async with h.stream(
                "POST", "/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY_A}"}
            ) as r:
                async for line in r.aiter_lines():
                    if "output_text.delta" in line:
                        break
        assert await fake.disconnected(within=10, count=2)
        # gRPC: the call is cancelled after the first delta.
        fake.push(slow(count=500, interval=0.02))
        async with stack.channel() as channel:
            session = RawSession(channel, api_key=KEY_A)
            await session.create(model="m", input="x", store=False)
            while (await session.next_event()).WhichOneof("event") != "output_text_delta":
                pass
            session.call.cancel()
            assert await fake.disconnected(within=10, count=3)
        # Nothing is left: sessions, connection counts, turns, cache bytes, tasks.
        await wait_for(lambda: not engine.sessions, 10)
        await wait_for(lambda: not stack.bridge.app.connections, 10)
        assert metric(engine, "tether_active_responses") == 0
        assert engine.cache_budget.used == 0
        await wait_for(_no_tether_tasks, 10)
        await engine.post.flush()
        # No response was completed, so none was stored or billed.
        assert await engine.store.usage_records() == []
        # Each abandoned turn is counted as one (they were missing from both counters).
        for transport in ("websocket", "http", "grpc"):
            assert metric(engine, "tether_turns_total", transport=transport, outcome="client_gone") == 1, transport
        assert metric(engine, "tether_errors_total", code="client_gone") == 3


async def test_a_stored_response_whose_client_vanished_is_cancelled_upstream_and_stored(
    fake: FakeChatServer,
) -> None:
    """`on_client_gone = "cancel"`: the upstream call is closed at once, as for a response that is
    not stored, and the response is stored `cancelled` with what was generated."""
    config = upstream_config(fake)
    config.limits.on_client_gone = "cancel"
    async with full_stack(config) as stack:
        engine = stack.engine
        fake.push(slow(count=500, interval=0.02))
        conn = await connect(stack.ws_url, additional_headers={"Authorization": f"Bearer {KEY_A}"})
        await send_json(conn, {**CREATE, "store": True})
        created = await recv_until(conn, lambda e: e["type"] == "response.created")
        await recv_until(conn, lambda e: e["type"] == "response.output_text.delta")
        conn.transport.abort()
        assert await fake.disconnected(within=10, count=1)
        await wait_for(lambda: not engine.sessions, 10)
        await engine.post.flush()
        response_id = created[-1]["response"]["id"]
        stored = await engine.store.get_response("a", response_id)
        assert stored is not None and stored.status == "cancelled" and stored.output
        assert engine.cache_budget.used == 0
        await wait_for(_no_tether_tasks, 10)


def _server_socket(stack: Any, client_port: int) -> Any:
    """The bridge's end of a connection (uvicorn's protocol objects know the peer's port)."""
    for proto in stack.bridge._server.server_state.connections:
        if getattr(proto, "client", None) and proto.client[1] == client_port:
            return proto.transport.get_extra_info("socket")
    raise AssertionError("connection not found")


async def test_session_close_survives_a_second_cancel() -> None:
    """F3 (fixed: `Session.close` is shielded): cancelling `close()` while it awaits the lane
    workers must still free the session. grpc cancels a gone client's handler twice, which hit
    exactly this and leaked the session, its cached chains and its per-key slot."""
    async with full_stack() as stack:
        engine = stack.engine
        session = await engine.open_session("a", transport="grpc")
        req = service_pb2.SessionRequest()
        req.create.model, req.create.input_text, req.create.store = "m", "x", False
        await session.send(req)
        async for batch in session.events():
            if any(ev.WhichOneof("event") == "completed" for ev in batch):
                break
        await session.wait_idle()
        closing = asyncio.create_task(session.close())
        await asyncio.sleep(0)  # close() is now waiting for the (finished) lane workers
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)
        assert session not in engine.sessions


@pytest.mark.parametrize("how", ["cancel", "channel-close"])
async def test_grpc_client_gone_after_a_turn_frees_its_session(how: str) -> None:
    async with full_stack(instant_config(max_connections_per_key=1)) as stack:
        channel = stack.channel()
        session = RawSession(channel, api_key=KEY_A)
        await session.create(model="m", input="x", store=False)
        assert (await session.until_terminal()).WhichOneof("event") == "completed"
        if how == "cancel":
            session.call.cancel()
        else:
            await channel.close()
        try:
            await wait_for(lambda: not stack.engine.sessions, 5)
        finally:
            await channel.close()
        async with stack.ws(KEY_A):  # the key's only slot is free again
            pass


async def _completed_stream(conn: Any) -> dict:
    """What a reader that resumes gets: its whole stream, valid, ending in a completed response."""
    events = await recv_until(conn, is_terminal, within=60)
    validate_events(events)
    done = events[-1]["response"]
    assert done["status"] == "completed"
    return done


async def test_slow_client_blocks_only_its_own_stream() -> None:
    """A reader that stops reading fills the socket buffers (made small on both ends), then its
    bounded outbox, then its own generation waits; another connection's response completes
    meanwhile. Counts only: the queue never exceeds `outbound_buffer_events`, the stalled
    generation pulls nothing more while the other one runs, and once the reader resumes its whole
    stream arrives intact."""
    chunks, limit = 800, 8  # 800 KiB of text, far more than the shrunken buffers hold
    # About 200,000 tokens of output: past the default output cap, which Tether enforces.
    config = instant_config(outbound_buffer_events=limit, max_coalesced_bytes=4096, max_output_tokens=1_000_000)
    with_backend(config, "hose", "hardening_firehose", chunks=chunks, chunk_bytes=1024)
    with_models(config, {"hose": {"backend": "hose"}, "*": {"backend": "sim"}})
    async with full_stack(config) as stack:
        engine = stack.engine
        slow_conn, _ = await slow_reader(stack)
        try:
            await send_json(slow_conn, {**CREATE, "model": "hose"})
            [slow_session] = list(engine.sessions)

            def stalled() -> bool:
                box = slow_session.outbox
                return len(box._queue) >= limit and not box._space.is_set()

            await wait_for(stalled, 30)
            pulled = Firehose.pulled["hose"]
            assert 0 < pulled < chunks
            async with stack.ws() as other:  # unaffected
                await send_json(other, CREATE)
                assert (await recv_response(other))[-1]["type"] == "response.completed"
            assert Firehose.pulled["hose"] == pulled  # the slow stream did not move meanwhile
            assert len(slow_session.outbox._queue) <= limit
            done = await _completed_stream(slow_conn)
        finally:
            await slow_conn.close()
        assert len(done["output"][0]["content"][0]["text"]) == chunks * 1024
        await wait_for(lambda: not engine.sessions, 10)


async def test_a_slow_client_of_a_real_upstream_stream_gets_it_whole_and_in_order(fake: FakeChatServer) -> None:
    """The same through a real upstream, whose tokens reach the turn in the upstream socket's
    callback (tether/core/intake.py): once the client's socket and then its outbox are full, a
    push no longer fits, the rest waits in order for the turn's task, which waits for room. The
    queue never exceeds `outbound_buffer_events`, and the whole stream arrives intact."""
    n, limit = 600, 4
    config = upstream_config(fake, outbound_buffer_events=limit, max_coalesced_bytes=64)
    fake.default = paced(n, 0.002)
    async with full_stack(config) as stack:
        slow_conn, _ = await slow_reader(stack)
        try:
            await send_json(slow_conn, CREATE)
            [session] = list(stack.engine.sessions)
            box = session.outbox
            await wait_for(lambda: len(box._queue) >= limit and not box._space.is_set(), 30)
            seen = []
            for _ in range(200):  # while it is held up
                seen.append(len(box._queue))
                await asyncio.sleep(0.005)
            assert max(seen) <= limit
            done = await _completed_stream(slow_conn)
        finally:
            await slow_conn.close()
    assert done["output"][0]["content"][0]["text"] == "".join(f" w{i}" for i in range(n))


async def test_bridge_connections_disable_nagle() -> None:
    """Every bridge connection (HTTP keep-alive and WebSocket) has TCP_NODELAY: without it, Nagle
    held each small write that followed an unacknowledged one until the client's delayed ACK,
    ~40 ms per WS turn and per keep-alive HTTP response (measured: WS turn p50 47 ms -> 3.4 ms)."""
    async with full_stack() as stack:
        async with stack.ws() as conn:
            await send_json(conn, CREATE)
            await recv_response(conn)
            port = conn.transport.get_extra_info("sockname")[1]
            assert _server_socket(stack, port).getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 10)
        port = writer.get_extra_info("sockname")[1]
        assert _server_socket(stack, port).getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writer.close()


@pytest.mark.parametrize("side", ["input", "output"])
async def test_items_of_a_million_characters(side: str) -> None:
    """Within `max_item_bytes` (8 MiB) an item of 1,000,000+ characters is legal, in the input or
    in the output; the turn must complete (and be stored), with no trailing `error`. (The output,
    about 275,000 tokens, needs an output cap above the default 128,000, which Tether enforces.)"""
    config = instant_config(max_output_tokens=1_000_000)
    with_backend(config, "hose", "hardening_firehose", chunks=1100, chunk_bytes=1000)
    with_models(config, {"hose": {"backend": "hose"}, "*": {"backend": "sim"}})
    async with full_stack(config) as stack, stack.ws() as conn:
        body = {**CREATE, "store": True}
        if side == "input":
            body["input"] = "word " * 220_000
        else:
            body["model"] = "hose"
        await send_json(conn, body)
        events = await recv_turn(conn, within=60)
        assert events[-1]["type"] == "response.completed", events[-1]
        await send_json(conn, {"type": "response.cancel", "response_id": "resp_sentinel"})
        ws_error(await recv_json(conn), "response_not_found")  # nothing else came in between
        await stack.engine.post.flush()
        assert len(await stack.engine.store.usage_records()) == 1


# -- process faults -----------------------------------------------------------------------------

TOOL = {"type": "function", "name": "run_tests", "parameters": {"type": "object", "properties": {}}}
SLOW_STORE = """
import asyncio
from tether.store.sqlite import SqliteStore
_put = SqliteStore.put_response
async def _slow_put(self, record):
    await asyncio.sleep(0.5)
    return await _put(self, record)
SqliteStore.put_response = _slow_put
"""


async def _rollout(server: ServerProcess, turns: int, previous: str | None = None) -> list[str]:
    """A store=true tool loop of `turns` turns; the ids of the completed responses, in order.
    Before each next turn the previous response is fetched over HTTP, which waits until its store
    write is done: every turn but the last is durable whatever the durability mode."""
    done: list[str] = []
    auth = {"Authorization": f"Bearer {KEY_A}"}
    async with (
        connect(server.ws_url, additional_headers=auth) as conn,
        httpx.AsyncClient(base_url=server.base_url, headers=auth, timeout=30) as h,
    ):
        call_id = None
        for i in range(turns):
            body: dict[str, Any] = {**CREATE, "store": True, "tools": [TOOL]}
            if call_id:
                body["input"] = [{"type": "function_call_output", "call_id": call_id, "output": f"ok {i}"}]
            else:
                body["input"] = f"step {i}"
            if previous:
                body["previous_response_id"] = previous
                assert (await h.get(f"/v1/responses/{previous}")).status_code == 200
            await send_json(conn, body)
            end = (await recv_response(conn, within=30))[-1]
            assert end["type"] == "response.completed", end
            previous = end["response"]["id"]
            done.append(previous)
            calls = [o for o in end["response"]["output"] if o["type"] == "function_call"]
            call_id = calls[0]["call_id"] if calls else None
    return done


def _ledger(db: Path) -> list[str]:
    with sqlite3.connect(db) as c:
        return [row[0] for row in c.execute("SELECT response_id FROM usage ORDER BY created_at")]


@pytest.mark.parametrize("durability", ["before_terminal", "overlap"])
async def test_kill_9_mid_rollout_then_restart(tmp_path: Path, durability: str) -> None:
    """`kill -9` right after a turn's `response.completed`, with a store write that takes 0.5 s
    (so the crash always lands inside the write window). `before_terminal`: the completed turn is
    durable, the rollout continues from it after the restart, the ledger has exactly one record
    per completed response. `overlap` (the default): the last write is lost, as documented, but
    nothing is duplicated or half-written and the rollout continues from the last durable one."""
    db = tmp_path / "tether.db"
    config = write_config(tmp_path / "tether.toml", store=f"sqlite:///{db}")
    env = {"TETHER_API_KEYS": f"{KEY_A}:a"}
    args = ["--set", f"store_durability={durability}"]
    server = ServerProcess(config, args=args, env=env, prelude=SLOW_STORE).start()
    try:
        completed = await _rollout(server, 3)
        server.kill()  # the instant the client has seen the third completion
    finally:
        server.kill()
    lost = completed[-1:] if durability == "overlap" else []
    durable = [r for r in completed if r not in lost]
    assert sorted(_ledger(db)) == sorted(durable)  # one record each, nothing else
    with ServerProcess(config, env=env) as server:
        async with httpx.AsyncClient(
            base_url=server.base_url, headers={"Authorization": f"Bearer {KEY_A}"}
        ) as h:
            for rid in durable:
                assert (await h.get(f"/v1/responses/{rid}")).status_code == 200
            for rid in lost:
                assert (await h.get(f"/v1/responses/{rid}")).status_code == 404
        # Continue the rollout from the last durable response: the chain is intact.
        more = await _rollout(server, 2, previous=durable[-1])
        async with httpx.AsyncClient(
            base_url=server.base_url, headers={"Authorization": f"Bearer {KEY_A}"}
        ) as h:
            items = (await h.get(f"/v1/responses/{more[-1]}/input_items", params={"limit": 100})).json()
            assert len(items["data"]) >= 2 * len(durable)
    assert sorted(_ledger(db)) == sorted(durable + more)


async def test_sigterm_drains_and_exits_0(tmp_path: Path) -> None:
    """SIGTERM with a WS turn, a gRPC turn and an HTTP stream in flight and an idle WS: the idle
    socket closes at once (1001); new upgrades get 503 and /readyz 503 from the listener, still
    open; the in-flight turns finish; the WS closes with 1001, the gRPC stream with UNAVAILABLE;
    post-inference writes are flushed (the ledger has every completed response); the process
    exits 0."""
    db = tmp_path / "tether.db"
    config = write_config(
        tmp_path / "tether.toml", store=f"sqlite:///{db}",
        sim={"ttft_ms": 0, "tokens_per_s": 40, "output_tokens": 80, "tick_ms": 5},  # 2 s turns: the checks below run within them
        extra="\n[server]\nshutdown_grace_s = 30\n",
    )  # fmt: skip
    env = {"TETHER_API_KEYS": f"{KEY_A}:a"}
    auth = {"Authorization": f"Bearer {KEY_A}"}
    server = ServerProcess(config, env=env).start()
    try:
        async with (
            connect(server.ws_url, additional_headers=auth) as busy,
            connect(server.ws_url, additional_headers=auth) as idle,
            grpc.aio.insecure_channel(server.grpc_target) as channel,
            httpx.AsyncClient(base_url=server.base_url, headers=auth, timeout=60) as h,
        ):
            await send_json(busy, {**CREATE, "store": True})
            assert (await recv_json(busy))["type"] == "response.created"
            session = RawSession(channel, api_key=KEY_A)
            await session.create(model="m", input="x", store=True)
            assert (await session.next_event()).WhichOneof("event") == "created"
            body = {"model": "m", "input": "x", "stream": True, "store": True}
            async with h.stream("POST", "/v1/responses", json=body) as sse:
                lines = sse.aiter_lines()
                async for line in lines:
                    if "response.created" in line:
                        break
                os.kill(server.pid, signal.SIGTERM)
                ws_error(await recv_json(idle, within=30), "server_shutting_down", 503)
                with pytest.raises(ConnectionClosed):
                    await recv_json(idle)
                assert idle.close_code == 1001
                # New work is refused while the in-flight turns finish, by a listener that is
                # still open: an upgrade gets 503 (a load balancer retries it on another replica
                # instead of seeing a refused connection), and /readyz says 503 already.
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(server.ws_url, additional_headers=auth, open_timeout=10):
                        pass
                assert refused.value.response.status_code == 503
                async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as probe:
                    assert (await probe.get("/readyz")).status_code == 503
                late = service_pb2_grpc.ResponsesServiceStub(channel).Session(
                    metadata=(("authorization", f"Bearer {KEY_A}"),)
                )
                with pytest.raises(grpc.aio.AioRpcError) as rpc:
                    await late.read()
                assert rpc.value.code() == grpc.StatusCode.UNAVAILABLE
                rest = [line async for line in lines]
            assert any('"type":"response.completed"' in line for line in rest)
            events = await recv_until(busy, is_terminal, within=60)
            assert events[-1]["type"] == "response.completed"
            ws_error(await recv_json(busy, within=30), "server_shutting_down", 503)
            with pytest.raises(ConnectionClosed):
                await recv_json(busy)
            assert busy.close_code == 1001
            end = await session.until_terminal(timeout=60)
            assert end.WhichOneof("event") == "completed"
            with pytest.raises(grpc.aio.AioRpcError) as rpc:
                while (ev := await session.next_event(timeout=30)) is not None:
                    assert ev.error.error.code == "server_shutting_down"
                await session._reader
            assert rpc.value.code() == grpc.StatusCode.UNAVAILABLE
            stored = [events[-1]["response"]["id"], end.completed.response.id]
        assert server.proc is not None
        assert server.proc.wait(60) == 0, server.log_text()[-3000:]
    finally:
        server.kill()
    ledger = _ledger(db)
    assert set(stored) <= set(ledger) and len(ledger) == 3  # WS, gRPC and the HTTP stream


async def test_failed_response_parses_strictly_with_the_sdk_types(fake: FakeChatServer) -> None:
    """A response its backend failed after `response.created` (F8), on every JSON surface: the
    WebSocket `response.failed` event, the SSE one, the non-streaming HTTP body and `GET
    /v1/responses/{id}` each parse strictly with the SDK's types; `error.code` is the API's
    `server_error` and `error.tether_code` keeps Tether's `backend_error` (or `backend_timeout`)."""
    strict_response = TypeAdapter(Response)

    def check(response: dict[str, Any], code: str) -> None:
        strict_response.validate_python(response, strict=True)
        assert response["status"] == "failed"
        assert (response["error"]["code"], response["error"]["tether_code"]) == ("server_error", code)

    config = upstream_config(fake)
    config.store_durability = "before_terminal"  # stored before `response.failed` goes out
    async with full_stack(config) as stack, stack.ws() as conn, stack.http() as h:
        fake.push(mid_stream_error())
        await send_json(conn, {**CREATE, "store": True})
        events = await recv_response(conn)  # strict: every event through the SDK's own pydantic types
        assert events[-1]["type"] == "response.failed"
        check(events[-1]["response"], "backend_error")
        stored_id = events[-1]["response"]["id"]

        fake.push(mid_stream_error())
        body = {"model": "m", "input": "x", "store": False}
        async with h.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
            sse = [event for _, event in sse_frames((await r.aread()).decode())]
        check_sse_events(sse)
        assert sse[-1]["type"] == "response.failed"
        check(sse[-1]["response"], "backend_error")

        fake.push(stall(after_chunks=1, seconds=10))
        r = await h.post("/v1/responses", json=body)
        assert r.status_code == 200
        check(r.json(), "backend_timeout")

        r = await h.get(f"/v1/responses/{stored_id}")
        assert r.status_code == 200, r.text
        check(r.json(), "backend_error")
