"""The rolling-restart campaign: agents mid-rollout while every replica behind nginx restarts.

    python -m tether_lab.rollout_restart                       # Redis, then PostgreSQL; 2 replicas
    python -m tether_lab.rollout_restart --stores redis --replicas 3 --ws-agents 8 --http-agents 4

What an operator does every week, measured end to end. Two or three `tether serve` replicas share a
store (a Redis key prefix / a PostgreSQL schema private to the run) behind nginx running the shipped
deploy/nginx/tether.conf. Agents run tool loops of the `bugfix20` shape (the simulated model plays
the workload's script; the agents answer every tool call with the workload's output) through nginx:

- `ws`: the openai SDK in WebSocket mode, `client.responses.connect(on_reconnecting=...)`,
  store=true, each turn continuing the last with `previous_response_id`;
- `http`: the openai SDK over HTTP (`stream: true`, SSE), store=true, `previous_response_id`, the
  SDK's own retries (max_retries=2);
- `ws-ephemeral`: WebSocket mode with store=false: the agent keeps its history and, after a
  reconnect, gets `previous_response_not_found` on its next continuation and sends the whole
  context instead (the documented WebSocket-mode behaviour).

While they run, every replica in turn gets SIGTERM; the next one goes only once it is back and
ready. Counted per agent kind: turns completed, failed (the server said the turn failed and the
agent could not go on), lost (sent and never answered within `--turn-timeout-s`), duplicated
output (store=true responses the store's usage ledger has and no agent received; a second
`response.created` for one WebSocket turn), the longest an agent waited for one turn, and what the clients saw on the way (close codes, `server_shutting_down`, HTTP
statuses the SDK retried, resent turns, `previous_response_not_found`).

What the agents do on a restart is what a careful agent does with the SDK as it is:

- WebSocket: the SDK reconnects by itself after a close with a recoverable code (1001, 1012, ...)
  and calls `on_reconnecting`; a turn whose `response.created` had not arrived when the
  connection went is sent again on the new connection (its create may never have reached the old
  replica, which drains only what it started). An `error` `server_shutting_down` is the old
  replica's goodbye, not the turn's failure; so is a `response.failed` whose `tether_code` is
  `server_shutting_down` (a turn cut when the grace ran out): that turn is sent again too.
- HTTP: the SDK retries a 502/503 itself; a stream cut when the grace ran out is sent again.

Exit status 0 when store=true agents lost and failed nothing and the store=false agents saw
exactly the documented behaviour; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether import eventloop, workloads
from tether.store.factory import open_store
from tether_lab.processes import ServerProcess, free_ports
from tether_lab.scaleout import (
    Nginx,
    nginx_binary,
    pg_reachable,
    redis_reachable,
    scratch_store,
    write_config,
)

KINDS = ("ws", "http", "ws-ephemeral")
STORED = {"ws": True, "http": True, "ws-ephemeral": False}
WORKLOAD = "bugfix20"
SHUTTING_DOWN = "server_shutting_down"
NOT_FOUND = "previous_response_not_found"
# What a store=false agent may see on a continuation (anything else misses the contract):
AFTER_RECONNECT = f"{NOT_FOUND} after a reconnect"  # expected: its response died with the connection
FULL_CONTEXT_OK = "full-context create after it: completed"
NOT_FOUND_SAME_CONNECTION = f"{NOT_FOUND} on the same connection"  # a bug
FOUND_AFTER_RECONNECT = "store=false continuation found after a reconnect"  # a bug
DUPLICATE = "a second response.created for one turn"  # a create that ran twice


class TurnFailed(Exception):
    """The server said a turn failed and the agent cannot go on."""


class TurnLost(Exception):
    """A turn was sent and never answered within the turn timeout."""


@dataclass
class Tally:
    """What one agent kind did and saw."""

    turns: int = 0
    failed: int = 0
    lost: int = 0
    rollouts: int = 0
    max_wait_s: float = 0.0
    spans: list[tuple[float, float]] = field(default_factory=list)  # each turn's (start, end), monotonic
    seen: Counter[str] = field(default_factory=Counter)
    received: set[str] = field(default_factory=set)  # response ids whose terminal event arrived
    errors: list[str] = field(default_factory=list)

    def waited(self, start: float, end: float) -> None:
        self.spans.append((start, end))
        self.max_wait_s = max(self.max_wait_s, end - start)

    def p50_wait_s(self) -> float:
        waits = sorted(end - start for start, end in self.spans)
        return waits[len(waits) // 2] if waits else float("nan")

    def across(self, moments: list[float]) -> list[float]:
        """The waits of the turns in flight at one of `moments` (a SIGTERM): sent before it,
        answered after it."""
        return [end - start for start, end in self.spans if any(start < t < end for t in moments)]


@dataclass
class Settings:
    lb_url: str
    model: str
    turn_timeout_s: float
    tool_s: float


class Agent:
    """One agent: rollouts of the workload, one after another, until `stop` is set (checked between
    turns). A transport supplies `turn(body) -> (response id, output items, calls)`."""

    kind = ""

    def __init__(self, settings: Settings, tally: Tally, workload: workloads.Workload) -> None:
        self.s = settings
        self.tally = tally
        self.workload = workload
        self.connection = 0  # which connection of the agent's: WebSocket reconnects count it up

    async def run(self, stop: asyncio.Event) -> None:
        try:
            async with self.session():
                while not stop.is_set():
                    await self.rollout(stop)
        except (TurnFailed, TurnLost) as exc:  # the agent stops: counted once, here
            if isinstance(exc, TurnFailed):
                self.tally.failed += 1
            else:
                self.tally.lost += 1
            self.tally.errors.append(f"{type(exc).__name__}: {exc}"[:500])

    def session(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return contextlib.nullcontext()

    def body(self, items: list[dict], previous: str | None) -> dict:
        wl = self.workload
        body: dict[str, Any] = {"model": self.s.model, "instructions": wl.instructions, "tools": list(wl.tools),
                                "input": items, "store": STORED[self.kind]}  # fmt: skip
        if previous:
            body["previous_response_id"] = previous
        return body

    async def rollout(self, stop: asyncio.Event) -> None:
        wl = self.workload
        history: list[dict] = []  # the whole context, for a store=false agent's full resend
        new_input = [wl.user_message()]
        previous: str | None = None
        previous_on = self.connection  # the connection `previous` was answered on
        for index in range(wl.turns):
            started = time.monotonic()
            response_id, output, calls = await self.turn_with_fallback(history, new_input, previous, previous_on)
            previous_on = self.connection
            self.tally.waited(started, time.monotonic())
            self.tally.turns += 1
            if not calls:
                self.tally.rollouts += 1
                return
            expected = [c.name for c in wl.steps[index].calls]
            if [c["name"] for c in calls] != expected:
                raise TurnFailed(f"turn {index}: the model called {[c['name'] for c in calls]}, expected {expected}")
            history += new_input + output
            new_input = [{"type": "function_call_output", "call_id": c["call_id"], "output": wl.tool_output(index, j)}
                         for j, c in enumerate(calls)]  # fmt: skip
            previous = response_id
            await asyncio.sleep(self.s.tool_s)  # the agent runs its tools
            if stop.is_set():
                return

    async def turn_with_fallback(self, history: list[dict], new_input: list[dict], previous: str | None,
                                 previous_on: int):  # fmt: skip
        """A turn; for a store=false agent, the documented fallback: a continuation whose
        response died with its connection gets previous_response_not_found, and the whole
        context is sent instead. Whether it did is checked against the agent's reconnects."""
        if STORED[self.kind] or previous is None:
            return await self.turn(self.body(new_input, previous))
        try:
            out = await self.turn(self.body(new_input, previous))
        except ContinuationNotFound:
            moved = self.connection != previous_on
            self.tally.seen[AFTER_RECONNECT if moved else NOT_FOUND_SAME_CONNECTION] += 1
            out = await self.turn(self.body(history + new_input, None))  # the whole context instead
            self.tally.seen[FULL_CONTEXT_OK] += 1
            return out
        if self.connection != previous_on:
            self.tally.seen[FOUND_AFTER_RECONNECT] += 1
        return out

    async def turn(self, body: dict) -> tuple[str, list[dict], list[dict]]:
        raise NotImplementedError


