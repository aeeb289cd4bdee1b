"""`tether bench`: agent rollouts over every transport, on identical work, against a Tether it
starts itself (or existing `--target` addresses); prints tables, writes JSON/CSV (and PNG charts
with `--plot`) under `bench-results/`.

    tether bench                          # = quick: seconds, every transport, CI smoke
    tether bench full --plot              # the write-up run (docs/transport-comparison.md)
    tether bench -- --workloads bugfix20 --speeds 1000 --reps 3 --delay-ms 10 --transports ws-inproc,grpc
    tether bench throughput               # 100 concurrent gRPC streams at 4,000 tok/s; coalescing on/off
    tether bench overhead                 # per-turn overhead, turn 1 vs 50 vs 100, cached gRPC continuation
    tether bench replicas --plot          # many agents on 1/2/4 simulated replicas, per routing policy
    tether bench upstream                 # CPU per token streamed from a paced upstream (tether_lab.upstream)

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
import contextlib
import datetime as dt
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from tether import eventloop, workloads
from tether_lab import replicas, report
from tether_lab.campaign import FAST, Bench, Phase, render_markdown
from tether_lab.processes import write_config
from tether_lab.transports import BASELINE, VARIANTS, RolloutResult

DEFAULT_OUT = Path("bench-results")


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
    p.add_argument("what", nargs="?", choices=[*sorted(PROFILES), "throughput", "overhead", "replicas", "upstream"],
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
    if argv[:1] == ["upstream"]:  # its own options (tether_lab.upstream)
        from tether_lab import upstream

        return upstream.main(argv[1:])
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
    data = eventloop.run(bench.execute())
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
