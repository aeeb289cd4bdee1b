"""The fairness campaign: can one tenant's heavy request hurt another tenant?

    python -m tether_lab.fairness                 # every scenario, ~1-2 minutes
    python -m tether_lab.fairness --quick         # toy sizes, seconds (the smoke test)
    python -m tether_lab.fairness --scenarios logprobs,sse_line --json out.json

A real `tether serve` subprocess (default limits, two API keys) serves a quiet tenant and a noisy
one. The quiet tenant runs short WebSocket turns back to back in a process of its own for the
whole campaign, each timed. The campaign first measures the quiet tenant alone (the baseline),
then, one scenario at a time, has the noisy tenant send one kind of heavy request (each a case
the red team used to stall the server):

- `big_input`: one create whose input is nearly `max_request_bytes` of text (in items of 6 MiB,
  under `max_item_bytes`, so that all of it is checked and tokenised);
- `big_conversation`: a conversation filled to `max_conversation_bytes`, then a create on it;
- `logprobs`: `top_logprobs: 20` on a model that answers 30,000 tokens;
- `template`: a prompt template that uses a 768 KiB variable ten times (a 7.5 MiB message);
- `sse_line`: an upstream that sends one 50 MB server-sent-events line;
- `queued_bytes`: 256 creates of 4 MiB queued on one WebSocket.

For each phase it reports the quiet tenant's turn latency (p50, p99, max) next to the baseline's,
and the server's longest event-loop stall in the phase (its loop-lag probe,
`tether_event_loop_lag_max_seconds`, read at the start and the end of the phase), next to the
loop's longest CPU-busy stretch (`tether_event_loop_busy_max_seconds`: its own work; the rest of
a stall is the machine not running the process, or the loop waiting for the interpreter lock
held by the offload thread). The target:
the quiet p99 within 50 ms of the baseline's and no stall over 50 ms (docs/reliability.md,
"Fairness").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from tether_lab.metrics import parse_prometheus
from tether_lab.processes import ServerProcess, die_with_parent

NOISY_KEY, QUIET_KEY = "sk-noisy", "sk-quiet"
TARGET_MS = 50.0
SCENARIOS = ("big_input", "big_conversation", "logprobs", "template", "sse_line", "queued_bytes")


@dataclass(frozen=True)
class Sizes:
    """How heavy each scenario is (`--quick` shrinks all of them)."""

    input_bytes: int = 30 * 1024 * 1024
    conversation_bytes: int = 30 * 1024 * 1024
    logprob_tokens: int = 30_000
    template_var_bytes: int = 768 * 1024  # used ten times: a 7.5 MiB message, under max_item_bytes
    sse_line_bytes: int = 50 * 1000 * 1000
    sse_cap_bytes: int = 0  # the upstream backend's max_event_bytes (0: its default, 16 MiB)
    queued_creates: int = 256
    queued_create_bytes: int = 4 * 1024 * 1024
    baseline_s: float = 6.0
    settle_s: float = 1.0  # quiet turns after each heavy request, still in its phase
    quiet_s: float = 2.0  # queued_bytes: a socket silent this long holds the rest of its creates
    warm_up_s: float = 1.0  # the quiet tenant connects before the baseline starts


QUICK = Sizes(
    input_bytes=512 * 1024, conversation_bytes=512 * 1024, logprob_tokens=500, template_var_bytes=64 * 1024,
    sse_line_bytes=2 * 1000 * 1000, sse_cap_bytes=1024 * 1024, queued_creates=16, queued_create_bytes=256 * 1024, baseline_s=1.0, settle_s=0.3, quiet_s=0.5, warm_up_s=0.3,
)  # fmt: skip


@dataclass
class PhaseResult:
    name: str
    seconds: float
    turns: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    stall_ms: float  # the server's longest event-loop stall in the phase (wall time)
    busy_ms: float  # the loop's longest CPU-busy stretch in it (its own work, not machine noise)
    noisy: str = ""  # what the heavy request got back
    failed_quiet: int = 0
    p99_over_baseline_ms: float = 0.0
    meets_target: bool = True


@dataclass
class Report:
    phases: list[PhaseResult] = field(default_factory=list)
    command: str = ""

    def markdown(self) -> str:
        lines = [
            f"`{self.command}`",
            "",
            "| phase | quiet turns | p50 ms | p99 ms | max ms | p99 - baseline ms | longest loop stall ms | of it busy ms | noisy request got | target |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in self.phases:
            lines.append(
                f"| {p.name} | {p.turns} | {p.p50_ms:.1f} | {p.p99_ms:.1f} | {p.max_ms:.1f} | "
                f"{p.p99_over_baseline_ms:+.1f} | {p.stall_ms:.1f} | {p.busy_ms:.1f} | {p.noisy} | "
                f"{'met' if p.meets_target else 'MISSED'} |"
            )
        return "\n".join(lines)


# -- the server -----------------------------------------------------------------------------------


def write_config(path: Path, upstream_port: int, sizes: Sizes) -> Path:
    """Default limits; a fast model for the quiet tenant, a long-answer model, an upstream model
    behind the campaign's own misbehaving Chat Completions server, and a template."""
    uses = " ".join(["{{v}}"] * 10)
    path.write_text(f"""store = "memory://"
log_level = "warning"

[server]
loop_lag_interval_s = 0.005
memory_reclaim_interval_s = 0

[backends.sim]
kind = "simulated"
ttft_ms = 1
tokens_per_s = 4000
output_tokens = 24
tick_ms = 2

[backends.long]
kind = "simulated"
ttft_ms = 1
tokens_per_s = 20000
output_tokens = {sizes.logprob_tokens}
tick_ms = 2

[backends.hang]
kind = "simulated"
ttft_ms = 60000

[backends.up]
kind = "openai"
base_url = "http://127.0.0.1:{upstream_port}/v1"
dialect = "openai"
discover_models = false
max_retries = 0
{f"max_event_bytes = {sizes.sse_cap_bytes}" if sizes.sse_cap_bytes else ""}

[models.quiet]
backend = "sim"

[models.long]
backend = "long"

[models.hang]
backend = "hang"

[models.upstream]
backend = "up"

[prompts.tenfold]
input = [{{ role = "user", content = "{uses}" }}]
""")
    return path


