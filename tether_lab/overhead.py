"""`tether bench overhead`: per-turn server overhead of a cached continuation, turn 1 vs 50 vs 100.

    tether bench overhead                                  # gRPC, long100, 10 repetitions
    tether bench -- --overhead --transports grpc,ws-inproc,http-full-keepalive --reps 5

Runs the `long100` workload (100 tool calls, history growing to ~200 KB) over each transport with
a fast simulated model (4,000 tok/s, TTFT 1 ms: the model's time is excluded from overhead anyway)
and reports the server's own `server_timing` per turn:

- `overhead_ms`: the turn's server time not spent waiting on the model, split into
  - `pre-backend`: resolve + validate + classify + render + route (the work connection-scoped state
    makes O(new items)),
  - `streaming`: the rest (turning model chunks into events and queueing them: proportional to
    the turn's output tokens, not to the history).

Turn k is sampled over turns k-2..k+2 of every repetition, tool-call turns only (turn 1, the
session's first create with no cached state, and turn 2 exactly); p50 and p99 over those samples. Flatness is p50(turn k) / p50(turn 2),
turn 2 being the first cached continuation.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from tether import eventloop
from tether_lab.campaign import Bench, Phase
from tether_lab.report import PRE_BACKEND, pct
from tether_lab.transports import RolloutResult

TURNS = (1, 2, 10, 50, 100)


def samples(results: list[RolloutResult], variant: str, turn: int, last: int) -> dict[str, list[float]]:
    # Tool-call turns only: the last turn (the final text answer) streams a different amount.
    lo, hi = (turn, turn) if turn <= 2 else (max(3, turn - 2), min(last - 1, turn + 2))
    out: dict[str, list[float]] = {"overhead": [], "pre_backend": [], "streaming": []}
    for r in results:
        if r.variant != variant or not r.ok:
            continue
        for t in r.turns:
            if lo <= t.index + 1 <= hi and t.overhead_ms is not None:
                pre = sum(t.stages_ms.get(k, 0.0) for k in PRE_BACKEND)
                out["overhead"].append(t.overhead_ms)
                out["pre_backend"].append(pre)
                out["streaming"].append(max(0.0, t.overhead_ms - pre))
    return out


def table(results: list[RolloutResult], variants: list[str], last: int) -> tuple[list[dict], str]:
    rows = []
    for v in variants:
        base = None
        for turn in TURNS:
            if turn > last:
                continue
            s = samples(results, v, turn, last)
            row = {"variant": v, "turn": turn, "n": len(s["overhead"])}
            for key, xs in s.items():
                row[f"{key}_p50"], row[f"{key}_p99"] = pct(xs, 50), pct(xs, 99)
            if turn == 2:
                base = row
            if base and row["overhead_p50"] and base["overhead_p50"]:
                row["vs_turn2"] = row["overhead_p50"] / base["overhead_p50"]
                row["pre_vs_turn2"] = (row["pre_backend_p50"] / base["pre_backend_p50"]) if base["pre_backend_p50"] else None
            rows.append(row)
    lines = ["| transport | turn | n | overhead p50 ms | p99 ms | pre-backend p50 | p99 | streaming p50 | p99 "
             "| overhead vs turn 2 | pre-backend vs turn 2 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['turn']} | {r['n']} | {_f(r['overhead_p50'])} | {_f(r['overhead_p99'])} "
            f"| {_f(r['pre_backend_p50'])} | {_f(r['pre_backend_p99'])} | {_f(r['streaming_p50'])} | {_f(r['streaming_p99'])} "
            f"| {_x(r.get('vs_turn2'))} | {_x(r.get('pre_vs_turn2'))} |"
        )
    return rows, "\n".join(lines)


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def main(args: argparse.Namespace) -> int:
    out = args.out or Path("bench-results") / f"overhead-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    variants = args.transports or ["grpc"]
    workload = (args.workloads or "long100").split(",")[0]
    speed = (args.speeds or "4000@1:1").split(",")[0]
    phase = Phase("overhead", workload, speed, args.reps or 10, variants=tuple(variants))
    args.no_remote = args.no_remote or "ws-remote" not in variants
    bench = Bench(args, [phase], out)
    data = eventloop.run(bench.execute())
    last = bench.workloads[workload].turns
    rows, text = table(bench.results, variants, last)
    header = (f"Per-turn server overhead, {workload} ({last} turns) at {speed}, {phase.reps} repetitions; "
              f"turn k = turns k-2..k+2 of the tool-call turns (turn 1 and 2 exact)")
    (out / "overhead.json").write_text(json.dumps({"command": data["command"], "machine": data["machine"],
                                                   "header": header, "rows": rows}, indent=1))
    (out / "overhead.md").write_text(header + "\n\n" + text + "\n")
    if args.plot:
        from tether_lab import plots

        plots.overhead_vs_turn(bench.results, "overhead", out / "overhead-vs-turn.png",
                               f"Per-turn server overhead vs turn: {workload}, cached continuation")
        plots.overhead_vs_turn(bench.results, "overhead", out / "prebackend-vs-turn.png",
                               f"Per-turn pre-backend stages vs turn: {workload}", what="pre_backend")
    print(header)
    print()
    print(text)
    print(f"results: {out}/ (overhead.json, overhead.md, results.json, turns.csv)")
    return 0 if not data["consistency"] else 1
