"""How a turn ends: one outcome, one transition function, and the control the session interrupts
a turn through (no server, no sleeps)."""

from __future__ import annotations

import asyncio

import pytest

from tether import errors
from tether.core.outcome import Outcome, TurnControl, next_outcome
from tether.errors import TetherError

RUNNING, STEERED, CANCELLED, CUT = Outcome.RUNNING, Outcome.STEERED, Outcome.CANCELLED, Outcome.CUT
COMPLETED, FAILED = Outcome.COMPLETED, Outcome.FAILED


@pytest.mark.parametrize("wanted", [STEERED, CANCELLED, CUT, COMPLETED, FAILED])
def test_a_running_turn_goes_anywhere(wanted: Outcome) -> None:
    assert next_outcome(RUNNING, wanted) is wanted


@pytest.mark.parametrize("current", [STEERED, CANCELLED])
def test_a_cut_overrides_a_steer_or_a_cancel(current: Outcome) -> None:
    assert next_outcome(current, CUT) is CUT


@pytest.mark.parametrize(
    ("current", "wanted"),
    [(STEERED, CANCELLED), (CANCELLED, STEERED), (CUT, CANCELLED), (CUT, STEERED), (COMPLETED, CANCELLED),
     (COMPLETED, CUT), (FAILED, STEERED), (STEERED, COMPLETED), (CANCELLED, FAILED), (RUNNING, RUNNING)],
)
def test_everything_else_leaves_the_outcome(current: Outcome, wanted: Outcome) -> None:
    assert next_outcome(current, wanted) is current


async def _waiting_task() -> asyncio.Task:
    task = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)  # started: a cancel now lands inside it
    return task


async def test_a_cancel_interrupts_the_task_once_and_is_claimed_once() -> None:
    task = await _waiting_task()
    control = TurnControl(task)
    assert control.interrupt(CANCELLED) is True
    assert control.interrupted and control.outcome is CANCELLED
    assert control.interrupt(CANCELLED) is False  # a second cancel: nothing more
    with pytest.raises(asyncio.CancelledError):
        await task
    assert control.claim() is CANCELLED
    assert control.claim() is None  # a later cancel is not this interruption
    assert not control.interrupted


async def test_a_cut_carries_its_reason_and_overrides_a_claimed_steer() -> None:
    task = await _waiting_task()
    control = TurnControl(task)
    control.interrupt(STEERED)
    assert control.claim() is STEERED
    reason = TetherError(errors.SERVER_SHUTTING_DOWN, "bye")
    assert control.interrupt(CUT, reason) is True
    assert control.claim() is CUT and control.reason is reason
    task.cancel()


async def test_a_turn_that_ended_is_not_interrupted() -> None:
    task = await _waiting_task()
    control = TurnControl(task)
    control.end(COMPLETED)
    assert control.interrupt(CANCELLED) is False
    assert control.interrupt(CUT, TetherError(errors.SERVER_SHUTTING_DOWN, "bye")) is False
    assert control.outcome is COMPLETED and control.claim() is None
    assert not task.cancelled() and not task.done()
    task.cancel()


def test_ending_after_an_interruption_keeps_the_interruption() -> None:
    control = TurnControl()
    control.interrupt(CANCELLED)
    control.end(FAILED)
    assert control.outcome is CANCELLED
