"""The transport-neutral response writer: one bounded, coalescing queue of server events per
session, drained in batches by whichever transport adapter serves the session.

Why here and not in each transport: a gRPC message costs ~65-110 µs in Python whatever its size,
a WebSocket frame ~10 µs, so token deltas must be merged before they are written, and the merge
rules (and their effect on sequence numbers) must be the same on every transport.

Rules (Nagle-like):
- a delta that arrives while the previous batch went out more than the window ago is sent at
  once (an idle stream adds no latency);
- so is one whose stream is slow: when deltas have been arriving (`delta_gap`, a moving average
  of the time between them) more than half a window apart, fewer than two more are expected within
  it, and waiting would only add latency (a paced upstream's tokens 20 ms apart under a 25 ms
  window waited ~12 ms each, to merge one in five);
- otherwise the writer waits out the rest of the window while later deltas for the same content
  are merged into the queued one (bounded by `max_coalesced_bytes`);
- any non-delta event ends the wait; everything ready goes out as one batch.
Sequence numbers are given when a producer puts an event (`put` commits it to its response's
run, `tether.core.run`, which numbers, logs and mirrors it): the queue only carries what the
connection has not sent yet. A delta merges into its run's tail, the last entry while no reader
has taken it (the entry sits in this queue then), so numbers stay contiguous per response
however deltas were merged, and the live client and the run's followers see the same ones.
Taking a batch freezes the tails it carries. The window is the process's `CoalesceWindow`:
`coalesce_ms`, wider while many streams generate at once.

Deltas travel as `Delta` records (plain strings), not protobuf messages: streamed text is merged
by appending to a list, and a protobuf event is built once per batch, only for a transport that
sends protobuf (`get_batch()`); the JSON transports take the records as they are
(`get_batch(lazy_deltas=True)`) and encode the merged text directly. A delta costs no message
per token on any transport.

One pass per token (`InlineWriter`): while the reader is idle (waiting in `get_batch` with
nothing queued) and the window does not hold it, a delta is committed and written in the
producer's own step: `put_now` commits it to its run (numbered, logged, mirrored) and hands it
to the transport's `write_now`, which encodes it and writes it to the socket without awaiting.
The producer's step is the upstream socket's callback where the backend pushes its reads to the
turn (`tether.core.intake`): the token then crosses the event loop once, instead of three times
(the socket's wake-up, the turn's task, the writer's). Anything else takes the queue: a non-delta (the pump reads every
lifecycle event), a delta behind queued events (order), a transport that cannot take the bytes
at once (paused writes, a write in progress, a message that needs its generic path), a delta
within `coalesce_ms` of the last write. Only the fixed floor `coalesce_ms` holds an inline
delta, not the window's widening under load: the widening bounds the process's rate of batches
through writer tasks (one task hop each), and an inline write has none.

Backpressure: the queue holds at most `max_events` entries; producers (the turns of the session)
wait in `put` when it is full, so a slow reader slows its own generation, never the server's
memory. Merged deltas take no extra entry, which keeps generation going while the reader catches up.
A session whose client went away (`discard`) never blocks its producers: events are committed
to their runs as always, and nothing is queued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, Protocol, overload

from tether.config import Limits
from tether.core.clock import SYSTEM_CLOCK, Clock
from tether.core.delta import Delta, Outgoing
from tether.core.run import ResponseRun
from tether.protocol.wire import DELTA_ARMS, TERMINAL_ARMS
from tether.responses.v1 import events_pb2


class OutboxClosed(Exception):
    pass


class InlineWriter(Protocol):
    """A transport that can take an event in the producer's step (module docstring)."""

    def write_now(self, delta: Delta) -> bool:
        """Encode and write `delta` (numbered) at once, without awaiting; False (and nothing
        written) when the transport cannot take it now: the outbox then queues it for the writer."""
        ...


class CoalesceWindow:
    """How long the process's outboxes hold deltas to merge them: `min_s` (`coalesce_ms`), wider
    while many streams generate at once (`streaming`), up to `max_s` (`coalesce_max_ms`).

    Why: a batch costs the same whatever it holds (a gRPC message ~60 µs of server CPU and as much
    again for a Python client; in the 100-stream run grpc's poller thread and the loop's native
    callbacks were ~40-47% of the server's samples), so what loads a busy process is its rate of
    batches, not of tokens. The window is
    `streaming / batches_per_s`: at most `batches_per_s` delta batches per second over all the
    process's streams, never narrower than `min_s` (up to 32 streams at the defaults keep the 8 ms
    window) nor wider than `max_s`. Only the pace of merged text changes: non-delta events (a new
    item with its first text, tool calls, the terminal event) are never held. `batches_per_s` 0
    is a fixed window; `min_s` 0 turns coalescing off."""

    __slots__ = ("min_s", "max_s", "batches_per_s", "streaming")

    def __init__(self, min_s: float, max_s: float | None = None, batches_per_s: float = 0.0) -> None:
        self.min_s = min_s
        self.max_s = min_s if max_s is None else max(min_s, max_s)
        self.batches_per_s = batches_per_s
        self.streaming = 0  # turns of this process reading a backend stream now

    @classmethod
    def fixed(cls, seconds: float) -> CoalesceWindow:
        return cls(seconds)

    @classmethod
    def from_limits(cls, limits: Limits) -> CoalesceWindow:
        return cls(limits.coalesce_ms / 1000.0, limits.coalesce_max_ms / 1000.0, limits.coalesce_batches_per_s)

    def current(self) -> float:
        if self.min_s <= 0 or self.batches_per_s <= 0:
            return self.min_s
        return min(self.max_s, max(self.min_s, self.streaming / self.batches_per_s))

    @contextmanager
    def generating(self) -> Iterator[None]:
        """Count one stream while the block runs (a turn reading its backend)."""
        self.streaming += 1
        try:
            yield
        finally:
            self.streaming -= 1


