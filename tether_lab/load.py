"""A bounded load campaign against a `tether serve` subprocess on loopback (`python -m tether_lab.load`).

    python -m tether_lab.load --connections 1000 --rolling 200 --grpc 20 --duration 60

What it does, in order:

1. starts `tether serve` (simulated backend, SQLite store in a temporary folder, both ports on
   127.0.0.1:0), warms it with one rollout, waits for its memory reclaimer to run
   (`tether/process_memory.py`, seen in `/metrics`) and reads its RSS from /proc (baseline);
2. opens `--connections` WebSocket connections and keeps them open; `--rolling` of them run
   rollouts back to back for `--duration` seconds: a tool loop (create with a tool -> the model
   calls it -> the client sends the tool output with `previous_response_id` -> a text answer),
   every `--stored-every`-th rollout with `store=true`; `--grpc` gRPC Session streams run the same
   rollouts. Every create asks for `include: ["tether:server_timing"]`;
3. reports throughput (turns/s, events/s), the per-turn server overhead (`server_timing.overhead_ms`:
   p50/p99, which excludes the model's time), errors (anything but a completed turn: must be 0),
   memory per idle connection ((RSS with all connections open - baseline) / connections), peak RSS;
4. retrieves every `store=true` response over HTTP (`GET /v1/responses/{id}`): all must be there;
5. closes every connection, waits for the server's own memory reclaimer to run and its RSS to
   settle: it must come back near its baseline (`--rss-slack-mib`; on `allocator = "pymalloc"`
   it does not, see docs/reliability.md "Load"). Then the census (a prelude
   the campaign installs; SIGUSR2) counts live objects after its own gc and heap purge.

The client is one asyncio process; the server another (its CPU and memory are its own). File
descriptors: each connection costs one in each process, so the soft `RLIMIT_NOFILE` is raised to
the hard limit here and in the server (the subprocess inherits it).

The server is `tether_lab.processes.ServerProcess`, as for every lab tool and the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tether import eventloop
from tether.config import ServerConfig
from tether_lab.metrics import ProcStat, parse_prometheus
from tether_lab.processes import ServerProcess, raise_fd_limit

FAST_SIM = {"ttft_ms": 1, "tokens_per_s": 4000, "output_tokens": 24, "tick_ms": 2}


def write_config(path: Path, *, store: str, sim: dict[str, Any] | None = None, extra: str = "") -> Path:
    """A TOML config: one simulated backend answering every model name, the given store."""
    options = "\n".join(f"{k} = {orjson.dumps(v).decode()}" for k, v in {**FAST_SIM, **(sim or {})}.items())
    path.write_text(
        f'store = "{store}"\nlog_level = "warning"\n\n[backends.sim]\nkind = "simulated"\n{options}\n\n'
        f'[models."*"]\nbackend = "sim"\n{extra}\n'
    )
    return path


async def wait_rss_settled(proc: ServerProcess, *, within_s: float = 10.0, step_s: float = 0.25) -> int:
    """The server's RSS once two readings in a row agree within 1 MiB (or after `within_s`)."""
    last = proc.rss()
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        await asyncio.sleep(step_s)
        now = proc.rss()
        if abs(now - last) < 1 << 20:
            return now
        last = now
    return last


async def server_metric(server: ServerProcess, name: str) -> float:
    """The sum of one metric's samples (every label set) in the server's /metrics."""
    import httpx

    async with httpx.AsyncClient(timeout=10) as h:
        text = (await h.get(f"{server.base_url}/metrics")).text
    return sum(v for (sample, _labels), v in parse_prometheus(text).items() if sample == name)


