"""`python -m tether_lab.cerebras_wire`: what gzip request bodies and connection warming buy the
Cerebras adapter, measured against the version-2 fake (tests/fakes/cerebras_v2; run from a
checkout), ~1 minute.

    python -m tether_lab.cerebras_wire                 # both tables
    python -m tether_lab.cerebras_wire --rounds 9 --uplink-mbit 20 --handshake-ms 80

Why: an HTTP-mode client resends its whole history every turn, and Cerebras takes
`Content-Encoding: gzip`; a new connection to Cerebras costs a TCP and a TLS handshake before the
first byte, which the SDK avoids with `/v1/tcp_warming`.

gzip: histories of a coding agent's shape (a system prompt, five tools, turns of a `read_file` call
whose output is a real source file of this repository, reasoning, a short answer) at four sizes.
For each: the body's bytes as JSON and gzip-compressed (level 1, the adapter's default, and 6),
the compression's CPU time, and the median time from the call's start to its last chunk against
the fake on loopback and with the fake reading the body at `--uplink-mbit` (a client's upload
link), gzip off and on, rounds alternating.

Warming: the fake sleeps `--handshake-ms` on every new connection (what a handshake costs a real
client; loopback's own connect is also shown with 0). The median time to the first chunk of a
call on a cold backend against one that warmed at start, and of a call after an idle gap longer
than the keep-alive against the same with warming through idle gaps.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
SIZES = (16 * 1024, 64 * 1024, 256 * 1024, 1024 * 1024)


def history(target_bytes: int) -> tuple[list[Any], list[Any], str]:
    """(items, tools, instructions) of a coding-agent conversation whose chat body is about
    `target_bytes` (real source files of this repository as the tool outputs)."""
    from tests.fakes.items import assistant, function_call, function_output, function_tool, reasoning, user

    sources = sorted((ROOT / "tether").rglob("*.py"))
    instructions = (ROOT / "README.md").read_text()[:2000]
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    tools = [function_tool(n, schema, f"{n} a file of the workspace") for n in ("read_file", "write_file", "grep",
                                                                              "run_tests", "list_dir")]  # fmt: skip
    items: list[Any] = [user("Find why the adapter drops the tier and fix it.")]
    size, i = len(instructions), 0
    while size < target_bytes:
        path = sources[i % len(sources)]
        text = path.read_text()[:6000]
        cid = f"call_{i}"
        items += [
            reasoning(f"I should read {path.name} to see how it handles this."),
            function_call(cid, "read_file", {"path": str(path.relative_to(ROOT))}),
            function_output(cid, text),
            assistant(f"{path.name} read; next step."),
        ]
        size += len(orjson.dumps(text)) + 300
        i += 1
    return items, tools, instructions


def median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1000


async def _timed_call(backend: Any, req_kw: dict[str, Any]) -> tuple[float, float]:
    """(seconds to the first run, seconds to the end) of one call."""
    from tests.fakes.items import request

    start = time.perf_counter()
    first = None
    async for _ in backend.stream_runs(request(*req_kw["items"], tools=req_kw["tools"],
                                               instructions=req_kw["instructions"])):  # fmt: skip
        if first is None:
            first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start


def _backend(server: Any, **options: Any) -> Any:
    from tether.backends.registry import build_backend

    return build_backend("cb", "cerebras", {"base_url": server.base_url, "api_key": "test-key", **options})


async def gzip_table(rounds: int, uplink_mbit: float) -> list[str]:
    from tests.fakes.cerebras_v2 import FakeCerebrasV2
    from tests.fakes.items import request

    rate = uplink_mbit * 1_000_000 / 8
    lines = [
        f"| body (JSON) | gzip -1 | gzip -6 | compress -1 | loopback off / on | {uplink_mbit:g} Mbit/s off / on |",
        "|---|---|---|---|---|---|",
    ]
    for target in SIZES:
        items, tools, instructions = history(target)
        kw = {"items": items, "tools": tools, "instructions": instructions}
        row: list[str] = []
        with FakeCerebrasV2(lifetime_s=600) as loop_fake, FakeCerebrasV2(lifetime_s=600, body_bytes_per_s=rate) as slow:
            probe = _backend(loop_fake)
            req = request(*items, tools=tools, instructions=instructions)
            await probe.prepare(req)
            raw = orjson.dumps(req.prepared)
            await probe.aclose()
            gz1, gz6 = gzip.compress(raw, 1), gzip.compress(raw, 6)
            cpu = []
            for _ in range(max(rounds, 5)):
                t = time.process_time()
                gzip.compress(raw, 1)
                cpu.append(time.process_time() - t)
            row += [f"{len(raw) / 1024:,.0f} KiB", f"{len(gz1) / 1024:,.1f} KiB ({len(raw) / len(gz1):.1f}x)",
                    f"{len(gz6) / 1024:,.1f} KiB ({len(raw) / len(gz6):.1f}x)", f"{median_ms(cpu):.2f} ms"]  # fmt: skip
            for fake in (loop_fake, slow):
                off, on = _backend(fake, gzip_min_bytes=None), _backend(fake)
                await _timed_call(off, kw)  # connections open, code paths warm
                await _timed_call(on, kw)
                t_off, t_on = [], []
                for _ in range(rounds):
                    t_off.append((await _timed_call(off, kw))[1])
                    t_on.append((await _timed_call(on, kw))[1])
                await off.aclose()
                await on.aclose()
                row.append(f"{median_ms(t_off):.1f} / {median_ms(t_on):.1f} ms")
        lines.append("| " + " | ".join(row) + " |")
    return lines


async def warming_table(rounds: int, handshake_ms: float) -> list[str]:
    from tests.fakes.cerebras_v2 import FakeCerebrasV2

    kw = {"items": ["hi"], "tools": [], "instructions": None}
    lines = [
        "| handshake | first call: cold / warmed at start | after an idle gap: not warmed / warmed through it |",
        "|---|---|---|",
    ]
    for delay in (0.0, handshake_ms / 1000):
        with FakeCerebrasV2(lifetime_s=600, new_connection_delay_s=delay) as fake:
            cold, warm, idle_cold, idle_warm = [], [], [], []
            for _ in range(rounds):
                b = _backend(fake, warm_path=None)
                cold.append((await _timed_call(b, kw))[0])
                await b.aclose()
                b = _backend(fake)
                await b.discover()
                await asyncio.sleep(delay + 0.05)  # the warming's handshake done
                warm.append((await _timed_call(b, kw))[0])
                await b.aclose()
            keepalive = 0.3
            for warm_path, out in ((None, idle_cold), ("/tcp_warming", idle_warm)):
                b = _backend(fake, warm_path=warm_path, keepalive_timeout_s=keepalive)
                await b.discover()
                await _timed_call(b, kw)
                for _ in range(rounds):
                    await asyncio.sleep(2 * keepalive)  # longer than the keep-alive: the connection is gone
                    out.append((await _timed_call(b, kw))[0])
                await b.aclose()
        lines.append(
            f"| {delay * 1000:g} ms | {median_ms(cold):.1f} / {median_ms(warm):.1f} ms "
            f"| {median_ms(idle_cold):.1f} / {median_ms(idle_warm):.1f} ms |"
        )
    return lines


async def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--uplink-mbit", type=float, default=50.0)
    ap.add_argument("--handshake-ms", type=float, default=60.0)
    args = ap.parse_args(argv)
    print("\n".join(await gzip_table(args.rounds, args.uplink_mbit)))
    print()
    print("\n".join(await warming_table(args.rounds, args.handshake_ms)))


if __name__ == "__main__":
    asyncio.run(main())
