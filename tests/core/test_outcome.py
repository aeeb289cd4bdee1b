"""How a turn ends: one outcome, one transition function, the control the session interrupts a
turn through, and the one table from how it ended to the Response's status and terminal event
(no server, no sleeps)."""

from __future__ import annotations

import asyncio

import pytest

from tether import errors
from tether.core.outcome import Ending, Outcome, TurnControl, ending, next_outcome
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


@pytest.mark.parametrize(
    ("outcome", "finish_reason", "expected"),
    [
        (COMPLETED, "stop", Ending("completed", "completed")),
        (COMPLETED, "tool_calls", Ending("completed", "completed")),
        (COMPLETED, None, Ending("completed", "completed")),  # a warm-up: nothing generated
        (COMPLETED, "length", Ending("incomplete", "incomplete", "max_output_tokens")),
        (COMPLETED, "content_filter", Ending("incomplete", "incomplete", "content_filter")),
        (COMPLETED, "something_new", Ending("incomplete", "incomplete", "max_output_tokens")),
        (STEERED, None, Ending("incomplete", "incomplete", "steered")),
        (STEERED, "stop", Ending("incomplete", "incomplete", "steered")),  # a steer wins over the finish
        (CANCELLED, None, Ending("cancelled", "incomplete")),  # no response.cancelled event exists
    ],
)
def test_how_a_turn_ended_decides_status_event_and_reason(outcome: Outcome, finish_reason: str | None,
                                                          expected: Ending) -> None:  # fmt: skip
    assert ending(outcome, finish_reason) == expected


@pytest.mark.parametrize("outcome", [FAILED, CUT])
def test_a_failure_or_a_cut_fails_with_its_error(outcome: Outcome) -> None:
    error = TetherError(errors.BACKEND_TIMEOUT, "too slow")
    end = ending(outcome, "stop", error)
    assert (end.status, end.arm, end.incomplete_reason) == ("failed", "failed", "")
    assert end.error is error


@pytest.mark.parametrize("outcome", [FAILED, CUT, CANCELLED])
def test_an_end_with_nothing_to_report_is_a_cancel(outcome: Outcome) -> None:
    assert ending(outcome, None, None) == Ending("cancelled", "incomplete")


def test_a_cancel_keeps_no_error_on_the_response() -> None:
    end = ending(CANCELLED, None, TetherError(errors.CANCELLED, "The response was cancelled by the client."))
    assert end.status == "cancelled" and end.error is None


def test_a_running_turn_has_no_ending() -> None:
    with pytest.raises(ValueError):
        ending(RUNNING)


def test_the_common_endings_are_shared() -> None:
    # The hot path allocates nothing to end a turn: completed and incomplete endings are constants.
    assert ending(COMPLETED, "stop") is ending(COMPLETED, "tool_calls")
    assert ending(COMPLETED, "length") is ending(COMPLETED, "length")
    assert ending(STEERED) is ending(STEERED)
