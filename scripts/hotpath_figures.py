"""Every figure of the server's hot path in one go, against its target, for any checkout.

    python scripts/hotpath_figures.py                       # this checkout (its .venv)
    python scripts/hotpath_figures.py --checkout /tmp/old   # another commit with tether_lab, its .venv
    python scripts/hotpath_figures.py --quick               # fewer repetitions (~2 min), for a smoke run
    TETHER_SERVER__EVENT_LOOP=uvloop python scripts/hotpath_figures.py   # servers and clients on uvloop

Stdlib only: it drives the checkout's own `tether bench` and `python -m tether_lab.hotpath`, so the
same script measures an old commit and a new one alike (run both in one quiet window for a
before/after pair). About 4-5 minutes on a 2-core machine. It prints one Markdown table (figure,
value, target, met?) plus the load average before and after each step, and writes the raw
results under `--out` (default <checkout>/bench-results/hotpath-figures-<time>/).

Steps and the figures they give:
1. `tether bench overhead --workloads bugfix20 --speeds 1000 --transports grpc,ws-inproc,
   http-full-keepalive`: server overhead per cached turn p50 (turns 2 to the end, every repetition)
   on gRPC and WebSocket, its streaming share (overhead - resolve/validate/classify/render/route),
   and for the stateless full resend its overhead at >= 80 KB of request body and its server CPU
   per turn.
2. `tether bench overhead --workloads long100 --speeds 1000@1:1 --transports grpc,ws-inproc`:
   overhead p50 at turns 2 / 10 / 50 / 100 (flatness = turn k / turn 2).
3. `tether bench throughput --tokens-per-chunk 1 --coalesce default --workers 1,2`: 100 streams
   at 4,000 tok/s, one token per chunk: per-stream tok/s p50 / p10, server CPU per worker, and the
   streams whose connection-scoped continuation resolved (`continued`).
4. `python -m tether_lab.hotpath turns` and `streams`: CPU (not wall) per cached turn and per
   streamed token in one process; the machine's load does not move these much.

Wall-clock figures (1-3) move with the machine's load; the CPU figures (4) much less so.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PRE_BACKEND = ("resolve", "validate", "classify", "render", "route")
LOADS: list[str] = []


def load(label: str) -> None:
    LOADS.append(f"{dt.datetime.now().strftime('%H:%M:%S')} {label}: load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def run(cmd: list[str], cwd: Path, label: str) -> str:
    load(f"before {label}")
    t0 = time.monotonic()
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    load(f"after {label} ({time.monotonic() - t0:.0f} s)")
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"{label} failed (exit {done.returncode})")
    return done.stdout


def p50(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def turn_rows(out: Path) -> list[dict]:
    with open(out / "turns.csv", newline="") as f:
        return list(csv.DictReader(f))


def bugfix20(args: argparse.Namespace, out: Path) -> dict:
    d = out / "bugfix20"
    run([args.tether, "bench", "overhead", "--workloads", "bugfix20", "--speeds", "1000", "--transports",
         "grpc,ws-inproc,http-full-keepalive", "--reps", str(args.reps), "--out", str(d)], args.checkout, "bugfix20")  # fmt: skip
    rows = turn_rows(d)
    fig: dict = {}
    for variant in ("grpc", "ws-inproc", "http-full-keepalive"):
        cached = [r for r in rows if r["variant"] == variant and int(r["turn"]) >= 1 and r["overhead_ms"]]
        over = [float(r["overhead_ms"]) for r in cached]
        streaming = [float(r["overhead_ms"]) - sum(float(r[k] or 0) for k in PRE_BACKEND) for r in cached]
        big = [float(r["overhead_ms"]) for r in cached if int(r["bytes_sent"] or 0) >= 80_000]
        fig[variant] = {"n": len(over), "overhead_p50": p50(over), "streaming_p50": p50(streaming),
                        "overhead_p50_at_80kb": p50(big), "n_at_80kb": len(big)}  # fmt: skip
    with open(d / "rollouts.csv", newline="") as f:
        for r in csv.DictReader(f):
            v = fig.get(r["variant"])
            if v is not None and r["server_cpu_s"] and int(r["turns"]):
                v.setdefault("cpu_ms_per_turn", []).append(1000 * float(r["server_cpu_s"]) / int(r["turns"]))
    for v in fig.values():
        v["cpu_ms_per_turn"] = p50(v.get("cpu_ms_per_turn", []))
    return fig


def long100(args: argparse.Namespace, out: Path) -> dict:
    d = out / "long100"
    run([args.tether, "bench", "overhead", "--workloads", "long100", "--speeds", "1000@1:1", "--transports",
         "grpc,ws-inproc", "--reps", str(max(1, args.reps - 1)), "--out", str(d)], args.checkout, "long100")  # fmt: skip
    rows = json.loads((d / "overhead.json").read_text())["rows"]
    return {(r["variant"], r["turn"]): (r["overhead_p50"], r.get("vs_turn2")) for r in rows}


def throughput(args: argparse.Namespace, out: Path) -> list[dict]:
    d = out / "throughput"
    run([args.tether, "bench", "throughput", "--tokens-per-chunk", "1", "--coalesce", "default", "--workers", "1,2",
         "--out", str(d)], args.checkout, "throughput")  # fmt: skip
    return json.loads((d / "throughput.json").read_text())["rounds"]


def hotpath(args: argparse.Namespace, mode: str) -> dict:
    text = run([args.python, "-m", "tether_lab.hotpath", mode, "--reps", "2"], args.checkout, f"hotpath {mode}")
    return json.loads(text[text.index("{") : text.rindex("}") + 1])


def f(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("yes" if ok else "no")


def table(b: dict, lg: dict, tp: list[dict], turns: dict, streams: dict) -> str:
    rows: list[tuple[str, str, str, str]] = []
    for v, name in (("grpc", "gRPC"), ("ws-inproc", "WebSocket")):
        x = b[v]["overhead_p50"]
        rows.append((f"overhead per cached turn p50, bugfix20 @ 1,000 tok/s, {name} (n={b[v]['n']})", f"{f(x, 3)} ms",
                     "<= 1.0 ms", verdict(x is not None and x <= 1.0)))  # fmt: skip
    for v, name in (("grpc", "gRPC"), ("ws-inproc", "WebSocket")):
        x = b[v]["streaming_p50"]
        rows.append((f"streaming share p50, bugfix20, {name}", f"{f(x, 3)} ms", "<= 0.3 ms",
                     verdict(x is not None and x <= 0.3)))  # fmt: skip
    for v, name in (("grpc", "gRPC"), ("ws-inproc", "WebSocket")):
        vals = [lg.get((v, t), (None, None)) for t in (2, 10, 50, 100)]
        ratios = [r for _, r in vals[1:] if r is not None]
        flat = max(ratios) if ratios else None
        rows.append((f"overhead p50 at turns 2 / 10 / 50 / 100, long100 @ 1,000 tok/s, {name}",
                     " / ".join(f(o, 3) for o, _ in vals) + f" ms (max {f(flat)}x turn 2)",
                     "<= 1.0 ms, flat (<= 1.2x)", verdict(all(o is not None and o <= 1.0 for o, _ in vals) and flat is not None
                                                and flat <= 1.2)))  # fmt: skip
    h = b["http-full-keepalive"]
    rows.append((f"HTTP full resend at >= 80 KB body: overhead p50 (n={h['n_at_80kb']})", f"{f(h['overhead_p50_at_80kb'])} ms",
                 "half of 17.9 ms (d9730f8)", verdict(h["overhead_p50_at_80kb"] is not None
                                                      and h["overhead_p50_at_80kb"] <= 17.9 / 2)))  # fmt: skip
    rows.append(("HTTP full resend: server CPU per turn (rollout p50; d9730f8: 24.2 ms)",
                 f"{f(h['cpu_ms_per_turn'], 1)} ms", "–", "–"))  # fmt: skip
    for r in tp:
        workers = r.get("workers", 1)
        per_worker = " / ".join(f"{c:.2f}" for c in r.get("worker_cpu_s") or []) or f"{r['server_cpu_s']:.2f}"
        rows.append((f"100 streams @ 4,000 tok/s, 1 token/chunk, --workers {workers}: per-stream tok/s p50 (p10)",
                     f"{f(r['per_stream_tps_p50'], 0)} ({f(r['per_stream_tps_p10'], 0)})", ">= 4,000",
                     verdict(r["per_stream_tps_p10"] is not None and r["per_stream_tps_p10"] >= 4000 * 0.98)))  # fmt: skip
        rows.append(("  same: server CPU s per worker; streams continued from the connection's cache; TTFT p50",
                     f"{per_worker} s; {r['continued']}/{r['streams']}; {f(r['ttft_p50_ms'], 0)} ms",
                     "continued = streams", verdict(r["continued"] == r["streams"])))  # fmt: skip
    rows.append(("CPU per cached bugfix20 turn, in process (hotpath turns)", f"{f(turns['cpu_ms_per_cached_turn_p50'])} ms",
                 "–", "–"))  # fmt: skip
    rows.append(("CPU per streamed token, in process, 100 streams (hotpath streams)",
                 f"{f(streams['cpu_us_per_token'])} µs ({f(streams['tokens_per_cpu_second'], 0)} tokens per CPU s)",
                 "<= 2.5 µs (one core carries 100 x 4,000 tok/s)", verdict(streams["cpu_us_per_token"] <= 2.5)))  # fmt: skip
    lines = ["| figure | value | target | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b_} | {c} | {d_} |" for a, b_, c, d_ in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parent.parent,
                   help="the repository to measure (default: this one); its .venv is used")  # fmt: skip
    p.add_argument("--out", type=Path, help="results directory (default <checkout>/bench-results/hotpath-figures-<time>)")
    p.add_argument("--reps", type=int, default=3, help="bugfix20 repetitions per transport (long100: one fewer)")
    p.add_argument("--quick", action="store_true", help="--reps 2 (a smoke run)")
    args = p.parse_args(argv)
    args.checkout = args.checkout.resolve()
    args.reps = 2 if args.quick else args.reps
    args.python = str(args.checkout / ".venv" / "bin" / "python")
    args.tether = str(args.checkout / ".venv" / "bin" / "tether")
    out = (args.out or args.checkout / "bench-results" / f"hotpath-figures-{dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(args.checkout), "log", "-1", "--format=%h %cs"], capture_output=True,
                            text=True, check=False).stdout.strip()  # fmt: skip
    started = time.monotonic()
    b = bugfix20(args, out)
    lg = long100(args, out)
    tp = throughput(args, out)
    turns, streams = hotpath(args, "turns"), hotpath(args, "streams")
    text = table(b, lg, tp, turns, streams)
    header = (f"Hot-path figures: {args.checkout} at {commit}, {dt.datetime.now():%Y-%m-%d %H:%M} "
              f"({time.monotonic() - started:.0f} s, {os.cpu_count()} CPUs)")  # fmt: skip
    report = "\n".join([header, "", text, "", "Load average (1 / 5 / 15 min):", *(f"- {x}" for x in LOADS)])
    (out / "figures.md").write_text(report + "\n")
    (out / "figures.json").write_text(json.dumps({"commit": commit, "bugfix20": b, "throughput": tp,
                                                  "long100": {f"{k[0]}@{k[1]}": v for k, v in lg.items()},
                                                  "hotpath_turns": turns, "hotpath_streams": streams,
                                                  "loads": LOADS}, indent=1))  # fmt: skip
    print(report)
    print(f"\nresults: {out}/ (figures.md, figures.json, and each step's own files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