class Outbox:
    def __init__(
        self, *, max_events: int, window: CoalesceWindow, max_coalesced_bytes: int, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._clock = clock
        self._queue: deque[Outgoing] = deque()
        self._max_events = max(1, max_events)
        self._window = window
        self._max_coalesced = max_coalesced_bytes
        self._ready = asyncio.Event()  # something to send
        self._urgent = asyncio.Event()  # a non-delta arrived: stop waiting out the window
        self._space = asyncio.Event()
        self._space.set()
        self._closed = False
        self._last_flush = 0.0
        self._last_delta: float | None = None  # when the last delta was put
        self.delta_gap: float | None = None  # moving average of the time between deltas (module docstring)
        self._runs: dict[str, ResponseRun] = {}  # response id -> its run (numbers and logs its events)
        self._final_queued: set[str] = set()  # responses whose terminal event is committed, not sent
        self._discarding = False  # nobody reads: commit only (`discard`)
        self._inline: InlineWriter | None = None  # the reader's transport, for one-pass writes
        self._idle = False  # the reader waits in get_batch with nothing queued (and nothing being written)
        self.events_inline = 0  # of events_out: written in the producer's step
        self.events_in = 0  # put() calls: what producers queued, before merging
        self.events_out = 0
        self.batches_out = 0

    @property
    def closed(self) -> bool:
        return self._closed

    async def put(self, event: Outgoing) -> None:
        """Commit an event to its response's run and queue it; waits while the queue is full.
        Raises OutboxClosed after close()."""
        while not self.put_now(event):
            self._space.clear()
            await self._space.wait()

    def put_now(self, event: Outgoing) -> bool:
        """`put` without waiting: False, and nothing committed, when the queue is full (a delta
        that merges into its run's tail, or is written inline, takes no entry and never waits)."""
        if type(event) is Delta:
            delta: Delta | None = event
            arm = None
        else:
            arm = event.WhichOneof("event")
            delta = Delta.from_event(event, arm) if arm in DELTA_ARMS else None
        rid = event.response_id
        run = self._runs.get(rid) if rid else None
        if run is None and rid:  # a response no run was bound for: numbered all the same
            run = self._runs[rid] = ResponseRun(rid)
        now = 0.0
        if delta is not None:
            now = self._clock.monotonic()
            if run is not None:
                tail = run.tail
                if tail is not None and tail.size < self._max_coalesced and tail.continues(delta):
                    self._delta_at(now)
                    run.extend(delta)
                    return True
                if not self._queue and self._idle and self._inline is not None and self._write_now(delta, run, now):
                    self._delta_at(now)
                    return True
        if len(self._queue) >= self._max_events and not self._closed and not self._discarding:
            return False
        if self._closed:
            raise OutboxClosed()
        if delta is not None:
            self._delta_at(now)
        else:
            self.events_in += 1
        entry = event if delta is None else delta
        if run is not None and run.stamp(entry, arm if delta is None else None):
            self._ended(rid)
        if self._discarding:
            return True
        self._queue.append(entry)
        if delta is None:
            self._urgent.set()
        self._ready.set()
        return True

    def _delta_at(self, now: float) -> None:
        """A delta was put at `now`: `events_in`, and the moving average of the gap between deltas."""
        self.events_in += 1
        last, self._last_delta = self._last_delta, now
        if last is not None:
            gap, average = now - last, self.delta_gap
            self.delta_gap = gap if average is None else average + (gap - average) * 0.25

    def _ended(self, response_id: str) -> None:
        """The run of `response_id` committed its terminal event: it is in flight here until that
        event leaves (`runs_in_flight`), or no longer at all when nothing is sent."""
        if self._discarding:
            del self._runs[response_id]
        else:
            self._final_queued.add(response_id)

    def _write_now(self, delta: Delta, run: ResponseRun, now: float) -> bool:
        """Commit `delta` and write it in this step (module docstring), when the transport takes
        it and the `coalesce_ms` floor since the last write has passed (`now`: the clock at its put)."""
        if self._closed or self._discarding or now - self._last_flush < self._window.min_s:
            return False
        delta.sequence_number = run.next_seq  # its number if written; committed only then
        writer = self._inline
        assert writer is not None
        try:
            if not writer.write_now(delta):
                return False
        except Exception:  # noqa: BLE001 - the transport's own path (the queue) meets the failure
            self._inline = None  # where its errors are handled: the producer never sees them
            return False
        run.stamp(delta, None)  # a delta never ends its run
        run.freeze()  # sent: it does not grow
        self._last_flush = now
        self.events_out += 1
        self.events_inline += 1
        self.batches_out += 1
        return True

    def write_inline(self, writer: InlineWriter | None) -> None:
        """Let the producers write deltas straight to `writer` while the reader is idle (module
        docstring); the reader must be the one loop that writes to it (`get_batch`'s caller)."""
        self._inline = writer

    def bind(self, run: ResponseRun) -> None:
        """Commit the events of `run.id` put here to `run` (it numbers and logs them)."""
        self._runs[run.id] = run
        run.sink = self

    def runs_in_flight(self) -> int:
        """Bound runs whose terminal event has not left yet: not produced, or still queued (a
        run leaves `_runs` when its terminal event leaves)."""
        return sum(1 for rid, run in self._runs.items() if not run.state.final or rid in self._final_queued)

    def put_nowait_final(self, event: events_pb2.ServerEvent) -> None:
        """Commit and queue a last event past the bound (a run's ending, connection-fatal errors)
        so close never blocks."""
        if not self._closed:
            rid = event.response_id
            run = self._runs.get(rid) if rid else None
            if run is None and rid:
                run = self._runs[rid] = ResponseRun(rid)
            if run is not None and run.stamp(event, event.WhichOneof("event")):
                self._ended(rid)
            if self._discarding:
                return
            self._queue.append(event)
            self._urgent.set()
            self._ready.set()

    def discard(self) -> None:
        """Nobody reads this outbox any more (its client went away): what is queued is dropped,
        and from now on `put` commits events to their runs and queues nothing (so it never waits)."""
        self._discarding = True
        self._queue.clear()
        self._final_queued.clear()
        self._ready.set()
        self._space.set()

    def close(self) -> None:
        """No more events; the reader drains what is queued, then `get_batch` returns []."""
        self._closed = True
        self._ready.set()
        self._urgent.set()
        self._space.set()

    @overload
    async def get_batch(self, *, lazy_deltas: Literal[False] = False) -> list[events_pb2.ServerEvent]: ...

    @overload
    async def get_batch(self, *, lazy_deltas: bool) -> list[Outgoing]: ...

    async def get_batch(self, *, lazy_deltas: bool = False) -> list[Outgoing] | list[events_pb2.ServerEvent]:
        """Everything ready, as one batch (waits for at least one event; [] once closed+drained).

        Deltas come as protobuf events, or with `lazy_deltas` as the `Delta` records themselves
        (for a transport that encodes JSON from the merged text)."""
        while not self._queue:
            if self._closed:
                return []
            self._ready.clear()
            self._idle = True
            try:
                await self._ready.wait()
            finally:
                self._idle = False
        window = self._window.current()
        if window > 0 and type(self._queue[0]) is Delta and not self._closed:
            wait = self._last_flush + window - self._clock.monotonic()
            # `_urgent` already set: a non-delta came since the last batch left (often in the same
            # step of the turn as the delta before it: the last text, then the terminal event), so
            # nothing waits. Otherwise the window's end sets the same event a non-delta would (a
            # timer, not wait_for, which costs a task per batch); it is cleared when the batch leaves.
            gap = self.delta_gap
            if wait > 0 and not self._urgent.is_set() and (gap is None or gap * 2 < window):
                timer = asyncio.get_running_loop().call_later(wait, self._urgent.set)
                try:
                    await self._urgent.wait()
                finally:
                    timer.cancel()
        batch: list[Outgoing] = []
        queue, runs, final_queued = self._queue, self._runs, self._final_queued
        while queue:
            entry = queue.popleft()
            if type(entry) is Delta:
                run = runs.get(entry.response_id)
                if run is not None and run.tail is entry:
                    run.tail = None  # taken: it no longer grows
                if not lazy_deltas:
                    entry = entry.to_event()
            elif final_queued and entry.response_id in final_queued:
                arm = entry.WhichOneof("event")
                if arm in TERMINAL_ARMS:  # the run's last event left: it is no longer in flight here
                    final_queued.discard(entry.response_id)
                    runs.pop(entry.response_id, None)
            batch.append(entry)
        self._urgent.clear()
        self._space.set()
        self._last_flush = self._clock.monotonic()
        self.events_out += len(batch)
        self.batches_out += 1
        return batch
