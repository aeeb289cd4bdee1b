"""The turn deadline (`tether.core.deadlines`): due turns are cut with `backend_timeout`, turns
that end in time are forgotten, and the whole process holds one timer, however many turns come
and go (a timer per turn left one cancelled entry per turn in asyncio's heap)."""

from __future__ import annotations

import asyncio

from tether.core.deadlines import TurnDeadlines
from tether.core.outcome import Outcome, TurnControl


async def test_a_due_turn_is_cut_with_backend_timeout_and_one_that_ended_is_not() -> None:
    deadlines = TurnDeadlines(0.05)
    slow = TurnControl(asyncio.create_task(asyncio.sleep(10)))
    quick = TurnControl(asyncio.create_task(asyncio.sleep(10)))
    deadlines.watch(quick)
    deadlines.watch(slow)
    deadlines.forget(quick)  # it ended in time
    await asyncio.sleep(0.15)
    assert slow.outcome is Outcome.CUT and slow.task.cancelled()
    assert slow.reason is not None and slow.reason.code == "backend_timeout"
    assert "limits.max_turn_s" in slow.reason.message
    assert quick.outcome is Outcome.RUNNING and not quick.task.done()
    assert len(deadlines) == 0
    quick.task.cancel()


async def test_the_timer_rearms_for_a_later_turn_after_the_first_one_ended() -> None:
    deadlines = TurnDeadlines(0.1)
    first = TurnControl(asyncio.create_task(asyncio.sleep(10)))
    deadlines.watch(first)
    await asyncio.sleep(0.05)
    second = TurnControl(asyncio.create_task(asyncio.sleep(10)))
    deadlines.watch(second)
    deadlines.forget(first)
    await asyncio.sleep(0.08)  # first's deadline passed: nothing to cut, re-armed for second
    assert second.outcome is Outcome.RUNNING
    await asyncio.sleep(0.1)
    assert second.outcome is Outcome.CUT
    first.task.cancel()


async def test_many_turns_leave_one_timer_in_the_loop() -> None:
    loop = asyncio.get_running_loop()
    before = len(loop._scheduled)  # noqa: SLF001 - the property under test is the loop's timer heap
    deadlines = TurnDeadlines(1800.0)
    for _ in range(1000):
        control = TurnControl()
        deadlines.watch(control)
        deadlines.forget(control)
    assert len(loop._scheduled) <= before + 1  # noqa: SLF001
