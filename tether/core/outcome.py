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
"""

from __future__ import annotations

import asyncio
import enum

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
        """The turn ended by itself (COMPLETED or FAILED); an interruption that got there first stays."""
        self.outcome = next_outcome(self.outcome, wanted)
