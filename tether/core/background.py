"""A background run's turn: no connection, no session, no outbox.

A background create (`background: true`) is checked and its Response reserved `queued` at its
entry (`Engine.start_run`); a task of the engine runs it when a background slot is free
(`tether.core.slots`). Nobody reads its events as they are made: a client follows its run
(`ResponseRun.follow`, by id), so its turn writes them straight into the run (`RunLog`), which
numbers them (contiguous from 0, as every response's), logs and mirrors them and wakes its
followers. It counts against the background limits only: not against the connections of its API
key, nor the bytes queued on connections (`tether.core.queued`).

Its deltas merge as an outbox merges them (`tether.core.outbox`: more text for the same content,
within the process's coalescing window and `max_coalesced_bytes`), so a long answer takes as few
entries of its bounded log as it would on a connection.
"""

from __future__ import annotations

import asyncio
import logging
import math

from tether import errors
from tether.core.chain import CacheBudget, ResponseCache
from tether.core.checked import CheckedCreate
from tether.core.clock import SYSTEM_CLOCK, Clock
from tether.core.context import TurnContext, TurnServices
from tether.core.delta import Delta, Outgoing
from tether.core.lane import Lane
from tether.core.outbox import CoalesceWindow, OutboxClosed
from tether.core.outcome import TurnControl
from tether.core.run import ResponseRun
from tether.core.turn import TurnStrategy
from tether.errors import TetherError
from tether.protocol.wire import DELTA_ARMS
from tether.responses.v1 import events_pb2

log = logging.getLogger("tether.background")

# The transport name of a background run's turn (telemetry labels, `TurnFacts`): no connection's.
BACKGROUND = "background"


class RunLog:
    """A run's events written straight into it (`EventSink`): each numbered, logged and mirrored
    by `ResponseRun.stamp` as it comes, except a delta, which waits out the rest of the coalescing
    window while more text for the same content merges into it (a non-delta, other text or the
    window's end commits it). Events of no response (a refusal's `error`, which the run's failed
    terminal event carries) have no reader here: telemetry has counted them, the run reports them."""

    __slots__ = ("_run", "_window", "_max_coalesced", "_clock", "_pending", "_timer", "_last", "closed")

    def __init__(self, run: ResponseRun, *, window: CoalesceWindow, max_coalesced_bytes: int,
                 clock: Clock = SYSTEM_CLOCK) -> None:  # fmt: skip
        self._run = run
        self._window = window
        self._max_coalesced = max_coalesced_bytes
        self._clock = clock
        self._pending: Delta | None = None  # a delta within the window, not numbered yet
        self._timer: asyncio.TimerHandle | None = None
        self._last = -math.inf  # when the last entry was committed
        self.closed = False

    def bind(self, run: ResponseRun) -> None:
        run.sink = self

    async def put(self, event: Outgoing) -> None:
        self.put_now(event)

    def put_now(self, event: Outgoing) -> bool:
        """Commit (or hold, a delta) `event`: a run's log never makes its producer wait."""
        if self.closed:
            raise OutboxClosed()
        if type(event) is Delta:
            self._delta(event)
            return True
        arm = event.WhichOneof("event")
        if arm in DELTA_ARMS:
            self._delta(Delta.from_event(event, arm))
        else:
            self._commit_event(event)
        return True

    def put_nowait_final(self, event: events_pb2.ServerEvent) -> None:
        """The run's ending when no terminal event came from its turn (`ResponseRun.close`)."""
        if not self.closed:
            self._commit_event(event)

    def close(self) -> None:
        """The turn is over: what waits is committed; nothing more comes."""
        self._flush()
        self.closed = True

    def _delta(self, delta: Delta) -> None:
        if delta.response_id != self._run.id:
            return
        pending = self._pending
        if pending is not None:
            if pending.continues(delta) and pending.size < self._max_coalesced:
                pending.merge(delta)
                return
            self._flush()
        wait = self._last + self._window.current() - self._clock.monotonic()
        if wait <= 0:  # the stream was idle for a window: no reason to hold it
            self._commit(delta, None)
            return
        self._pending = delta
        self._timer = asyncio.get_running_loop().call_later(wait, self._flush)

    def _commit_event(self, event: events_pb2.ServerEvent) -> None:
        self._flush()  # order: the text before it
        if event.response_id == self._run.id:
            self._commit(event, event.WhichOneof("event"))

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if pending is not None:
            self._commit(pending, None)

    def _commit(self, entry: Outgoing, arm: str | None) -> None:
        self._last = self._clock.monotonic()
        self._run.stamp(entry, arm)


async def run_turn(services: TurnServices, strategy: TurnStrategy, cache_budget: CacheBudget,
                   checked: CheckedCreate, run: ResponseRun) -> None:  # fmt: skip
    """Run the turn of background run `run` (its params `checked` at its entry) in this task,
    to its end, and close the run (failed with the turn's refusal or crash, cancelled when it was
    interrupted before it was created; settled otherwise). An interruption (cancel, the server's
    cut) reaches the turn through its `TurnControl`; another cancel of this task (the server
    giving up on it) propagates, and the caller closes the run as the server stops."""
    task = asyncio.current_task()
    assert task is not None
    tenant = run.tenant
    sink = RunLog(run, window=services.coalesce, max_coalesced_bytes=services.limits.max_coalesced_bytes,
                  clock=services.clock)  # fmt: skip
    cache = ResponseCache(1, cache_budget, on_evict=services.telemetry.cache_eviction, tenant=tenant)
    ctx = TurnContext.of(services, tenant, BACKGROUND, run.id, sink, cache, lambda _: None)
    turn = strategy.turn(ctx, checked.params, Lane(""), TurnControl(task), "")
    turn.checked = checked
    turn.size_hint = checked.nbytes  # as a session's turn gets it: the turn adds the prompt's expansion
    turn.response_run = run
    crash: TetherError | None = None
    try:
        with services.telemetry.turn_span(turn.facts):
            await turn.run()
    except asyncio.CancelledError:
        if turn.control.claim() is None:  # no interruption of the turn's: the server gives up on it
            sink.close()
            raise
        task.uncancel()  # interrupted before it generated: the run ends cancelled (below)
    except Exception:  # noqa: BLE001 - a bug in the turn fails its run, not the server
        log.exception("background turn crashed")
        crash = TetherError(errors.SERVER_ERROR, "The server had an error processing the request.")
        services.telemetry.error(crash.code)  # as a session's crashed turn counts it
    finally:
        ctx.mcp.close_soon()
        cache.clear()
    run.close(turn.refusal or crash)  # a run whose turn ended without its terminal event ends here
    sink.close()
