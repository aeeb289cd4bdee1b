"""`tether serve --workers 2`: one supervisor, two workers on the same gRPC and bridge ports.

The server runs as a real subprocess on free ports with a SQLite (WAL) store. Which worker holds
a connection is read from /proc (see conftest): the kernel's SO_REUSEPORT balancing spreads
connections, so sessions are opened until both workers hold some (at most MAX_CONNECTIONS; with
two workers the chance that 48 connections all land on one is 2**-47).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
from websockets.asyncio.client import connect

from tests.support.metrics import samples
from tether import eventloop
from tether.responses.v1 import service_pb2_grpc
from tether_lab.processes import ServerProcess, established, free_ports, listens
from tether_lab.scaleout import grpc_reader, grpc_turn, write_config, ws_turn

from .conftest import owner_of, wait_visible

MAX_CONNECTIONS = 48
MODEL = "tether-sim"


@contextlib.contextmanager
def _two_workers(tmp_path, sim: dict | None = None, **server: object) -> Iterator[ServerProcess]:
    cfg = write_config(tmp_path / "tether.toml", f"sqlite:///{tmp_path}/store.db", sim=sim, server=server)
    grpc_port, bridge_port = free_ports(2)
    proc = ServerProcess(cfg, tmp_path, grpc_port, bridge_port, workers=2, name="workers").start()
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop(timeout=30)


@pytest.fixture
def server(tmp_path):
    with _two_workers(tmp_path) as proc:
        yield proc


async def _metrics_of_each_worker(server: ServerProcess, pids: list[int]) -> dict[int, dict]:
    """One `/metrics` scrape per worker: fresh connections to the shared bridge port, each one
    attributed (from /proc) to the worker that accepted it, until every worker answered one."""
    scrapes: dict[int, dict] = {}
    for _ in range(MAX_CONNECTIONS):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.bridge_port)
        local_port = writer.get_extra_info("sockname")[1]
        for _ in range(200):  # until the kernel handed the connection to a worker and it accepted it
            owner = owner_of(pids, server.bridge_port, local_port)
            if owner is not None:
                break
            await asyncio.sleep(0.01)
        writer.write(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        raw = await reader.read()
        writer.close()
        assert owner in pids, f"no worker accepted the scrape from port {local_port}"
        scrapes.setdefault(owner, samples(raw.partition(b"\r\n\r\n")[2].decode()))
        if len(scrapes) == len(pids):
            return scrapes
    raise AssertionError(f"every scrape landed on one worker: {sorted(scrapes)}")


async def _event_loops_of_each_worker(server: ServerProcess, pids: list[int]) -> list[str]:
    scrapes = await _metrics_of_each_worker(server, pids)
    return [
        dict(labels)["event_loop"]
        for pid in pids
        for name, labels in scrapes[pid]
        if name == "tether_event_loop_info"
    ]


async def test_every_worker_runs_the_configured_event_loop(tmp_path) -> None:
    with _two_workers(tmp_path, event_loop="auto") as server:  # uvloop where installed: not the default
        pids = sorted(server.worker_pids().values())
        assert await _event_loops_of_each_worker(server, pids) == [eventloop.resolve("auto")] * 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_both_workers_serve_websocket_and_grpc_sessions(server: ServerProcess) -> None:
    pids = sorted(server.worker_pids().values())
    assert len(pids) == 2 and server.pid not in pids
    for pid in pids:  # both workers listen on both ports (SO_REUSEPORT)
        assert listens(pid, server.grpc_port) and listens(pid, server.bridge_port)
    assert not listens(server.pid, server.bridge_port)  # the supervisor serves nothing itself
    assert await _event_loops_of_each_worker(server, pids) == [eventloop.DEFAULT] * 2

    # WebSocket sessions, each with one store=true turn, until both workers hold some.
    conns, by_worker = [], {pid: [] for pid in pids}
    try:
        for i in range(MAX_CONNECTIONS):
            conn = await connect(server.ws_url, compression=None, max_size=None)
            conns.append(conn)
            done = await ws_turn(conn, model=MODEL, input=f"session {i}", store=True)
            assert done["type"] == "response.completed", done
            owner = owner_of(pids, server.bridge_port, conn.local_address[1])
            assert owner in pids
            by_worker[owner].append((conn, done["response"]))
            if all(by_worker.values()):
                break
        assert all(by_worker.values()), f"every WebSocket landed on one worker: {by_worker}"

        # A store=true response made on one worker continues on a connection held by the other:
        # the workers share the SQLite file (WAL).
        (conn_a, made_on_a), (conn_b, _) = by_worker[pids[0]][0], by_worker[pids[1]][0]
        await wait_visible(server, made_on_a["id"])
        cont = await ws_turn(
            conn_b, model=MODEL, input="continue", store=True, previous_response_id=made_on_a["id"]
        )
        assert cont["type"] == "response.completed", cont
        assert cont["response"]["previous_response_id"] == made_on_a["id"]
        assert cont["response"]["usage"]["input_tokens"] > made_on_a["usage"]["input_tokens"]
        # store=false state stays with its connection: the other worker's connection cannot use it.
        eph = await ws_turn(conn_a, model=MODEL, input="ephemeral", store=False)
        miss = await ws_turn(
            conn_b, model=MODEL, input="x", store=False, previous_response_id=eph["response"]["id"]
        )
        assert miss["type"] == "error" and miss["error"]["code"] == "previous_response_not_found"
    finally:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    # gRPC: one channel (one TCP connection) per session, until both workers hold some.
    channels, calls = [], []
    try:
        for i in range(MAX_CONNECTIONS):
            channel = grpc.aio.insecure_channel(
                server.grpc_target, options=[("grpc.use_local_subchannel_pool", 1)]
            )
            channels.append(channel)
            call = service_pb2_grpc.ResponsesServiceStub(channel).Session()
            queue: asyncio.Queue = asyncio.Queue()
            calls.append((call, asyncio.create_task(grpc_reader(call, queue))))
            ev = await grpc_turn(call, queue, model=MODEL, input=f"grpc session {i}", store=False)
            assert ev.WhichOneof("event") == "completed", ev
            counts = {pid: established(pid, server.grpc_port) for pid in pids}
            assert sum(counts.values()) == i + 1
            if all(counts.values()):
                break
        assert all(counts.values()), f"every gRPC connection landed on one worker: {counts}"
    finally:
        for call, reader in calls:
            call.cancel()
            await reader
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)


async def test_every_worker_opens_the_reasoning_another_worker_sealed(tmp_path) -> None:
    """No `server.reasoning_key`: the supervisor makes one for the run and every worker gets it,
    so a stateless client's sealed reasoning (store=false, encrypted_content) resent on any
    connection is accepted by whichever worker holds it."""
    with _two_workers(tmp_path, sim={"reasoning_tokens": 4}) as server:
        assert "workers share one made for this run (fingerprint " in server.stdout_path.read_text()
        pids = sorted(server.worker_pids().values())
        conns, by_worker = [], {pid: [] for pid in pids}
        try:
            for _ in range(MAX_CONNECTIONS):
                conn = await connect(server.ws_url, compression=None, max_size=None)
                conns.append(conn)
                by_worker[owner_of(pids, server.bridge_port, conn.local_address[1])].append(conn)
                if all(by_worker.values()):
                    break
            assert all(by_worker.values()), f"every WebSocket landed on one worker: {by_worker}"
            stateless = {"model": MODEL, "store": False, "include": ["reasoning.encrypted_content"]}
            first = await ws_turn(by_worker[pids[0]][0], input="think", **stateless)
            assert first["type"] == "response.completed", first
            output = first["response"]["output"]
            sealed = [i for i in output if i["type"] == "reasoning"]
            assert sealed and sealed[0]["encrypted_content"].startswith("tether.r1.")
            resend = [{"type": "message", "role": "user", "content": "think"}, *output,
                      {"type": "message", "role": "user", "content": "again"}]  # fmt: skip
            for pid in pids:  # the worker that sealed it, and the other one
                again = await ws_turn(by_worker[pid][0], input=resend, **stateless)
                assert again["type"] == "response.completed", (pid, again)
        finally:
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


async def test_a_crashed_worker_is_restarted_and_sigterm_stops_all(server: ServerProcess) -> None:
    before = server.worker_pids()
    victim = before[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # the supervisor notices, backs off, starts a new worker 0 on the same ports
        now = server.worker_pids()
        if (
            now.get(0) not in (None, victim)
            and listens(now[0], server.bridge_port)
            and listens(now[0], server.grpc_port)
        ):
            break
        assert server.proc.poll() is None, server.logs()
        assert time.monotonic() < deadline, f"worker 0 not restarted\n{server.logs()}"
        await asyncio.sleep(0.05)
    assert now[1] == before[1] and _alive(before[1])  # the other worker was left alone
    assert "exited with -9; restarting" in server.stderr_path.read_text()
    conn = await connect(server.ws_url, compression=None, max_size=None)
    done = await ws_turn(conn, model=MODEL, input="still serving", store=True)
    assert done["type"] == "response.completed"

    # SIGTERM to the supervisor: forwarded to both workers, which drain; everything exits, status 0.
    pids = list(server.worker_pids().values())
    assert await asyncio.to_thread(server.stop, signal.SIGTERM, 30) == 0, server.logs()
    assert not any(_alive(pid) for pid in pids)
    with contextlib.suppress(Exception):  # the idle WebSocket was closed by the server: going away
        async for _ in conn:
            pass
    assert conn.close_code == 1001


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tether", "serve", "--log-level", "error", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_several_workers_refuse_a_private_store() -> None:
    result = _serve("--workers", "2", "--store", "memory://", "--grpc-port", "0", "--port", "0")
    assert result.returncode == 1
    assert "memory://" in result.stderr and "share" in result.stderr


def test_several_workers_refuse_a_port_someone_else_listens_on(tmp_path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]
        result = _serve(
            "--workers", "2", "--store", f"sqlite:///{tmp_path}/s.db", "--grpc-port", "0", "--port", str(port)
        )
    assert result.returncode == 1
    assert result.stderr == (
        f"tether: the HTTP/WebSocket port 127.0.0.1:{port} is already in use (another tether serve?): "
        "choose another with [server] bridge_port or --port (0 picks a free port)\n"
    )
