"""`tether bench throughput`: many concurrent gRPC sessions, each streaming one long answer.

    tether bench throughput                       # 100 streams x 4,000 tokens at 4,000 tok/s, coalescing default vs 0
    tether bench -- --throughput --streams 50 --answer-tokens 8000 --tps 4000 --coalesce 8,2,0
    tether bench throughput --coalesce default --workers 1,2   # one process vs one per core

For each `coalesce_ms` value (x each `--tokens-per-chunk`, x each `--workers`) a fresh server
subprocess is started (`coalesce_ms` is the window's minimum: with many streams generating it
widens to streams / `limits.coalesce_batches_per_s`, 25 ms for 100 streams at the defaults; pass
`--set limits.coalesce_batches_per_s=0` for a fixed window; messages per stream show the effect)
(simulated model, unscripted text answer of `--answer-tokens` tokens at `--tps`, by default one
delta per token as most upstreams send them);
`--streams` gRPC Session streams (one channel and TCP connection each, like separate agents) each send one create at
the same moment and read to `response.completed`. Per stream: delivered tokens/s = output tokens /
(completion - first delta), TTFT, SessionResponse messages and events received. Server: RSS
before / peak / after (sampled every 50 ms), CPU seconds during the round, per worker process
with `--workers N` (N > 1 serves an SQLite store in the results directory: workers refuse a private
`memory://` one). The client runs in this process (it shares the machine's cores with the server:
its CPU time is reported too).

Connection-scoped state is checked on every stream: after `response.completed` the stream sends a
continuation of that response with `store: false` and `generate: false`. It can only resolve from
the connection's own cache (nothing was stored), so with several workers it proves the state
lives in the worker that holds the socket; `continued` counts the streams where it did (a cached
prefix, `usage.input_tokens_details.cached_tokens` > 0).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from tether import eventloop
from tether.protocol.wire import DELTA_ARMS
from tether.responses.v1 import service_pb2, service_pb2_grpc
from tether_lab.metrics import ProcStat, machine
from tether_lab.processes import ServerProcess, serve_process, worker_pids
from tether_lab.report import pct


@dataclass
class StreamResult:
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    duration_s: float = 0.0  # first delta -> completed
    output_tokens: int = 0
    messages: int = 0
    events: int = 0
    deltas: int = 0
    continued: bool = False  # the store=false continuation resolved from the connection's cache

    @property
    def tokens_per_s(self) -> float | None:
        return self.output_tokens / self.duration_s if self.ok and self.duration_s > 0 else None


@dataclass
class Round:
    coalesce_ms: str
    streams: int
    wall_s: float = 0.0
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    server_cpu_s: float = 0.0
    worker_cpu_s: list[float] = field(default_factory=list)  # per worker process (--workers > 1)
    client_cpu_s: float = 0.0
    results: list[StreamResult] = field(default_factory=list)

    def summary(self, target_tps: float) -> dict:
        ok = [r for r in self.results if r.ok]
        rates = [r.tokens_per_s for r in ok if r.tokens_per_s]
        total_tokens = sum(r.output_tokens for r in ok)
        return {
            "coalesce_ms": self.coalesce_ms,
            "streams": self.streams,
            "ok": len(ok),
            "per_stream_tps_p50": pct(rates, 50),
            "per_stream_tps_p10": pct(rates, 10),
            "per_stream_tps_min": min(rates) if rates else None,
            "streams_at_target": sum(1 for r in rates if r >= target_tps * 0.98),
            "continued": sum(1 for r in ok if r.continued),
            "aggregate_tps": total_tokens / self.wall_s if self.wall_s else None,
            "ttft_p50_ms": _ms(pct([r.ttft_s for r in ok], 50)),
            "ttft_p99_ms": _ms(pct([r.ttft_s for r in ok], 99)),
            "messages_per_stream": _mean([r.messages for r in ok]),
            "events_per_stream": _mean([r.events for r in ok]),
            "deltas_per_stream": _mean([r.deltas for r in ok]),
            "tokens_per_message": (total_tokens / sum(r.messages for r in ok)) if ok else None,
            "wall_s": self.wall_s,
            "server_cpu_s": self.server_cpu_s,
            "server_cpu_util": self.server_cpu_s / self.wall_s if self.wall_s else None,
            "worker_cpu_s": self.worker_cpu_s,
            "client_cpu_s": self.client_cpu_s,
            "rss_before_mb": self.rss_before / 2**20,
            "rss_peak_mb": self.rss_peak / 2**20,
            "rss_after_mb": self.rss_after / 2**20,
            "errors": sorted({r.error for r in self.results if r.error})[:3],
        }


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def write_config(path: Path, *, tps: float, tokens: int, ttft_ms: float, store: str, tokens_per_chunk: int = 1) -> None:
    path.write_text(
        f'store = "{store}"\nlog_level = "warning"\n\n'
        "[server]\nlog_format = \"text\"\ngrpc_port = 0\nbridge_port = 0\nshutdown_grace_s = 2.0\n\n"
        '[backends."tput"]\nkind = "simulated"\n'
        f"ttft_ms = {ttft_ms}\ntokens_per_s = {tps}\noutput_tokens = {tokens}\ncall_tools = false\n"
        f"tokens_per_chunk = {tokens_per_chunk}\n\n"
        '[models."*"]\nbackend = "tput"\n'
    )


async def _one_stream(addr: str, start: asyncio.Event) -> StreamResult:
    res = StreamResult()
    # A connection of its own, like a separate agent: grpc otherwise shares one TCP connection
    # among channels to the same address (its global subchannel pool), so every stream would be
    # multiplexed on one HTTP/2 connection, and land on one worker.
    channel = grpc.aio.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        call = service_pb2_grpc.ResponsesServiceStub(channel).Session()
        req = service_pb2.SessionRequest()
        req.create.model = "tether-sim"
        req.create.input_text = "Write a long, detailed answer."
        req.create.store = False
        await channel.channel_ready()
        await start.wait()
        t0 = time.perf_counter()
        first = None
        await call.write(req)
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                res.error = "stream ended early"
                return res
            res.messages += 1
            for ev in msg.events:
                res.events += 1
                arm = ev.WhichOneof("event")
                if arm in DELTA_ARMS:
                    res.deltas += 1
                    if first is None:
                        first = time.perf_counter()
                        res.ttft_s = first - t0
                elif arm == "completed":
                    res.duration_s = time.perf_counter() - (first or t0)
                    res.output_tokens = ev.completed.response.usage.output_tokens
                    res.ok = True
                    res.continued = await _continues(call, ev.completed.response.id)
                    call.cancel()
                    return res
                elif arm in ("failed", "incomplete", "error"):
                    res.error = arm
                    return res
    except grpc.aio.AioRpcError as exc:
        res.error = f"{exc.code().name}: {exc.details()}"
        return res
    finally:
        await channel.close()


async def _continues(call, response_id: str) -> bool:
    """Whether a store=false, generate=false continuation of `response_id` on this stream resolves
    from the connection's cache (see the module docstring)."""
    req = service_pb2.SessionRequest()
    req.create.model = "tether-sim"
    req.create.input_text = "Thanks."
    req.create.store = False
    req.create.generate = False
    req.create.previous_response_id = response_id
    await call.write(req)
    while True:
        msg = await call.read()
        if msg is grpc.aio.EOF:
            return False
        for ev in msg.events:
            arm = ev.WhichOneof("event")
            if arm == "completed":
                return ev.completed.response.usage.cached_tokens > 0
            if arm in ("failed", "incomplete", "error"):
                return False


