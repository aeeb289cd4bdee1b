"""`python -m tether_lab.hotpath`: the server's own CPU per cached turn and per streamed token,
in one process, with a CPU-clock profile. Wall-clock figures on a shared 2-core machine move with
everyone else's load; CPU seconds and a CPU-clock profile do not, so they show what the hot path
itself costs and where it goes.

    python -m tether_lab.hotpath turns [--workload bugfix20] [--tps 1000] [--reps 3] [--profile]
    python -m tether_lab.hotpath streams [--streams 100] [--tokens 4000] [--tps 4000] [--profile]

- `turns`: rollouts of a workload (its simulated script at `--tps`, TTFT 1 ms) through a real
  Engine and session, driven the way a WebSocket client drives it: each `response.create` (the
  full instructions and tools, `previous_response_id`, the tool outputs) goes in through the
  WebSocket decoder, every outgoing event is encoded to its JSON text. Reports this process's CPU
  per turn (the simulated model included: the profile shows its share) and the turns'
  `server_timing` overhead.
- `streams`: `--streams` sessions at once, each streaming one `--tokens`-token answer at `--tps`
  with one token per backend chunk, events encoded as WebSocket JSON. Reports CPU per token and so
  how many tokens per second one core can carry.
- `--event-loop`: the loop it runs on, as the server's `server.event_loop` (default:
  TETHER_SERVER__EVENT_LOOP, else the server's default, asyncio); the result says which.
- `--spin-ms`: run on asyncio's loop with a selector that polls instead of blocking through any
  wait of up to that many ms (`SpinningSelector`): the experiment that shows a wake-up's cost is
  the idle before it (issue 16: the streaming share of a cached turn falls to ~0.33 ms, at ~17x
  the CPU per turn). A measurement, not a server setting.
- `--profile`: cProfile with `time.process_time` as its clock (descheduling by other processes
  adds nothing), the top functions by own and by cumulative time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import selectors
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from tether import eventloop, workloads
from tether.bridge import common
from tether.config import BackendSpec, TetherConfig
from tether.core.delta import Delta
from tether.core.engine import Engine
from tether.protocol import json_codec
from tether.server import build_engine


async def _engine(options: dict) -> Engine:
    config = TetherConfig()
    config.store = "memory://"
    config.log_level = "warning"
    config.backends = {"sim": BackendSpec(options=options)}
    return await build_engine(config)


async def _until_terminal(events) -> tuple[dict, int]:
    """Encode every event as the WebSocket transport does; the terminal response's JSON, and the
    number of delta events."""
    deltas = 0
    while True:
        for ev in await anext(events):
            text = common.encode_event(ev, ws=True)
            if type(ev) is Delta:
                deltas += 1
            elif ev.WhichOneof("event") in ("completed", "failed", "incomplete"):
                return orjson.loads(text)["response"], deltas


async def run_turns(wl: workloads.Workload, tps: float, reps: int) -> dict:
    speed = workloads.SpeedProfile.parse(f"{tps:g}@1:1")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(wl.simulated_script(speed), f)
    engine = await _engine({"ttft_ms": 1, "tokens_per_s": tps, "script": f.name})
    limits = engine.config.limits
    cpu_per_turn: list[float] = []
    overhead_ms: list[float] = []
    streaming_ms: list[float] = []
    try:
        for _ in range(reps):
            session = await engine.open_session("", transport="websocket")
            events = session.events(lazy_deltas=True)
            previous, new_input = "", [wl.user_message()]
            for _turn in range(wl.turns):
                body = {"type": "response.create", "model": "tether-sim", "instructions": wl.instructions,
                        "tools": list(wl.tools), "input": new_input, "store": False,
                        "include": ["tether:server_timing"]}  # fmt: skip
                if previous:
                    body["previous_response_id"] = previous
                cpu0 = time.process_time()
                text = orjson.dumps(body)
                request = json_codec.client_event_from_json(common.decode_object(text, limits))
                await session.send(request, nbytes=len(text))  # as the WebSocket transport does
                response, _ = await _until_terminal(events)
                cpu_per_turn.append(time.process_time() - cpu0)
                timing = response.get("server_timing") or {}
                stages = timing.get("stages_ms", {})
                pre = sum(stages.get(k, 0.0) for k in ("resolve", "validate", "classify", "render", "route"))
                overhead_ms.append(timing.get("overhead_ms", 0.0))
                streaming_ms.append(timing.get("overhead_ms", 0.0) - pre)
                previous = response["id"]
                calls = [o for o in response["output"] if o["type"] == "function_call"]
                new_input = [{"type": "function_call_output", "call_id": c["call_id"], "output": "ok " * 400}
                             for c in calls]  # fmt: skip
                if not calls:
                    break
            await session.close()
    finally:
        await engine.aclose()
        Path(f.name).unlink(missing_ok=True)  # noqa: ASYNC240 - after the run, a temp file
    cached = cpu_per_turn[1:] if len(cpu_per_turn) > 1 else cpu_per_turn
    return {
        "turns": len(cpu_per_turn),
        "cpu_ms_per_cached_turn_p50": 1000 * statistics.median(cached),
        "overhead_ms_p50": statistics.median(overhead_ms[1:] or overhead_ms),
        "streaming_ms_p50": statistics.median(streaming_ms[1:] or streaming_ms),
    }


async def run_streams(streams: int, tokens: int, tps: float) -> dict:
    engine = await _engine({"ttft_ms": 1, "tokens_per_s": tps, "output_tokens": tokens, "call_tools": False})
    rates: list[float] = []
    deltas: list[int] = []

    async def one() -> None:
        session = await engine.open_session("", transport="websocket")
        events = session.events(lazy_deltas=True)
        request = json_codec.client_event_from_json(
            {"type": "response.create", "model": "tether-sim", "input": "Write a long answer.", "store": False}
        )
        await session.send(request)
        t0 = time.perf_counter()
        _, n = await _until_terminal(events)
        rates.append(tokens / (time.perf_counter() - t0))
        deltas.append(n)
        await session.close()

    try:
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(streams)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    finally:
        await engine.aclose()
    return {
        "streams": streams,
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_us_per_token": 1e6 * cpu / (streams * tokens),
        "tokens_per_cpu_second": streams * tokens / cpu,
        "per_stream_tps_p50": statistics.median(rates),
        "delta_events_per_stream": statistics.mean(deltas),
    }


class SpinningSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls (timeout 0) instead of blocking, for up to `spin_s` of each wait, then blocks for
    the rest: the CPU never idles through a short wait, so the code that runs after it finds its
    caches warm. Burns a core while it spins."""

    def __init__(self, spin_s: float) -> None:
        super().__init__()
        self.spin_s = spin_s

    def select(self, timeout: float | None = None):  # type: ignore[override]
        if timeout is not None and timeout <= 0:
            return super().select(timeout)
        started = time.perf_counter()
        limit = self.spin_s if timeout is None else min(self.spin_s, timeout)
        while True:
            ready = super().select(0)
            spent = time.perf_counter() - started
            if ready or spent >= limit:
                break
        if ready or (timeout is not None and spent >= timeout):
            return ready
        return super().select(None if timeout is None else timeout - spent)


