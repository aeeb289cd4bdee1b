"""The pump: the one loop that moves server events from a source to a transport, and the one
place that knows a stream's lifecycle.

Every transport drains something: a session's batches (WebSocket, the gRPC `Session` RPC), a
one-response stream (a stateless create: HTTP `POST /v1/responses`, gRPC `CreateResponse`), or a
run followed from `after=n` (`GET /v1/responses/{id}?stream=true`, gRPC `StreamResponse`). Each
of them needs the same answers: when has a one-response stream ended (its terminal event, or a
connection-scoped `error` instead of a response), why did a session's stream end (the server
shutting down says so in its last event: WebSocket close 1001, a gRPC status), and, while the
server drains, when is nothing in flight any more. Those answers live here, so no transport
pattern-matches event arms for them; a transport only encodes and writes (`Writer`).

A one-response stream is pumped once, where its events are made (`one_response`: the engine's
create, or the adapter of a remote engine's, whose wire carries the events but not their end):
its batches, then one `ResponseEnd` record that says how the response ended. Its transport writes
the batches and reads the record as it is (`deliver`); a session's stream goes through `Pump.run`.

A JSON transport's deltas may skip the pump: while it waits for a session's next batch, a delta
is written by its producer, in the step the upstream woke it (`tether.core.outbox`,
`InlineWriter`: one pass per token). Only deltas do, so the pump still sees every event its
answers depend on (`created`, terminal events, errors).

Where "in flight" comes from: a session in this process answers from its runs
(`SessionHandle.responses_in_flight`: the runs bound to its outbox whose terminal event has not
left it, `ResponseRun.state`). A session that cannot tell (one forwarded to a remote engine)
answers None, and the pump counts `response.created` up to the terminal event itself.

Cost: nothing per event on a session's stream (the hot path): per batch a few attribute reads
and the writer's one await; the last batch is kept to read its last event once the source ends.
A one-response stream looks at each of its non-delta events (as the create path always did),
and a remote session's stream at each of its events, to count what is in flight.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tether.core.delta import Delta, Outgoing
from tether.errors import SERVER_SHUTTING_DOWN
from tether.protocol.wire import TERMINAL_ARMS
from tether.responses.v1 import events_pb2, response_pb2


class Until(enum.Enum):
    """What ends a stream besides its source running dry."""

    SOURCE_END = "source_end"  # a session, a followed run: whatever the source gives
    RESPONSE_END = "response_end"  # a one-response stream: its terminal event, or an error instead


class PumpEnd(enum.Enum):
    """How a pump ended."""

    TERMINAL = "terminal"  # one-response stream: its terminal event went out
    REFUSED = "refused"  # one-response stream: its first event is an `error` (not written by `run`)
    ABORTED = "aborted"  # one-response stream: a connection-scoped `error` after it began
    SHUTTING_DOWN = "shutting_down"  # the source ended after a `server_shutting_down` error
    DRAINED = "drained"  # draining, and no response is in flight any more
    SOURCE_ENDED = "source_ended"  # the source has nothing more (lifetime, idle, a run's end)
    WRITER_GONE = "writer_gone"  # the writer's peer is gone


RESPONSE_ENDS = frozenset({PumpEnd.TERMINAL, PumpEnd.REFUSED, PumpEnd.ABORTED})


@dataclass(frozen=True, slots=True)
class ResponseEnd:
    """The last record of a one-response stream (`ResponsesAPI.create`, made by `one_response`):
    how its response ended, read by the transports as it is.

    `end`: TERMINAL (`event` is the terminal event, the last of the last batch), REFUSED (`event`
    is the request's `error`, which came instead of the response and is in no batch: the
    transport answers it, as an HTTP status or in-band), ABORTED (`event` is the
    connection-scoped `error` that ended the last batch), SHUTTING_DOWN or SOURCE_ENDED (the
    stream ran dry without either; `event` is the last connection-scoped `error`, if any),
    WRITER_GONE (`deliver`: the transport's peer went first)."""

    end: PumpEnd
    event: events_pb2.ServerEvent | None = None

    @property
    def response(self) -> response_pb2.Response | None:
        """The Response of the terminal event (None for any other end)."""
        ev = self.event
        if self.end is not PumpEnd.TERMINAL or ev is None:
            return None
        return getattr(ev, ev.WhichOneof("event")).response  # type: ignore[arg-type]  # a terminal event: its arm is set

    @property
    def error(self) -> events_pb2.Error | None:
        """The `error` that ended the stream (None for a terminal event)."""
        ev = self.event
        return ev.error.error if ev is not None and ev.WhichOneof("event") == "error" else None


class PumpState(enum.Enum):
    """RUNNING moves batches; DRAINING (the server stops) moves them until nothing is in flight;
    ENDED is final. The only ways: RUNNING -> DRAINING -> ENDED and RUNNING -> ENDED
    (`next_pump_state`)."""

    RUNNING = "running"
    DRAINING = "draining"
    ENDED = "ended"


_TRANSITIONS = {
    PumpState.RUNNING: {PumpState.DRAINING, PumpState.ENDED},
    PumpState.DRAINING: {PumpState.DRAINING, PumpState.ENDED},  # asked to drain twice: no-op
    PumpState.ENDED: {PumpState.ENDED},  # a drain that comes after the end changes nothing
}


def next_pump_state(current: PumpState, wanted: PumpState) -> PumpState:
    """The one transition function of `PumpState`: `wanted`, or ValueError for a way back."""
    if wanted not in _TRANSITIONS[current]:
        raise ValueError(f"pump cannot go from {current.value} to {wanted.value}")
    return wanted


# The events a stream carries: `Outgoing` (a JSON transport's source, with `Delta` records), or
# protobuf events only (a gRPC source). The pump hands each writer batches of its source's kind.
E = TypeVar("E", bound=Outgoing)
E_contra = TypeVar("E_contra", bound=Outgoing, contravariant=True)


class Writer(Protocol[E_contra]):
    """A transport's side: encode and write one batch (a transport opens its source with the
    event form its encoding wants: `Delta` records for JSON, protobuf events for gRPC)."""

    async def write(self, batch: Sequence[E_contra]) -> bool:
        """Write `batch`; False when the peer is gone (the pump stops)."""
        ...


def connection_error(event: Outgoing) -> events_pb2.Error | None:
    """The error of a connection-scoped `error` event (one that names no response), else None."""
    if type(event) is Delta or event.response_id or event.WhichOneof("event") != "error":
        return None
    return event.error.error


class Pump:
    """One stream's pump (module docstring). `feed` is the lifecycle, pure and synchronous, for
    a caller that drives the source itself (`one_response`, a create's stream); `run` drives a
    session's source into a `Writer`. `in_flight`: the source's count of responses in flight
    (`SessionHandle.responses_in_flight`; one that answers None has them counted from the
    events), for a pump that may be drained; without it `drain` is a programming error."""

    __slots__ = ("until", "state", "end", "last", "error", "_in_flight", "_ids", "_started")

    def __init__(self, until: Until = Until.SOURCE_END, in_flight: Callable[[], int | None] | None = None) -> None:
        self.until = until
        self.state = PumpState.RUNNING
        self.end: PumpEnd | None = None
        self.last: events_pb2.ServerEvent | None = None  # the event that ended a one-response stream
        self.error: events_pb2.Error | None = None  # the last connection-scoped error seen at an end
        self._in_flight = in_flight
        # Response ids between `created` and their terminal event, when the source cannot count them.
        self._ids: set[str] | None = None
        if until is Until.SOURCE_END and in_flight is not None and in_flight() is None:
            self._ids = set()
        self._started = False

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Responses of the source in flight now."""
        if self._ids is not None:
            return len(self._ids)
        if self._in_flight is None:
            raise ValueError("this pump does not know what is in flight (no `in_flight` given)")
        return self._in_flight() or 0

    def ending(self) -> ResponseEnd:
        """A one-response stream's end record, once it has ended."""
        assert self.end is not None, "the stream has not ended"
        return ResponseEnd(self.end, self.last)

    def drain(self) -> bool:
        """The server stops: end once nothing is in flight. True when nothing is now."""
        if self.state is PumpState.ENDED:
            return True
        self.state = next_pump_state(self.state, PumpState.DRAINING)
        return self.in_flight == 0

    def _finish(self, end: PumpEnd) -> PumpEnd:
        self.state = next_pump_state(self.state, PumpState.ENDED)
        self.end = end
        return end

    def feed(self, batch: Sequence[E]) -> Sequence[E]:
        """Account for `batch`; what of it goes to the transport (a one-response stream's batch
        is cut after the event that ended it). Sets `end` when the stream ended with it."""
        events: Sequence[Outgoing] = batch  # read as the tagged union (a type variable does not narrow)
        if self.until is Until.SOURCE_END:
            ids = self._ids
            if ids is not None:
                for ev in events:
                    if type(ev) is Delta:
                        continue
                    arm = ev.WhichOneof("event")
                    if arm == "created":
                        ids.add(ev.created.response.id)
                    elif arm in TERMINAL_ARMS:
                        ids.discard(getattr(ev, arm).response.id)
            return batch
        for i, ev in enumerate(events):
            if type(ev) is Delta:
                continue
            arm = ev.WhichOneof("event")
            if arm in TERMINAL_ARMS:
                end = PumpEnd.TERMINAL
            elif arm != "error":
                continue
            elif not (self._started or i):  # an error instead of the response
                end = PumpEnd.REFUSED
            elif not ev.response_id:
                end = PumpEnd.ABORTED
            else:  # a request-scoped error along the way (the response goes on)
                continue
            if end is not PumpEnd.TERMINAL:
                self.error = ev.error.error
            self.last = ev
            self._finish(end)
            return batch if i == len(batch) - 1 else batch[: i + 1]
        self._started = True
        return batch

    def source_ended(self, last: Sequence[Outgoing]) -> PumpEnd:
        """The source ran dry; its last batch says whether the server was shutting down."""
        error = connection_error(last[-1]) if last else None
        if error is not None:
            self.error = error
            self.last = last[-1]  # type: ignore[assignment]  # a connection-scoped error: a protobuf event
            if error.code == SERVER_SHUTTING_DOWN:
                return self._finish(PumpEnd.SHUTTING_DOWN)
        return self._finish(PumpEnd.SOURCE_ENDED)

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, source: AsyncIterable[Sequence[E]], writer: Writer[E]) -> PumpEnd:
        """Move a session's (or a followed run's) batches into `writer` until one of the ends of
        `PumpEnd`. A one-response stream is `one_response`'s: its transport only writes it."""
        assert self.until is Until.SOURCE_END, "a one-response stream goes through one_response"
        last: Sequence[E] = ()
        # A session whose runs say what is in flight needs nothing from each batch: not even a call.
        feed = None if self._ids is None else self.feed
        write = writer.write
        async for batch in source:
            if feed is not None:
                feed(batch)
            if not await write(batch):
                return self._finish(PumpEnd.WRITER_GONE)
            if self.state is PumpState.DRAINING and self.in_flight == 0:
                return self._finish(PumpEnd.DRAINED)
            last = batch
        return self.source_ended(last)