class ContinuationNotFound(Exception):
    """`previous_response_not_found`: the agent sends the whole context instead."""


def cut_by_shutdown(response: Any) -> bool:
    """A response that failed because its replica stopped past the drain's grace: the Response's
    `error.code` is OpenAI's `server_error`, Tether's own code is in `error.tether_code`. The
    agent does such a turn again."""
    error = getattr(response, "error", None)
    return error is not None and (getattr(error, "tether_code", None) or error.code) == SHUTTING_DOWN


def _outputs(response: Any) -> tuple[list[dict], list[dict]]:
    items = [i.model_dump(mode="json", exclude_none=True) for i in response.output]
    calls = [i for i in items if i.get("type") == "function_call"]
    return items, calls


class WsAgent(Agent):
    """The openai SDK in WebSocket mode with automatic reconnection."""

    kind = "ws"

    def __init__(self, *args: Any, ephemeral: bool = False) -> None:
        super().__init__(*args)
        if ephemeral:
            self.kind = "ws-ephemeral"
        self.conn: Any = None
        self.pending: dict | None = None  # the create of the turn in flight
        self.created = False  # its response.created arrived
        self.resent_for_this_drop = False
        self.resends: set[asyncio.Task[None]] = set()  # held until sent (the loop keeps weak references)

    @contextlib.asynccontextmanager
    async def session(self):  # type: ignore[override]
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=self.s.lb_url, api_key="unused-when-open", max_retries=0)
        async with client.responses.connect(on_reconnecting=self._on_reconnecting) as conn:
            self.conn = conn
            yield conn
        await client.close()

    def _on_reconnecting(self, event: Any) -> None:
        """Called by the SDK before each reconnect attempt: a turn whose create the old replica
        did not start is queued again (the SDK flushes its send queue on the new connection)."""
        self.tally.seen[f"reconnect after close {event.close_code}"] += 1
        self.connection += 1
        if self.pending is not None and not self.created and not self.resent_for_this_drop:
            self.resent_for_this_drop = True
            self.tally.seen["turn sent again after reconnect"] += 1
            task = asyncio.get_running_loop().create_task(self.conn.response.create(**self.pending))
            self.resends.add(task)
            task.add_done_callback(self.resends.discard)
        return None

    async def turn(self, body: dict) -> tuple[str, list[dict], list[dict]]:
        from websockets.exceptions import ConnectionClosed

        self.pending, self.created, self.resent_for_this_drop = body, False, False
        try:
            await self.conn.response.create(**body)
        except ConnectionClosed:
            # The close came while the agent ran its tools: reading reconnects, and the
            # reconnect handler sends the create again.
            self.tally.seen["send on a closed connection"] += 1
        try:
            return await asyncio.wait_for(self._read(), self.s.turn_timeout_s)
        except TimeoutError:
            raise TurnLost(f"no answer to {body.get('previous_response_id') or 'a first turn'}") from None
        finally:
            self.pending = None

    async def _read(self) -> tuple[str, list[dict], list[dict]]:
        async for ev in self.conn:
            kind = ev.type
            if kind == "response.created":
                if self.created:  # a second response for one turn: a create ran twice
                    self.tally.seen[DUPLICATE] += 1
                self.created = True
                self.resent_for_this_drop = False
            elif kind == "error":
                code = ev.error.code
                if code == NOT_FOUND and self.kind == "ws-ephemeral":
                    raise ContinuationNotFound  # counted by the fallback
                self.tally.seen[f"error {code}"] += 1
                if code == SHUTTING_DOWN:
                    continue  # the replica's goodbye; the SDK reconnects on its close
                raise TurnFailed(f"error event {code}: {ev}")
            elif kind in ("response.completed", "response.failed", "response.incomplete"):
                r = ev.response
                self.tally.received.add(r.id)
                if kind == "response.completed":
                    return (r.id, *_outputs(r))
                if cut_by_shutdown(r):
                    # The connection closes next; the reconnect handler sends the turn again.
                    self.tally.seen[f"{kind} {SHUTTING_DOWN} (a turn cut past the grace)"] += 1
                    self.created = self.resent_for_this_drop = False
                    continue
                raise TurnFailed(f"{kind}: {r.error}")
        raise TurnLost("the connection ended and the SDK did not reconnect")


