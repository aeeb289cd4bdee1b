"""One bench campaign: phases (workload x model speed x network delay x repetitions) run over
every selected transport against a Tether it starts itself (or `--target` addresses), with the
server's CPU, stage histograms and proxy byte counters read around each rollout; `Bench.execute`
returns (and writes) the results, `render_markdown` the report.

`tether bench` (tether_lab.bench, the command line and its profiles) and `tether bench overhead`
(tether_lab.overhead) both drive a `Bench`; neither imports the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from tether import workloads
from tether_lab import metrics as M
from tether_lab import report
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



# The warm-up rollouts' speed (and the fast phases' of the profiles).
FAST = "4000@5:10"


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