async def rss_after_reclaim(server: ServerProcess, interval_s: float, *, within_s: float = 60.0) -> int:
    """The server's settled RSS once every session is gone and its memory reclaimer has had two
    checks since (it checks every `interval_s` and runs once closes outnumber open sessions: a
    run in the middle of a wave of closes is followed by one for the rest)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await server_metric(server, "tether_connections") == 0:
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(2 * interval_s + 0.5)
    return await wait_rss_settled(server)


RECLAIM_INTERVAL_S = ServerConfig().memory_reclaim_interval_s  # the server's default


# -- the campaign ----------------------------------------------------------------------------------

LOAD_KEYS = [f"sk-load-{i}-0123456789" for i in range(8)]  # tenants load0..load7
TOOL = {
    "type": "function",
    "name": "run_tests",
    "description": "Run the test suite and return its output.",
    "parameters": {"type": "object", "properties": {"filter": {"type": "string"}}, "required": ["filter"]},
}
TERMINAL = ("response.completed", "response.failed", "response.incomplete")
INCLUDE = ["tether:server_timing"]


@dataclass
class LoadStats:
    turns: int = 0
    events: int = 0
    rollouts: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    error_examples: list[str] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)
    turn_ms: list[float] = field(default_factory=list)
    stored: list[tuple[str, str]] = field(default_factory=list)  # (api key, response id)

    def error(self, cls: str, example: Any) -> None:
        self.errors[cls] = self.errors.get(cls, 0) + 1
        if len(self.error_examples) < 5:
            self.error_examples.append(f"{cls}: {example!s:.300}")

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * (len(s) - 1)))], 3)


async def _ws_rollout(conn: Any, key: str, stats: LoadStats, n: int, store: bool, turns: int) -> None:
    previous: str | None = None
    call_id: str | None = None
    for t in range(turns):
        body: dict[str, Any] = {
            "type": "response.create",
            "model": "load-sim",
            "store": store,
            "include": INCLUDE,
        }
        if call_id:
            body["input"] = [
                {"type": "function_call_output", "call_id": call_id, "output": f"{n}.{t}: 12 passed"}
            ]
        else:
            body["input"] = f"rollout {n} turn {t}: fix the failing test"
        body["tools"] = [TOOL]
        if previous:
            body["previous_response_id"] = previous
        started = time.perf_counter()
        await conn.send(orjson.dumps(body).decode())
        while True:
            ev = orjson.loads(await asyncio.wait_for(conn.recv(), 60))
            stats.events += 1
            if ev["type"] == "error":
                stats.error(f"ws error {ev['error'].get('code')}", ev)
                return
            if ev["type"] in TERMINAL:
                break
        stats.turn_ms.append((time.perf_counter() - started) * 1000)
        response = ev["response"]
        if response["status"] != "completed":
            stats.error(
                f"ws {response['status']}", response.get("error") or response.get("incomplete_details")
            )
            return
        stats.turns += 1
        timing = response.get("server_timing") or {}
        if "overhead_ms" in timing:
            stats.overhead_ms.append(timing["overhead_ms"])
        previous = response["id"]
        if store:
            stats.stored.append((key, previous))
        calls = [o for o in response["output"] if o["type"] == "function_call"]
        call_id = calls[0]["call_id"] if calls else None
    stats.rollouts += 1


async def _grpc_rollouts(
    channel: Any, key: str, stats: LoadStats, stop_at: float, turns: int, stored_every: int
) -> None:
    from tether.responses.v1 import request_pb2, service_pb2, service_pb2_grpc

    stub = service_pb2_grpc.ResponsesServiceStub(channel)
    call = stub.Session(metadata=(("authorization", f"Bearer {key}"),))
    tool = request_pb2.Tool()
    tool.function.name = TOOL["name"]
    tool.function.parameters_json = orjson.dumps(TOOL["parameters"]).decode()
    events = aiter(call)
    n = 0
    try:
        while time.monotonic() < stop_at:
            n += 1
            store = n % stored_every == 0
            previous, call_id = "", ""
            for t in range(turns):
                req = service_pb2.SessionRequest()
                c = req.create
                c.model, c.store, c.previous_response_id = "load-sim", store, previous
                c.include.append(INCLUDE[0])
                c.tools.append(tool)
                if call_id:
                    item = c.input.add()
                    item.function_call_output.call_id = call_id
                    item.function_call_output.output_text = f"{n}.{t}: 12 passed"
                else:
                    c.input_text = f"grpc rollout {n} turn {t}"
                started = time.perf_counter()
                await call.write(req)
                done = None
                while done is None:
                    batch = await asyncio.wait_for(anext(events), 60)
                    for ev in batch.events:
                        stats.events += 1
                        arm = ev.WhichOneof("event")
                        if arm == "error":
                            stats.error(f"grpc error {ev.error.error.code}", ev.error.error.message)
                            return
                        if arm in ("completed", "failed", "incomplete"):
                            done = getattr(ev, arm).response
                stats.turn_ms.append((time.perf_counter() - started) * 1000)
                if done.status != "completed":
                    stats.error(f"grpc {done.status}", done.error.code)
                    return
                stats.turns += 1
                stats.overhead_ms.append(done.server_timing.overhead_ms)
                previous = done.id
                if store:
                    stats.stored.append((key, previous))
                calls = [o.function_call for o in done.output if o.WhichOneof("item") == "function_call"]
                call_id = calls[0].call_id if calls else ""
            stats.rollouts += 1
    finally:
        call.cancel()


# `objects` counts the startup heap the server froze (`gc.freeze`, which `gc.get_objects()` does not
# list) too, so it stays comparable across versions; `top` is by type of the unfrozen ones.
CENSUS_PRELUDE = """
import collections, gc, json, signal, sys
def _tether_census(signum, frame):
    from tether.process_memory import trim_heap
    gc.collect()
    counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
    trimmed = trim_heap()
    frozen = gc.get_freeze_count()
    sys.stderr.write("TETHER_CENSUS " + json.dumps({"objects": sum(counts.values()) + frozen, "frozen": frozen,
                     "top": counts.most_common(15), "trimmed": trimmed}) + "\\n")
    sys.stderr.flush()
