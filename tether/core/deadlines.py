"""The turn deadline (`limits.max_turn_s`) of every generating turn of a process, on one timer.

A turn's generation (its model calls, from the first, MCP calls included) must end within
`max_turn_s`, whatever the upstream sends meanwhile: an upstream that keeps its stream open with
SSE keep-alive comments never wakes the turn, so only a timer can end it. Past the deadline the
turn is interrupted like a server cut (`Outcome.CUT`) and its response fails with
`backend_timeout`, naming the setting.

Why one timer for the process and not one per turn (`asyncio.timeout_at` around each model call):
a per-turn timer is cancelled when the turn ends, long before it is due, and asyncio keeps
cancelled timers in its heap until they reach the top or outnumber the live ones; with
half-hour deadlines the heap grows by one dead entry per turn, and every timer of the loop (the
model's pacing, the outboxes' coalescing windows) pays for the deeper heap: a cached turn's
server overhead rose by ~20% (`python -m tether_lab.hotpath turns`, `TimerHandle.__lt__` calls
x3). Here the watched turns sit in an insertion-ordered dict: every deadline is `max_turn_s` after
its turn started, so insertion order is deadline order, the earliest is the first entry, and a
turn that ends is removed in O(1). The one timer is armed at the earliest deadline and, when it
fires, interrupts what is due and re-arms at the next.
"""

from __future__ import annotations

import asyncio

from tether import errors
from tether.core.outcome import Outcome, TurnControl
from tether.errors import TetherError


class TurnDeadlines:
    __slots__ = ("max_turn_s", "_due", "_timer")

    def __init__(self, max_turn_s: float) -> None:
        self.max_turn_s = max_turn_s
        self._due: dict[TurnControl, float] = {}  # in deadline order (see the module docstring)
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._due)

    def watch(self, control: TurnControl) -> None:
        """From now, `control`'s turn must end within `max_turn_s` (until `forget`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_turn_s
        self._due.pop(control, None)  # watched again: its place is at the end
        self._due[control] = deadline
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._fire)

    def forget(self, control: TurnControl) -> None:
        self._due.pop(control, None)

    def _fire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._due:
            control, deadline = next(iter(self._due.items()))
            if deadline > now:
                self._timer = loop.call_at(deadline, self._fire)
                return
            del self._due[control]
            control.interrupt(Outcome.CUT, TetherError(
                errors.BACKEND_TIMEOUT,
                f"The model did not finish within the turn deadline of {self.max_turn_s:g} s (limits.max_turn_s).",
            ))  # fmt: skip
