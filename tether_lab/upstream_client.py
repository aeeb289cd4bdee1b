"""`python -m tether_lab.upstream_client`: the CPU of the Chat Completions adapter's HTTP client
per request and per streamed read, next to aiohttp's (where installed) and a plain asyncio
exchange of the same bytes, in one process against the lab's paced upstream.

    python -m tether_lab.upstream_client                     # 500 requests, 3,000-token stream
    python -m tether_lab.upstream_client --requests 2000 --tokens 10000

Why: every create makes one upstream request before its first token can come, so a request's
CPU is paid by every later create of a burst (TTFT at 100 simultaneous creates), and every
streamed token is one read. The figures include the upstream's own CPU (same process), so read
the differences, not the totals.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import time
from collections.abc import Awaitable, Callable

import orjson

from tether.backends.chat.http1 import UpstreamPool
from tether_lab.upstream import PacedUpstream, Pacing

BODY = orjson.dumps({"model": "paced", "messages": [{"role": "user", "content": "hi"}], "stream": True})


async def _cpu_per(n: int, one: Callable[[], Awaitable[int]]) -> tuple[float, int]:
    """µs of process CPU per unit of `one()` (which returns how many units it did), after a warm-up
    of `n` calls (at most 20)."""
    for _ in range(min(n, 20)):
        await one()
    units, t0 = 0, time.process_time()
    for _ in range(n):
        units += await one()
    return (time.process_time() - t0) / units * 1e6, units


async def measure(requests: int, tokens: int) -> list[tuple[str, str, float]]:
    rows: list[tuple[str, str, float]] = []
    short = await PacedUpstream(Pacing(tokens=1, interval_s=0, ttft_s=0, stamp=False)).start(0)
    long = await PacedUpstream(Pacing(tokens=tokens, interval_s=0.0005, ttft_s=0, stamp=False)).start(0)
    try:
        for upstream, what, n in ((short, "request (1-token stream)", requests), (long, "streamed read", 2)):
            rows += await _round(upstream.port, what, n)
    finally:
        await short.stop()
        await long.stop()
    return rows


async def _round(port: int, what: str, n: int) -> list[tuple[str, str, float]]:
    """Each client against the upstream at `port`: `n` requests, CPU per request or per read."""
    per_read = what == "streamed read"
    base = f"http://127.0.0.1:{port}/v1"
    url = base + "/chat/completions"
    rows: list[tuple[str, str, float]] = []
    pool = UpstreamPool(base, max_connections=4, keepalive_timeout_s=15, connect_timeout_s=5, pool_timeout_s=5,
                        headers={"content-type": "application/json"})  # fmt: skip

    async def tether_call() -> int:
        async with await pool.request("POST", url, body=BODY) as r:
            reads = sum([1 async for _ in r])
        return reads if per_read else 1

    rows.append(("tether http1", what, (await _cpu_per(n, tether_call))[0]))
    await pool.aclose()
    if importlib.util.find_spec("aiohttp") is not None:
        import aiohttp

        async with aiohttp.ClientSession(headers={"content-type": "application/json"}) as session:

            async def aiohttp_call() -> int:
                async with session.post(url, data=BODY) as r:
                    reads = sum([1 async for _ in r.content.iter_any()])
                return reads if per_read else 1

            rows.append(("aiohttp", what, (await _cpu_per(n, aiohttp_call))[0]))
    if not per_read:
        rows.append(("plain asyncio", what, (await _cpu_per(n, _plain(port)))[0]))
    return rows


def _plain(port: int) -> Callable[[], Awaitable[int]]:
    """The least a client does: one kept-alive connection, the request written, the chunked body
    read to its end (no pool, no header parsing)."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(BODY)}\r\n\r\n").encode() + BODY  # fmt: skip
    conn: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def call() -> int:
        if not conn:
            conn.append(await asyncio.open_connection("127.0.0.1", port))
        reader, writer = conn[0]
        writer.write(head)
        await reader.readuntil(b"\r\n\r\n")
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return 1

    return call


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tether_lab.upstream_client", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--tokens", type=int, default=3000, help="tokens of the streamed-read round")
    args = p.parse_args(argv)
    rows = asyncio.run(measure(args.requests, args.tokens))
    print("| client | per | CPU µs (upstream included) |\n|---|---|---|")
    for client, what, us in rows:
        print(f"| {client} | {what} | {us:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