signal.signal(signal.SIGUSR2, _tether_census)
"""


async def census(server: ServerProcess) -> dict[str, Any] | None:
    """Ask a server started with `CENSUS_PRELUDE` for a gc object census (it also purges the C
    heap, `tether.process_memory.trim_heap`, so the RSS read afterwards is what the process really holds)."""
    if CENSUS_PRELUDE.strip() not in server.prelude or server.proc is None:
        return None
    before = server.log_text().count("TETHER_CENSUS ")
    os.kill(server.pid, signal.SIGUSR2)
    for _ in range(200):
        await asyncio.sleep(0.05)
        lines = [ln for ln in server.log_text().splitlines() if ln.startswith("TETHER_CENSUS ")]
        if len(lines) > before:
            data = orjson.loads(lines[-1][len("TETHER_CENSUS ") :])
            await asyncio.sleep(0.2)
            data["rss_mib"] = round(server.rss() / 2**20, 1)
            return data
    return None


async def run_load(
    server: ServerProcess,
    *,
    connections: int = 1000,
    rolling: int = 200,
    grpc_sessions: int = 20,
    duration_s: float = 60.0,
    turns: int = 3,
    stored_every: int = 4,
    connect_concurrency: int = 50,
    cycles: int = 1,
    reclaim_interval_s: float = RECLAIM_INTERVAL_S,
    progress: Any = None,
) -> dict[str, Any]:
    """The campaign against a running `ServerProcess` started with `LOAD_KEYS` (see `main`):
    `cycles` times (open, roll, check the store, close). The figures of the first cycle are the
    headline; `cycles[*]` has every cycle's, so memory can be compared cycle to cycle.
    `reclaim_interval_s` is the server's `server.memory_reclaim_interval_s` (`load_server` sets it)."""
    say = progress or (lambda _m: None)
    raise_fd_limit()
    # Warm the server (tokenizer, codecs, store) with one rollout, then take the baseline.
    from websockets.asyncio.client import connect

    async with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {LOAD_KEYS[0]}"}) as warm:
        await _ws_rollout(warm, LOAD_KEYS[0], LoadStats(), 0, True, turns)
    base = await rss_after_reclaim(server, reclaim_interval_s)
    base_census = await census(server)
    runs = []
    for cycle in range(cycles):
        out = await _one_cycle(server, base, connections=connections, rolling=rolling, grpc_sessions=grpc_sessions,
                               duration_s=duration_s, turns=turns, stored_every=stored_every,
                               connect_concurrency=connect_concurrency, reclaim_interval_s=reclaim_interval_s,
                               say=say)  # fmt: skip
        out["census_after_close"] = await census(server)
        runs.append(out)
        say(f"load: cycle {cycle + 1}: {out['turns']} turns, {out['errors']} errors, RSS after close "
            f"{out['rss_after_close_mib']} MiB")  # fmt: skip
    result = dict(runs[0])
    result["census_baseline"] = base_census
    result["cycles"] = [
        {k: r[k] for k in ("turns", "errors", "stored_responses", "stored_missing", "rss_peak_mib",
                           "rss_after_close_mib", "census_after_close")}
        for r in runs
    ]  # fmt: skip
    result["errors"] = sum(r["errors"] for r in runs)
    result["stored_missing"] = sum(r["stored_missing"] for r in runs)
    return result


