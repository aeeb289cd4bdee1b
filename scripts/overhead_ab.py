"""A cached turn's server overhead, this checkout against another one, measured side by side.

    python scripts/overhead_ab.py --base /tmp/old                # 4 rounds, gRPC and WebSocket
    python scripts/overhead_ab.py --base /tmp/old --rounds 8 --transports grpc

Each round runs `tether bench overhead --workloads bugfix20 --speeds 1000` for both checkouts at
the same time, each pinned to a core of its own (its bench client and its server share it), and
the cores are swapped every round. Both sides thus see the same machine at the same moment: on a
shared VM, runs one after the other drift by 10-20% between minutes, which is more than the
differences worth measuring, while the ratio of two runs side by side stays within a few percent.
It prints, per transport, each side's overhead p50 (turns 2 to the end of every repetition, as
`scripts/hotpath_figures.py` reads them), the ratio of each round, and their median; the same for
the streaming share (overhead minus the stages before the model).

Each checkout runs its own code (`PYTHONPATH=<checkout>`) with its own `.venv/bin/python` when it
has one, else this interpreter: a worktree of an old commit can share this checkout's venv.
Stdlib only; Linux (core pinning). With fewer than two cores the sides alternate instead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
from pathlib import Path

from hotpath_figures import PRE_BACKEND, turn_rows  # scripts/: this script's own folder


def interpreter(checkout: Path) -> str:
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def bench(checkout: Path, out: Path, transports: str, reps: int, core: int | None) -> tuple[subprocess.Popen, Path]:
    cmd = [interpreter(checkout), "-m", "tether.cli", "bench", "overhead", "--workloads", "bugfix20", "--speeds",
           "1000", "--transports", transports, "--reps", str(reps), "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    with open(out.with_suffix(".log"), "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin)
    return proc, out


def finish(proc: subprocess.Popen, out: Path) -> None:
    if proc.wait() != 0:
        raise SystemExit(f"bench failed (exit {proc.returncode}); see {out.with_suffix('.log')}")


def figures(out: Path, variant: str) -> tuple[float, float]:
    """(overhead p50, streaming share p50) in ms of a bench's cached turns."""
    rows = [r for r in turn_rows(out) if r["variant"] == variant and int(r["turn"]) >= 1 and r["overhead_ms"]]
    over = [float(r["overhead_ms"]) for r in rows]
    streaming = [float(r["overhead_ms"]) - sum(float(r[k] or 0) for k in PRE_BACKEND) for r in rows]
    return statistics.median(over), statistics.median(streaming)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, required=True, help="the checkout to compare against")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--reps", type=int, default=2, help="repetitions of the workload per bench")
    p.add_argument("--transports", default="grpc,ws-inproc")
    p.add_argument("--out", type=Path, help="results (default bench-results/overhead-ab-<time>)")
    args = p.parse_args()
    here = Path(__file__).resolve().parent.parent
    base = args.base.resolve()
    out = (args.out or here / "bench-results" / f"overhead-ab-{dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    side_by_side = len(cores) >= 2
    sides = {"base": base, "this": here}
    for i in range(args.rounds):
        pair = (cores[i % 2], cores[(i + 1) % 2]) if side_by_side else (None, None)
        started = []
        for (name, checkout), core in zip(sides.items(), pair, strict=True):
            d = out / f"{name}-{i + 1}"
            started.append(bench(checkout, d, args.transports, args.reps, core))
            if not side_by_side:
                finish(*started.pop())
        for proc, d in started:
            finish(proc, d)
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    commits = {name: subprocess.run(["git", "-C", str(c), "log", "-1", "--format=%h"], capture_output=True,
                                    text=True).stdout.strip() for name, c in sides.items()}  # fmt: skip
    print(f"Overhead per cached turn, bugfix20 @ 1,000 tok/s: this ({here}, {commits['this']}) against base "
          f"({base}, {commits['base']}), {args.rounds} rounds "
          f"{'side by side on pinned cores' if side_by_side else 'alternating'}, {args.reps} repetitions each\n")
    print("| transport | figure | base p50 ms | this p50 ms | this / base, per round | median |")
    print("|---|---|---|---|---|---|")
    for variant in args.transports.split(","):
        b = [figures(out / f"base-{i + 1}", variant) for i in range(args.rounds)]
        t = [figures(out / f"this-{i + 1}", variant) for i in range(args.rounds)]
        for k, name in ((0, "overhead"), (1, "streaming share")):
            ratios = [y[k] / x[k] for x, y in zip(b, t, strict=True)]
            print(f"| {variant} | {name} | {statistics.median(x[k] for x in b):.3f} | {statistics.median(y[k] for y in t):.3f} "
                  f"| {' '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.3f} |")
    print(f"\nresults: {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