async def long_line_upstream(size: int) -> asyncio.Server:
    """A Chat Completions upstream that answers every request with the start of an SSE stream whose
    first line does not end within `size` bytes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
            writer.write(b"data: ")
            block = b"x" * (1024 * 1024)
            sent = 0
            while sent < size:
                writer.write(block)
                sent += len(block)
                await writer.drain()
            writer.write(b"\n\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


# -- the quiet tenant (a process of its own) ------------------------------------------------------


async def quiet_tenant(ws_url: str) -> list[tuple[float, float, bool]]:
    """Short turns back to back until SIGTERM; (wall start, seconds, completed) per turn."""
    from websockets.asyncio.client import connect

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    rows: list[tuple[float, float, bool]] = []
    create = orjson.dumps({"type": "response.create", "model": "quiet", "input": "hi", "store": False}).decode()
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {QUIET_KEY}"},
                       compression=None, max_size=None) as conn:  # fmt: skip
        while not stop.is_set():
            started, t0 = time.time(), time.perf_counter()
            await conn.send(create)
            ok = False
            while True:
                ev = orjson.loads(await conn.recv())
                kind = ev.get("type", "")
                if kind in ("response.completed", "response.failed", "response.incomplete", "error"):
                    ok = kind == "response.completed"
                    break
            rows.append((started, time.perf_counter() - t0, ok))
            await asyncio.sleep(0.005)
    return rows


# -- the noisy tenant's requests ------------------------------------------------------------------


async def _ws_create(url: str, create: dict[str, Any], *, within: float = 120.0) -> str:
    """One create on a fresh WebSocket of the noisy key; what ended it."""
    from websockets.asyncio.client import connect

    async with connect(url, additional_headers={"Authorization": f"Bearer {NOISY_KEY}"},
                       compression=None, max_size=None) as conn:  # fmt: skip
        await conn.send(orjson.dumps({"type": "response.create", "store": False, **create}).decode())
        async with asyncio.timeout(within):
            while True:
                ev = orjson.loads(await conn.recv())
                kind = ev.get("type", "")
                if kind == "error":
                    return f"error {ev['error'].get('code')}"
                if kind in ("response.completed", "response.failed", "response.incomplete"):
                    r = ev["response"]
                    detail = (r.get("error") or {}).get("tether_code") or (r.get("incomplete_details") or {}).get("reason")
                    return f"{r['status']}" + (f" {detail}" if detail else "")


def noisy_requests(server: ServerProcess, sizes: Sizes) -> dict[str, Callable[[], Awaitable[str]]]:
    ws = server.ws_url
    headers = {"Authorization": f"Bearer {NOISY_KEY}", "content-type": "application/json"}

    async def big_input() -> str:
        piece = min(sizes.input_bytes, 6 * 1024 * 1024)  # items under max_item_bytes: all of it is read
        items = [{"type": "message", "role": "user", "content": "lorem ipsum " * (piece // 12)}
                 for _ in range(max(1, sizes.input_bytes // piece))]  # fmt: skip
        return await _ws_create(ws, {"model": "quiet", "input": items})

    async def big_conversation() -> str:
        async with httpx.AsyncClient(base_url=server.api_url, headers=headers, timeout=120) as h:
            conv = (await h.post("/conversations", json={})).json()["id"]
            per_item = 1024 * 1024
            left, got = sizes.conversation_bytes, "filled"
            while left > 0:
                n = min(20, max(1, left // per_item))
                chunk = min(per_item, left)
                items = [{"type": "message", "role": "user", "content": "word " * (chunk // 5)}] * n
                r = await h.post(f"/conversations/{conv}/items", json={"items": items})
                left -= n * chunk
                if r.status_code != 200:
                    got = f"fill refused {r.json()['error']['code']}"
                    break
        return f"{got}; create: " + await _ws_create(ws, {"model": "quiet", "input": "and now?", "conversation": conv})

    async def logprobs() -> str:
        return await _ws_create(ws, {"model": "long", "input": "talk", "top_logprobs": 20})

    async def template() -> str:
        var = "v " * (sizes.template_var_bytes // 2)
        return await _ws_create(ws, {"model": "quiet", "prompt": {"id": "tenfold", "variables": {"v": var}}})

    async def sse_line() -> str:
        return await _ws_create(ws, {"model": "upstream", "input": "hi"})

    async def queued_bytes() -> str:
        from websockets.asyncio.client import connect

        body = orjson.dumps({"type": "response.create", "model": "hang", "store": False,
                             "input": "x" * sizes.queued_create_bytes}).decode()  # fmt: skip
        codes: dict[str, int] = {}
        async with connect(ws, additional_headers={"Authorization": f"Bearer {NOISY_KEY}"},
                           compression=None, max_size=None) as conn:  # fmt: skip
            for _ in range(sizes.queued_creates):
                await conn.send(body)
            while sum(codes.values()) < sizes.queued_creates:
                try:  # the creates not refused wait behind the first (whose model never answers)
                    ev = orjson.loads(await asyncio.wait_for(conn.recv(), sizes.quiet_s))
                except TimeoutError:
                    codes["held"] = sizes.queued_creates - sum(codes.values())
                    break
                if ev.get("type") == "error":
                    code = ev["error"]["code"]
                elif ev.get("type") == "response.created":
                    code = "running"
                else:
                    continue
                codes[code] = codes.get(code, 0) + 1
        return ", ".join(f"{n} {code}" for code, n in sorted(codes.items()))

    return {name: fn for name, fn in locals().items() if name in SCENARIOS}


# -- the campaign ---------------------------------------------------------------------------------


def _stall_peak(server: ServerProcess) -> tuple[float, float]:
    """The longest loop stall since the previous read, and the loop's longest CPU-busy stretch
    (both reset by the read: the probe's peak gauges)."""
    samples = parse_prometheus(httpx.get(f"{server.base_url}/metrics", timeout=30).text)
    return samples.get(("tether_event_loop_lag_max_seconds", ()), 0.0), samples.get(("tether_event_loop_busy_max_seconds", ()), 0.0)


def _phase(name: str, rows: list[tuple[float, float, bool]], start: float, end: float,
           stall: tuple[float, float], noisy: str = "") -> PhaseResult:  # fmt: skip
    ms = sorted(1000 * s for (t, s, ok) in rows if start <= t < end)
    failed = sum(1 for (t, _, ok) in rows if start <= t < end and not ok)
    if not ms:
        ms = [float("nan")]
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return PhaseResult(name, end - start, len(ms), statistics.median(ms), p99, ms[-1], 1000 * stall[0],
                       1000 * stall[1], noisy, failed)  # fmt: skip


async def run_campaign(sizes: Sizes, scenarios: list[str], workdir: Path, command: str) -> Report:
    upstream = await long_line_upstream(sizes.sse_line_bytes)
    config = write_config(workdir / "fairness.toml", upstream.sockets[0].getsockname()[1], sizes)
    server = ServerProcess(config, workdir, name="fairness",
                           env={"TETHER_API_KEYS": f"{NOISY_KEY}:noisy,{QUIET_KEY}:quiet"})  # fmt: skip
    report = Report(command=command)
    await asyncio.to_thread(server.start)  # the upstream above answers on this loop meanwhile
    try:
        quiet = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tether_lab.fairness", "quiet", "--url", server.ws_url,
            stdout=asyncio.subprocess.PIPE, preexec_fn=die_with_parent,
        )  # fmt: skip
        try:
            await asyncio.sleep(sizes.warm_up_s)  # the quiet tenant connects and warms up
            windows: list[tuple[str, float, float, tuple[float, float], str]] = []
            await asyncio.to_thread(_stall_peak, server)
            t0 = time.time()
            await asyncio.sleep(sizes.baseline_s)
            windows.append(("baseline", t0, time.time(), await asyncio.to_thread(_stall_peak, server), ""))
            requests = noisy_requests(server, sizes)
            for name in scenarios:
                t0 = time.time()
                try:
                    got = await requests[name]()
                except Exception as exc:  # noqa: BLE001 - reported as the phase's outcome
                    got = f"client error {type(exc).__name__}: {exc}"[:120]
                await asyncio.sleep(sizes.settle_s)
                windows.append((name, t0, time.time(), await asyncio.to_thread(_stall_peak, server), got))
        finally:
            quiet.terminate()
            out, _ = await quiet.communicate()
    finally:
        await asyncio.to_thread(server.__exit__, None, None, None)
        upstream.close()
    rows = json.loads(out or b"[]")
    for name, start, end, stall, got in windows:
        report.phases.append(_phase(name, rows, start, end, stall, got))
    base = report.phases[0]
    for p in report.phases:
        p.p99_over_baseline_ms = p.p99_ms - base.p99_ms
        p.meets_target = p.p99_over_baseline_ms <= TARGET_MS and p.stall_ms <= TARGET_MS and not p.failed_quiet
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tether_lab.fairness", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role")
    q = sub.add_parser("quiet", help="(internal) the quiet tenant's process")
    q.add_argument("--url", required=True)
    parser.add_argument("--quick", action="store_true", help="toy sizes: runs in seconds")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--json", help="also write the results as JSON here")
    parser.add_argument("--workdir", help="where the server's config and logs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.role == "quiet":  # its turns as JSON on stdout, once SIGTERM ends it
        print(json.dumps(asyncio.run(quiet_tenant(args.url))))
        return 0
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tether-fairness-"))
    workdir.mkdir(parents=True, exist_ok=True)
    command = "python -m tether_lab.fairness " + " ".join(argv if argv is not None else sys.argv[1:])
    report = asyncio.run(run_campaign(QUICK if args.quick else Sizes(), scenarios, workdir, command.strip()))
    print(report.markdown())
    if args.json:
        Path(args.json).write_text(json.dumps({"command": report.command, "phases": [asdict(p) for p in report.phases]}, indent=1))
    return 0 if all(p.meets_target for p in report.phases) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