async def _one_cycle(server: ServerProcess, base: int, *, connections: int, rolling: int, grpc_sessions: int,
                     duration_s: float, turns: int, stored_every: int, connect_concurrency: int,
                     reclaim_interval_s: float, say: Any) -> dict[str, Any]:  # fmt: skip
    import grpc
    import httpx
    from websockets.asyncio.client import connect

    stats = LoadStats()
    out: dict[str, Any] = {"connections": connections, "rolling": rolling, "grpc_sessions": grpc_sessions,
                           "duration_s": duration_s, "turns_per_rollout": turns}  # fmt: skip
    out["rss_baseline_mib"] = round(base / 2**20, 1)
    conns: list[Any] = [None] * connections
    sem = asyncio.Semaphore(connect_concurrency)

    async def open_one(i: int) -> None:
        key = LOAD_KEYS[i % len(LOAD_KEYS)]
        async with sem:
            try:
                conns[i] = await connect(server.ws_url, additional_headers={"Authorization": f"Bearer {key}"},
                                         max_size=None, open_timeout=60)  # fmt: skip
            except Exception as exc:  # noqa: BLE001
                stats.error("ws connect", repr(exc))

    t0 = time.perf_counter()
    await asyncio.gather(*(open_one(i) for i in range(connections)))
    out["connect_seconds"] = round(time.perf_counter() - t0, 2)
    opened = sum(1 for c in conns if c is not None)
    out["connections_opened"] = opened
    idle_rss = await wait_rss_settled(server)
    out["rss_all_open_mib"] = round(idle_rss / 2**20, 1)
    out["kib_per_idle_connection"] = round((idle_rss - base) / max(1, opened) / 1024, 1)
    say(f"load: {opened} connections open, {out['kib_per_idle_connection']} KiB each; rolling {rolling} + "
        f"{grpc_sessions} gRPC for {duration_s:g}s")  # fmt: skip

    stop_at = time.monotonic() + duration_s
    peak = idle_rss

    async def roller(i: int) -> None:
        conn, key = conns[i], LOAD_KEYS[i % len(LOAD_KEYS)]
        n = 0
        while conn is not None and time.monotonic() < stop_at:
            n += 1
            try:
                await _ws_rollout(conn, key, stats, n, n % stored_every == 0, turns)
            except Exception as exc:  # noqa: BLE001
                stats.error(f"ws {type(exc).__name__}", repr(exc))
                return

    async def sampler() -> None:
        nonlocal peak
        while time.monotonic() < stop_at:
            peak = max(peak, server.rss())
            await asyncio.sleep(0.5)

    server_stat = ProcStat(server.pid)
    started, cpu_started = time.perf_counter(), server_stat.cpu_seconds()
    async with grpc.aio.insecure_channel(server.grpc_target) as channel:
        tasks = [roller(i) for i in range(min(rolling, connections))]
        tasks += [_grpc_rollouts(channel, LOAD_KEYS[i % len(LOAD_KEYS)], stats, stop_at, turns, stored_every)
                  for i in range(grpc_sessions)]  # fmt: skip

        async def guarded(coro: Any) -> None:
            try:
                await coro
            except Exception as exc:  # noqa: BLE001
                stats.error(f"grpc {type(exc).__name__}", repr(exc))

        await asyncio.gather(sampler(), *(guarded(t) for t in tasks))
    elapsed, server_cpu = time.perf_counter() - started, server_stat.cpu_seconds() - cpu_started
    out.update(
        turns=stats.turns,
        rollouts=stats.rollouts,
        events=stats.events,
        seconds=round(elapsed, 1),
        turns_per_s=round(stats.turns / elapsed, 1),
        events_per_s=round(stats.events / elapsed, 1),
        server_cpu_ms_per_turn=round(server_cpu * 1000 / max(1, stats.turns), 3),
        overhead_ms={"samples": len(stats.overhead_ms), "p50": _pct(stats.overhead_ms, 0.5),
                     "p99": _pct(stats.overhead_ms, 0.99), "max": _pct(stats.overhead_ms, 1.0)},
        client_turn_ms={"p50": _pct(stats.turn_ms, 0.5), "p99": _pct(stats.turn_ms, 0.99)},
        rss_peak_mib=round(peak / 2**20, 1),
    )  # fmt: skip

    # Every stored response is retrievable.
    missing: list[str] = []
    hsem = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as h:

        async def check(key: str, rid: str) -> None:
            async with hsem:
                r = await h.get(f"/v1/responses/{rid}", headers={"Authorization": f"Bearer {key}"})
                if r.status_code != 200 or r.json().get("id") != rid:
                    missing.append(rid)

        await asyncio.gather(*(check(k, r) for k, r in stats.stored))
    out["stored_responses"] = len(stats.stored)
    out["stored_missing"] = len(missing)

    # Close everything; memory should come back near the baseline, by the server's own doing
    # (its memory reclaimer), not the census's gc and purge.
    names = ("tether_memory_reclaims_total", "tether_memory_reclaim_seconds_total", "tether_memory_reclaimed_bytes_total")
    before = [await server_metric(server, n) for n in names]
    await asyncio.gather(*(c.close() for c in conns if c is not None), return_exceptions=True)
    conns.clear()
    after = await rss_after_reclaim(server, reclaim_interval_s)
    runs, seconds, released = [await server_metric(server, n) - b for n, b in zip(names, before, strict=True)]
    out["reclaimed_by_server"] = runs > 0
    out["reclaims"] = {"runs": int(runs), "ms": round(seconds * 1000, 1), "released_mib": round(released / 2**20, 1)}
    out["rss_after_close_mib"] = round(after / 2**20, 1)
    out["rss_after_close_delta_mib"] = round((after - base) / 2**20, 1)
    out["errors"] = stats.error_count
    out["error_classes"] = stats.errors
    out["error_examples"] = stats.error_examples
    return out


