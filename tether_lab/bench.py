"""`tether bench`: agent rollouts over every transport, on identical work, against a Tether it
starts itself (or existing `--target` addresses); prints tables, writes JSON/CSV (and PNG charts
with `--plot`) under `bench-results/`.

    tether bench                          # = quick: seconds, every transport, CI smoke
    tether bench full --plot              # the write-up run (docs/transport-comparison.md)
    tether bench -- --workloads bugfix20 --speeds 1000 --reps 3 --delay-ms 10 --transports ws-inproc,grpc
    tether bench throughput               # 100 concurrent gRPC streams at 4,000 tok/s; coalescing on/off
    tether bench overhead                 # per-turn overhead, turn 1 vs 50 vs 100, cached gRPC continuation
    tether bench replicas --plot          # many agents on 1/2/4 simulated replicas, per routing policy

(`python -m tether_lab.bench ...` takes the same arguments. The `tether` CLI passes everything after
`bench` through, but its parser rejects a first argument that starts with `--`: lead with the
positional shorthand or with `--`.)

A run is a list of phases (workload x model speed x network delay x repetitions). Per phase every
selected transport runs the same rollouts, interleaved (rep-major, rotating order), one at a time
unless the phase is `concurrent` (slow-model phases, where the server is idle most of the time).
Around each rollout the bench reads the server's (and the remote bridge's) CPU time from /proc, the
`/metrics` stage histogram, and the delay proxy's byte counters. The server is a subprocess
started from a generated config: one simulated backend per (workload, speed) driven by the
workload's script (see `tether.workloads`), SQLite store, everything else default.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from tether import workloads
from tether_lab import metrics as M
from tether_lab import replicas, report
from tether_lab.processes import (
    ServerProcess,
    bridge_process,
    die_with_parent,
    model_name,
    serve_process,
    write_config,
)
from tether_lab.proxy import query_control
from tether_lab.transports import BASELINE, VARIANTS, RolloutResult, Target

DEFAULT_OUT = Path("bench-results")


@dataclass
class Phase:
    name: str
    workload: str
    speed: str  # SpeedProfile spec: "1000" or "4000@20:50" (tokens/s @ TTFT min:max ms)
    reps: int = 1
    variants: tuple[str, ...] | None = None  # None: every selected transport
    delay_ms: float = 0.0
    bandwidth_mbps: float = 0.0
    concurrent: bool = False
    client: str = "sdk"  # HTTP/WebSocket client: sdk (openai SDK) or raw (httpx/websockets + orjson)
    note: str = ""


FAST = "4000@5:10"
PROFILES: dict[str, list[Phase]] = {
    "quick": [
        Phase("quick", "chat3", FAST, 1, note="CI smoke: every transport, no proxy"),
        Phase("quick-net", "chat3", FAST, 1, delay_ms=2.0, note="CI smoke through the delay proxy"),
        Phase("quick-raw", "chat3", FAST, 1, client="raw", note="CI smoke of the lean (non-SDK) clients",
              variants=("http-full-keepalive", "http-full-newconn", "http-prev", "ws-inproc", "ws-proto", "grpc")),
    ],
    "full": [
        Phase("main", "bugfix20", "1000", 3, note="the headline: 22-call bug fix at 1,000 tok/s"),
        Phase("main-raw", "bugfix20", "1000", 2, client="raw",
              variants=("http-full-keepalive", "http-full-newconn", "http-prev", "ws-inproc", "ws-proto", "grpc"),
              note="the headline without the openai SDK in the client (httpx/websockets + orjson)"),
        Phase("speed-4000", "bugfix20", "4000", 2, note="fast model"),
        Phase("speed-65", "bugfix20", "65", 1, concurrent=True,
              note="slow model; transports run side by side (the server is idle >95% of the time)"),
        Phase("history", "long100", "4000@20:50", 1, note="100 calls: per-turn cost vs history"),
        Phase("chat", "chat3", "1000", 3, note="short chat: little history to save"),
        Phase("net-10ms", "bugfix20", "1000", 2, delay_ms=10.0, note="20 ms RTT (same-region cloud)"),
    ],
}


@dataclass
class Run:
    """Everything a bench run started, and the figures it took outside the rollouts."""

    out: Path
    server: ServerProcess | None = None
    bridge: ServerProcess | None = None
    grpc_addr: str = ""
    bridge_url: str = ""
    remote_url: str | None = None
    server_pid: int | None = None
    models: dict[tuple[str, str], str] = field(default_factory=dict)
    phase_info: dict[str, dict] = field(default_factory=dict)
    config_text: str = ""

    @property
    def metrics_url(self) -> str | None:
        return self.bridge_url.rsplit("/v1", 1)[0] + "/metrics" if self.bridge_url else None


class Proxy:
    """The delay proxy as a subprocess (so it never competes with the client's event loop)."""

    def __init__(self, routes: list[str], delay_ms: float, bandwidth_mbps: float, log: Path) -> None:
        argv = [sys.executable, "-m", "tether_lab.proxy", "--delay-ms", str(delay_ms),
                "--bandwidth-mbps", str(bandwidth_mbps)]
        for target in routes:
            argv += ["--route", f"0:{target}"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True,  # noqa: SIM115
                                     preexec_fn=die_with_parent)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"delay proxy did not start: {line!r}")
        info = json.loads(line[6:])
        self.ports = [r["listen"] for r in info["routes"]]
        self.control = info["control"]

    def counters(self) -> tuple[int, int, int]:
        stats = query_control(self.control)
        routes = stats["routes"]
        return sum(r["c2s"] for r in routes), sum(r["s2c"] for r in routes), sum(r["connections"] for r in routes)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- measuring one rollout ----------------------------------------------------------------------