class HttpAgent(Agent):
    """The openai SDK over HTTP, streaming (SSE), with its default retries."""

    kind = "http"

    @contextlib.asynccontextmanager
    async def session(self):  # type: ignore[override]
        import httpx
        from openai import AsyncOpenAI

        async def count(response: httpx.Response) -> None:
            if response.status_code >= 400:
                self.tally.seen[f"HTTP {response.status_code} (the SDK retries)"] += 1

        http = httpx.AsyncClient(event_hooks={"response": [count]}, timeout=self.s.turn_timeout_s)
        self.client = AsyncOpenAI(base_url=self.s.lb_url, api_key="unused-when-open", max_retries=2,
                                  http_client=http)  # fmt: skip
        try:
            yield self.client
        finally:
            await self.client.close()

    async def turn(self, body: dict) -> tuple[str, list[dict], list[dict]]:
        import openai

        try:
            for _ in range(3):
                stream = await self.client.responses.create(**body, stream=True)
                terminal = None
                async for ev in stream:  # read to the end: the connection goes back to the pool
                    if ev.type in ("response.completed", "response.failed", "response.incomplete"):
                        terminal = ev
                if terminal is None:
                    break
                r = terminal.response
                self.tally.received.add(r.id)
                if terminal.type == "response.completed":
                    return (r.id, *_outputs(r))
                if not cut_by_shutdown(r):
                    raise TurnFailed(f"{terminal.type}: {r.error}")
                self.tally.seen[f"{terminal.type} {SHUTTING_DOWN} (a turn cut past the grace), sent again"] += 1
        except openai.APIStatusError as exc:
            self.tally.seen[f"HTTP {exc.status_code} after the SDK's retries"] += 1
            raise TurnFailed(f"HTTP {exc.status_code}: {exc}") from None
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            raise TurnLost(f"{type(exc).__name__}: {exc}") from None
        raise TurnLost("the stream ended without a terminal event")