def load_server(
    tmp: Path, *, sim: dict[str, Any] | None = None, reclaim_interval_s: float = RECLAIM_INTERVAL_S
) -> ServerProcess:
    """`tether serve` for the campaign: simulated model, SQLite store in `tmp`, LOAD_KEYS."""
    config = write_config(
        tmp / "load.toml", store=f"sqlite:///{tmp / 'load.db'}",
        sim={"ttft_ms": 5, "tokens_per_s": 4000, "output_tokens": 24, "tick_ms": 2, **(sim or {})},
        extra=f"\n[server]\nmemory_reclaim_interval_s = {reclaim_interval_s}\n",
    )  # fmt: skip
    keys = ",".join(f"{k}:load{i}" for i, k in enumerate(LOAD_KEYS))
    return ServerProcess(
        config, tmp, name="server", env={"TETHER_API_KEYS": keys}, prelude=CENSUS_PRELUDE
    )


def format_load(out: dict[str, Any]) -> str:
    rows = [
        ("connections open / rolling / gRPC", f"{out['connections_opened']} / {out['rolling']} / {out['grpc_sessions']}"),
        ("duration (s)", out["seconds"]),
        ("turns, rollouts, events", f"{out['turns']}, {out['rollouts']}, {out['events']}"),
        ("throughput", f"{out['turns_per_s']} turns/s, {out['events_per_s']} events/s"),
        ("server overhead per turn (ms)", f"p50 {out['overhead_ms']['p50']}, p99 {out['overhead_ms']['p99']}, "
                                          f"max {out['overhead_ms']['max']} ({out['overhead_ms']['samples']} turns)"),
        ("server CPU per turn (ms, all of its work)", out["server_cpu_ms_per_turn"]),
        ("client-seen turn time (ms)", f"p50 {out['client_turn_ms']['p50']}, p99 {out['client_turn_ms']['p99']}"),
        ("errors", f"{out['errors']} {out['error_classes'] or ''}"),
        ("RSS baseline / all open / peak (MiB)", f"{out['rss_baseline_mib']} / {out['rss_all_open_mib']} / {out['rss_peak_mib']}"),
        ("memory per idle connection (KiB)", out["kib_per_idle_connection"]),
        ("stored responses / missing", f"{out['stored_responses']} / {out['stored_missing']}"),
        ("RSS after close (MiB), delta vs baseline", f"{out['rss_after_close_mib']} ({out['rss_after_close_delta_mib']:+})"
                                                     + ("" if out.get("reclaimed_by_server") else ", server did not reclaim")),
        ("server's reclaims after the close: runs, time (ms), released (MiB)",
         f"{out['reclaims']['runs']}, {out['reclaims']['ms']}, {out['reclaims']['released_mib']}"),
    ]  # fmt: skip
    base = out.get("census_baseline")
    if base:
        rows.append(
            ("baseline after gc + heap purge: RSS (MiB), gc objects", f"{base['rss_mib']}, {base['objects']}")
        )
    for n, c in enumerate(out.get("cycles", []), 1):
        cen = c.get("census_after_close") or {}
        rows.append(
            (
                f"cycle {n}: turns, errors, missing, peak/after close (MiB)",
                f"{c['turns']}, {c['errors']}, {c['stored_missing']}, {c['rss_peak_mib']}/{c['rss_after_close_mib']}",
            )
        )
        if cen:
            rows.append(
                (
                    f"cycle {n}: after gc + heap purge: RSS (MiB), gc objects",
                    f"{cen['rss_mib']}, {cen['objects']}",
                )
            )
    width = max(len(k) for k, _ in rows)
    lines = ["tether load campaign (loopback, simulated backend)", ""]
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    for ex in out.get("error_examples", []):
        lines.append(f"  error: {ex}")
    return "\n".join(lines)


