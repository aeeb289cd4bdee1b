"""Many followers of one run: what N SSE readers of one background response cost the server's
event loop.

    python -m tether_lab.followers                      # 1 and 300 followers
    python -m tether_lab.followers --followers 1,100,300 --tokens 3000 --tokens-per-s 300
    python -m tether_lab.followers --in-process --followers 1,300 --log-events 20000

One `tether serve` (SQLite store, a simulated model, `coalesce_ms = 0`: one event per token, so
the run's log grows by one entry per token) runs one background response; N clients follow it
with `GET /v1/responses/{id}?stream=true` from its first event to its last. While it runs,
`/metrics` is scraped every 0.25 s: the largest `tether_event_loop_lag_max_seconds` seen is the
figure (how long the server's loop was blocked at worst), with the server's CPU time per event
delivered to one follower (`process_cpu_seconds_total`: less at the mercy of other processes on
the machine than the lag). Each follower must receive every event, in order.

`--in-process` measures the run's side alone, without sockets: one `ResponseRun` whose log
already holds `--log-events` events, N `follow()` subscribers, then 200 more events committed one
per loop iteration; it prints the loop's time per committed event (every subscriber woken and
given its batch) and per subscriber. What a read costs is what separates "reads from its cursor"
from "copies the log per read".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tether.core.delta import Delta
from tether.core.run import ReplayLog, ResponseRun
from tether_lab.processes import ServerProcess
from tether_lab.scaleout import write_config

MODEL = "tether-sim"


@dataclass(frozen=True)
class Result:
    followers: int
    events: int  # per follower
    lag_max_s: float
    wall_s: float
    cpu_us_per_delivery: float  # the server's CPU per event delivered to one follower


async def _follow(client: httpx.AsyncClient, response_id: str) -> list[int]:
    numbers: list[int] = []
    try:
        async with client.stream("GET", f"/v1/responses/{response_id}", params={"stream": "true"}) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    numbers.append(json.loads(line[6:])["sequence_number"])
    except httpx.TransportError as exc:
        raise RuntimeError(f"a follower's stream broke after {len(numbers)} events: {exc!r}") from exc
    return numbers


async def _sample(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    return 0.0


async def _lag_max(client: httpx.AsyncClient) -> float:
    return await _sample(client, "tether_event_loop_lag_max_seconds")


async def measure(server: ServerProcess, followers: int) -> Result:
    limits = httpx.Limits(max_connections=followers + 8, max_keepalive_connections=followers + 8)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
        await _lag_max(client)  # resets the gauge's window
        cpu_before = await _sample(client, "process_cpu_seconds_total")
        created = (await client.post("/v1/responses", json={"model": MODEL, "input": "go", "background": True})).json()
        started = time.monotonic()
        readers = [asyncio.create_task(_follow(client, created["id"])) for _ in range(followers)]
        worst = 0.0
        while not all(r.done() for r in readers):
            await asyncio.sleep(0.25)
            worst = max(worst, await _lag_max(client))
        got = [r.result() for r in readers]
        wall = time.monotonic() - started
        worst = max(worst, await _lag_max(client))
        cpu = await _sample(client, "process_cpu_seconds_total") - cpu_before
    counts = {len(numbers) for numbers in got}
    assert len(counts) == 1 and all(numbers == list(range(len(numbers))) for numbers in got), "a follower lost events"
    events = counts.pop()
    return Result(followers, events, worst, wall, cpu / (events * followers) * 1e6)


async def measure_in_process(followers: int, log_events: int, events: int = 200) -> tuple[float, float]:
    """(µs of loop time per committed event, µs per event and subscriber)."""
    run = ResponseRun("resp_follow", log=ReplayLog(max(log_events + events, 1), 1 << 40))
    for n in range(log_events):
        run.stamp(_delta(n), None)
    last = log_events - 1
    got = [0] * followers

    async def follow(i: int) -> None:
        async for batch in run.follow(after=last):
            got[i] += len(batch)
            if got[i] >= events:
                return

    readers = [asyncio.create_task(follow(i)) for i in range(followers)]
    await asyncio.sleep(0)
    started = time.perf_counter()
    for n in range(log_events, log_events + events):
        run.stamp(_delta(n), None)
        await asyncio.sleep(0)  # every subscriber takes its batch
    await asyncio.gather(*readers)
    per_event = (time.perf_counter() - started) / events * 1e6
    assert all(g == events for g in got)
    return per_event, per_event / followers


def _delta(n: int) -> Delta:
    d = Delta("output_text_delta", "msg_1", 0, f"t{n} ")
    d.response_id = "resp_follow"
    return d


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--followers", default="1,300", help="comma-separated follower counts")
    parser.add_argument("--tokens", type=int, default=2000, help="output tokens of the followed response")
    parser.add_argument("--tokens-per-s", type=float, default=400.0)
    parser.add_argument("--in-process", action="store_true", help="the run and its subscribers alone, no server")
    parser.add_argument("--log-events", type=int, default=20_000, help="--in-process: events already logged")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.followers.split(",")]
    if args.in_process:
        print(f"{'followers':>9} {'logged':>7} {'µs per event':>12} {'µs per event and follower':>25}")
        for n in counts:
            per_event, per_follower = asyncio.run(measure_in_process(n, args.log_events))
            print(f"{n:>9} {args.log_events:>7} {per_event:>12.1f} {per_follower:>25.2f}")
        return
    with tempfile.TemporaryDirectory(prefix="tether-followers-") as tmp:
        workdir = Path(tmp)
        sim = {"ttft_ms": 0, "tokens_per_s": args.tokens_per_s, "output_tokens": args.tokens}
        cfg = write_config(workdir / "tether.toml", f"sqlite:///{workdir / 'store.db'}", sim=sim)
        server = ServerProcess(cfg, workdir, name="followers")
        server.start()
        try:
            server.wait_ready()
            print(f"{'followers':>9} {'events each':>11} {'loop lag max (s)':>16} {'wall (s)':>8} "
                  f"{'server CPU µs per event and follower':>36}")  # fmt: skip
            for n in counts:
                try:
                    r = asyncio.run(measure(server, n))
                except Exception:
                    print(server.logs())
                    raise
                print(f"{r.followers:>9} {r.events:>11} {r.lag_max_s:>16.3f} {r.wall_s:>8.2f} "
                      f"{r.cpu_us_per_delivery:>36.1f}")  # fmt: skip
        finally:
            server.stop(timeout=15)


if __name__ == "__main__":
    main()