# -- the cluster -------------------------------------------------------------------------------------


@dataclass
class Restart:
    replica: str
    at: float  # when it got SIGTERM (monotonic)
    exit_code: int | None
    drain_s: float  # SIGTERM -> the process exited
    back_s: float  # SIGTERM -> the new process ready


class Cluster:
    """N replicas sharing `store_url` behind nginx (deploy/nginx/tether.conf)."""

    def __init__(self, workdir: Path, store_url: str, replicas: int, *, grace_s: float) -> None:
        cfg = write_config(workdir / "tether.toml", store_url, durability="before_terminal",
                           server={"shutdown_grace_s": grace_s})  # fmt: skip
        ports = free_ports(2 * replicas + 2)
        self.replicas = [
            ServerProcess(cfg, workdir, ports[2 * i], ports[2 * i + 1], name=f"replica-{i + 1}")
            for i in range(replicas)
        ]
        self.lb = Nginx(workdir / "nginx", ports[-2], ports[-1], self.replicas)

    def start(self) -> None:
        for r in self.replicas:
            r.start()
        for r in self.replicas:
            r.wait_ready()
        self.lb.start()

    def stop(self) -> None:
        self.lb.stop()
        for r in self.replicas:
            r.stop(timeout=15)

    def restart(self, replica: ServerProcess, timeout: float = 60.0) -> Restart:
        """SIGTERM, wait for the exit, start again on the same ports, wait until ready."""
        t0 = time.monotonic()
        code = replica.terminate(timeout)
        drained = time.monotonic() - t0
        replica.start()
        replica.wait_ready(timeout)
        return Restart(replica.name, t0, code, drained, time.monotonic() - t0)


async def rolling_restart(cluster: Cluster, *, rounds: int, pause_s: float) -> list[Restart]:
    """Every replica in turn, `rounds` times; the next goes only when the last is back."""
    done: list[Restart] = []
    for replica in cluster.replicas * rounds:
        if done:
            await asyncio.sleep(pause_s)
        done.append(await asyncio.to_thread(cluster.restart, replica))
    return done


