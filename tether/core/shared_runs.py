"""Runs shared between replicas, through the store's engine (`tether.store.runbus.RunBus`).

With a Redis or PostgreSQL store every stored response's run is mirrored to the store: its
numbered events, its state and its Response as it stands (`RunMirror`, one write per batch of
events leaving the outbox: the batch is published after the step that numbered it, and while
one write is in flight the next batch collects everything stamped meanwhile). Any replica can
then answer for a run another one runs (`SharedRuns`): retrieve (`snapshot`), resume
(`follow`: the events above N from the shared log, then the live ones as they are published),
and cancel (`cancel`: a signal the owner acts on, then the run as it ends).

The local registry (`tether.core.run.Runs`) stays the fast path: a replica asks the bus only for
runs it does not hold. Orphans: every replica heartbeats through the bus; a run in progress
whose owner stopped heartbeating for `run_orphan_after_s` is ended `failed` with code
`run_orphaned` by whichever replica looks at it (a retrieve, a cancel, or a follower waiting for
events), with a terminal event that every follower receives. A queued background run whose
owner stopped is taken over (`RunBus.claim`) by a replica with a free background slot, and runs
there (`Engine`).

Final is final (fencing): ownership carries the run's epoch (`tether.store.runbus`). The replica
that ends an orphan raises it, and so does a takeover. An owner that was only paused (SIGSTOP, a long GC, a VM migration) and wakes up
finds its next write refused (or, for a run that writes nothing meanwhile, its check after the
stall, `recheck`, finds the run ended or moved): it counts it
(`tether_runs_total{event="fenced"}`), stops the turn at once (it is cut, failed
`run_orphaned`, generating nothing more), forgets the run (this replica answers for it from the
store from then on), and its own store write is refused by the store (`FencedWrite`: the run's
epoch is higher than the write's), so every replica keeps answering what the shared log says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from tether import errors
from tether.core.delta import Delta, Outgoing
from tether.core.run import RESPONSE_ARMS, ReplayGap, ResponseRun
from tether.errors import TetherError
from tether.protocol.wire import TERMINAL_ARMS
from tether.responses.v1 import events_pb2, response_pb2
from tether.store.runbus import FINAL_STATES, RunBus, RunInfo

log = logging.getLogger("tether.runs")


class RunMirror:
    """Publishes one run's events to the bus as they are numbered (`ResponseRun.stamp` calls
    `push`), batched: one write per outbox batch, never two in flight for one run (order)."""

    __slots__ = ("shared", "run", "params", "fenced", "_pending", "_dirty", "_task")

    def __init__(self, shared: SharedRuns, run: ResponseRun) -> None:
        self.shared = shared
        self.run = run
        self._pending: list[Outgoing] = []
        self._dirty = True  # the Response changed since the last write (the first write carries it)
        self._task: asyncio.Task | None = None
        self.params: bytes | None = None  # a queued background run's create params, sent once (takeover)
        self.fenced = False  # a write was refused: another replica ended or took the run

    def push(self, entry: Outgoing, arm: str | None) -> None:
        if self.fenced:
            return
        self._pending.append(entry)
        if arm is not None and arm in RESPONSE_ARMS:
            self._dirty = True
        if self._task is None:
            self._task = self.shared.spawn(self._flush())

    async def publish_now(self) -> None:
        """Publish the run's state (without new events: a queued background run) and wait until
        it has landed, so any replica knows the run once its creator answers."""
        self._dirty = True
        if self._task is None:
            self._task = self.shared.spawn(self._flush())
        await asyncio.shield(self._task)

    def fence(self) -> None:
        """The shared log refused a write of this run, or says after a stall that it is no longer
        this replica's: another replica ended it (an orphan) or took it over. Stop generating now
        and leave the run to the shared side (once: a write in flight and the check after a stall
        may both find it)."""
        if self.fenced:
            return
        self.fenced = True
        self._pending = []
        run = self.run
        log.warning("response %s: another replica ended or took over this run; stopping it here", run.id)
        self.shared.fenced(run)

    async def _flush(self) -> None:
        run, bus = self.run, self.shared.bus
        try:
            while True:
                entries, self._pending = self._pending, []
                if entries and run.tail is entries[-1]:
                    run.freeze()  # written now: later text is an entry of its own
                events = [
                    (e.sequence_number, (e.to_event() if type(e) is Delta else e).SerializeToString()) for e in entries
                ]
                response = run.snapshot().SerializeToString() if self._dirty else None
                params, self.params = self.params, None
                self._dirty = False
                try:
                    accepted = await bus.publish(
                        run.tenant, run.id, events, state=run.state.value, response=response,
                        next_seq=run.next_seq if not entries else entries[-1].sequence_number + 1,
                        epoch=run.epoch, params=params,
                    )  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - the local run goes on; other replicas lag
                    log.warning("publishing run %s to the store failed: %s", run.id, exc)
                else:
                    if not accepted and (entries or not run.state.final):
                        self.fence()
                        return
                if not self._pending and not self._dirty:
                    return
        finally:
            self._task = None


class SharedRuns:
    """The engine's view of runs held by other replicas (see the module docstring)."""

    def __init__(self, bus: RunBus, *, orphan_after_s: float, on_event: Callable[[str], None] = lambda kind: None,
                 on_fenced: Callable[[ResponseRun], None] = lambda run: None) -> None:  # fmt: skip
        """`on_fenced`: called once with a run of this replica whose shared write was refused or
        that the shared side gave to another (`RunMirror.fence`: the engine stops it and forgets
        it)."""
        self.bus = bus
        self.orphan_after_s = orphan_after_s
        self.poll_s = max(0.05, min(1.0, orphan_after_s / 3))  # a follower's longest wait between checks
        self._tasks: set[asyncio.Task] = set()
        self._on_event = on_event
        self._on_fenced = on_fenced

    def attach(self, run: ResponseRun) -> None:
        """Mirror a run this replica creates: its owner, with the first epoch (a takeover sets
        the one its claim got)."""
        run.epoch = 1
        run.mirror = RunMirror(self, run)

    async def recheck(self, runs: list[ResponseRun]) -> None:
        """This process was stalled long enough for other replicas to end its runs or take
        them over: fence off each run of `runs` the shared side says is no longer this
        replica's to write (another owner, or final there and not here)."""
        for run in runs:
            mirror = run.mirror
            if mirror is None or mirror.fenced or run.state.final:
                continue
            try:
                info = await self.bus.info(run.tenant, run.id)
            except Exception as exc:  # noqa: BLE001 - the next write will tell
                log.warning("checking run %s after a stall failed: %s", run.id, exc)
                continue
            if info is not None and (info.owner != self.bus.replica or info.state in FINAL_STATES):
                mirror.fence()

    def fenced(self, run: ResponseRun) -> None:
        self._on_event("fenced")
        self._on_fenced(run)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, timeout: float = 5.0) -> None:
        """Let the writes in flight land (shutdown)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    # -- reading another replica's run -----------------------------------------------------

    async def info(self, tenant: str, run_id: str) -> RunInfo | None:
        """The run as the store has it; a run in progress whose owner died is ended `run_orphaned`
        first (a queued one waits to be taken over by a replica with capacity, `Engine`)."""
        info = await self.bus.info(tenant, run_id)
        if info is not None and info.state not in FINAL_STATES and info.state != "queued" and not info.owner_alive:
            await self._fail_orphan(tenant, run_id, info)
            info = await self.bus.info(tenant, run_id)
        return info

    async def _fail_orphan(self, tenant: str, run_id: str, info: RunInfo) -> None:
        response = response_pb2.Response.FromString(info.response) if info.response else response_pb2.Response()
        response.id, response.status = run_id, "failed"
        response.error.code = errors.RUN_ORPHANED
        response.error.message = (
            f"The server replica running this response stopped (no heartbeat for {self.orphan_after_s:g} s); "
            "the response did not finish."
        )
        ev = events_pb2.ServerEvent(response_id=run_id, sequence_number=info.next_seq)
        ev.failed.response.CopyFrom(response)
        # The write raises the run's epoch: the old owner's writes, should it wake up, are refused
        # (its events and state by the bus, its response by the store).
        if await self.bus.fail_orphan(tenant, run_id, info.next_seq, ev.SerializeToString(), response.SerializeToString()):
            log.warning("response %s orphaned: replica %s stopped heartbeating", run_id, info.owner)
            self._on_event("orphaned")

    @staticmethod
    def snapshot(run_id: str, info: RunInfo) -> response_pb2.Response:
        response = response_pb2.Response.FromString(info.response) if info.response else response_pb2.Response()
        response.id = run_id
        if info.state not in FINAL_STATES:
            response.status = info.state
        return response

    async def follow(self, tenant: str, run_id: str, after: int) -> AsyncIterator[list[events_pb2.ServerEvent]] | None:
        """The run's events above `after`, then the live ones until its terminal event, in
        batches (what each read of the shared log returned); None when
        the store has no such run. ReplayGap (before anything is yielded) when the log no longer
        holds event `after + 1`."""
        info = await self.info(tenant, run_id)
        if info is None:
            return None
        first = await self.bus.read(tenant, run_id, after, 0)
        if first and first[0][0] > after + 1:
            raise ReplayGap(f"events {after + 1}..{first[0][0] - 1} are no longer retained")
        return self._follow(tenant, run_id, after, first)

    async def _follow(self, tenant: str, run_id: str, after: int,
                      entries: list[tuple[int, bytes]]) -> AsyncIterator[list[events_pb2.ServerEvent]]:  # fmt: skip
        bus = self.bus
        while True:
            if entries:
                if entries[0][0] > after + 1:
                    raise ReplayGap(f"events {after + 1}..{entries[0][0] - 1} are no longer retained")
                batch = []  # one read's events: this follower's batch
                for seq, data in entries:
                    event = events_pb2.ServerEvent.FromString(data)
                    after = seq
                    batch.append(event)
                    if event.WhichOneof("event") in TERMINAL_ARMS:
                        yield batch
                        return
                yield batch
            else:
                info = await self.info(tenant, run_id)  # between waits: has its owner died?
                if info is None:
                    raise ReplayGap("the response's events expired")
                if info.state in FINAL_STATES and after >= info.next_seq - 1:
                    return
            entries = await bus.read(tenant, run_id, after, self.poll_s)

    async def cancel(self, tenant: str, run_id: str, wait_s: float) -> RunInfo | None:
        """Ask the owner to cancel the run and wait (at most `wait_s`) for it to end; the run as
        it stands then (None: the store has no such run)."""
        info = await self.info(tenant, run_id)
        if info is None or info.state in FINAL_STATES:
            return info
        await self.bus.cancel(tenant, run_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        delay = 0.01
        while loop.time() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.poll_s)
            info = await self.info(tenant, run_id)
            if info is None or info.state in FINAL_STATES:
                break
        return info


def not_retained(run_id: str) -> TetherError:
    return TetherError(
        errors.REPLAY_UNAVAILABLE,
        f"The events of response '{run_id}' are not retained on this server (a stored "
        "response's events are kept while it runs and for a while after it ends).",
        param="response_id",
    )
