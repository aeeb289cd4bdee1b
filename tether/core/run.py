"""A response run: one response's life, owned by the engine rather than by the connection that
started it.

A `ResponseRun` holds what outlives a connection: the response's state (`RunState`, every way
between states in one pure function, `next_run_state`), its latest Response object, the turn's
`TurnControl` (so a cancel can reach it from anywhere), the sequence numbers of its events and a
bounded replay log of them. Subscribers read the log from any point (`follow(after=n)`: the
events numbered above n, then the live ones until the terminal event). The log holds the events
as they were committed (merged deltas as `Delta` records, the others as protobuf events) and,
once a subscriber's transport asked for it, each one's encoded frame (`ReplayLog.frame`): an
event's number is part of its frame and fixed once stamped, so every follower of the run sends
the same bytes, encoded once, counted in the log's byte bound.

Where the numbers come from: an event is numbered when its producer commits it to the run
(`stamp`, called by `Outbox.put` in the producer's step), before any reader sees it: the
connection that created the response reads it from its outbox as one follower among others, and
anyone replaying the log sees the same contiguous numbers. Text deltas are merged at the run's
tail: a delta for the same content as the run's last entry joins that entry (`extend`) while no
reader has taken it yet; the first read of the tail (the outbox's batch leaving, a follower's
read, the shared mirror's write, an inline write) freezes it (`freeze`), and the next delta is
a new entry. A connection whose client went away discards what it would have sent: its runs
already hold it.

`Runs` is the process's registry: runs of stored responses in flight (retrievable, resumable,
cancellable by id, per tenant), finished ones for `replay_retention_s` (at most
`replay_max_finished_runs` of them, their logs at most `replay_bytes_per_process` together), and
the background admission counters. Responses with
`store=false` get a run too (its numbers) but no log and no registration: nobody can name them
from elsewhere.

The ways between states (anything else leaves the state as it is):
  QUEUED      -> IN_PROGRESS | FAILED | CANCELLED
  IN_PROGRESS -> COMPLETED | INCOMPLETE | FAILED | CANCELLED
  COMPLETED, INCOMPLETE, FAILED, CANCELLED: final
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Protocol, cast

from tether import errors
from tether.core.delta import Delta, Outgoing
from tether.core.outcome import Outcome, TurnControl, ending
from tether.errors import TetherError
from tether.protocol.wire import TERMINAL_ARMS
from tether.responses.v1 import events_pb2, response_pb2


class RunState(enum.Enum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"

    # Members are singletons compared by identity: hash them as objects (in C), not by name as
    # Enum does (a Python call for every lookup in FINAL and _TRANSITIONS, on every run's events).
    __hash__ = object.__hash__

    @property
    def final(self) -> bool:
        return self in FINAL


FINAL = frozenset({RunState.COMPLETED, RunState.INCOMPLETE, RunState.FAILED, RunState.CANCELLED})

_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.IN_PROGRESS, RunState.FAILED, RunState.CANCELLED}),
    RunState.IN_PROGRESS: FINAL,
    **{state: frozenset() for state in FINAL},
}

_STATUS = {state.value: state for state in RunState}


def next_run_state(current: RunState, wanted: RunState) -> RunState:
    """The one transition function of `RunState`: `wanted` where the table allows it, else
    `current` (a cancel after the end, a second terminal event: nothing changes)."""
    return wanted if wanted in _TRANSITIONS[current] else current


def state_of_status(status: str) -> RunState:
    """The state a Response's `status` names (an unknown status is a failure)."""
    return _STATUS.get(status, RunState.FAILED)


class ReplayGap(Exception):
    """The events a subscriber asked for are no longer in the log (it is bounded)."""