def _scrape(url: str | None) -> dict[str, tuple[float, float]]:
    if not url:
        return {}
    try:
        return M.stage_sums(httpx.get(url, timeout=10).text)
    except httpx.HTTPError:
        return {}


class Bench:
    def __init__(self, args: argparse.Namespace, phases: list[Phase], out: Path) -> None:
        self.args = args
        self.phases = phases
        self.run = Run(out=out)
        self.results: list[RolloutResult] = []
        self.speeds = {p.speed: self._speed(p.speed) for p in phases}
        self.workloads = {p.workload: workloads.load(p.workload) for p in phases}
        self.progress = None
        self.loadavg_start = os.getloadavg()
        self.t_start = time.time()

    def _speed(self, spec: str) -> workloads.SpeedProfile:
        return workloads.SpeedProfile.parse(spec, ttft=self.args.ttft, ttft_ctx_tokens=self.args.ttft_ctx_tokens)

    def variants(self, phase: Phase) -> list[str]:
        chosen = list(phase.variants or VARIANTS)
        if self.args.transports:
            chosen = [v for v in chosen if v in self.args.transports]
        if self.args.no_remote or (self.args.target and not self.run.remote_url):
            chosen = [v for v in chosen if v != "ws-remote"]
        return chosen

    def pairs(self) -> list[tuple[workloads.Workload, workloads.SpeedProfile]]:
        pairs = [(self.workloads[p.workload], self.speeds[p.speed]) for p in self.phases]
        warm = self.warmup_pair()
        return [*pairs, warm] if warm else pairs

    def warmup_pair(self) -> tuple[workloads.Workload, workloads.SpeedProfile] | None:
        if self.args.no_warmup or not self.phases:
            return None
        return self.workloads[self.phases[0].workload], self._speed(FAST)

    # -- processes --------------------------------------------------------------------------------

    def start(self) -> None:
        run, args = self.run, self.args
        run.out.mkdir(parents=True, exist_ok=True)
        if args.target:
            t = dict(kv.split("=", 1) for kv in args.target.split(","))
            run.grpc_addr, run.bridge_url, run.remote_url = t.get("grpc", ""), t.get("http", ""), t.get("remote")
            run.server_pid = args.server_pid
            run.models = {(w.name, s.name): model_name(w, s) for w, s in self.pairs()}
            return
        cfg = run.out / "server.toml"
        store = args.store or f"sqlite:///{(run.out / 'tether.db').resolve()}"
        run.models = write_config(cfg, self.pairs(), store=store, script_dir=run.out / "scripts")
        run.config_text = cfg.read_text()
        extra = [x for s in args.set for x in ("--set", s)]
        run.server = serve_process(cfg, run.out, extra=extra).start()
        run.server_pid = run.server.pid
        run.grpc_addr = f"127.0.0.1:{run.server.grpc_port}"
        run.bridge_url = run.server.bridge_url or ""
        needs_remote = any("ws-remote" in self.variants(p) for p in self.phases)
        if needs_remote:
            run.bridge = bridge_process(run.grpc_addr, run.out).start()
            run.remote_url = run.bridge.bridge_url

    def stop(self) -> None:
        for proc in (self.run.bridge, self.run.server):
            if proc is not None:
                proc.stop()

    # -- phases -----------------------------------------------------------------------------------

    def target(self, phase: Phase, proxy: Proxy | None) -> Target:
        run = self.run
        model = run.models[(phase.workload, self.speeds[phase.speed].name)]
        if proxy is None:
            return Target(model, run.bridge_url, run.grpc_addr, run.remote_url, client=phase.client)
        ports = proxy.ports
        return Target(model, f"http://127.0.0.1:{ports[0]}/v1", f"127.0.0.1:{ports[1]}",
                      f"http://127.0.0.1:{ports[2]}/v1" if len(ports) > 2 else None, client=phase.client)

    def start_proxy(self, phase: Phase) -> Proxy | None:
        if phase.delay_ms <= 0 and phase.bandwidth_mbps <= 0:
            return None
        run = self.run
        routes = [run.bridge_url.split("//", 1)[1].split("/", 1)[0], run.grpc_addr]
        if run.remote_url:
            routes.append(run.remote_url.split("//", 1)[1].split("/", 1)[0])
        return Proxy(routes, phase.delay_ms, phase.bandwidth_mbps, self.run.out / f"proxy-{phase.name}.log")

    def _cpu(self) -> tuple[float | None, float | None]:
        run = self.run
        server = M.ProcStat(run.server_pid).cpu_seconds() if run.server_pid else None
        bridge = M.ProcStat(run.bridge.pid).cpu_seconds() if run.bridge else None
        return server, bridge

    async def measured(self, variant: str, phase: Phase, rep: int, target: Target, proxy: Proxy | None) -> RolloutResult:
        wl, speed = self.workloads[phase.workload], self.speeds[phase.speed]
        stages0 = _scrape(self.run.metrics_url)
        wire0 = proxy.counters() if proxy else None
        cpu0, bcpu0 = self._cpu()
        result = await VARIANTS[variant](target).run_rollout(
            wl, speed=speed.name, phase=phase.name, rep=rep, delay_ms=phase.delay_ms
        )
        cpu1, bcpu1 = self._cpu()
        if cpu0 is not None and cpu1 is not None:
            result.server_cpu_s = cpu1 - cpu0
        if variant == "ws-remote" and bcpu0 is not None and bcpu1 is not None:
            result.bridge_cpu_s = bcpu1 - bcpu0
        if proxy is not None and wire0 is not None:
            c2s, s2c, conns = proxy.counters()
            result.wire_c2s, result.wire_s2c = c2s - wire0[0], s2c - wire0[1]
            result.connections = conns - wire0[2]
        result.stage_sums = M.diff_stage_sums(stages0, _scrape(self.run.metrics_url))
        self._tick(result)
        return result

    def _tick(self, r: RolloutResult) -> None:
        if self.progress is not None:
            self.progress.set_postfix_str(f"{r.phase} {r.variant} {'ok' if r.ok else 'FAILED'} {r.e2e_s:.1f}s")
            self.progress.update(1)

    async def run_phase(self, phase: Phase) -> None:
        proxy = self.start_proxy(phase)
        try:
            target = self.target(phase, proxy)
            variants = self.variants(phase)
            for rep in range(phase.reps):
                k = rep % len(variants)
                order = variants[k:] + variants[:k]  # rotate so no transport always runs first
                if phase.concurrent:
                    await self._concurrent(phase, rep, order, target, proxy)
                else:
                    for variant in order:
                        self.results.append(await self.measured(variant, phase, rep, target, proxy))
                self.save()
        finally:
            if proxy is not None:
                proxy.stop()

    async def _concurrent(self, phase: Phase, rep: int, order: list[str], target: Target, proxy: Proxy | None) -> None:
        wl, speed = self.workloads[phase.workload], self.speeds[phase.speed]
        cpu0, bcpu0 = self._cpu()
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(
            VARIANTS[v](target).run_rollout(wl, speed=speed.name, phase=phase.name, rep=rep, delay_ms=phase.delay_ms)
            for v in order
        ))  # fmt: skip
        cpu1, bcpu1 = self._cpu()
        info = self.run.phase_info.setdefault(phase.name, {"concurrent": True, "reps": []})
        info["reps"].append({
            "wall_s": time.perf_counter() - t0,
            "server_cpu_s": None if cpu0 is None else cpu1 - cpu0,
            "bridge_cpu_s": None if bcpu0 is None else bcpu1 - bcpu0,
            "turns": sum(len(r.turns) for r in rs),
        })  # fmt: skip
        for r in rs:
            r.client_cpu_s = None  # one process ran them all: not attributable
            self.results.append(r)
            self._tick(r)

    async def warmup(self) -> None:
        pair = self.warmup_pair()
        if pair is None:
            return
        wl, speed = pair
        phase = Phase("warmup", wl.name, FAST)
        self.speeds.setdefault(FAST, speed)
        target = self.target(phase, None)
        for variant in sorted({v for p in self.phases for v in self.variants(p)}):
            r = await VARIANTS[variant](target).run_rollout(wl, phase="warmup")
            if not r.ok:
                raise RuntimeError(f"warm-up rollout of {variant} failed: {r.error}")

    async def execute(self) -> dict:
        from tqdm import tqdm

        total = sum(p.reps * len(self.variants(p)) for p in self.phases)
        self.start()
        try:
            await self.warmup()
            with tqdm(total=total, desc="rollouts", unit="rollout", disable=self.args.no_progress,
                      file=sys.stderr, dynamic_ncols=True) as bar:
                self.progress = bar
                for phase in self.phases:
                    await self.run_phase(phase)
        finally:
            self.progress = None
            self.stop()
        return self.save()

    # -- output -----------------------------------------------------------------------------------

    def payload(self) -> dict:
        rows = report.summarize(self.results, BASELINE)
        expected = {name: wl.turns for name, wl in self.workloads.items()}
        return {
            "command": "tether bench " + " ".join(shlex.quote(a) for a in self.args.argv),
            "started": self.args.started,
            "machine": M.machine(),
            "loadavg_start": self.loadavg_start,
            "loadavg_end": os.getloadavg(),
            "duration_s": time.time() - self.t_start,
            "baseline": BASELINE,
            "phases": [
                {**asdict(p), "variants": self.variants(p), "speed_profile": asdict(self.speeds[p.speed]),
                 "workload_summary": self.workloads[p.workload].summary()}
                for p in self.phases
            ],
            "phase_info": self.run.phase_info,
            "server_config": self.run.config_text,
            "consistency": report.check_consistency(self.results, expected),
            "summary": rows,
            "rollouts": [r.to_dict() for r in self.results],
        }

    def save(self) -> dict:
        out = self.run.out
        out.mkdir(parents=True, exist_ok=True)
        data = self.payload()
        report.write_json(out / "results.json", data)
        report.write_csvs(self.results, data["summary"], out)
        (out / "report.md").write_text(render_markdown(data))
        return data


