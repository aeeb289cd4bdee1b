"""The transport-neutral response writer: one bounded, coalescing queue of server events per
session, drained in batches by whichever transport adapter serves the session.

Why here and not in each transport: a gRPC message costs ~65-110 µs in Python whatever its size,
a WebSocket frame ~10 µs, so token deltas must be merged before they are written, and the merge
rules (and their effect on sequence numbers) must be the same on every transport.

Rules (Nagle-like):
- a delta that arrives while the previous batch went out more than `coalesce_s` ago is sent at
  once (an idle stream adds no latency);
- otherwise the writer waits out the rest of the window while later deltas for the same content
  are merged into the queued one (bounded by `max_coalesced_bytes`);
- any non-delta event ends the wait; everything ready goes out as one batch.
Sequence numbers are stamped when events leave the queue, so they stay contiguous per response
however deltas were merged.

Backpressure: the queue holds at most `max_events` entries; producers (the turns of the session)
wait in `put` when it is full, so a slow reader slows its own generation, never the server's
memory. Merged deltas take no extra entry, which keeps generation going while the reader catches up.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from tether.responses.v1 import events_pb2

# Delta arms and the field that holds their text.
_DELTA_ARMS = {
    "output_text_delta",
    "refusal_delta",
    "reasoning_text_delta",
    "function_call_arguments_delta",
    "reasoning_summary_text_delta",
}
_TERMINAL_ARMS = {"completed", "failed", "incomplete"}


class OutboxClosed(Exception):
    pass


class _PendingDelta:
    """A delta being coalesced: text pieces are joined once, when the batch leaves."""

    __slots__ = ("event", "arm", "pieces", "size", "merge_key")

    def __init__(self, event: events_pb2.ServerEvent, arm: str) -> None:
        self.event = event
        self.arm = arm
        payload = getattr(event, arm)
        self.pieces = [payload.delta]
        self.size = len(payload.delta)
        self.merge_key = (event.response_id, arm, payload.item_id, getattr(payload, "content_index", 0),
                          getattr(payload, "summary_index", 0))

    def materialize(self) -> events_pb2.ServerEvent:
        if len(self.pieces) > 1:
            getattr(self.event, self.arm).delta = "".join(self.pieces)
        return self.event


class Outbox:
    def __init__(self, *, max_events: int, coalesce_s: float, max_coalesced_bytes: int) -> None:
        self._queue: deque[events_pb2.ServerEvent | _PendingDelta] = deque()
        self._max_events = max(1, max_events)
        self._coalesce_s = coalesce_s
        self._max_coalesced = max_coalesced_bytes
        self._ready = asyncio.Event()  # something to send
        self._urgent = asyncio.Event()  # a non-delta arrived: stop waiting out the window
        self._space = asyncio.Event()
        self._space.set()
        self._closed = False
        self._last_flush = 0.0
        self._seq: dict[str, int] = {}
        self.events_out = 0
        self.batches_out = 0

    @property
    def closed(self) -> bool:
        return self._closed

    async def put(self, event: events_pb2.ServerEvent) -> None:
        """Queue an event; waits while the queue is full. Raises OutboxClosed after close()."""
        arm = event.WhichOneof("event")
        if arm in _DELTA_ARMS and self._queue:
            tail = self._queue[-1]
            if isinstance(tail, _PendingDelta) and tail.size < self._max_coalesced:
                payload = getattr(event, arm)
                if tail.merge_key == (event.response_id, arm, payload.item_id,
                                      getattr(payload, "content_index", 0), getattr(payload, "summary_index", 0)):
                    tail.pieces.append(payload.delta)
                    tail.size += len(payload.delta)
                    return
        while len(self._queue) >= self._max_events and not self._closed:
            self._space.clear()
            await self._space.wait()
        if self._closed:
            raise OutboxClosed()
        self._queue.append(_PendingDelta(event, arm) if arm in _DELTA_ARMS else event)
        if arm not in _DELTA_ARMS:
            self._urgent.set()
        self._ready.set()

    def put_nowait_final(self, event: events_pb2.ServerEvent) -> None:
        """Queue a last event past the bound (connection-fatal errors) so close never blocks."""
        if not self._closed:
            self._queue.append(event)
            self._urgent.set()
            self._ready.set()

    def close(self) -> None:
        """No more events; the reader drains what is queued, then `get_batch` returns []."""
        self._closed = True
        self._ready.set()
        self._urgent.set()
        self._space.set()

    async def get_batch(self) -> list[events_pb2.ServerEvent]:
        """Everything ready, as one batch (waits for at least one event; [] once closed+drained)."""
        while not self._queue:
            if self._closed:
                return []
            self._ready.clear()
            await self._ready.wait()
        if self._coalesce_s > 0 and isinstance(self._queue[0], _PendingDelta) and not self._closed:
            wait = self._last_flush + self._coalesce_s - time.monotonic()
            if wait > 0:
                self._urgent.clear()
                try:
                    await asyncio.wait_for(self._urgent.wait(), wait)
                except TimeoutError:
                    pass
        batch = []
        while self._queue:
            entry = self._queue.popleft()
            event = entry.materialize() if isinstance(entry, _PendingDelta) else entry
            self._stamp(event)
            batch.append(event)
        self._urgent.clear()
        self._space.set()
        self._last_flush = time.monotonic()
        self.events_out += len(batch)
        self.batches_out += 1
        return batch

    def _stamp(self, event: events_pb2.ServerEvent) -> None:
        rid = event.response_id
        if not rid:
            return  # request- or connection-scoped errors keep their sequence number (0)
        seq = self._seq.get(rid, 0)
        event.sequence_number = seq
        if event.WhichOneof("event") in _TERMINAL_ARMS:
            self._seq.pop(rid, None)
        else:
            self._seq[rid] = seq + 1