class ReplayLog:
    """The events of one run in order, bounded by `max_events` and `max_bytes` (the oldest go
    first; `first_seq` says where the log starts). Sizes: a delta's text length, an event's
    serialized size, plus its encoded frame once one is cached (`frame`).

    Reads cost what they return: the entries sit in a list behind a head index (dropping the
    oldest moves the index; the list is compacted once the dropped part is as long as the rest),
    so `since(after)` is one slice of the new entries. A run followed by hundreds of subscribers
    is read hundreds of times per wake-up: a read that copied the whole log would cost them all
    O(log) each.

    Frames: an entry's wire encoding (the bridge's SSE frame) is the same for every subscriber,
    since its sequence number is fixed once it is logged; `frame` encodes it for the first
    subscriber that asks and keeps it (by its number) for the others. The cached bytes count
    in `nbytes` under the same `max_bytes`: caching one drops the oldest entries (with their
    frames) as an append does, never the entry itself nor a newer one; a frame that does not fit
    even so is returned uncached. A followed run's log therefore holds fewer events in the same
    memory, never more memory. `on_resize` (None, or the process's count of finished logs'
    bytes, `Runs`) is told of every change of `nbytes` once set."""

    __slots__ = ("_entries", "_sizes", "_frames", "_head", "_encode", "max_events", "max_bytes", "nbytes",
                 "first_seq", "on_resize")  # fmt: skip

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self._entries: list[Outgoing | None] = []  # None: dropped, until the next compaction
        self._sizes: list[int] = []
        self._frames: dict[int, bytes] = {}  # sequence number -> its entry's cached frame
        self._head = 0  # entries before it were dropped (not yet compacted away)
        self._encode: Callable[[Outgoing], bytes] | None = None  # the encoding the frames are of
        self.max_events = max(1, max_events)
        self.max_bytes = max(1, max_bytes)
        self.nbytes = 0
        self.first_seq = 0
        self.on_resize: Callable[[int], None] | None = None

    def __len__(self) -> int:
        return len(self._entries) - self._head

    def append(self, entry: Outgoing, size: int) -> None:
        entries = self._entries
        entries.append(entry)
        self._sizes.append(size)
        self.nbytes = nbytes = self.nbytes + size
        if len(entries) - self._head > self.max_events or nbytes > self.max_bytes:
            self._drop_oldest(len(entries) - 1)
        if self.on_resize is not None:
            self.on_resize(self.nbytes - nbytes + size)

    def _drop_oldest(self, keep: int) -> None:
        """Drop the oldest entries past either bound, down to (never including) index `keep`."""
        entries, sizes, frames = self._entries, self._sizes, self._frames
        head = self._head
        while head < keep and (len(entries) - head > self.max_events or self.nbytes > self.max_bytes):
            self.nbytes -= sizes[head]
            entries[head] = None  # let it go now, not at the next compaction
            if frames:
                frames.pop(self.first_seq, None)
            head += 1
            self.first_seq += 1
        if head and head >= len(entries) - head:
            del entries[:head]
            del sizes[:head]
            head = 0
        self._head = head

    def grow(self, size: int) -> None:
        """The last entry grew by `size` (a delta merged into the run's tail, which no reader has
        taken, so it has no frame yet)."""
        self._sizes[-1] += size
        self.nbytes = nbytes = self.nbytes + size
        if nbytes > self.max_bytes:
            self._drop_oldest(len(self._entries) - 1)
        if self.on_resize is not None:
            self.on_resize(self.nbytes - nbytes + size)

    def since(self, after: int) -> LogBatch:
        """The entries numbered above `after` (a new list of just those); ReplayGap when some of
        them were dropped."""
        start = after + 1 - self.first_seq
        if start < 0:
            raise ReplayGap(f"events {after + 1}..{self.first_seq - 1} are no longer retained")
        batch = LogBatch(cast("list[Outgoing]", self._entries[self._head + start :]))  # past the head: none dropped
        batch.log = self
        return batch

    def frame(self, entry: Outgoing, encode: Callable[[Outgoing], bytes]) -> bytes:
        """`encode(entry)`, encoded once for every reader of this log (class docstring). The log
        keeps the frames of one encoding, the first one asked for; `entry` is one of its
        entries (one already dropped, or a frame of another encoding, is encoded uncached)."""
        seq = entry.sequence_number
        i = self._head + seq - self.first_seq
        if self._head <= i < len(self._entries) and self._entries[i] is entry:
            if self._encode is None:
                self._encode = encode
            if encode is self._encode:
                frame = self._frames.get(seq)
                if frame is None:
                    frame = encode(entry)
                    if len(frame) + self._sizes[i] <= self.max_bytes:  # else it could never fit
                        self._cache(seq, frame)
                return frame
        return encode(entry)

    def _cache(self, seq: int, frame: bytes) -> None:
        """Keep `frame` for the entry numbered `seq`, in the byte bound (class docstring)."""
        size = len(frame)
        before = self.nbytes
        self.nbytes = before + size
        self._drop_oldest(self._head + seq - self.first_seq)
        if self.nbytes > self.max_bytes:  # the newer entries leave no room for it
            self.nbytes -= size
        else:
            self._frames[seq] = frame
            self._sizes[self._head + seq - self.first_seq] += size  # a compaction may have moved it
        if self.on_resize is not None and self.nbytes != before:
            self.on_resize(self.nbytes - before)