async def run_round(addr: str, pid: int, streams: int, coalesce: str, workers: list[int] | None = None) -> Round:
    """One round against the server process `pid` (with `workers`: the supervisor, and the pids
    of its workers, whose CPU and memory are what the round reports)."""
    procs = [ProcStat(p) for p in (workers or [pid])]
    rnd = Round(coalesce_ms=coalesce, streams=streams, rss_before=sum(s.rss_bytes() for s in procs))
    start = asyncio.Event()
    tasks = [asyncio.create_task(_one_stream(addr, start)) for _ in range(streams)]
    await asyncio.sleep(0.5)  # channels connect before the clock starts
    peak = rnd.rss_before
    cpu0, ccpu0 = [s.cpu_seconds() for s in procs], time.process_time()
    t0 = time.perf_counter()
    start.set()
    done = asyncio.gather(*tasks)
    while not done.done():
        peak = max(peak, sum(s.rss_bytes() for s in procs))
        await asyncio.wait({done}, timeout=0.05)
    rnd.wall_s = time.perf_counter() - t0
    cpu = [s.cpu_seconds() - c for s, c in zip(procs, cpu0, strict=True)]
    rnd.server_cpu_s, rnd.client_cpu_s = sum(cpu), time.process_time() - ccpu0
    rnd.worker_cpu_s = cpu if workers else []
    rnd.results = done.result()
    await asyncio.sleep(1.0)  # sessions close, memory settles
    rss = sum(s.rss_bytes() for s in procs)
    rnd.rss_peak, rnd.rss_after = max(peak, rss), rss
    return rnd


