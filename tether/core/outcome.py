"""How a turn ends, as one state with every transition in one place (`next_outcome`).

A turn is RUNNING until it ends by itself (COMPLETED: the model stopped, or FAILED: the backend or
a stage failed) or something outside it stops it: a steer (STEERED: it ends `incomplete`, reason
`steered`), the client (CANCELLED: it ends `cancelled`), or the server cutting it (CUT, with the
error the response fails with: the connection ending past its grace, or the turn deadline
`limits.max_turn_s`, tether.core.deadlines). An interruption reaches the turn
as a `CancelledError` in the lane task that runs it; `TurnControl` records which interruption
that cancel carries, so the turn (and the lane, when the turn was not generating yet) can tell
it from the session being torn down, which no one handles.

The ways (anything else leaves the outcome as it is):
  RUNNING   -> STEERED | CANCELLED | CUT | COMPLETED | FAILED
  STEERED   -> CUT        (a cut overrides a steer: the response fails with the cut's reason)
  CANCELLED -> CUT        (likewise)

How it ended decides, in one pure function (`ending`), the Response's status, the terminal event
and the incomplete reason; the turn and a response run closed without a terminal event
(tether.core.run) both ask it, so the two can never disagree.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from dataclasses import dataclass

from tether.errors import TetherError


class Outcome(enum.Enum):
    RUNNING = "running"
    STEERED = "steered"
    CANCELLED = "cancelled"
    CUT = "cut"
    COMPLETED = "completed"
    FAILED = "failed"


INTERRUPTIONS = frozenset({Outcome.STEERED, Outcome.CANCELLED, Outcome.CUT})

_TRANSITIONS = {
    Outcome.RUNNING: {Outcome.STEERED, Outcome.CANCELLED, Outcome.CUT, Outcome.COMPLETED, Outcome.FAILED},
    Outcome.STEERED: {Outcome.CUT},
    Outcome.CANCELLED: {Outcome.CUT},
    Outcome.CUT: set(),
    Outcome.COMPLETED: set(),
    Outcome.FAILED: set(),
}


def next_outcome(current: Outcome, wanted: Outcome) -> Outcome:
    """The one transition function of `Outcome`: `wanted` where the table allows it, else
    `current` (a cancel after the turn ended, a steer after a cancel: nothing changes)."""
    return wanted if wanted in _TRANSITIONS[current] else current


# The finish reason of a generation a steer interrupted (not a backend's: the turn makes it), and
# the incomplete reason its response reports.
STEERED_REASON = "steered"
# The finish reasons of a model that stopped by itself: anything else cut its output short.
_ANSWERED = frozenset({"stop", "tool_calls"})


@dataclass(frozen=True, slots=True)
class Ending:
    """How a response ends: its `status`, the arm of its terminal event (`arm`: there is no
    `response.cancelled` event, the `incomplete` one ends a cancelled response), the
    `incomplete_details.reason` of an incomplete one, and the error a failed one reports."""

    status: str
    arm: str
    incomplete_reason: str = ""
    error: TetherError | None = None


COMPLETED_ENDING = Ending("completed", "completed")
CANCELLED_ENDING = Ending("cancelled", "incomplete")
# Within the API's list: max_output_tokens | max_messages | content_filter | steered.
_INCOMPLETE = {reason: Ending("incomplete", "incomplete", reason)
               for reason in ("max_output_tokens", "content_filter", STEERED_REASON)}  # fmt: skip


def ending(outcome: Outcome, finish_reason: str | None = None, error: TetherError | None = None) -> Ending:
    """The one mapping from how a turn ended to how its response ends (no allocation but for a
    failure):
      COMPLETED  completed, when the model stopped by itself (`finish_reason` stop | tool_calls,
                 or None: nothing was generated); else incomplete, reason content_filter for a
                 filter, max_output_tokens for anything else that cut it (length)
      STEERED    incomplete, reason steered
      CANCELLED  cancelled (terminal event: incomplete)
      FAILED,    failed with `error`; without one (nothing to report: a run nobody ran to its
      CUT        end) the response is cancelled"""
    if outcome is Outcome.COMPLETED:
        if finish_reason is None or finish_reason in _ANSWERED:
            return COMPLETED_ENDING
        return _INCOMPLETE["content_filter" if finish_reason == "content_filter" else "max_output_tokens"]
    if outcome is Outcome.STEERED:
        return _INCOMPLETE[STEERED_REASON]
    if outcome is Outcome.RUNNING:
        raise ValueError("a running turn has not ended")
    if outcome is Outcome.CANCELLED or error is None:
        return CANCELLED_ENDING
    return Ending("failed", "failed", error=error)


class TurnControl:
    """A turn's outcome and the lane task that runs it: the session interrupts through it
    (`interrupt`), the turn and the lane claim the cancel that carries the interruption
    (`claim`), and the turn records how it ended (`end`)."""

    __slots__ = ("outcome", "reason", "task", "_unclaimed")

    def __init__(self, task: asyncio.Task | None = None) -> None:
        self.outcome = Outcome.RUNNING
        self.reason: TetherError | None = None  # set with CUT: what the response fails with
        self.task = task
        self._unclaimed = False  # an interruption whose CancelledError no one has handled yet

    @property
    def interrupted(self) -> bool:
        """An interruption was asked and its cancel is still in flight."""
        return self._unclaimed

    def interrupt(self, wanted: Outcome, reason: TetherError | None = None) -> bool:
        """Ask for an interruption (STEERED, CANCELLED or CUT): cancels the task when the outcome
        moves. Returns whether it did."""
        assert wanted in INTERRUPTIONS
        moved = next_outcome(self.outcome, wanted)
        if moved is self.outcome:
            return False
        self.outcome, self._unclaimed = moved, True
        if moved is Outcome.CUT:
            self.reason = reason
        if self.task is not None:
            self.task.cancel()
        return True

    def claim(self) -> Outcome | None:
        """In an `except CancelledError`: the interruption this cancel carries (it is handled from
        now on, so a later cancel is not mistaken for it), or None for a cancel no one asked the
        turn for (the session closing), which must propagate."""
        if not self._unclaimed:
            return None
        self._unclaimed = False
        return self.outcome

    def end(self, wanted: Outcome) -> None:
        """The turn ended (COMPLETED or FAILED by itself, or the interruption it claimed); an
        interruption that got there first stays."""
        self.outcome = next_outcome(self.outcome, wanted)


async def finish_or_cut(tasks: Mapping[asyncio.Task, TurnControl | None], reason: TetherError,
                        grace: float) -> set[asyncio.Task]:  # fmt: skip
    """The server ends work (shutdown, a connection's end): wait up to `grace` for `tasks` (each
    running a turn, whose `TurnControl` it maps to, or None), then cut the turns still running
    (each still ends with a terminal event carrying `reason`) and cancel the tasks a cut cannot
    reach (not generating yet, or finishing). Returns the tasks still pending after the grace."""
    if not tasks:
        return set()
    _, pending = await asyncio.wait(tasks, timeout=grace)
    for task in pending:
        control = tasks[task]
        if control is None or not control.interrupt(Outcome.CUT, reason):
            task.cancel()
    return pending
