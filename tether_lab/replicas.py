"""`tether bench replicas`: many agents sharing 1, 2 and 4 inference replicas, per routing policy.

    tether bench replicas --plot                              # bugfix20, 8 agents, 1/2/4 replicas
    tether bench replicas -- --agents 4 --replica-counts 1,4 --time-scale 10

What the transport comparison (`tether bench full`) cannot show: a continuation that reaches the
replica already holding its prefix skips the prefill of the whole history. Here every model is a
pool of simulated replicas that prefill like real ones (`tether.backends.kvsim`: a KV prefix cache
per replica, a FIFO prefill queue, decode slowing with concurrent sequences), at the published
figures of Llama 3.1 8B on one H100 (`kvsim.LLAMA_31_8B_H100`), sped up by `--time-scale` (all
rates multiplied, the fixed TTFT divided: the ratios between variants are what the phase reports).

Variants (transport + the pool's routing policy), each with a fresh pool per replica count, so no
cell inherits another's caches:

- `http-rr`: full-resend HTTP (store=false), round-robin: what a plain load balancer does;
- `http-prefix`: full-resend HTTP, prefix-aware routing over the rendered prompt (what
  SGLang's / llm-d's cache-aware gateways do for stateless requests);
- `ws-affine`: WebSocket mode with `previous_response_id`, chain-affine routing;
- `grpc-affine`: the gRPC session, chain-affine routing.

All use the lean clients (httpx / websockets + orjson, the raw gRPC stub), so client CPU does not
blur the upstream effect. The agents run the same workload with distinct tickets (their user
prompts differ, so only the instructions-and-tools header is shared between agents), started a
few ms apart. Per cell: e2e per agent, client-observed TTFT per turn, prompt tokens, prefill
tokens computed (prompt - cached), the cache hit ratio per replica (from the server's
`tether_replica_prompt_tokens` counters), and load balance: in-flight calls per replica sampled
from `/metrics` every 100 ms, time-averaged; balance = max/mean over replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from tether import eventloop, workloads
from tether.backends.kvsim import LLAMA_31_8B_H100
from tether_lab import metrics as M
from tether_lab.processes import serve_process, toml_value
from tether_lab.transports import VARIANTS as TRANSPORTS
from tether_lab.transports import RolloutResult, Target

VARIANTS: dict[str, tuple[str, str]] = {  # name -> (transport, pool policy)
    "http-rr": ("http-full-keepalive", "round-robin"),
    "http-prefix": ("http-full-keepalive", "prefix-aware"),
    "ws-affine": ("ws-inproc", "chain-affine"),
    "grpc-affine": ("grpc", "chain-affine"),
}
# Both cache-seeking policies give way to load alike: a preferred replica with more than 2 calls
# in flight above the least-loaded one (and 1.5x its count) is passed over.
BALANCE = {"balance_abs": 2, "balance_rel": 1.5}
SAMPLE_S = 0.1


@dataclass
class Cell:
    variant: str
    replicas: int
    agents: int
    ok: int = 0
    e2e_s: list[float] = field(default_factory=list)
    ttft_by_turn_s: list[float] = field(default_factory=list)  # mean over agents, per turn index
    prompt_tokens: dict[str, float] = field(default_factory=dict)  # per replica
    cached_tokens: dict[str, float] = field(default_factory=dict)
    calls: dict[str, float] = field(default_factory=dict)
    in_flight_mean: dict[str, float] = field(default_factory=dict)  # time-averaged, per replica
    wall_s: float = 0.0
    server_cpu_s: float = 0.0  # the Tether process (replicas simulated in it), during the cell
    client_cpu_s: float = 0.0  # this process: every agent's client
    errors: list[str] = field(default_factory=list)

    @property
    def e2e_mean(self) -> float:
        return statistics.fmean(self.e2e_s) if self.e2e_s else float("nan")

    @property
    def prefill_tokens(self) -> float:
        return sum(self.prompt_tokens.values()) - sum(self.cached_tokens.values())

    @property
    def hit_ratio(self) -> float:
        total = sum(self.prompt_tokens.values())
        return sum(self.cached_tokens.values()) / total if total else 0.0

    def hit_ratio_of(self, replica: str) -> float:
        total = self.prompt_tokens.get(replica, 0.0)
        return self.cached_tokens.get(replica, 0.0) / total if total else 0.0

    @property
    def balance(self) -> float:
        """max/mean of the time-averaged in-flight calls over replicas (1.0 = perfectly even)."""
        loads = [self.in_flight_mean.get(r, 0.0) for r in self.replica_names]
        mean = statistics.fmean(loads) if loads else 0.0
        return max(loads) / mean if mean else float("nan")

    @property
    def replica_names(self) -> list[str]:
        return [f"{model_name(self.variant, self.replicas)}/{i}" for i in range(self.replicas)]


def model_name(variant: str, replicas: int) -> str:
    return f"rep-{variant}-{replicas}"


def scaled_profile(time_scale: float) -> dict[str, float | int]:
    p = dict(LLAMA_31_8B_H100)
    p["ttft_ms"] = float(p["ttft_ms"]) / time_scale
    p["prefill_tokens_per_s"] = float(p["prefill_tokens_per_s"]) * time_scale
    p["tokens_per_s"] = float(p["tokens_per_s"]) * time_scale
    return p


def replica_script(wl: workloads.Workload) -> dict:
    """The workload's script without per-step timing: the replica's prefill model decides TTFT,
    and its decode model (`tokens_per_s`, slowed by `decode_slowdown` per sequence decoding) the
    rest. A step's own `tokens_per_s` would override the replica's rate (0 = instant decode)."""
    script = wl.simulated_script(workloads.SpeedProfile("replicas", 0.0))
    for step in [*script["steps"], script["after"]]:
        step.pop("ttft_ms", None)
        step.pop("tokens_per_s", None)
    return script


def write_config(path: Path, wl: workloads.Workload, counts: list[int], variants: list[str], time_scale: float) -> None:
    script = path.parent / f"{wl.name}-replicas.json"
    script.write_text(json.dumps(replica_script(wl), indent=1))
    lines = ['store = "memory://"', 'log_level = "warning"', "",
             "[server]", 'log_format = "text"', "grpc_port = 0", "bridge_port = 0", "shutdown_grace_s = 2.0", "",
             "[limits]", "max_connections_per_key = 100000"]
    profile = {**scaled_profile(time_scale), "tick_ms": 2.0, "script": str(script.resolve())}
    for variant in variants:
        for n in counts:
            name = toml_value(model_name(variant, n))
            lines += ["", f"[backends.{name}]", 'kind = "simulated"']
            lines += [f"{k} = {toml_value(v)}" for k, v in profile.items()]
            pool = {"replicas": n, "policy": VARIANTS[variant][1], **BALANCE}
            lines += ["", f"[backends.{name}.pool]"] + [f"{k} = {toml_value(v)}" for k, v in pool.items()]
            lines += ["", f"[models.{name}]", f"backend = {name}"]
    path.write_text("\n".join(lines) + "\n")


# --- running one cell -------------------------------------------------------------------------------


def _replica_samples(text: str, backend: str) -> dict[str, dict[str, float]]:
    """{metric: {replica: value}} for one pool, from a /metrics page."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), value in M.parse_prometheus(text).items():
        lab = dict(labels)
        if lab.get("backend") != backend:
            continue
        if name == "tether_replica_prompt_tokens_total":
            out.setdefault(f"tokens_{lab['kind']}", {})[lab["replica"]] = value
        elif name == "tether_replica_in_flight":
            out.setdefault("in_flight", {})[lab["replica"]] = value
        elif name == "tether_replica_calls_total" and lab.get("outcome") == "ok":
            out.setdefault("calls", {})[lab["replica"]] = value
    return out