class LogBatch(list[Outgoing]):
    """A subscriber's batch of a run's log (`ReplayLog.since`), with the log it came from: a
    transport asks `log.frame` for its entries' frames, encoded once for all the subscribers."""

    __slots__ = ("log",)

    log: ReplayLog


class RunSink(Protocol):
    """Where a run's events leave while a connection's outbox carries them (`Outbox.bind`): its
    ending goes behind its other events there while the outbox is open."""

    @property
    def closed(self) -> bool: ...

    def put_nowait_final(self, event: events_pb2.ServerEvent) -> None: ...


class Mirror(Protocol):
    """A run's shared side with a Redis/PostgreSQL store (`tether.core.shared_runs.RunMirror`):
    every stamped entry is pushed to it; a queued background run's create params are published
    with it at once, so another replica can take the run over."""

    params: bytes | None
    fenced: bool  # a shared write was refused: another replica ended the run or took it over

    def push(self, entry: Outgoing, arm: str | None) -> None: ...

    def fence(self) -> None: ...

    async def publish_now(self) -> None: ...


class ResponseRun:
    """One response's run (see the module docstring). `control` is the turn's `TurnControl`
    once a turn runs it (None while queued, or for a run closed before it started)."""

    __slots__ = ("id", "tenant", "state", "response", "control", "background", "log", "next_seq", "epoch",
                 "terminal_produced", "settled", "sink", "finished_at", "mirror", "tail", "_waiters", "_settled",
                 "_on_final")  # fmt: skip

    def __init__(self, response_id: str, tenant: str = "", *, response: response_pb2.Response | None = None,
                 log: ReplayLog | None = None, background: bool = False,
                 on_final: Callable[[ResponseRun], None] | None = None,
                 state: RunState = RunState.IN_PROGRESS) -> None:  # fmt: skip
        self.id = response_id
        self.tenant = tenant
        self.state = state
        self.response = response
        self.control: TurnControl | None = None
        self.background = background
        self.log = log
        self.next_seq = 0
        # This replica's fencing token for the run's shared side (`tether.store.runbus`): every
        # shared write and the response's store write carry it; 0 for a run kept in one process.
        self.epoch = 0
        self.terminal_produced = False  # the turn committed its terminal event
        self.settled = False  # the turn is over and its bookkeeping done (see `settle`)
        self.sink: RunSink | None = None  # the outbox its events leave through (`Outbox.bind`)
        self.finished_at = 0.0
        self.mirror: Mirror | None = None  # its shared side with a Redis/PostgreSQL store
        # The last entry while it is a delta no reader has taken yet: more text for the same
        # content joins it (`extend`) instead of taking a number of its own. None once read.
        self.tail: Delta | None = None
        # One future per subscriber waiting for the next event (not one shared future behind
        # `asyncio.shield`, which costs each of them a second future and a callback per wake-up).
        self._waiters: list[asyncio.Future[None]] = []
        self._settled: asyncio.Future | None = None
        self._on_final = on_final

    @property
    def recorded(self) -> bool:
        return self.log is not None

    # -- producing ---------------------------------------------------------------------------

    def stamp(self, entry: Outgoing, arm: str | None) -> bool:
        """Number `entry` (an event whose oneof arm is `arm`, or a delta record, whose `arm` is
        None), log it and wake the subscribers. Returns whether it ended the run."""
        entry.sequence_number = seq = self.next_seq
        self.next_seq = seq + 1
        log = self.log
        ended = False
        if type(entry) is Delta:
            self.tail = entry
            if log is not None:
                log.append(entry, entry.size)
        else:
            self.tail = None
            if log is not None:
                log.append(entry, entry.ByteSize())
        if arm is not None and arm in RESPONSE_ARMS:
            response = getattr(entry, arm).response
            self.response = response
            if arm in _TERMINAL:
                ended = True
                self._move(state_of_status(response.status))
            elif self.state is not RunState.IN_PROGRESS:  # created / in_progress of a queued run
                self._move(RunState.IN_PROGRESS)
        if self.mirror is not None:
            self.mirror.push(entry, arm)
        if self._waiters:
            self._wake()
        return ended

    def extend(self, delta: Delta) -> None:
        """Merge `delta` into the tail (the caller checked that it continues it), unseen by any
        reader so far: it keeps the tail's number, and the log's size grows with it."""
        tail = self.tail
        assert tail is not None, "extend: the run has no tail to merge into"
        tail.merge(delta)
        if self.log is not None:
            self.log.grow(delta.size)

    def freeze(self) -> None:
        """A reader took the tail: it is final, the next delta is an entry of its own."""
        self.tail = None

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        _release(waiters, 0)

    def _move(self, wanted: RunState) -> None:
        before = self.state
        self.state = next_run_state(before, wanted)
        if self.state is not before and self.state.final:
            self._wake()
            if self._on_final is not None:
                self._on_final(self)

    def close(self, error: TetherError | None = None) -> None:
        """The turn is over (or never started). A run whose terminal event was queued is only
        settled; a logged one that has none ends here, as `ending` says: cancelled when nobody
        ran it to its end (`error` None), else failed with `error`, with a terminal event that
        says so: committed through the outbox it is bound to while that is open (the connection
        gets it behind its other events), else logged at once."""
        if not self.terminal_produced and not self.state.final and self.log is not None:
            end = ending(Outcome.CANCELLED if error is None else Outcome.FAILED, None, error)
            response = response_pb2.Response()
            if self.response is not None:
                response.CopyFrom(self.response)
            response.id = self.id
            response.status = end.status
            if end.error is not None:
                response.error.code, response.error.message = end.error.code, end.error.message
            ev = events_pb2.ServerEvent(response_id=self.id)
            arm = end.arm
            getattr(ev, arm).response.CopyFrom(response)
            self.terminal_produced = True
            sink = self.sink
            if sink is not None and not sink.closed:
                sink.put_nowait_final(ev)
            else:
                self.stamp(ev, arm)
        self.settle()

    def settle(self) -> None:
        """The turn's bookkeeping is done (its store write queued): continuations may read it."""
        self.settled = True
        if self._settled is not None and not self._settled.done():
            self._settled.set_result(None)

    async def wait_settled(self) -> None:
        if self.settled:
            return
        if self._settled is None:
            self._settled = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._settled)

    # -- reading -----------------------------------------------------------------------------

    def snapshot(self) -> response_pb2.Response:
        """The Response as it stands (status from the state)."""
        r = response_pb2.Response()
        if self.response is not None:
            r.CopyFrom(self.response)
        r.id = self.id
        if not self.state.final:
            r.status = self.state.value
        return r

    async def follow(self, after: int = -1) -> AsyncIterator[LogBatch]:
        """The logged events numbered above `after`, then the live ones, until the run has
        ended and its last event was given, in batches: each batch is everything logged since
        this subscriber's last one (its own view: a subscriber that reads slowly gets fewer,
        larger batches, and never holds up the run or another subscriber). Raises ReplayGap
        when the log no longer holds them (asked too late, or a subscriber that fell behind the
        log's bound)."""
        assert self.log is not None, "a run without a log has nothing to follow"
        while True:
            batch = self.log.since(after)
            if batch:
                self.tail = None  # read: it no longer grows
                after = batch[-1].sequence_number
                yield batch
                continue  # what was logged while the batch was being written, before waiting
            if self.state.final and after >= self.next_seq - 1:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:  # not woken yet: nobody else lets it go
                    self._waiters.remove(waiter)
                raise


