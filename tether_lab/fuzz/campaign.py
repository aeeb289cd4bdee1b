"""The campaign (`run_campaign`): seeds, every surface in turn, the server's health, RSS and log
afterwards, the report; and the `tether fuzz` command (`main`). See the package notes."""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from tether.protocol.wire import TERMINAL_EVENT_TYPES
from tether_lab.fuzz.mutation import STATIC_SEEDS, Mutator, recorded_seeds
from tether_lab.fuzz.oracle import Report, SurfaceStats
from tether_lab.fuzz.surfaces import Target, fuzz_grpc, fuzz_http, fuzz_ws
from tether_lab.load import write_config
from tether_lab.metrics import ProcStat
from tether_lab.processes import ServerProcess

FUZZ_KEY = "sk-fuzz-0123456789abcdef"
SURFACES = ("ws", "http", "grpc")


# -- health after the campaign --------------------------------------------------------------------------


async def healthy_rollout(target: Target) -> dict[str, Any]:
    """A normal tool loop over WebSocket (store=true), its retrieval over HTTP and a gRPC session."""
    import grpc
    import httpx
    from websockets.asyncio.client import connect

    from tether.responses.v1 import service_pb2, service_pb2_grpc

    out: dict[str, Any] = {"ok": False}
    auth = {"Authorization": f"Bearer {target.api_key}"}
    try:
        async with connect(target.ws_url, additional_headers=auth, max_size=None) as conn:
            seeds = await asyncio.wait_for(recorded_seeds(target.ws_url, target.api_key), 60)
            out["ws_frames"] = len(seeds)
            await conn.send(
                orjson.dumps({"type": "response.create", "model": "m", "input": "hi", "store": True}).decode()
            )
            while True:
                ev = orjson.loads(await asyncio.wait_for(conn.recv(), 30))
                if ev["type"] in TERMINAL_EVENT_TYPES:
                    break
            out["ws"] = ev["response"]["status"]
            rid = ev["response"]["id"]
        async with httpx.AsyncClient(base_url=target.http_url, headers=auth, timeout=30) as h:
            out["http_retrieve"] = (await h.get(f"/v1/responses/{rid}")).status_code
            out["healthz"] = (await h.get("/healthz")).status_code
            out["readyz"] = (await h.get("/readyz")).status_code
        async with grpc.aio.insecure_channel(target.grpc) as channel:
            stub = service_pb2_grpc.ResponsesServiceStub(channel)
            call = stub.Session(metadata=(("authorization", f"Bearer {target.api_key}"),))
            req = service_pb2.SessionRequest()
            req.create.model, req.create.input_text, req.create.previous_response_id = "m", "and again", rid
            await call.write(req)
            status = None
            async for batch in call:
                for e in batch.events:
                    if e.WhichOneof("event") in ("completed", "failed", "incomplete"):
                        status = getattr(e, e.WhichOneof("event")).response.status
                if status:
                    break
            call.cancel()
            out["grpc"] = status
        out["ok"] = (out["ws"] == "completed" and out["http_retrieve"] == 200 and out["healthz"] == 200
                     and out["readyz"] == 200 and out["grpc"] == "completed" and out["ws_frames"] > 0)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


# -- the campaign ------------------------------------------------------------------------------------------


