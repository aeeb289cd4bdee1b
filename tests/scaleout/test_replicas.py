"""Two Tether replicas sharing PostgreSQL or Redis behind nginx (deploy/nginx/tether.conf).

Everything runs on loopback as real subprocesses: the replicas (`tether serve`), and nginx in
the foreground with a private prefix (config, pid file, error log and temp dirs under tmp_path),
running the shipped config rendered with this run's ports. A rollout goes through nginx; the
replica holding the connection (read from /proc, see conftest) is then taken down, and the
client's reconnect, which nginx sends to the other replica, continues the rollout with
previous_response_id from the shared store. A store=false response does not survive the move
(previous_response_not_found), as on any new connection.

WebSocket (official SDK, `client.responses.connect()`): the holder is SIGKILLed (a crash).
gRPC (raw `ResponsesServiceStub`): the holder gets SIGTERM (a rolling restart) and exits 0.

The replicas run with `store_durability = "before_terminal"`, the setting for replicas sharing a
store: a store=true response is in the store before its terminal event goes out, so the moment
the client has `response.completed` the other replica can read it (checked: the first GET there
answers 200) and a crash right after loses nothing. With the default "overlap" the write follows
the terminal event and a quick reconnect elsewhere can miss it (docs/deployment.md measures how
often: `python -m tether_lab.scaleout --parts visibility`).

Needs nginx (apt-get install -y nginx), PostgreSQL (TETHER_TEST_PG_URL) and Redis
(TETHER_TEST_REDIS_URL); each missing piece skips with the reason (fails under
TETHER_TEST_REQUIRE_SERVERS=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from dataclasses import dataclass

import grpc
import httpx
import pytest
import websockets
from openai import AsyncOpenAI

from tether.responses.v1 import service_pb2_grpc
from tether_lab.processes import ServerProcess, established, free_ports
from tether_lab.scaleout import (
    Nginx,
    grpc_reader,
    grpc_turn,
    nginx_binary,
    pg_reachable,
    redis_reachable,
    scratch_store,
    turn_state_of,
    write_config,
)

from .conftest import holders, unavailable, wait_visible

MODEL = "tether-sim"
TURN_STATE_KEY = "replicas-test-turn-state-key"
# What Codex 0.169 sends on its WebSocket handshake (ws-mode contract 1.2), less its metadata.
CODEX_HEADERS = {
    "authorization": "Bearer sk-codex",
    "openai-beta": "responses_websockets=2026-02-06",
    "originator": "codex_exec",
    "session-id": "3f1c2d4e-0000-4000-8000-000000000001",
    "x-client-request-id": "3f1c2d4e-0000-4000-8000-000000000002",
}
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


@dataclass
class Cluster:
    kind: str
    replicas: list[ServerProcess]
    lb: Nginx

    def ensure_up(self) -> None:
        for r in self.replicas:
            if r.proc is None or r.proc.poll() is not None:
                r.start()
        for r in self.replicas:
            r.wait_ready()

    def holder(self, transport: str) -> tuple[ServerProcess, ServerProcess]:
        """(the replica holding the one open connection of `transport`, the other one)."""
        port_of = (lambda r: r.bridge_port) if transport == "websocket" else (lambda r: r.grpc_port)
        held = holders(self.replicas, port_of)
        assert len(held) == 1, (
            f"expected one replica holding the {transport} connection, got {[r.name for r in held]}"
        )
        other = next(r for r in self.replicas if r is not held[0])
        return held[0], other


@pytest.fixture(scope="module", params=["postgres", "redis"])
def cluster(request, tmp_path_factory):
    if nginx_binary() is None:
        unavailable(
            "nginx is not installed: apt-get install -y nginx (runs as a foreground subprocess on loopback)"
        )
    kind = request.param
    why = pg_reachable() if kind == "postgres" else redis_reachable()
    if why:
        unavailable(why)
    workdir = tmp_path_factory.mktemp(f"replicas-{kind}")
    with scratch_store(kind, workdir) as url:
        cfg = write_config(
            workdir / "tether.toml", url, durability="before_terminal", server={"turn_state_key": TURN_STATE_KEY}
        )
        ports = free_ports(6)
        replicas = [  # each names itself in x-codex-turn-state (sticky routing for Codex)
            ServerProcess(cfg, workdir, ports[0], ports[1], name="replica-1",
                          env={"TETHER_SERVER__REPLICA_ID": "replica-1"}),
            ServerProcess(cfg, workdir, ports[2], ports[3], name="replica-2",
                          env={"TETHER_SERVER__REPLICA_ID": "replica-2"}),
        ]  # fmt: skip
        lb = Nginx(workdir / "nginx", ports[4], ports[5], replicas)
        c = Cluster(kind, replicas, lb)
        try:
            c.ensure_up()
            lb.start()
            yield c
        finally:
            lb.stop()
            for r in replicas:
                r.stop(timeout=15)


async def _durable_on(replica: ServerProcess, response_id: str) -> None:
    """The response is already readable on `replica` (before_terminal: written before its
    terminal event reached the client)."""
    assert await wait_visible(replica, response_id) == 0, f"{response_id} was not in the store yet"


async def _terminal(conn):
    async for ev in conn:
        if ev.type in TERMINAL:
            return ev
    raise AssertionError("connection ended before a terminal event")


async def test_websocket_rollout_survives_its_replica_crashing(cluster: Cluster) -> None:
    cluster.ensure_up()
    client = AsyncOpenAI(base_url=cluster.lb.base_url, api_key="unused-when-open", max_retries=0)
    async with client.responses.connect() as conn:
        last = None
        for i in range(3):
            extra = {"previous_response_id": last.id} if last else {}
            await conn.response.create(model=MODEL, input=f"step {i}", store=True, **extra)
            done = await _terminal(conn)
            assert done.type == "response.completed", done
            last = done.response
        await conn.response.create(model=MODEL, input="scratch", store=False)
        ephemeral = (await _terminal(conn)).response

        holder, other = cluster.holder("websocket")
        await _durable_on(other, last.id)
        holder.kill()
        with pytest.raises(Exception):  # noqa: B017 - the SDK surfaces the drop as the socket's own error
            await asyncio.wait_for(_terminal(conn), 15)

    async with client.responses.connect() as conn:  # nginx: the dead replica refuses, the other takes it
        await conn.response.create(model=MODEL, input="step 3", store=True, previous_response_id=last.id)
        cont = await _terminal(conn)
        assert cont.type == "response.completed", cont
        assert cont.response.previous_response_id == last.id
        # The whole history came back from the store: the new input counts every earlier turn.
        assert cont.response.usage.input_tokens > last.usage.input_tokens + last.usage.output_tokens
        assert cluster.holder("websocket")[0] is other

        await conn.response.create(model=MODEL, input="more", store=False, previous_response_id=ephemeral.id)
        miss = await _terminal(conn)
        assert miss.type == "error" and miss.error.code == "previous_response_not_found"


async def test_grpc_rollout_survives_a_rolling_restart(cluster: Cluster) -> None:
    cluster.ensure_up()
    async with grpc.aio.insecure_channel(cluster.lb.grpc_target) as channel:
        stub = service_pb2_grpc.ResponsesServiceStub(channel)
        call = stub.Session()
        queue: asyncio.Queue = asyncio.Queue()
        reader = asyncio.create_task(grpc_reader(call, queue))
        previous = ""
        for i in range(3):
            ev = await grpc_turn(
                call, queue, model=MODEL, input=f"step {i}", store=True, previous_response_id=previous
            )
            assert ev.WhichOneof("event") == "completed", ev
            last = ev.completed.response
            previous = last.id
        ev = await grpc_turn(call, queue, model=MODEL, input="scratch", store=False)
        ephemeral = ev.completed.response

        holder, other = cluster.holder("grpc")
        await _durable_on(other, last.id)
        assert await asyncio.to_thread(holder.stop, signal.SIGTERM, 30) == 0, holder.logs()
        # The stream ends: a server_shutting_down event, then UNAVAILABLE relayed by nginx.
        events = []
        while (ev := await asyncio.wait_for(queue.get(), 15)) is not None:
            events.append(ev)
        await reader
        assert await call.code() == grpc.StatusCode.UNAVAILABLE, await call.details()
        assert any(e.error.error.code == "server_shutting_down" for e in events)

        call = stub.Session()  # same channel (same nginx connection): a new stream, the other replica
        queue = asyncio.Queue()
        reader = asyncio.create_task(grpc_reader(call, queue))
        try:
            ev = await grpc_turn(
                call, queue, model=MODEL, input="step 3", store=True, previous_response_id=last.id
            )
            assert ev.WhichOneof("event") == "completed", ev
            cont = ev.completed.response
            assert cont.previous_response_id == last.id
            assert cont.usage.input_tokens > last.usage.input_tokens + last.usage.output_tokens
            assert cluster.holder("grpc")[0] is other

            ev = await grpc_turn(
                call, queue, model=MODEL, input="more", store=False, previous_response_id=ephemeral.id
            )
            assert (
                ev.WhichOneof("event") == "error" and ev.error.error.code == "previous_response_not_found"
            ), ev
        finally:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def test_codex_turn_state_routes_a_turn_back_to_its_replica(cluster: Cluster) -> None:
    """Codex echoes the `x-codex-turn-state` it was given on the follow-up requests of a turn
    (shared reference notes on the wire contract, [CODEX]; seen with Codex 0.169 on its HTTP
    requests, docs/deployment.md): nginx sends those to the replica that set it, even where
    least_conn would pick the other one;
    a request without it, or with a made-up one, takes least_conn; a pinned replica that is down
    hands the turn to the other."""
    cluster.ensure_up()
    tokens = {r.name: turn_state_of(r) for r in cluster.replicas}
    assert len(set(tokens.values())) == 2 and all(t.startswith(f"{n}.") for n, t in tokens.items())
    ws_url = f"ws://127.0.0.1:{cluster.lb.http_port}/v1/responses"
    async with (
        websockets.connect(ws_url, additional_headers=CODEX_HEADERS) as first,
        httpx.AsyncClient(base_url=cluster.lb.base_url, timeout=10) as http,
    ):
        token = first.response.headers["x-codex-turn-state"]
        holder, other = cluster.holder("websocket")
        assert token == tokens[holder.name]
        await first.send(json.dumps({"type": "response.create", "model": MODEL, "input": "warm up", "store": False,
                                     "stream": True, "generate": False}))  # fmt: skip
        warm = json.loads(await asyncio.wait_for(first.recv(), 10))
        assert warm["type"] == "response.created", warm

        # The holder has a connection open, the other none: least_conn alone picks the other.
        before = established(holder.pid, holder.bridge_port), established(other.pid, other.bridge_port)
        async with websockets.connect(ws_url, additional_headers={**CODEX_HEADERS, "x-codex-turn-state": token}) as again:
            assert again.response.headers["x-codex-turn-state"] == token
            after = established(holder.pid, holder.bridge_port), established(other.pid, other.bridge_port)
            assert after == (before[0] + 1, before[1]), (before, after)

        body = {"model": MODEL, "input": "fallback", "store": False, "stream": True}
        for _ in range(3):  # the HTTP fallback of the same turn
            r = await http.post("/responses", json=body, headers={**CODEX_HEADERS, "x-codex-turn-state": token})
            assert r.status_code == 200 and r.headers["x-codex-turn-state"] == token
        forged = token[: token.index(".") + 1] + "A" * (len(token) - token.index(".") - 1)
        for headers in (CODEX_HEADERS, {**CODEX_HEADERS, "x-codex-turn-state": forged}):
            r = await http.post("/responses", json=body, headers=headers)
            assert r.status_code == 200 and r.headers["x-codex-turn-state"] == tokens[other.name]

    holder.kill()  # the pinned replica is gone: its backup takes the turn
    async with httpx.AsyncClient(base_url=cluster.lb.base_url, timeout=10) as http:
        r = await http.post("/responses", json=body, headers={**CODEX_HEADERS, "x-codex-turn-state": token})
        assert r.status_code == 200 and r.headers["x-codex-turn-state"] == tokens[other.name]