async def ledger_ids(store_url: str) -> set[str]:
    """The response ids the store's usage ledger holds (one line per finished store=true
    response)."""
    store = await open_store(store_url)
    try:
        return {r.response_id for r in await store.usage_records()}
    finally:
        await store.close()


@dataclass
class Result:
    store: str
    replicas: int
    tallies: dict[str, Tally]
    restarts: list[Restart]
    unreceived: int  # store=true responses the usage ledger has and no agent received
    elapsed_s: float

    def problems(self) -> list[str]:
        """What misses the campaign's target (empty: the target is met)."""
        out = []
        for kind, t in self.tallies.items():
            if t.failed or t.lost:
                out.append(f"{kind}: {t.failed} failed, {t.lost} lost ({'; '.join(t.errors)[:800]})")
            elif t.errors:
                out.append(f"{kind}: {'; '.join(t.errors)[:800]}")
            if not t.turns:
                out.append(f"{kind}: no turn completed")
        eph = self.tallies.get("ws-ephemeral")
        if eph is not None:
            for wrong in (NOT_FOUND_SAME_CONNECTION, FOUND_AFTER_RECONNECT):
                if eph.seen[wrong]:
                    out.append(f"ws-ephemeral: {eph.seen[wrong]} x {wrong}")
            nf, ok = eph.seen[AFTER_RECONNECT] + eph.seen[NOT_FOUND_SAME_CONNECTION], eph.seen[FULL_CONTEXT_OK]
            if nf != ok:
                out.append(f"ws-ephemeral: {nf} previous_response_not_found but {ok} full-context creates completed")
        if self.unreceived:
            out.append(f"{self.unreceived} store=true responses finished that no agent received")
        for kind, t in self.tallies.items():
            if t.seen[DUPLICATE]:
                out.append(f"{kind}: {t.seen[DUPLICATE]} x {DUPLICATE}")
        for r in self.restarts:
            if r.exit_code != 0:
                out.append(f"{r.replica} exited {r.exit_code} on SIGTERM")
        return out


async def campaign(store: str, store_url: str, workdir: Path, args: argparse.Namespace) -> Result:
    cluster = Cluster(workdir, store_url, args.replicas, grace_s=args.grace_s)
    await asyncio.to_thread(cluster.start)
    try:
        wl = workloads.load(WORKLOAD)
        settings = Settings(cluster.lb.base_url, f"tether-lab/{WORKLOAD}@{args.speed}", args.turn_timeout_s,
                            args.tool_ms / 1000)  # fmt: skip
        tallies = {kind: Tally() for kind in KINDS}
        agents: list[Agent] = []
        agents += [WsAgent(settings, tallies["ws"], wl) for _ in range(args.ws_agents)]
        agents += [HttpAgent(settings, tallies["http"], wl) for _ in range(args.http_agents)]
        agents += [WsAgent(settings, tallies["ws-ephemeral"], wl, ephemeral=True) for _ in range(args.ephemeral_agents)]
        stop = asyncio.Event()
        t0 = time.monotonic()
        tasks = []
        for agent in agents:
            tasks.append(asyncio.create_task(agent.run(stop)))
            await asyncio.sleep(0.05)  # spread the agents' turns
        await asyncio.sleep(args.warmup_s)
        restarts = await rolling_restart(cluster, rounds=args.rounds, pause_s=args.pause_s)
        await asyncio.sleep(args.tail_s)
        stop.set()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - t0
    finally:
        await asyncio.to_thread(cluster.stop)
    ledger = await ledger_ids(store_url)
    received = set().union(*(t.received for t in tallies.values()))
    return Result(store, args.replicas, tallies, restarts, len(ledger - received), elapsed)


