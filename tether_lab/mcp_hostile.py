"""What a hostile MCP server costs Tether, and another tenant on it.

    python -m tether_lab.mcp_hostile                 # every attack, 3 s of baseline each
    python -m tether_lab.mcp_hostile --attack description --seconds 5

A real `tether serve` (memory store, the instant simulated model, `[mcp]` at its defaults) and
the hostile MCP server of the test suite (`python -m tests.fakes.hostile_mcp`, a process of its
own) on 127.0.0.1. Another tenant sends a small create every 20 ms throughout; for each attack
it reports that tenant's latency (p50 / p99 / max) for `--seconds` before the attack and for
`--seconds` while the attack is made again and again (one create after the other), how long an
attacked create took to end (the first, the longest), what its item says, and the server's
resident memory (peak, `VmHWM`, and after) against its resident memory before.

Attacks: `description` (one tool with a 200 MB description), `result` (a 500 MB plain JSON
result), `pages` (empty `tools/list` pages with a `nextCursor` for ever), `error` (an 8 MB error
message), and `none` (the control: a small listing, as a benign server answers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tether_lab.processes import ServerProcess, free_ports

ATTACKS = {
    "description": ["--description-bytes", "200000000"],
    "result": ["--result-bytes", "500000000"],
    "pages": ["--endless-pages"],
    "error": ["--error-bytes", "8000000"],
    "none": [],  # the control: the same server answering a small listing, as a benign one would
}
ROOT = Path(__file__).resolve().parent.parent
CONFIG = """store = "memory://"
[server]
console = false
[limits]
coalesce_ms = 0
[backends.sim]
kind = "simulated"
ttft_ms = 0
tokens_per_s = 0
output_tokens = 12
tick_ms = 1
[models."*"]
backend = "sim"
[mcp]
allowed_servers = ["127.0.0.1"]
allow_private_networks = ["127.0.0.0/8"]
"""


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


async def other_tenant(url: str, stop: asyncio.Event, out: list[tuple[float, float]]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        while not stop.is_set():
            started = time.perf_counter()
            r = await http.post("/responses", json={"model": "sim", "input": "hi", "store": False})
            r.raise_for_status()
            out.append((started, time.perf_counter() - started))
            await asyncio.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


def hostile(name: str, port: int) -> subprocess.Popen[bytes]:
    """The test suite's hostile MCP server, in a process of its own, mounting `name`."""
    return subprocess.Popen([sys.executable, "-m", "tests.fakes.hostile_mcp", "--port", str(port), *ATTACKS[name]],
                            cwd=ROOT)  # fmt: skip


async def attack(name: str, tether: ServerProcess, seconds: float) -> dict[str, Any]:
    port = free_ports(1)[0]
    bad = hostile(name, port)
    try:
        await asyncio.sleep(1.5)
        tool = {"type": "mcp", "server_label": "bad", "server_url": f"http://127.0.0.1:{port}/mcp",
                "require_approval": "never"}  # fmt: skip
        body: dict[str, Any] = {"model": "sim", "input": "x", "tools": [tool], "store": False}
        if name in ("result", "error"):
            body["tool_choice"] = {"type": "mcp", "server_label": "bad", "name": "t0"}
        rss_before = tether.rss()
        stop, latencies = asyncio.Event(), []
        load = asyncio.create_task(other_tenant(tether.api_url, stop, latencies))
        await asyncio.sleep(seconds)
        took: list[float] = []
        async with httpx.AsyncClient(base_url=tether.api_url, timeout=600) as http:
            started = time.perf_counter()
            while not took or time.perf_counter() - started < seconds:  # the attack, again and again
                one = time.perf_counter()
                r = await http.post("/responses", json=body)
                took.append(time.perf_counter() - one)
        ended = time.perf_counter()
        await asyncio.sleep(0.5)
        stop.set()
        await load
        out = r.json().get("output", [])
        item = out[1] if name in ("result", "error") and len(out) > 1 else (out[0] if out else {})
        what = item.get("error") or item.get("output")
        before = [lat for t, lat in latencies if t < started]
        during = [lat for t, lat in latencies if started <= t <= ended]
        return {"attack": name, "status": r.status_code, "attacks": len(took), "took_s_first": round(took[0], 3),
                "took_s_max": round(max(took), 3), "item": str(what)[:160],
                "response_bytes": len(r.content), "rss_before_mib": rss_before >> 20,
                "rss_after_mib": tether.rss() >> 20, "peak_rss_mib": peak_rss(tether.pid) >> 20,
                "other_p50_ms": (round(pct(before, 0.5), 1), round(pct(during, 0.5), 1)),
                "other_p99_ms": (round(pct(before, 0.99), 1), round(pct(during, 0.99), 1)),
                "other_max_ms": (round(max(before) * 1000, 1), round(max(during, default=0) * 1000, 1)),
                "other_requests_during": len(during)}  # fmt: skip
    finally:
        bad.terminate()
        bad.wait(10)


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "tether.toml"
        cfg.write_text(CONFIG)
        for name in args.attack or list(ATTACKS):
            tether = ServerProcess(cfg, Path(tmp), name=f"tether-{name}").start()  # a fresh process per attack
            try:
                row = await attack(name, tether, args.seconds)
            finally:
                tether.stop(timeout=15)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attack", action="append", choices=list(ATTACKS))
    ap.add_argument("--seconds", type=float, default=3.0, help="baseline before the attack")
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