def _profile_text(prof: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tether_lab.hotpath", description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("turns", "streams"))
    p.add_argument("--workload", default="bugfix20")
    p.add_argument("--tps", type=float, default=None, help="model tokens/s (turns: 1000, streams: 4000)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--tokens", type=int, default=4000)
    p.add_argument("--profile", action="store_true", help="print a CPU-clock cProfile of the run")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--event-loop", choices=eventloop.CHOICES, default=eventloop.environment_choice(),
                   help="the loop to run on, as `server.event_loop` (default: TETHER_SERVER__EVENT_LOOP, else asyncio)")
    p.add_argument("--spin-ms", type=float, default=0.0,
                   help="asyncio's loop polling through waits up to this long (an experiment; 0: off)")
    args = p.parse_args(argv)
    if args.mode == "turns":
        run = run_turns(workloads.load(args.workload), args.tps or 1000.0, args.reps)
    else:
        run = run_streams(args.streams, args.tokens, args.tps or 4000.0)
    prof = cProfile.Profile(time.process_time) if args.profile else None
    if prof is not None:
        prof.enable()
    if args.spin_ms > 0:
        spinning = SpinningSelector(args.spin_ms / 1000.0)
        with asyncio.Runner(loop_factory=lambda: asyncio.SelectorEventLoop(spinning)) as runner:
            result = {"event_loop": f"asyncio, spinning {args.spin_ms:g} ms", **runner.run(run)}
    else:
        result = {"event_loop": eventloop.resolve(args.event_loop), **eventloop.run(run, args.event_loop)}
    if prof is not None:
        prof.disable()
    print(json.dumps(result, indent=1))
    if prof is not None:
        print(_profile_text(prof, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