def print_result(result: Result, out=sys.stdout) -> None:
    print(f"\n## {result.store}: {result.replicas} replicas, each restarted with SIGTERM "
          f"({len(result.restarts)} restarts, {result.elapsed_s:.1f} s)", file=out)  # fmt: skip
    for r in result.restarts:
        print(f"  {r.replica}: exit {r.exit_code}, drained in {r.drain_s:.2f} s, ready again after {r.back_s:.2f} s",
              file=out)  # fmt: skip
    sigterms = [r.at for r in result.restarts]
    print(f"{'agents':<14} {'store':<6} {'turns':>6} {'across a SIGTERM':>17} {'failed':>7} {'lost':>5} "
          f"{'max wait s':>11} {'of those across':>16} {'p50 wait s':>11}", file=out)  # fmt: skip
    for kind, t in result.tallies.items():
        store = "true" if STORED[kind] else "false"
        across = t.across(sigterms)
        print(f"{kind:<14} {store:<6} {t.turns:>6} {len(across):>17} {t.failed:>7} {t.lost:>5} "
              f"{t.max_wait_s:>11.2f} {max(across, default=0.0):>16.2f} {t.p50_wait_s():>11.3f}", file=out)  # fmt: skip
    print("duplicated output (store=true responses the usage ledger has and no agent received; a second "
          f"response.created for one turn): {result.unreceived}; "
          f"{sum(t.seen[DUPLICATE] for t in result.tallies.values())}", file=out)  # fmt: skip
    print("what the clients saw:", file=out)
    for kind, t in result.tallies.items():
        seen = ", ".join(f"{what}: {n}" for what, n in sorted(t.seen.items()) if n) or "nothing unusual"
        print(f"  {kind}: {seen}", file=out)
    problems = result.problems()
    print("target met" if not problems else "TARGET MISSED:\n  " + "\n  ".join(problems), file=out, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tether_lab.rollout_restart", description=__doc__.split("\n\n")[0])
    p.add_argument("--stores", default="redis,postgres", help="comma-separated: redis, postgres")
    p.add_argument("--replicas", type=int, default=2, help="replicas behind nginx (2 or more)")
    p.add_argument("--ws-agents", type=int, default=6, help="store=true agents in WebSocket mode")
    p.add_argument("--http-agents", type=int, default=3, help="store=true agents over HTTP (SSE)")
    p.add_argument("--ephemeral-agents", type=int, default=3, help="store=false agents in WebSocket mode")
    p.add_argument("--rounds", type=int, default=1, help="how many times every replica is restarted")
    p.add_argument("--speed", default="2000@20:60", help="the simulated model: tokens/s@ttft_min:ttft_max (ms)")
    p.add_argument("--tool-ms", type=float, default=30.0, help="how long an agent runs its tools between turns")
    p.add_argument("--grace-s", type=float, default=10.0, help="the replicas' server.shutdown_grace_s")
    p.add_argument("--warmup-s", type=float, default=2.0, help="agents run this long before the first restart")
    p.add_argument("--pause-s", type=float, default=2.5,
                   help="between one replica being back and the next SIGTERM (more than nginx's fail_timeout, 2 s)")
    p.add_argument("--tail-s", type=float, default=2.0, help="agents run this long after the last restart")
    p.add_argument("--workdir", help="keep the replicas' and nginx's logs here (default: a temporary folder)")
    p.add_argument("--turn-timeout-s", type=float, default=30.0, help="a turn unanswered this long is lost")
    args = p.parse_args(argv)
    if args.replicas < 2:
        p.error("--replicas: at least 2 (one must stay up while another restarts)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if nginx_binary() is None:
        print("nginx is not installed (apt-get install -y nginx)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop what was started
    print(f"rolling-restart campaign: {os.cpu_count()} CPU cores, workload {WORKLOAD} at {args.speed}, "
          f"{args.ws_agents} ws + {args.http_agents} http (store=true), {args.ephemeral_agents} ws (store=false) agents")  # fmt: skip
    failed = False
    with contextlib.ExitStack() as stack:
        tmp = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="tether-rollout-restart-"))
        for store in [s.strip() for s in args.stores.split(",") if s.strip()]:
            why = pg_reachable() if store == "postgres" else redis_reachable() if store == "redis" else "unknown store"
            if why:
                print(f"\n## {store}: skipped: {why}")
                continue
            workdir = Path(tmp) / store
            workdir.mkdir(parents=True)
            with scratch_store(store, workdir) as url:
                result = eventloop.run(campaign(store, url, workdir, args))
            print_result(result)
            failed = failed or bool(result.problems())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