def _run_main(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    out = eventloop.run(run_load(server, connections=args.connections, rolling=args.rolling, grpc_sessions=args.grpc,
                               duration_s=args.duration, turns=args.turns, stored_every=args.stored_every,
                               cycles=args.cycles, progress=lambda m: print(m, file=sys.stderr, flush=True)))  # fmt: skip
    out["server_exit_code"] = server.terminate(60)
    out["server_log_errors"] = sum(1 for line in server.log_text().splitlines() if '"level":"error"' in line)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tether_lab.load", description="A bounded load campaign on loopback."
    )
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--rolling", type=int, default=200, help="connections that run rollouts back to back")
    p.add_argument("--grpc", type=int, default=20, help="gRPC Session streams running rollouts")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of rollouts")
    p.add_argument("--turns", type=int, default=3, help="turns per rollout (a tool loop)")
    p.add_argument("--stored-every", type=int, default=4, help="every N-th rollout uses store=true")
    p.add_argument(
        "--cycles", type=int, default=1, help="open/roll/close cycles (memory compared cycle to cycle)"
    )
    p.add_argument("--rss-slack-mib", type=float, default=32.0, help="allowed RSS above baseline after close")
    p.add_argument(
        "--server-prelude", metavar="FILE", help="Python run in the server before it starts (experiments)"
    )
    p.add_argument("--json", help="write the results as JSON to this file")
    args = p.parse_args(argv)
    raise_fd_limit()
    with tempfile.TemporaryDirectory(prefix="tether-load-") as tmp:
        server = load_server(Path(tmp))
        if args.server_prelude:
            server.prelude += "\n" + Path(args.server_prelude).read_text()
        with server:
            out = _run_main(server, args)
    print(format_load(out))
    print(
        f"server exit code after SIGTERM: {out['server_exit_code']}, error lines in its log: {out['server_log_errors']}"
    )
    if args.json:
        Path(args.json).write_text(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    ok = (out["errors"] == 0 and out["stored_missing"] == 0 and out["server_exit_code"] == 0
          and out["rss_after_close_delta_mib"] <= args.rss_slack_mib)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