async def one_response(source: AsyncIterable[Sequence[E]]) -> AsyncGenerator[Sequence[E] | ResponseEnd, None]:
    """The one-response stream of `source` (a one-turn session's batches; a remote engine's
    `CreateResponse` messages, whose end is not on the wire): its batches, the last one cut after
    the event that ended the response, then one `ResponseEnd`. A refused create yields no batch:
    its error is in the end record. The one pump of a create: its transport only writes
    (`deliver`). The caller closes `source`."""
    pump = Pump(Until.RESPONSE_END)
    last: Sequence[E] = ()
    async for batch in source:
        out = pump.feed(batch)
        if pump.end is not PumpEnd.REFUSED:
            yield out
        if pump.end is not None:
            yield pump.ending()
            return
        last = batch
    pump.source_ended(last)
    yield pump.ending()


async def deliver(stream: AsyncIterable[Sequence[E] | ResponseEnd], writer: Writer[E]) -> ResponseEnd:
    """Write a stream's batches into `writer` up to its end record, and return that record
    (`ResponsesAPI.create`'s shape). A stream without one (a followed run's) ends SOURCE_ENDED
    when it runs dry; WRITER_GONE when the writer's peer went first."""
    async for item in stream:
        if isinstance(item, ResponseEnd):
            return item
        if not await writer.write(item):
            return ResponseEnd(PumpEnd.WRITER_GONE)
    return ResponseEnd(PumpEnd.SOURCE_ENDED)