class Sampler:
    """Polls /metrics while a cell runs: time-averaged in-flight calls per replica."""

    def __init__(self, client: httpx.AsyncClient, url: str, backend: str) -> None:
        self.client, self.url, self.backend = client, url, backend
        self.sums: dict[str, float] = {}
        self.n = 0
        self._task: asyncio.Task | None = None

    async def scrape(self) -> dict[str, dict[str, float]]:
        return _replica_samples((await self.client.get(self.url)).text, self.backend)

    async def _run(self) -> None:
        while True:
            in_flight = (await self.scrape()).get("in_flight", {})
            for replica, value in in_flight.items():
                self.sums[replica] = self.sums.get(replica, 0.0) + value
            self.n += 1
            await asyncio.sleep(SAMPLE_S)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> dict[str, float]:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return {r: s / self.n for r, s in self.sums.items()} if self.n else {}


def _diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


async def run_cell(variant: str, n: int, wl: workloads.Workload, agents: int, base: Target,
                   metrics_url: str, stagger_s: float, server: M.ProcStat) -> Cell:
    transport, _ = VARIANTS[variant]
    model = model_name(variant, n)
    target = replace(base, model=model)
    tickets = [replace(wl, user_prompt=f"Ticket T-{4100 + k}. {wl.user_prompt}") for k in range(agents)]
    cell = Cell(variant, n, agents)
    async with httpx.AsyncClient(timeout=30) as http:
        sampler = Sampler(http, metrics_url, model)
        before = await sampler.scrape()
        sampler.start()

        async def agent(k: int) -> RolloutResult:
            await asyncio.sleep(k * stagger_s)
            return await TRANSPORTS[transport](target).run_rollout(tickets[k], phase=f"{variant}-{n}", rep=k)

        t0, cpu0, client0 = time.perf_counter(), server.cpu_seconds(), time.process_time()
        results = await asyncio.gather(*(agent(k) for k in range(agents)))
        cell.wall_s = time.perf_counter() - t0
        cell.server_cpu_s = server.cpu_seconds() - cpu0
        cell.client_cpu_s = time.process_time() - client0
        cell.in_flight_mean = await sampler.stop()
        after = await sampler.scrape()
    cell.prompt_tokens = _diff(after.get("tokens_prompt", {}), before.get("tokens_prompt", {}))
    cell.cached_tokens = _diff(after.get("tokens_cached", {}), before.get("tokens_cached", {}))
    cell.calls = _diff(after.get("calls", {}), before.get("calls", {}))
    cell.ok = sum(r.ok for r in results)
    cell.errors = [r.error for r in results if r.error][:3]
    cell.e2e_s = [r.e2e_s for r in results if r.ok]
    turns = max((len(r.turns) for r in results), default=0)
    for i in range(turns):
        ttfts = [r.turns[i].ttft_s for r in results if r.ok and len(r.turns) > i and r.turns[i].ttft_s is not None]
        cell.ttft_by_turn_s.append(statistics.fmean(ttfts) if ttfts else float("nan"))
    return cell


