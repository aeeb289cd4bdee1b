"""A turn's intake of its backend's chunks (tether/core/intake.py) without sockets: what a pushed
run becomes in the outbox, and when a push is held for the turn's task instead."""

from __future__ import annotations

from tether.backends.base import Finish, TextDelta, ToolCallDelta
from tether.core.accounting import OutputCap
from tether.core.builder import OutputBuilder
from tether.core.intake import Intake
from tether.core.outbox import CoalesceWindow, Outbox
from tether.core.outcome import Outcome, TurnControl


def setup(max_events: int = 64, cap: int = 1000, **builder) -> tuple[Intake, Outbox, OutputBuilder, TurnControl]:
    box = Outbox(max_events=max_events, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    b = OutputBuilder(**builder)
    control = TurnControl()
    intake = Intake(b, box, OutputCap(cap), "s1", "resp_1", control)
    intake.armed = True
    return intake, box, b, control


async def batch_texts(box: Outbox) -> list[str]:
    batch = await box.get_batch()
    return [ev.output_text_delta.delta or ev.WhichOneof("event") for ev in batch]


async def test_a_pushed_run_is_built_numbered_and_queued_in_the_same_step():
    intake, box, _, _ = setup()
    assert intake.take([TextDelta("Hel")]) is True
    assert intake.take([TextDelta("lo")]) is True
    batch = await box.get_batch()
    arms = [ev.WhichOneof("event") for ev in batch]
    assert arms == ["output_item_added", "content_part_added", "output_text_delta"]
    assert batch[-1].output_text_delta.delta == "Hello"  # merged at the run's tail
    assert [ev.sequence_number for ev in batch] == [0, 1, 2]
    assert all(ev.response_id == "resp_1" and ev.stream_id == "s1" for ev in batch)
    assert intake.first_at is not None and intake.spent > 0


async def test_a_push_while_the_task_is_busy_is_held_and_later_consumed_first():
    intake, box, _, _ = setup()
    intake.armed = False  # the turn's task is handling what it read itself
    assert intake.take([TextDelta("a")]) is False
    assert intake.take([TextDelta("b")]) is False
    assert box.events_in == 0 and intake.take_held() == [TextDelta("a"), TextDelta("b")]
    intake.armed = True
    intake.held = [TextDelta("x")]
    assert intake.take([TextDelta("y")]) is False  # behind held chunks: held too, in order
    assert intake.take_held() == [TextDelta("x"), TextDelta("y")]


async def test_an_interrupted_turn_takes_no_more_pushes():
    intake, box, _, control = setup()
    control.interrupt(Outcome.CANCELLED)
    assert intake.take([TextDelta("late")]) is False
    assert box.events_in == 0 and intake.held == [TextDelta("late")]


async def test_a_full_outbox_leaves_the_rest_in_order_for_the_task():
    intake, box, _, _ = setup(max_events=2)
    assert intake.take([TextDelta("a")]) is False  # item added + part added fill it; the delta waits
    assert [ev.WhichOneof("event") if not hasattr(ev, "pieces") else "delta" for ev in intake.backlog] == ["delta"]
    assert intake.take([TextDelta("b")]) is False and intake.held == [TextDelta("b")]
    assert await batch_texts(box) == ["output_item_added", "content_part_added"]
    while intake.backlog:  # what Turn.stream does with it
        await box.put(intake.backlog.popleft())
    intake.consume(intake.take_held())
    assert await batch_texts(box) == ["ab"]


async def test_past_the_output_cap_or_max_tool_calls_a_push_stops_the_stream():
    intake, box, b, _ = setup(cap=3)
    assert intake.take([TextDelta("abcdefghij klmnop qrstuv wxyz")]) is False
    assert intake.stopped and b.finish == Finish(reason="length")
    intake, box, b, _ = setup(max_tool_calls=1)
    assert intake.take([ToolCallDelta(0, "{}", "call_1", "f"), ToolCallDelta(1, "{}", "call_2", "g")]) is False
    assert intake.stopped
    assert intake.take([TextDelta("more")]) is False and intake.held == [TextDelta("more")]


async def test_a_failure_while_handling_a_push_is_kept_for_the_task():
    intake, box, _, _ = setup()
    box.close()
    assert intake.take([TextDelta("a")]) is False
    assert type(intake.error).__name__ == "OutboxClosed"
    assert intake.take([TextDelta("b")]) is False and intake.held == [TextDelta("b")]