def render_markdown(data: dict) -> str:
    lines = [f"# tether bench: {data['started']}", "", f"`{data['command']}`", ""]
    m = data["machine"]
    lines += [f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}, loopback. "
              f"Run took {data['duration_s']:.0f} s; load average at start {data['loadavg_start'][0]:.2f}, "
              f"at end {data['loadavg_end'][0]:.2f} (anything above ~0 is another process on the machine).", ""]
    lines.append(report.markdown_tables(data["summary"], data["baseline"]))
    for name, info in data["phase_info"].items():
        for i, rep in enumerate(info.get("reps", [])):
            cpu = rep.get("server_cpu_s")
            per = f"{1000 * cpu / rep['turns']:.1f}" if cpu is not None and rep["turns"] else "–"
            lines.append(f"- {name} rep {i}: concurrent, wall {rep['wall_s']:.1f} s, server CPU {per} ms/turn (all transports together)")
    problems = data["consistency"]
    lines += ["", "Consistency: " + ("every transport completed every rollout with the same tool calls and answer."
                                     if not problems else "PROBLEMS"), ""]
    lines += [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def make_plots(data: dict, results: list[RolloutResult], out: Path) -> list[Path]:
    from tether_lab import plots

    img = out / "plots"
    img.mkdir(parents=True, exist_ok=True)
    made: list[Path | None] = []
    for ph in data["phases"]:
        name = ph["name"]
        title = f"{ph['workload']} at {ph['speed_profile']['name']}" + (f", {ph['delay_ms']:g} ms delay" if ph["delay_ms"] else "")
        made.append(plots.overhead_vs_turn(results, name, img / f"overhead-vs-turn-{name}.png",
                                           f"Per-turn server overhead vs turn: {title}"))
        made.append(plots.overhead_vs_turn(results, name, img / f"prebackend-vs-turn-{name}.png",
                                           f"Per-turn pre-backend stages vs turn: {title}", what="pre_backend"))
        made.append(plots.bytes_vs_turn(results, name, img / f"bytes-vs-turn-{name}.png", f"Bytes sent per turn: {title}"))
        made.append(plots.stage_breakdown(results, name, img / f"stages-{name}.png", f"Server time per turn by stage: {title}"))
    # e2e vs speed: phases of one workload and client at several speeds, no delay.
    groups: dict[tuple[str, str], list[dict]] = {}
    for ph in data["phases"]:
        if not ph["delay_ms"]:
            groups.setdefault((ph["workload"], ph.get("client", "sdk")), []).append(ph)
    for (wl, client), phs in groups.items():
        if len({p["speed_profile"]["tokens_per_s"] for p in phs}) >= 2:
            suffix = "" if client == "sdk" else f"-{client}"
            made.append(plots.e2e_vs_speed(results, [p["name"] for p in phs], data["baseline"],
                                           img / f"e2e-vs-speed-{wl}{suffix}.png",
                                           f"End-to-end rollout time vs model speed: {wl} ({client} client)"))
    return [p for p in made if p is not None]


# --- CLI ----------------------------------------------------------------------------------------


def _ttft(spec: str) -> tuple[float, float]:
    lo, _, hi = spec.partition(":")
    return float(lo), float(hi or lo)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("what", nargs="?", choices=[*sorted(PROFILES), "throughput", "overhead", "replicas"],
                   help="shorthand for --profile NAME / --throughput / --overhead (works with the `tether` CLI, "
                        "whose sub-command parser drops a leading --option; `tether bench -- --opts` also works)")
    p.add_argument("--profile", choices=sorted(PROFILES), help="a preset list of phases (default: quick)")
    p.add_argument("--workloads", help=f"comma-separated workloads ({', '.join(workloads.available())}) or files")
    p.add_argument("--speeds", help="comma-separated model speeds: tokens/s[@ttft_min:ttft_max ms], e.g. 65,1000,4000")
    p.add_argument("--transports", help=f"comma-separated subset of: {', '.join(VARIANTS)}")
    p.add_argument("--reps", type=int, help="repetitions per transport (custom runs; default 3)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way client-server delay via the proxy (custom runs)")
    p.add_argument("--bandwidth-mbps", type=float, default=0.0, help="link rate cap via the proxy (custom runs)")
    p.add_argument("--concurrent", action="store_true", help="run the transports side by side (custom runs)")
    p.add_argument("--client", choices=("sdk", "raw"), default="sdk",
                   help="HTTP/WebSocket client: the openai SDK (default) or raw httpx/websockets + orjson (custom runs)")
    p.add_argument("--ttft-ms", dest="ttft", type=_ttft, default=(200.0, 500.0), metavar="MIN:MAX",
                   help="simulated TTFT, growing from MIN (empty context) to MAX (default 200:500)")
    p.add_argument("--ttft-ctx-tokens", type=int, default=64_000, help="context size at which TTFT reaches MAX")
    p.add_argument("--out", type=Path, help="results directory (default bench-results/<profile>-<time>)")
    p.add_argument("--plot", action="store_true", help="write PNG charts under <out>/plots")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="server setting for the started Tether, e.g. limits.coalesce_ms=0 (repeatable)")
    p.add_argument("--store", help="store URL for the started server (default: SQLite in the results dir)")
    p.add_argument("--target", help="use a running Tether instead: grpc=HOST:PORT,http=URL[,remote=URL] "
                                     "(configured with --write-config's file)")
    p.add_argument("--server-pid", type=int, help="with --target: the server's pid, for CPU figures")
    p.add_argument("--write-config", type=Path, metavar="FILE",
                   help="write the server config for the selected workloads/speeds and exit")
    p.add_argument("--no-remote", action="store_true", help="skip ws-remote (no separate bridge process)")
    p.add_argument("--no-warmup", action="store_true", help="skip the discarded warm-up rollouts")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    p.add_argument("--replot", type=Path, metavar="DIR",
                   help="recompute the tables and redraw the charts of an earlier run (its results.json)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--throughput", action="store_true", help="concurrent-streams mode (see tether_lab.throughput)")
    mode.add_argument("--overhead", action="store_true", help="per-turn overhead mode (see tether_lab.overhead)")
    p.add_argument("--streams", type=int, default=100, help="--throughput: concurrent gRPC sessions")
    p.add_argument("--answer-tokens", type=int, default=4000, help="--throughput: tokens per streamed answer")
    p.add_argument("--tps", type=float, default=4000.0, help="--throughput: simulated tokens/s per stream")
    p.add_argument("--coalesce", default="default,0", help="--throughput: coalesce_ms values to compare")
    p.add_argument("--tokens-per-chunk", default="1", help="--throughput: tokens per backend chunk (comma list)")
    p.add_argument("--workers", default="1",
                   help="--throughput: server worker processes (`tether serve --workers N`; comma list)")
    p.add_argument("--turns", type=int, default=100, help="--overhead: turns per session")
    replicas.add_argument_group_to(p)
    return p


