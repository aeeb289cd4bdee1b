"""Shared pieces of the scale-out suite: Tether and nginx as real subprocesses on loopback.

Which process holds a connection is read from the kernel: `/proc/<pid>/fd` + `/proc/<pid>/net/tcp`
(`tether_lab.processes.tcp_sockets`), i.e. which process owns the accepted socket whose
remote port is the client's local port. No server code is involved, so the answer cannot lie,
and it works the same for WebSocket and gRPC, for workers and replicas.
"""

from __future__ import annotations

import asyncio
import os
import sys

import httpx
import pytest

from tether_lab.processes import TCP_ESTABLISHED, ServerProcess, established, tcp_sockets

if not sys.platform.startswith("linux"):
    pytest.skip("scale-out tests need Linux (SO_REUSEPORT balancing, /proc)", allow_module_level=True)

REQUIRE = os.environ.get("TETHER_TEST_REQUIRE_SERVERS") == "1"


def unavailable(reason: str) -> None:
    """Skip, or fail when TETHER_TEST_REQUIRE_SERVERS=1 (CI)."""
    if REQUIRE:
        pytest.fail(reason + " (TETHER_TEST_REQUIRE_SERVERS=1)")
    pytest.skip(reason)


def owner_of(pids: list[int], server_port: int, client_port: int) -> int | None:
    """The pid among `pids` holding the accepted end of the connection from `client_port`."""
    for pid in pids:
        for local, remote, state in tcp_sockets(pid):
            if local == server_port and remote == client_port and state == TCP_ESTABLISHED:
                return pid
    return None


def holders(procs: list[ServerProcess], port_of) -> list[ServerProcess]:
    """The processes that hold at least one accepted connection on their own port."""
    return [
        p
        for p in procs
        if p.proc is not None and p.proc.poll() is None and established(p.pid, port_of(p)) > 0
    ]


async def wait_visible(replica: ServerProcess, response_id: str, within: float = 10.0) -> int:
    """Poll GET /v1/responses/{id} straight on `replica` until 200; returns how many polls were
    not 200 first. A 200 means the write has landed in the shared store (a process that still has
    the write queued waits for it before answering)."""
    misses = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            status = (await http.get(f"{replica.api_url}/responses/{response_id}")).status_code
            if status == 200:
                return misses
            assert status == 404, status
            misses += 1
            if loop.time() > deadline:
                pytest.fail(f"{response_id} not visible on {replica.name} after {within} s")
            await asyncio.sleep(0.01)
