"""A turn's handling of its backend's chunks: the one place they become events.

`Intake.consume(chunks)` builds the events of a run of chunks (`OutputBuilder`), counts the
output cap, and commits each event to the outbox (`Outbox.put_now`: numbered by its run, written
to the client inline when the transport takes it); it never waits. The turn's task calls it for
what it read (`Turn.stream`), and the backend calls it through `take` (`RunSink`) for a run it
read while the turn waited: the token is then built, numbered and written in the upstream
socket's callback, one pass of the event loop instead of a switch to the turn's task and back
through the backend's generators (the profile of 100 paced streams put that switch at ~15% of the
CPU per token).

`take` only handles a run at once while the turn is waiting on its backend (`armed`) and nothing
is left over from before; otherwise it keeps the run (`held`) and asks for the turn's task, which
consumes what was held before anything newer. What the outbox had no room for stays in
`backlog`, in order, for the task to `put` (waiting for room: backpressure, as before). An
interruption (steer, cancel, a server cut) asked for the turn stops the pushes at once: the run
is held and the task meets its cancellation.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

from tether.backends.base import Chunk, Finish
from tether.core.accounting import OutputCap
from tether.core.builder import OutputBuilder
from tether.core.context import EventSink
from tether.core.delta import Delta, Outgoing
from tether.core.outcome import TurnControl


class Intake:
    """One backend call's chunks -> the turn's events (module docstring). A `RunSink`."""

    __slots__ = ("_builder", "_outbox", "_cap", "_stream_id", "_response_id", "_control",
                 "armed", "held", "backlog", "stopped", "error", "first_at", "spent")  # fmt: skip

    def __init__(self, builder: OutputBuilder, outbox: EventSink, cap: OutputCap, stream_id: str, response_id: str,
                 control: TurnControl) -> None:  # fmt: skip
        self._builder = builder
        self._outbox = outbox
        self._cap = cap
        self._stream_id = stream_id
        self._response_id = response_id
        self._control = control
        self.armed = False  # the turn's task waits on the backend: a pushed run is handled at once
        self.held: list[Chunk] = []  # chunks pushed while the task has to handle them
        self.backlog: deque[Outgoing] = deque()  # events the outbox had no room for, in order
        self.stopped = False  # the rest of the stream is not wanted (max_tool_calls, the output cap)
        self.error: Exception | None = None  # what handling a pushed run raised: the task raises it
        self.first_at: float | None = None  # perf_counter of the first chunks (the backend's TTFT)
        self.spent = 0.0  # seconds handling pushed runs (the turn's work, inside the backend's wait)

    def take(self, run: list[Chunk]) -> bool:
        """`RunSink.take`: handle `run` in this step, or hold it for the task (False)."""
        if not self.armed or self.held or self.backlog or self.stopped or self.error or self._control.interrupted:
            self.held += run
            return False
        t0 = time.perf_counter()
        try:
            self.consume(run)
        except Exception as exc:  # noqa: BLE001 - raised by the turn's task, not the socket's callback
            self.error = exc
        self.spent += time.perf_counter() - t0
        return not (self.backlog or self.stopped or self.error)

    def consume(self, chunks: list[Chunk]) -> None:
        """Build, count and commit the events of `chunks` (module docstring); never waits."""
        if self.first_at is None:
            self.first_at = time.perf_counter()
        builder, outbox, cap, backlog = self._builder, self._outbox, self._cap, self.backlog
        for ev in builder.feed(chunks):
            if type(ev) is Delta:  # what the model generated
                cap.add("".join(ev.pieces))
            ev.stream_id, ev.response_id = self._stream_id, self._response_id
            if backlog or not outbox.put_now(ev):
                backlog.append(ev)
        if builder.capped:  # max_tool_calls reached
            self.stopped = True
        elif cap.room < 0 and cap.over():  # the upstream ignored the output cap
            builder.finish = dataclasses.replace(builder.finish or Finish(), reason="length")
            self.stopped = True

    def take_held(self) -> list[Chunk]:
        held, self.held = self.held, []
        return held