# --- the phase ------------------------------------------------------------------------------------


def run_phase(args: argparse.Namespace, out: Path) -> list[Cell]:
    """Start one server with a fresh pool per (variant, replica count), then run every cell."""
    wl = workloads.load(args.workload)
    counts = [int(c) for c in args.replica_counts.split(",")]
    variants = [v.strip() for v in args.variants.split(",")]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variant(s) {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "server.toml"
    write_config(cfg, wl, counts, variants, args.time_scale)
    server = serve_process(cfg, out).start()
    try:
        bridge = server.bridge_url or ""
        base = Target("", bridge, f"127.0.0.1:{server.grpc_port}", client="raw")
        metrics_url = bridge.rsplit("/v1", 1)[0] + "/metrics"
        return eventloop.run(_run_cells(wl, counts, variants, args, base, metrics_url, server.stat))
    finally:
        server.stop()


async def _run_cells(wl: workloads.Workload, counts: list[int], variants: list[str], args: argparse.Namespace,
                     base: Target, metrics_url: str, server: M.ProcStat) -> list[Cell]:
    cells: list[Cell] = []
    stagger = 0.25 / args.time_scale
    for i, n in enumerate(counts):
        k = i % len(variants)
        for variant in variants[k:] + variants[:k]:  # rotate so no variant always runs first
            cell = await run_cell(variant, n, wl, args.agents, base, metrics_url, stagger, server)
            cells.append(cell)
            print(f"  {variant:<12} x{n}: {cell.ok}/{cell.agents} ok, e2e mean {cell.e2e_mean:.2f} s, "
                  f"hit {cell.hit_ratio:.0%}, balance {cell.balance:.2f}", file=sys.stderr)
    return cells


def ratios(cells: list[Cell], n: int) -> dict[str, float]:
    by = {c.variant: c for c in cells if c.replicas == n}
    out = {}
    for fast in ("ws-affine", "grpc-affine"):
        for slow in ("http-rr", "http-prefix"):
            if fast in by and slow in by:
                out[f"{fast}/{slow}"] = by[fast].e2e_mean / by[slow].e2e_mean
    return out


def render_markdown(cells: list[Cell], meta: dict) -> str:
    lines = [f"# tether bench replicas: {meta['started']}", "", f"`{meta['command']}`", "",
             f"{meta['workload']}, {meta['agents']} concurrent agents per cell, simulated replicas at "
             f"Llama 3.1 8B / H100 figures x{meta['time_scale']:g} time scale; run took {meta['duration_s']:.0f} s.", "",
             "| variant | replicas | ok | e2e mean s | e2e p50 s | TTFT mean ms | prompt ktok | prefill ktok computed "
             "| hit ratio | hit ratio per replica | calls per replica | in-flight mean per replica | balance max/mean "
             "| CPU % of a core: server | client |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        names = c.replica_names
        ttft = [t for t in c.ttft_by_turn_s if t == t]
        lines.append(
            f"| {c.variant} | {c.replicas} | {c.ok}/{c.agents} | {c.e2e_mean:.2f} | "
            f"{statistics.median(c.e2e_s) if c.e2e_s else float('nan'):.2f} | "
            f"{1000 * statistics.fmean(ttft) if ttft else float('nan'):.0f} | {sum(c.prompt_tokens.values()) / 1000:.0f} | "
            f"{c.prefill_tokens / 1000:.0f} | {c.hit_ratio:.0%} | "
            f"{' / '.join(f'{c.hit_ratio_of(r):.0%}' for r in names)} | "
            f"{' / '.join(f'{c.calls.get(r, 0):.0f}' for r in names)} | "
            f"{' / '.join(f'{c.in_flight_mean.get(r, 0):.2f}' for r in names)} | {c.balance:.2f} | "
            f"{100 * c.server_cpu_s / c.wall_s:.0f} | {100 * c.client_cpu_s / c.wall_s:.0f} |")
    lines += ["", "| replicas | " + " | ".join(ratios(cells, max(c.replicas for c in cells))) + " |",
              "|---|" + "---|" * len(ratios(cells, max(c.replicas for c in cells)))]
    for n in sorted({c.replicas for c in cells}):
        r = ratios(cells, n)
        lines.append(f"| {n} | " + " | ".join(f"{v:.2f}x" for v in r.values()) + " |")
    lines += ["", "Ratios are e2e means (lower = the first variant is faster). A server CPU near 100% means the "
              "cell measured Tether's (single-core) CPU as much as the replicas: compare cells below it."]
    return "\n".join(lines) + "\n"


def make_plots(cells: list[Cell], out: Path) -> list[Path]:
    from tether_lab import plots

    img = out / "plots"
    img.mkdir(parents=True, exist_ok=True)
    top = max(c.replicas for c in cells)
    made = [
        plots.replicas_e2e(cells, img / "replicas-e2e.png"),
        plots.replicas_ttft_by_turn([c for c in cells if c.replicas == top], img / f"replicas-ttft-by-turn-{top}.png"),
        plots.replicas_hit_ratio([c for c in cells if c.replicas == top], img / f"replicas-hit-ratio-{top}.png"),
    ]
    return [p for p in made if p is not None]


def add_argument_group_to(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("replicas phase (`tether bench replicas`)")
    g.add_argument("--agents", type=int, default=8, help="concurrent agents per cell (default 8)")
    g.add_argument("--replica-counts", default="1,2,4", help="replica counts per pool (default 1,2,4)")
    g.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {', '.join(VARIANTS)}")
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="speed-up of the simulated replicas (rates x, fixed TTFT /; default 1: the published rates)")
    g.add_argument("--workload", default="bugfix20", help="the agents' workload (default bugfix20)")


def main(args: argparse.Namespace) -> int:
    started = dt.datetime.now().astimezone()
    out = args.out or Path("bench-results") / f"replicas-{started.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.time()
    cells = run_phase(args, out)
    meta = {"started": started.isoformat(timespec="seconds"),
            "command": "tether bench " + " ".join(args.argv), "workload": args.workload, "agents": args.agents,
            "time_scale": args.time_scale, "duration_s": time.time() - t0, "machine": M.machine(),
            "profile": LLAMA_31_8B_H100, "balance": BALANCE}
    (out / "replicas.json").write_text(json.dumps(
        {**meta, "cells": [asdict(c) for c in cells],
         "ratios": {n: ratios(cells, n) for n in sorted({c.replicas for c in cells})}}, indent=1, default=str))
    report = render_markdown(cells, meta)
    (out / "report.md").write_text(report)
    print(report)
    if args.plot:
        for path in make_plots(cells, out):
            print(f"plot: {path}")
    print(f"results: {out}/ (replicas.json, report.md)")
    failed = sum(c.agents - c.ok for c in cells)
    for c in cells:
        for e in c.errors:
            print(f"PROBLEM: {c.variant} x{c.replicas}: {e}", file=sys.stderr)
    return 1 if failed else 0
