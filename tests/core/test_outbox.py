"""The transport-neutral writer: coalescing, sequence numbers, backpressure (no timing asserts)."""

from __future__ import annotations

import asyncio

from tests.core.clocks import SetClock
from tether.core.outbox import CoalesceWindow, Outbox, OutboxClosed
from tether.responses.v1 import events_pb2


def delta(rid: str, text: str, item: str = "msg_1") -> events_pb2.ServerEvent:
    ev = events_pb2.ServerEvent(response_id=rid)
    ev.output_text_delta.item_id = item
    ev.output_text_delta.delta = text
    return ev


def created(rid: str) -> events_pb2.ServerEvent:
    ev = events_pb2.ServerEvent(response_id=rid)
    ev.created.response.id = rid
    return ev


def completed(rid: str) -> events_pb2.ServerEvent:
    ev = events_pb2.ServerEvent(response_id=rid)
    ev.completed.response.id = rid
    return ev


async def test_deltas_queued_behind_a_busy_reader_merge_and_numbers_stay_contiguous():
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    await box.put(created("r"))
    for piece in ["a", "b", "c", "d"]:
        await box.put(delta("r", piece))
    await box.put(completed("r"))
    batch = await box.get_batch()
    assert [ev.WhichOneof("event") for ev in batch] == ["created", "output_text_delta", "completed"]
    assert batch[1].output_text_delta.delta == "abcd"
    assert [ev.sequence_number for ev in batch] == [0, 1, 2]


async def test_deltas_of_different_items_or_responses_do_not_merge():
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    await box.put(delta("r", "a", "msg_1"))
    await box.put(delta("r", "b", "msg_2"))
    await box.put(delta("s", "c", "msg_2"))
    batch = await box.get_batch()
    assert [ev.output_text_delta.delta for ev in batch] == ["a", "b", "c"]
    assert [ev.sequence_number for ev in batch] == [0, 1, 0]  # per-response counters


async def test_merge_is_bounded_by_bytes():
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=4)
    for _ in range(6):
        await box.put(delta("r", "xx"))
    batch = await box.get_batch()
    assert [ev.output_text_delta.delta for ev in batch] == ["xxxx", "xxxx", "xxxx"]


async def test_full_queue_blocks_the_producer_until_the_reader_drains():
    box = Outbox(max_events=2, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    await box.put(created("r"))
    await box.put(completed("r"))
    third = asyncio.create_task(box.put(created("s")))
    await asyncio.sleep(0.01)
    assert not third.done()  # backpressure: the producer waits
    assert len(await box.get_batch()) == 2
    await asyncio.wait_for(third, 5)
    assert [ev.response_id for ev in await box.get_batch()] == ["s"]


async def test_window_waits_for_more_deltas_then_sends_one_message():
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.05), max_coalesced_bytes=1 << 16)
    await box.put(delta("r", "first"))
    assert [ev.output_text_delta.delta for ev in await box.get_batch()] == ["first"]  # idle: sent at once

    async def producer():
        for piece in "abc":
            await box.put(delta("r", piece))
            await asyncio.sleep(0.001)

    task = asyncio.create_task(producer())
    batch = await box.get_batch()  # inside the window: later deltas merge into the queued one
    await task
    rest = "".join(ev.output_text_delta.delta for ev in [*batch, *(await box.get_batch() if box._queue else [])])
    assert rest == "abc"
    assert box.events_out < 1 + 3  # fewer messages than deltas