async def run(args: argparse.Namespace, out: Path) -> list[dict]:
    rows = []
    chunks = [int(c) for c in str(args.tokens_per_chunk).split(",")]
    coalesces = [c.strip() for c in args.coalesce.split(",") if c.strip()]
    worker_counts = [int(w) for w in str(getattr(args, "workers", "1")).split(",")]
    settings = [(c, k, w) for w in worker_counts for k in chunks for c in coalesces]
    for coalesce, per_chunk, workers in settings:
        tag = f"{coalesce}-x{per_chunk}-w{workers}"
        cfg = out / f"throughput-{tag}.toml"
        store = f"sqlite:///{(out / f'throughput-{tag}.db').resolve()}" if workers > 1 else "memory://"
        write_config(cfg, tps=args.tps, tokens=args.answer_tokens, ttft_ms=50.0, store=store,
                     tokens_per_chunk=per_chunk)
        extra = [x for s in args.set for x in ("--set", s)]
        if coalesce != "default":
            extra += ["--set", f"limits.coalesce_ms={coalesce}"]
        if workers > 1:
            extra += ["--workers", str(workers)]
        proc = serve_process(cfg, out, name=f"throughput-{tag}", extra=extra).start()
        try:
            pids = _wait_for_workers(proc, workers) if workers > 1 else None
            addr = f"127.0.0.1:{proc.grpc_port}"
            await run_round(addr, proc.pid, min(10, args.streams), coalesce, pids)  # warm-up
            rnd = await run_round(addr, proc.pid, args.streams, coalesce, pids)
        finally:
            proc.stop()
        row = {"tokens_per_chunk": per_chunk, "workers": workers, **rnd.summary(args.tps)}
        rows.append(row)
        (out / f"throughput-{tag}-streams.json").write_text(json.dumps([asdict(r) for r in rnd.results]))
    return rows


def _wait_for_workers(proc: ServerProcess, n: int, timeout: float = 30.0) -> list[int]:
    """The workers' pids from the supervisor's start lines (blocking: called between measurements)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = worker_pids(proc.stdout_path.read_text(errors="replace"))
        if len(pids) == n:
            return pids
        time.sleep(0.05)
    raise TimeoutError(f"{n} workers did not start within {timeout:g} s; see {proc.stdout_path}")


def render(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"{args.streams} concurrent gRPC streams, {args.answer_tokens} tokens each at {args.tps:g} tok/s simulated "
        "(tokens/chunk: tokens per backend chunk; 1 = one delta per token, as most upstreams stream)",
        "",
        "| workers | coalesce_ms | tokens/chunk | ok | continued | per-stream tok/s p50 | p10 | min | streams at target "
        "| aggregate tok/s | TTFT p50 ms | p99 ms | msgs/stream | events/stream | tokens/msg | server CPU (util) "
        "| CPU s per worker | client CPU s | RSS before/peak/after MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_worker = " / ".join(f"{c:.1f}" for c in r["worker_cpu_s"]) or "–"
        lines.append(
            f"| {r['workers']} | {r['coalesce_ms']} | {r['tokens_per_chunk']} | {r['ok']}/{r['streams']} | {r['continued']} "
            f"| {_f(r['per_stream_tps_p50'], 0)} | {_f(r['per_stream_tps_p10'], 0)} "
            f"| {_f(r['per_stream_tps_min'], 0)} | {r['streams_at_target']} | {_f(r['aggregate_tps'], 0)} "
            f"| {_f(r['ttft_p50_ms'], 0)} | {_f(r['ttft_p99_ms'], 0)} | {_f(r['messages_per_stream'], 0)} "
            f"| {_f(r['events_per_stream'], 0)} | {_f(r['tokens_per_message'], 1)} "
            f"| {r['server_cpu_s']:.1f} s ({100 * (r['server_cpu_util'] or 0):.0f}%) | {per_worker} | {r['client_cpu_s']:.1f} "
            f"| {r['rss_before_mb']:.0f} / {r['rss_peak_mb']:.0f} / {r['rss_after_mb']:.0f} |"
        )
    return "\n".join(lines)


def _f(v: float | None, digits: int) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def main(args: argparse.Namespace) -> int:
    out = args.out or Path("bench-results") / f"throughput-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    rows = eventloop.run(run(args, out))
    payload = {"command": "tether bench " + " ".join(args.argv), "started": args.started, "machine": machine(),
               "streams": args.streams, "answer_tokens": args.answer_tokens, "tps": args.tps, "rounds": rows}
    (out / "throughput.json").write_text(json.dumps(payload, indent=1))
    text = render(rows, args)
    (out / "throughput.md").write_text(text + "\n")
    print(text)
    print(f"results: {out}/ (throughput.json, throughput.md)")
    return 0 if all(r["ok"] == r["continued"] == r["streams"] for r in rows) else 1
