"""Aggregation, consistency checks and output (tables, CSV, JSON) of a bench run.

Figures per (phase, variant), over repeated rollouts:
- end-to-end rollout time p50/p99 and its ratio to the HTTP baseline of the same phase;
- per-turn server overhead p50/p99 (`server_timing.overhead_ms` of every turn; for the prototype
  shape, which has one response per rollout, its overhead divided by the number of model turns);
- client-observed TTFT p50 (request sent -> first delta, every turn);
- bytes sent client->server per turn (application level), and on the wire (delay proxy) when the
  phase ran through one;
- CPU per turn of the server process, the separate bridge process (ws-remote) and the client;
- the stage breakdown per turn (server_timing stages, plus `post_inference` from /metrics).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from tether_lab.transports.base import RolloutResult

PRE_BACKEND = ("resolve", "validate", "classify", "render", "route")


def pct(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear interpolation; None for no values."""
    vals = sorted(v for v in values if v is not None and not math.isnan(v))
    if not vals:
        return None
    if len(vals) == 1:
        return vals[0]
    k = (len(vals) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def turn_overheads(r: RolloutResult) -> list[float]:
    """Per-turn server overhead (ms) of a rollout."""
    if r.whole_rollout_timing is not None and r.turns:
        return [r.whole_rollout_timing["overhead_ms"] / len(r.turns)] * len(r.turns)
    return [t.overhead_ms for t in r.turns if t.overhead_ms is not None]


def turn_stages(r: RolloutResult) -> dict[str, float]:
    """Mean ms per turn of each reported stage (plus `streaming`: overhead outside the named
    pre-backend stages, i.e. turning chunks into events and queueing them; and `finalize` and
    `post_inference` from the /metrics histogram deltas, since they run after the terminal event
    that carries server_timing)."""
    n = len(r.turns) or 1
    sums: dict[str, float] = defaultdict(float)
    if r.whole_rollout_timing is not None:
        stages = [r.whole_rollout_timing["stages_ms"]]
        overhead = r.whole_rollout_timing["overhead_ms"]
    else:
        stages = [t.stages_ms for t in r.turns]
        overhead = sum(t.overhead_ms or 0.0 for t in r.turns)
    for st in stages:
        for k, v in st.items():
            sums[k] += v
    out = {k: v / n for k, v in sums.items()}
    named = sum(out.get(k, 0.0) for k in PRE_BACKEND)
    out["streaming"] = max(0.0, overhead / n - named)
    for stage in ("finalize", "post_inference"):  # timed after the terminal event: /metrics only
        summed = r.stage_sums.get(stage)
        if summed and stage not in out:
            out[stage] = summed["seconds"] * 1000 / n
    return out


def summarize(results: list[RolloutResult], baseline: str) -> list[dict]:
    groups: dict[tuple[str, str], list[RolloutResult]] = defaultdict(list)
    order: list[tuple[str, str]] = []
    for r in results:
        key = (r.phase, r.variant)
        if key not in groups:
            order.append(key)
        groups[key].append(r)
    base_p50: dict[str, float | None] = {}
    for (phase, variant), rs in groups.items():
        if variant == baseline:
            base_p50[phase] = pct([r.e2e_s for r in rs if r.ok], 50)
    rows = []
    for phase, variant in order:
        rs = groups[(phase, variant)]
        ok = [r for r in rs if r.ok]
        turns = sum(len(r.turns) for r in ok) or 1
        e2e50 = pct([r.e2e_s for r in ok], 50)
        base = base_p50.get(phase)
        overheads = [o for r in ok for o in turn_overheads(r)]
        stage_means: dict[str, list[float]] = defaultdict(list)
        for r in ok:
            for k, v in turn_stages(r).items():
                stage_means[k].append(v)
        cpu = [r.server_cpu_s for r in ok if r.server_cpu_s is not None]
        bcpu = [r.bridge_cpu_s for r in ok if r.bridge_cpu_s is not None]
        ccpu = [r.client_cpu_s for r in ok if r.client_cpu_s is not None]
        wire = [r.wire_c2s for r in ok if r.wire_c2s is not None]
        cpu_turns = sum(len(r.turns) for r in ok if r.server_cpu_s is not None) or 1
        rows.append({
            "phase": phase,
            "variant": variant,
            "workload": rs[0].workload,
            "speed": rs[0].speed,
            "delay_ms": rs[0].delay_ms,
            "rollouts": len(rs),
            "ok": len(ok),
            "turns_per_rollout": (turns / len(ok)) if ok else 0,
            "e2e_p50_s": e2e50,
            "e2e_p99_s": pct([r.e2e_s for r in ok], 99),
            "e2e_vs_baseline": (e2e50 / base) if (e2e50 and base) else None,
            "faster_than_baseline_pct": (100 * (1 - e2e50 / base)) if (e2e50 and base) else None,
            "overhead_p50_ms": pct(overheads, 50),
            "overhead_p99_ms": pct(overheads, 99),
            "ttft_p50_ms": _ms(pct([t.ttft_s for r in ok for t in r.turns], 50)),
            "latency_p50_ms": _ms(pct([t.latency_s for r in ok for t in r.turns], 50)),
            "bytes_per_turn": (sum(r.bytes_sent for r in ok) / turns) if ok else None,
            "wire_c2s_per_turn": (sum(wire) / sum(len(r.turns) for r in ok if r.wire_c2s is not None)) if wire else None,
            "wire_s2c_per_turn": _per_turn([r for r in ok if r.wire_s2c is not None], "wire_s2c"),
            "connections_per_rollout": mean(r.connections for r in ok),
            "server_cpu_ms_per_turn": (1000 * sum(cpu) / cpu_turns) if cpu else None,
            "bridge_cpu_ms_per_turn": (1000 * sum(bcpu) / cpu_turns) if bcpu else None,
            "client_cpu_ms_per_turn": (1000 * sum(ccpu) / cpu_turns) if ccpu else None,
            "stages_ms_per_turn": {k: statistics.fmean(v) for k, v in sorted(stage_means.items())},
            "errors": sorted({r.error for r in rs if r.error})[:3],
        })  # fmt: skip
    return rows


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000


def _per_turn(rs: list[RolloutResult], attr: str) -> float | None:
    turns = sum(len(r.turns) for r in rs)
    return (sum(getattr(r, attr) for r in rs) / turns) if rs and turns else None


def overhead_by_turn(
    results: list[RolloutResult], phase: str, what: str = "overhead"
) -> dict[str, list[tuple[int, float, float]]]:
    """{variant: [(turn index, p50 ms, p99 ms)]} for the phase's per-turn plot. `what`: the whole
    overhead, or `pre_backend` (resolve..route: the part that depends on the history)."""
    per: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.phase != phase or not r.ok:
            continue
        if what == "pre_backend":
            if r.whole_rollout_timing is not None:
                continue  # one response per rollout: no per-turn stages
            values = [sum(t.stages_ms.get(k, 0.0) for k in PRE_BACKEND) for t in r.turns]
        else:
            values = turn_overheads(r)
        for t, o in zip(r.turns, values, strict=False):
            per[r.variant][t.index].append(o)
    return {v: [(i, pct(xs, 50), pct(xs, 99)) for i, xs in sorted(d.items())] for v, d in per.items()}


def check_consistency(results: list[RolloutResult], turns_expected: dict[str, int]) -> list[str]:
    """Problems: failed rollouts, wrong turn counts, tool-call sequences or final answers that
    differ between transports of one phase, turns without server_timing."""
    problems = []
    by_phase: dict[str, list[RolloutResult]] = defaultdict(list)
    for r in results:
        by_phase[r.phase].append(r)
        if not r.ok:
            problems.append(f"{r.phase}/{r.variant} rep {r.rep}: failed: {r.error}")
            continue
        want = turns_expected.get(r.workload)
        if want is not None and len(r.turns) != want:
            problems.append(f"{r.phase}/{r.variant} rep {r.rep}: {len(r.turns)} turns, expected {want}")
        if r.whole_rollout_timing is None:
            missing = [t.index for t in r.turns if t.overhead_ms is None]
            if missing:
                problems.append(f"{r.phase}/{r.variant} rep {r.rep}: no server_timing on turns {missing[:5]}")
    for phase, rs in by_phase.items():
        ok = [r for r in rs if r.ok]
        if not ok:
            continue
        ref = ok[0]
        for r in ok[1:]:
            if r.tool_calls != ref.tool_calls:
                problems.append(f"{phase}: tool calls of {r.variant} differ from {ref.variant}")
            if r.final_text != ref.final_text:
                problems.append(f"{phase}: final answer of {r.variant} differs from {ref.variant}")
    return problems


# --- output -------------------------------------------------------------------------------------

ROLLOUT_FIELDS = ("phase", "variant", "workload", "speed", "delay_ms", "rep", "ok", "e2e_s", "connect_s", "turns",
                  "bytes_sent", "wire_c2s", "wire_s2c", "connections", "server_cpu_s", "bridge_cpu_s", "client_cpu_s",
                  "overhead_ms_sum", "error")
TURN_FIELDS = ("phase", "variant", "rep", "turn", "latency_ms", "ttft_ms", "bytes_sent", "events", "overhead_ms",
               "input_tokens", "cached_tokens", *PRE_BACKEND, "backend_ttft", "backend_wait", "backend", "append_wait")


def write_csvs(results: list[RolloutResult], rows: list[dict], out: Path) -> None:
    with open(out / "rollouts.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(ROLLOUT_FIELDS)
        for r in results:
            w.writerow([r.phase, r.variant, r.workload, r.speed, r.delay_ms, r.rep, r.ok, f"{r.e2e_s:.6f}",
                        f"{r.connect_s:.6f}", len(r.turns), r.bytes_sent, r.wire_c2s, r.wire_s2c, r.connections,
                        r.server_cpu_s, r.bridge_cpu_s, r.client_cpu_s,
                        sum(turn_overheads(r)), r.error or ""])
    with open(out / "turns.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TURN_FIELDS)
        for r in results:
            for t in r.turns:
                st = t.stages_ms
                w.writerow([r.phase, r.variant, r.rep, t.index, f"{t.latency_s * 1000:.3f}",
                            "" if t.ttft_s is None else f"{t.ttft_s * 1000:.3f}", t.bytes_sent, t.events,
                            "" if t.overhead_ms is None else f"{t.overhead_ms:.4f}", t.input_tokens, t.cached_tokens,
                            *(_fmt(st.get(k)) for k in TURN_FIELDS[11:])])
    flat = [{k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in row.items()} for row in rows]
    if flat:
        with open(out / "summary.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(flat[0]))
            w.writeheader()
            w.writerows(flat)


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def _n(v: float | None, fmt: str = "{:.1f}") -> str:
    return "–" if v is None else fmt.format(v)


def markdown_tables(rows: list[dict], baseline: str) -> str:
    """One table per phase (the headline figures) and one stage-breakdown table per phase."""
    out = []
    phases: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        phases[row["phase"]].append(row)
    for phase, prs in phases.items():
        r0 = prs[0]
        delay = f", {r0['delay_ms']:g} ms one-way delay" if r0["delay_ms"] else ""
        out.append(f"#### {phase}: {r0['workload']} at {r0['speed']}{delay}\n")
        out.append("| transport | ok | e2e p50 s | e2e p99 s | vs " + baseline + " | overhead/turn p50 ms | p99 ms "
                   "| TTFT p50 ms | KB sent/turn | wire KB/turn c2s | CPU ms/turn: server | bridge | client |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in prs:
            ratio = r["e2e_vs_baseline"]
            if ratio is None:
                ratio_s = "–"
            else:
                gain = r["faster_than_baseline_pct"]
                ratio_s = f"{ratio:.2f}× ({abs(gain):.0f}% {'faster' if gain >= 0 else 'slower'})"
            out.append(
                f"| {r['variant']} | {r['ok']}/{r['rollouts']} | {_n(r['e2e_p50_s'], '{:.2f}')} | {_n(r['e2e_p99_s'], '{:.2f}')} "
                f"| {ratio_s} | {_n(r['overhead_p50_ms'], '{:.2f}')} | {_n(r['overhead_p99_ms'], '{:.2f}')} "
                f"| {_n(r['ttft_p50_ms'], '{:.0f}')} | {_n(_kb(r['bytes_per_turn']))} | {_n(_kb(r['wire_c2s_per_turn']))} "
                f"| {_n(r['server_cpu_ms_per_turn'])} | {_n(r['bridge_cpu_ms_per_turn'])} | {_n(r['client_cpu_ms_per_turn'])} |"
            )
        out.append("")
        stages = [*PRE_BACKEND, "streaming", "finalize", "post_inference"]
        out.append("| transport (ms/turn) | " + " | ".join(stages) + " |")
        out.append("|---|" + "---|" * len(stages))
        for r in prs:
            st = r["stages_ms_per_turn"]
            out.append(f"| {r['variant']} | " + " | ".join(_n(st.get(s), "{:.3f}") for s in stages) + " |")
        out.append("")
    return "\n".join(out)


def _kb(v: float | None) -> float | None:
    return None if v is None else v / 1024


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str))


def load_results(path: Path) -> list[RolloutResult]:
    data = json.loads(path.read_text())
    return [RolloutResult.from_dict(d) for d in data["rollouts"]]


__all__ = ["check_consistency", "markdown_tables", "overhead_by_turn", "pct", "summarize", "turn_stages",
           "write_csvs", "write_json"]
