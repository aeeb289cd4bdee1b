"""The delay proxy: one-way delay per chunk, one round trip per new connection, byte counters."""

from __future__ import annotations

import asyncio
import time

from tether_lab.proxy import DelayProxy


async def _echo_server():
    async def handle(r, w):
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
        w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_delay_and_counters():
    server, port = await _echo_server()
    proxy = DelayProxy([(0, "127.0.0.1", port)], delay_ms=30)
    await proxy.start(control=True)
    try:
        t0 = time.perf_counter()
        r, w = await asyncio.open_connection("127.0.0.1", proxy.routes[0].listen_port)
        w.write(b"ping")
        await w.drain()
        assert await r.readexactly(4) == b"ping"
        first = time.perf_counter() - t0  # handshake RTT + one RTT for the echo
        t1 = time.perf_counter()
        w.write(b"pong!")
        await w.drain()
        assert await r.readexactly(5) == b"pong!"
        second = time.perf_counter() - t1  # one RTT on the open connection
        assert 0.115 <= first < 0.5, first
        assert 0.055 <= second < 0.3, second
        w.close()
        stats = proxy.stats()["routes"][0]
        assert stats["c2s"] == 9 and stats["s2c"] == 9 and stats["connections"] == 1
    finally:
        await proxy.stop()
        server.close()
