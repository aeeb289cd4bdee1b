"""One pass per token: a delta written in its producer's step while the outbox's reader is idle
(`tether.core.outbox`, `InlineWriter`), numbered and logged by its run exactly as a queued one."""

from __future__ import annotations

import asyncio

from tests.core.clocks import SetClock
from tests.core.test_outbox import completed, created, delta
from tether.core.delta import Delta
from tether.core.outbox import CoalesceWindow, Outbox
from tether.core.run import ReplayLog, ResponseRun


class Taker:
    """A transport that takes what it is offered while `open`."""

    def __init__(self) -> None:
        self.open = True
        self.written: list[tuple[int, str]] = []

    def write_now(self, d: Delta) -> bool:
        if self.open:
            self.written.append((d.sequence_number, d.delta))
        return self.open


def _box(window: CoalesceWindow, clock: SetClock) -> tuple[Outbox, ResponseRun, Taker]:
    box = Outbox(max_events=16, window=window, max_coalesced_bytes=1 << 16, clock=clock)
    run = ResponseRun("r", log=ReplayLog(100, 1 << 20))
    box.bind(run)
    taker = Taker()
    box.write_inline(taker)
    return box, run, taker


async def _idle_reader(box: Outbox) -> asyncio.Task:
    task = asyncio.create_task(box.get_batch(lazy_deltas=True))
    await asyncio.sleep(0)
    assert not task.done()
    return task


async def test_an_idle_readers_delta_is_written_in_the_producers_step_and_numbered_by_its_run():
    clock = SetClock(monotonic=10.0)
    box, run, taker = _box(CoalesceWindow.fixed(0.0), clock)
    reader = await _idle_reader(box)
    await box.put(created("r"))  # a lifecycle event: always through the queue (the pump reads it)
    assert [ev.sequence_number for ev in await reader] == [0] and taker.written == []
    reader = await _idle_reader(box)
    await box.put(delta("r", "a"))
    await box.put(delta("r", "b"))
    assert taker.written == [(1, "a"), (2, "b")]  # no hop: the reader never woke
    assert not reader.done()
    await box.put(completed("r"))
    assert [ev.sequence_number for ev in await reader] == [3]
    assert [e.sequence_number for e in run.log.since(-1)] == [0, 1, 2, 3]  # the one log, contiguous
    assert box.events_inline == 2 and box.events_out == 4


async def test_a_declined_delta_is_queued_under_the_same_number():
    clock = SetClock(monotonic=10.0)
    box, run, taker = _box(CoalesceWindow.fixed(0.0), clock)
    reader = await _idle_reader(box)
    taker.open = False  # e.g. the socket's writes are paused
    await box.put(delta("r", "a"))
    batch = await reader
    assert [(d.sequence_number, d.delta) for d in batch] == [(0, "a")] and run.next_seq == 1
    taker.open = True
    await _idle_reader(box)
    await box.put(delta("r", "b"))
    assert taker.written == [(1, "b")]


async def test_nothing_overtakes_the_queue_or_a_busy_reader():
    clock = SetClock(monotonic=10.0)
    box, _, taker = _box(CoalesceWindow.fixed(0.0), clock)
    await box.put(delta("r", "a"))  # no reader waiting (it is writing a batch): queued
    await box.put(delta("r", "b"))
    assert taker.written == []
    batch = await box.get_batch(lazy_deltas=True)
    assert [(d.sequence_number, d.delta) for d in batch] == [(0, "ab")]


async def test_the_coalesce_floor_holds_an_inline_delta_but_the_widening_does_not():
    clock = SetClock(monotonic=10.0)
    window = CoalesceWindow(0.008, 1.0, batches_per_s=1.0)
    window.streaming = 100  # a loaded process: the queue's window is 1 s wide
    box, _, taker = _box(window, clock)
    await _idle_reader(box)
    await box.put(delta("r", "a"))
    clock.advance(0.004)
    await box.put(delta("r", "b"))  # within coalesce_ms of the last write: held in the queue
    assert taker.written == [(0, "a")]
    box2, _, taker2 = _box(window, clock)
    await _idle_reader(box2)
    await box2.put(delta("r", "c"))
    clock.advance(0.020)  # past the floor, far inside the widened window: written at once
    await box2.put(delta("r", "d"))
    assert taker2.written == [(0, "c"), (1, "d")]


async def test_a_failing_transport_never_fails_the_producer():
    class Broken:
        def write_now(self, d: Delta) -> bool:
            raise ConnectionResetError("gone")

    clock = SetClock(monotonic=10.0)
    box, run, _ = _box(CoalesceWindow.fixed(0.0), clock)
    box.write_inline(Broken())
    reader = await _idle_reader(box)
    await box.put(delta("r", "a"))  # queued instead: the reader's writer meets the failure
    assert [(d.sequence_number, d.delta) for d in await reader] == [(0, "a")]
    await _idle_reader(box)
    await box.put(delta("r", "b"))  # and the broken writer is not offered again
    assert run.next_seq == 2 and box.events_inline == 0  # "b" committed (numbered 1) and queued