# Subscribers woken per pass of the event loop. Each woken subscriber writes its batch in the
# pass after its wake-up, so this bounds one pass's work, and so the loop's lag: the batch of a
# run's last events carries the whole output several times (`output_text.done`, `output_item.done`,
# the terminal Response), and 300 followers writing it in one pass held the loop for ~60 ms of
# CPU with a 40,000-token output. A wake-up of up to this many costs no extra pass.
WAKE_PER_PASS = 64


def _release(waiters: list[asyncio.Future[None]], start: int) -> None:
    """Wake `waiters[start:]`, `WAKE_PER_PASS` of them now and the rest in the loop's next passes
    (in order: the earliest subscribers first)."""
    end = start + WAKE_PER_PASS
    for waiter in waiters[start:end]:
        if not waiter.done():  # a subscriber cancelled since
            waiter.set_result(None)
    if end < len(waiters):
        waiters[end].get_loop().call_soon(_release, waiters, end)


_TERMINAL = TERMINAL_ARMS
RESPONSE_ARMS = frozenset({"created", "in_progress", "queued", *TERMINAL_ARMS})


class Runs:
    """The process's runs of stored responses by (tenant, id): in flight, and finished ones for
    `retention_s` (the newest `max_finished`), plus background admission (`admit_background`)."""

    def __init__(self, *, max_events: int, max_bytes: int, retention_s: float, max_finished: int,
                 finished_bytes: int = 1 << 62, background_per_tenant: int, background_per_process: int,
                 clock: Callable[[], float] = time.monotonic,
                 on_event: Callable[[str], None] = lambda kind: None) -> None:  # fmt: skip
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.retention_s = retention_s
        self.max_finished = max_finished
        self.finished_bytes = finished_bytes  # the finished runs' logs together, per process
        self._finished_nbytes = 0
        self.background_per_tenant = background_per_tenant
        self.background_per_process = background_per_process
        self._clock = clock
        self._live: dict[tuple[str, str], ResponseRun] = {}
        self._finished: OrderedDict[tuple[str, str], ResponseRun] = OrderedDict()
        self._background: Counter[str] = Counter()  # tenant -> background runs not finished
        self.background_total = 0
        self.counts: Counter[str] = Counter()  # background, resumed, cancelled, detached
        self._on_event = on_event  # the telemetry's `run_event`
        # Called with each registered run (stored responses): the shared side with a Redis or
        # PostgreSQL store (`SharedRuns.attach`); None keeps runs in this process.
        self.attach: Callable[[ResponseRun], None] | None = None

    def count(self, kind: str) -> None:
        self.counts[kind] += 1
        self._on_event(kind)

    def __len__(self) -> int:
        return len(self._live)

    def open(self, tenant: str, response: response_pb2.Response, control: TurnControl,
             preset: ResponseRun | None = None) -> ResponseRun:  # fmt: skip
        """The run of a response a turn just created (`preset`: the run a background create
        reserved for it). Stored responses are registered and logged; others only numbered."""
        if preset is not None:
            run = preset
            run.response = response
        elif response.store:
            run = ResponseRun(response.id, tenant, response=response, log=self._new_log(), on_final=self._final)
            self._live[(tenant, response.id)] = run
            if self.attach is not None:
                self.attach(run)
        else:
            run = ResponseRun(response.id, tenant, response=response)
        run.control = control
        return run

    def reserve(self, tenant: str, response: response_pb2.Response) -> ResponseRun:
        """A queued background run (its id known before any turn runs it)."""
        run = ResponseRun(response.id, tenant, response=response, log=self._new_log(), background=True,
                          on_final=self._final, state=RunState.QUEUED)  # fmt: skip
        self._live[(tenant, response.id)] = run
        if self.attach is not None:
            self.attach(run)
        self._background[tenant] += 1
        self.background_total += 1
        return run

    def _new_log(self) -> ReplayLog:
        return ReplayLog(self.max_events, self.max_bytes)

    def get(self, tenant: str, response_id: str) -> ResponseRun | None:
        key = (tenant, response_id)
        run = self._live.get(key)
        if run is not None:
            return run
        self._expire()
        return self._finished.get(key)

    def disown(self, run: ResponseRun) -> None:
        """Another replica ended or owns the run now (this one's shared writes were fenced off):
        this process forgets it, in flight or finished here (its local log and ending are not
        the run's), and asks the shared side and the store about it from now on; its background
        slot is freed."""
        key = (run.tenant, run.id)
        if self._live.pop(key, None) is not None:
            self._release_background(run)
        elif self._finished.get(key) is run:
            self._drop(key)

    def forget(self, tenant: str, response_id: str) -> None:
        """Drop a finished run (its response was deleted); one in flight stays."""
        if (tenant, response_id) in self._finished:
            self._drop((tenant, response_id))

    def in_flight(self, tenant: str, response_id: str) -> ResponseRun | None:
        """The run of that response while it has not settled (its turn still owns it)."""
        run = self.get(tenant, response_id)
        return run if run is not None and not run.settled else None

    def admit_background(self, tenant: str) -> None:
        """Raise 429 `rate_limit_exceeded` when a new background run would pass a bound."""
        if self.background_total >= self.background_per_process:
            raise TetherError(
                errors.RATE_LIMIT_EXCEEDED,
                "Too many background responses queued or running on this server "
                f"(limit {self.background_per_process}).",
                retry_after=1.0,
            )
        if self._background[tenant] >= self.background_per_tenant:
            raise TetherError(
                errors.RATE_LIMIT_EXCEEDED,
                "Too many background responses queued or running for this API key "
                f"(limit {self.background_per_tenant}).",
                retry_after=1.0,
            )

    def in_flight_runs(self) -> list[ResponseRun]:
        """Every registered run not final yet (a copy: the caller may await between them)."""
        return list(self._live.values())

    def background_counts(self) -> tuple[int, int]:
        """(queued, running) background runs."""
        queued = sum(1 for r in self._live.values() if r.background and r.state is RunState.QUEUED)
        return queued, self.background_total - queued

    def _final(self, run: ResponseRun) -> None:
        key = (run.tenant, run.id)
        if self._live.pop(key, None) is None:
            return
        run.finished_at = self._clock()
        self._release_background(run)
        self._finished[key] = run
        if run.log is not None:
            self._finished_nbytes += run.log.nbytes
            run.log.on_resize = self._finished_resized  # frames cached for its late subscribers
        self._expire()

    def _finished_resized(self, change: int) -> None:
        self._finished_nbytes += change
        if change > 0 and self._finished_nbytes > self.finished_bytes:
            self._expire()

    def _release_background(self, run: ResponseRun) -> None:
        if run.background:
            self._background[run.tenant] -= 1
            if self._background[run.tenant] <= 0:
                del self._background[run.tenant]
            self.background_total -= 1

    def _expire(self) -> None:
        """Drop finished runs, oldest first: past the count, the bytes or the retention."""
        finished = self._finished
        horizon = self._clock() - self.retention_s
        while finished:
            key, run = next(iter(finished.items()))
            if (len(finished) <= self.max_finished and self._finished_nbytes <= self.finished_bytes
                    and run.finished_at > horizon):  # fmt: skip
                break
            self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        run = self._finished.pop(key)
        if run.log is not None:
            run.log.on_resize = None
            self._finished_nbytes -= run.log.nbytes
