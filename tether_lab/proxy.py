"""A loopback TCP proxy that adds network delay, so per-request connection costs show.

    python -m tether_lab.proxy --route 0:127.0.0.1:8000 --delay-ms 10 [--bandwidth-mbps 100]

Each `--route LISTEN_PORT:TARGET_HOST:TARGET_PORT` listens on 127.0.0.1 (port 0 = any free
port) and forwards to the target. Every chunk read in either direction is written to the other
side `delay_ms` later (one-way delay, order kept); with a bandwidth cap a chunk also waits for its
serialisation time behind the chunks before it. A new connection costs one round trip before the
client's first byte goes on (the TCP handshake: SYN out, SYN-ACK back), which is what makes
connection-per-request transports pay for setup. No TLS: with TLS 1.3 add one more round trip per
new connection.

Counters (bytes each way, connections) are per route and cumulative; a control port answers any
connection with one JSON line `{"routes": [{"listen", "target", "c2s", "s2c", "connections"}]}` and
closes. The first stdout line is `READY <json>` with the bound listen ports and the control port.

`DelayProxy` is also usable in-process (`await proxy.start()`, `proxy.routes`, `await proxy.stop()`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
from dataclasses import dataclass, field

from tether_lab.processes import announce_and_wait

_CHUNK = 64 * 1024


@dataclass
class Route:
    listen_port: int
    target_host: str
    target_port: int
    c2s: int = 0
    s2c: int = 0
    connections: int = 0
    server: asyncio.AbstractServer | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {
            "listen": self.listen_port,
            "target": f"{self.target_host}:{self.target_port}",
            "c2s": self.c2s,
            "s2c": self.s2c,
            "connections": self.connections,
        }


class DelayProxy:
    def __init__(self, routes: list[tuple[int, str, int]], delay_ms: float = 0.0, bandwidth_mbps: float = 0.0,
                 host: str = "127.0.0.1") -> None:
        self.routes = [Route(p, h, tp) for p, h, tp in routes]
        self.delay = delay_ms / 1000.0
        self.rate = bandwidth_mbps * 1e6 / 8 if bandwidth_mbps > 0 else 0.0  # bytes/s
        self.host = host
        self._tasks: set[asyncio.Task] = set()
        self._control: asyncio.AbstractServer | None = None
        self.control_port = 0

    async def start(self, control: bool = False) -> None:
        for route in self.routes:
            route.server = await asyncio.start_server(
                lambda r, w, route=route: self._accept(route, r, w), self.host, route.listen_port
            )
            route.listen_port = route.server.sockets[0].getsockname()[1]
        if control:
            self._control = await asyncio.start_server(self._answer_control, self.host, 0)
            self.control_port = self._control.sockets[0].getsockname()[1]

    def stats(self) -> dict:
        return {"routes": [r.as_dict() for r in self.routes], "delay_ms": self.delay * 1000,
                "bandwidth_mbps": self.rate * 8 / 1e6}

    async def stop(self) -> None:
        servers = [r.server for r in self.routes if r.server] + ([self._control] if self._control else [])
        for s in servers:
            s.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for s in servers:
            with contextlib.suppress(Exception):
                await s.wait_closed()

    async def _answer_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(json.dumps(self.stats()).encode() + b"\n")
        with contextlib.suppress(Exception):
            await writer.drain()
            writer.close()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept(self, route: Route, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        route.connections += 1
        self._spawn(self._serve(route, c_reader, c_writer))

    async def _serve(self, route: Route, c_reader, c_writer) -> None:
        try:
            if self.delay > 0:
                await asyncio.sleep(2 * self.delay)  # the TCP handshake's round trip
            s_reader, s_writer = await asyncio.open_connection(route.target_host, route.target_port)
        except (OSError, asyncio.CancelledError):
            c_writer.close()
            return
        for w in (c_writer, s_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        up = self._spawn(self._pipe(route, c_reader, s_writer, "c2s"))
        down = self._spawn(self._pipe(route, s_reader, c_writer, "s2c"))
        await asyncio.wait({up, down}, return_when=asyncio.ALL_COMPLETED)

    async def _pipe(self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        """Forward reader -> writer, each chunk `delay` after it was read (order kept)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            try:
                while True:
                    due, data = await queue.get()
                    if not data:
                        break
                    wait = due - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    if writer.can_write_eof():
                        writer.write_eof()
                    else:
                        writer.close()

        sender = self._spawn(deliver())
        link_free = 0.0  # when the simulated link finishes sending what is queued
        try:
            while True:
                data = await reader.read(_CHUNK)
                now = loop.time()
                if not data:
                    break
                setattr(route, direction, getattr(route, direction) + len(data))
                due = now + self.delay
                if self.rate:
                    start = max(now, link_free)
                    link_free = start + len(data) / self.rate
                    due = link_free + self.delay
                queue.put_nowait((due, data))
        except (ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(Exception):
                await sender
            if direction == "s2c":
                with contextlib.suppress(Exception):
                    writer.close()


def query_control(port: int, host: str = "127.0.0.1") -> dict:
    """Read a proxy's counters through its control port (blocking, a few hundred µs)."""
    with socket.create_connection((host, port), timeout=5) as s:
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


def _parse_route(spec: str) -> tuple[int, str, int]:
    parts = spec.split(":")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"--route wants LISTEN_PORT:TARGET_HOST:TARGET_PORT, got {spec!r}")
    return int(parts[0]), parts[1], int(parts[2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tether_lab.proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--route", action="append", type=_parse_route, required=True,
                    help="LISTEN_PORT:TARGET_HOST:TARGET_PORT (repeatable; port 0 = any)")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per chunk and direction")
    ap.add_argument("--bandwidth-mbps", type=float, default=0.0, help="link rate per direction (0 = unlimited)")
    args = ap.parse_args(argv)

    async def run() -> None:
        proxy = DelayProxy(args.route, args.delay_ms, args.bandwidth_mbps)
        await proxy.start(control=True)
        await announce_and_wait({"routes": [r.as_dict() for r in proxy.routes], "control": proxy.control_port})
        await proxy.stop()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