async def run_campaign(target: Target, *, iterations: int, seed: int, surfaces: Iterable[str] = SURFACES,
                       server: ServerProcess | None = None, deadline_s: float = 15.0, raw_deadline_s: float = 1.0,
                       huge_rate: float = 0.002, rss_growth_mib: float = 96.0, warmup: int = 500,
                       progress: Callable[[str], None] | None = None) -> Report:  # fmt: skip
    surfaces = list(surfaces)
    say = progress or (lambda _m: None)
    rng = random.Random(seed)
    recorded = await recorded_seeds(target.ws_url, target.api_key)
    seeds = [*recorded, *copy.deepcopy(STATIC_SEEDS)]
    mutator = Mutator(rng, seeds, huge_rate=huge_rate)
    report = Report({name: SurfaceStats(name) for name in surfaces}, seed=seed)
    rss = report.rss
    proc = ProcStat(server.pid) if server else None
    if proc:
        rss["start"] = proc.rss_bytes()
    peak = 0
    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling and proc:
            peak = max(peak, proc.rss_bytes())
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    try:
        # Warm-up: a slice of every surface, so the baseline includes caches, codecs, pools.
        warm = {name: SurfaceStats(name) for name in surfaces}
        for name in surfaces:
            await _run_surface(
                name, target, mutator, min(warmup, iterations), warm[name], deadline_s, raw_deadline_s
            )
        if proc:
            rss["after_warmup"] = proc.rss_bytes()
        for name in surfaces:
            say(f"fuzz: {name}: {iterations} inputs")
            stats = report.surfaces[name]
            started = time.perf_counter()
            await _run_surface(name, target, mutator, iterations, stats, deadline_s, raw_deadline_s)
            stats.seconds = time.perf_counter() - started
            say(f"fuzz: {name}: done in {stats.seconds:.1f}s, findings {dict(stats.findings) or 'none'}")
            if server is not None and server.proc is not None and server.proc.poll() is not None:
                stats.finding("crash", f"server exited with {server.proc.returncode}")
                break
        # Warm-up findings count too (they are real inputs), under their own label.
        for name, w in warm.items():
            stats = report.surfaces[name]
            stats.warmup_inputs = w.inputs
            for cls, count in w.findings.items():
                stats.findings[f"{cls} (warm-up)"] += count
                stats.examples.setdefault(f"{cls} (warm-up)", w.examples.get(cls, ""))
            stats.signatures.update(w.signatures)
            stats.deviations.update(w.deviations)
    finally:
        sampling = False
        sampler.cancel()
    report.health = await healthy_rollout(target)
    if proc:
        await asyncio.sleep(1.0)
        rss["end"] = proc.rss_bytes()
        rss["peak"] = peak
        growth = rss["end"] - rss.get("after_warmup", rss["end"])
        rss["growth_after_warmup"] = growth
        rss["growth_exceeded"] = int(growth > rss_growth_mib * 1024 * 1024)
    if server is not None:
        errors = [
            line
            for line in server.log_text().splitlines()
            if '"level":"error"' in line or "Traceback" in line
        ]
        report.server_log_errors = len(errors)
        report.server_log_examples = [e[:4000] for e in errors[:5]]
        report.server_log_signatures = Counter(log_signature(e) for e in errors)
    return report


_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\w+)')


def log_signature(line: str) -> str:
    """`<logger>: <exception type> at <file>:<function>` of an error log line (JSON or text)."""
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line[:80]
    exc = rec.get("exc") or ""
    frames = _FRAME.findall(exc)
    last = exc.strip().splitlines()[-1] if exc.strip() else rec.get("msg", "")
    where = ""
    if frames:
        file, func = frames[-1]
        where = f" at {file.rsplit('/', 1)[-1]}:{func}"
    kind = last.split(":", 1)[0][:60]
    return f"{rec.get('logger')}: {kind}{where}"


async def _run_surface(name: str, target: Target, mutator: Mutator, n: int, stats: SurfaceStats, deadline_s: float,
                       raw_deadline_s: float) -> None:  # fmt: skip
    if name == "ws":
        await fuzz_ws(target, mutator, n, stats, deadline_s=deadline_s)
    elif name == "http":
        await fuzz_http(target, mutator, n, stats, deadline_s=deadline_s)
    elif name == "grpc":
        await fuzz_grpc(target, mutator, n, stats, deadline_s=deadline_s, raw_deadline_s=raw_deadline_s)
    else:
        raise ValueError(f"unknown surface {name!r}")


def own_server(tmp: Path, *, extra_args: list[str] | None = None) -> ServerProcess:
    """A `tether serve` subprocess for fuzzing: fast simulated model, SQLite store in `tmp`."""
    config = write_config(tmp / "fuzz.toml", store=f"sqlite:///{tmp / 'fuzz.db'}",
                          sim={"ttft_ms": 0, "tokens_per_s": 0, "output_tokens": 12, "tick_ms": 1})  # fmt: skip
    return ServerProcess(config, tmp, name="server", args=list(extra_args or []),
                         env={"TETHER_API_KEYS": f"{FUZZ_KEY}:fuzz"})  # fmt: skip