def phases_from_args(args: argparse.Namespace) -> list[Phase]:
    if args.workloads or args.speeds:
        wls = (args.workloads or "bugfix20").split(",")
        speeds = (args.speeds or "1000").split(",")
        return [
            Phase(f"{w}-{s}" + (f"-{args.delay_ms:g}ms" if args.delay_ms else ""), w, s, args.reps or 3,
                  delay_ms=args.delay_ms, bandwidth_mbps=args.bandwidth_mbps, concurrent=args.concurrent,
                  client=args.client)
            for w in wls for s in speeds
        ]
    phases = [replace(p) for p in PROFILES[args.profile or "quick"]]
    if args.reps:
        phases = [replace(p, reps=args.reps) for p in phases]
    return phases


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt  # unwinds through the finally blocks that stop the subprocesses


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    args = parser().parse_args(argv)
    if args.what in PROFILES:
        args.profile = args.profile or args.what
    args.throughput = args.throughput or args.what == "throughput"
    args.overhead = args.overhead or args.what == "overhead"
    args.argv = argv
    args.started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    if args.transports:
        args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
        unknown = set(args.transports) - set(VARIANTS)
        if unknown:
            raise SystemExit(f"unknown transport(s) {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    if args.replot:
        data = json.loads((args.replot / "results.json").read_text())
        results = [RolloutResult.from_dict(d) for d in data["rollouts"]]
        data["summary"] = report.summarize(results, data["baseline"])
        report.write_json(args.replot / "results.json", data)
        report.write_csvs(results, data["summary"], args.replot)
        (args.replot / "report.md").write_text(render_markdown(data))
        for path in make_plots(data, results, args.replot):
            print(f"plot: {path}")
        return 0
    if args.throughput:
        from tether_lab import throughput

        return throughput.main(args)
    if args.overhead:
        from tether_lab import overhead

        return overhead.main(args)
    if args.what == "replicas":
        return replicas.main(args)
    phases = phases_from_args(args)
    label = args.profile or ("custom" if (args.workloads or args.speeds) else "quick")
    out = args.out or DEFAULT_OUT / f"{label}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    bench = Bench(args, phases, out)
    if args.write_config:
        write_config(args.write_config, bench.pairs(), store=args.store or "sqlite://tether-data/bench.db",
                     script_dir=args.write_config.parent / "scripts")
        print(f"wrote {args.write_config}; start it with: tether serve --config {args.write_config}")
        return 0
    data = asyncio.run(bench.execute())
    if args.plot:
        for path in make_plots(data, bench.results, out):
            print(f"plot: {path}")
    if args.json:
        print(json.dumps(data["summary"], indent=1, default=str))
    else:
        print(report.markdown_tables(data["summary"], BASELINE))
    problems = data["consistency"]
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    print(f"results: {out}/ (results.json, summary.csv, rollouts.csv, turns.csv, report.md)")
    return 1 if problems else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    os._exit(130)