async def test_close_drains_then_ends_and_rejects_new_events():
    box = Outbox(max_events=4, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    await box.put(created("r"))
    box.close()
    assert len(await box.get_batch()) == 1
    assert await box.get_batch() == []
    try:
        await box.put(created("s"))
    except OutboxClosed:
        pass
    else:
        raise AssertionError("put after close must raise")


async def test_merged_deltas_concatenate_their_log_probabilities_in_order():
    import orjson

    from tether.core.delta import Delta

    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    await box.put(created("r"))
    for piece in ["a", "b"]:  # protobuf events (a gRPC-style producer)
        ev = delta("r", piece)
        ev.output_text_delta.logprobs_json = orjson.dumps([{"token": piece, "logprob": -1.0}]).decode()
        await box.put(ev)
    record = Delta("output_text_delta", "msg_1", 0, "cd")  # a builder record: two tokens merged
    record.response_id, record.logprobs = "r", [{"token": "c", "logprob": -2.0}, {"token": "d", "logprob": -3.0}]
    await box.put(record)
    await box.put(delta("r", "e"))  # a delta without any: the merged list keeps the others
    lazy = await box.get_batch(lazy_deltas=True)
    merged = lazy[1]
    assert merged.delta == "abcde" and [lp["token"] for lp in merged.logprobs] == ["a", "b", "c", "d"]
    ev = merged.to_event()
    assert [lp["logprob"] for lp in orjson.loads(ev.output_text_delta.logprobs_json)] == [-1.0, -1.0, -2.0, -3.0]


async def _one_step(coro) -> asyncio.Task:
    """`coro` as a task that has run until its first wait."""
    task = asyncio.create_task(coro)
    await asyncio.sleep(0)
    return task


async def _flushed_at_zero() -> tuple[SetClock, Outbox]:
    """An outbox with a 10 ms window on a set clock, whose last batch (a `created`) left at t = 0:
    a delta put now is inside the window."""
    clock = SetClock()
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.010), max_coalesced_bytes=1 << 16, clock=clock)
    await box.put(created("r"))
    assert len(await box.get_batch()) == 1
    return clock, box


async def test_the_coalescing_window_runs_on_the_outbox_clock():
    clock, box = await _flushed_at_zero()
    await box.put(delta("r", "a"))
    waiting = await _one_step(box.get_batch())
    assert not waiting.done()  # a delta inside the window waits for more
    await box.put(delta("r", "b"))
    await box.put(completed("r"))  # a non-delta ends the wait
    batch = await waiting
    assert [ev.WhichOneof("event") for ev in batch] == ["output_text_delta", "completed"]
    assert batch[0].output_text_delta.delta == "ab"
    clock.advance(0.010)  # the window since that flush is over: the next delta goes at once
    await box.put(delta("s", "c"))
    at_once = await _one_step(box.get_batch())
    assert at_once.done() and [ev.output_text_delta.delta for ev in at_once.result()] == ["c"]


async def test_a_non_delta_queued_behind_a_held_delta_is_not_held_for_the_window():
    """The last text and the terminal event often reach the queue in one step of the turn, before
    the writer asks for a batch: the terminal event must not wait out the delta's window."""
    _, box = await _flushed_at_zero()
    await box.put(delta("r", "last words"))
    await box.put(completed("r"))
    at_once = await _one_step(box.get_batch())
    assert at_once.done()
    assert [ev.WhichOneof("event") for ev in at_once.result()] == ["output_text_delta", "completed"]


async def test_a_slow_stream_is_not_held_for_the_window():
    """Deltas that come more than half a window apart are sent at once, even inside the window
    since the last batch: fewer than two more would come within it, so waiting only adds latency.
    Deltas that come faster are held and merged, as before."""
    clock, box = await _flushed_at_zero()
    await box.put(delta("r", "a"))
    held = await _one_step(box.get_batch())
    assert not held.done()  # how fast this stream is, nobody knows yet: held
    clock.advance(0.006)
    await box.put(delta("r", "b"))  # 6 ms after the last: more than half the 10 ms window
    await box.put(completed("r"))
    assert [ev.WhichOneof("event") for ev in await held] == ["output_text_delta", "completed"]
    clock.advance(0.006)
    await box.put(delta("s", "c"))  # 4 ms before the window since the last batch ends
    at_once = await _one_step(box.get_batch())
    assert at_once.done()  # inside the window, but this stream is slow: at once
    for _ in range(6):  # deltas 1 ms apart: the average falls below half the window
        clock.advance(0.001)
        await box.put(delta("s", "d"))
    assert box.delta_gap is not None and box.delta_gap * 2 < 0.010
    await box.get_batch()
    await box.put(delta("s", "e"))
    held = await _one_step(box.get_batch())
    assert not held.done()  # a fast stream: held for more, as before
    await box.put(completed("s"))
    await held