def format_report(report: Report) -> str:
    lines = [f"tether fuzz, seed {report.seed}", ""]
    header = f"{'surface':<6} {'inputs':>7} {'secs':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  findings"
    lines += [header, "-" * len(header)]
    for name, s in report.surfaces.items():
        d = s.summary()
        lat = d["latency_ms"]
        lines.append(f"{name:<6} {s.inputs:>7} {s.seconds:>6.1f} {lat['p50']!s:>8} {lat['p99']!s:>8} {lat['max']!s:>8}  "
                     f"{dict(s.findings) or 'none'}")  # fmt: skip
    for name, s in report.surfaces.items():
        lines += ["", f"{name}: outcomes by class"]
        for cls, count in s.outcomes.most_common(25):
            lines.append(f"  {count:>7}  {cls}")
        if len(s.outcomes) > 25:
            rest = sum(c for _, c in s.outcomes.most_common()[25:])
            lines.append(f"  {rest:>7}  ({len(s.outcomes) - 25} more classes)")
        for cls, count in s.deviations.items():
            lines.append(f"  deviation x{count}: {cls}")
        for sig, count in s.signatures.most_common():
            lines.append(f"  finding x{count}: {sig}")
        for cls, ex in s.examples.items():
            lines.append(f"  e.g. {cls}: {ex[:300]}")
    if report.rss:
        mib = {k: round(v / 2**20, 1) for k, v in report.rss.items() if k != "growth_exceeded"}
        lines += ["", f"server RSS (MiB): {mib}"]
    lines += [f"health after: {report.health}", f"server log error lines: {report.server_log_errors}"]
    for sig, count in report.server_log_signatures.most_common():
        lines.append(f"  {count:>7}  {sig}")
    findings = report.findings
    lines += ["", f"FINDINGS: {dict(findings)}" if findings else "FINDINGS: none"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tether fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=10_000, help="inputs per surface (default 10000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--surfaces", default=",".join(SURFACES), help="comma-separated: ws,http,grpc")
    p.add_argument(
        "--target", help="BRIDGE_HOST:PORT,GRPC_HOST:PORT of a running Tether (default: start one)"
    )
    p.add_argument("--api-key", default=FUZZ_KEY, help="API key for --target")
    p.add_argument("--deadline-s", type=float, default=15.0, help="answer deadline per input")
    p.add_argument("--raw-deadline-s", type=float, default=1.0, help="deadline for raw gRPC stream bytes")
    p.add_argument("--huge-rate", type=float, default=0.002, help="share of strings of 1.1M characters")
    p.add_argument("--rss-growth-mib", type=float, default=96.0, help="allowed RSS growth after warm-up")
    p.add_argument(
        "--warmup", type=int, default=500, help="warm-up inputs per surface before the RSS baseline"
    )
    p.add_argument("--json", help="write the report as JSON to this file")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `tether fuzz -- --iterations N` (see docs/reliability.md on the CLI)
        argv = argv[1:]
    args = p.parse_args(argv)
    surfaces = [s.strip() for s in args.surfaces.split(",") if s.strip()]

    async def go(target: Target, server: ServerProcess | None) -> Report:
        return await run_campaign(target, iterations=args.iterations, seed=args.seed, surfaces=surfaces, server=server,
                                  deadline_s=args.deadline_s, raw_deadline_s=args.raw_deadline_s,
                                  huge_rate=args.huge_rate, rss_growth_mib=args.rss_growth_mib, warmup=args.warmup,
                                  progress=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip

    if args.target:
        bridge, _, grpc_addr = args.target.partition(",")
        report = asyncio.run(go(Target(bridge, grpc_addr, args.api_key), None))
    else:
        with tempfile.TemporaryDirectory(prefix="tether-fuzz-") as tmp:
            with own_server(Path(tmp)) as server:
                target = Target(f"127.0.0.1:{server.bridge_port}", server.grpc_target, FUZZ_KEY)
                report = asyncio.run(go(target, server))
                code = server.terminate(60)
                if code != 0:
                    report.surfaces[surfaces[0]].finding("crash", f"server exit code {code} after SIGTERM")
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode())
    return 1 if report.findings else 0

