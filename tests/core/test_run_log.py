"""A background run's events written straight into its run (`tether.core.background.RunLog`):
numbered contiguously from 0 as they are committed, deltas merged within the coalescing window as
an outbox merges them, the text always before the event that follows it."""

from __future__ import annotations

import asyncio

import pytest

from tether.core.background import RunLog
from tether.core.delta import Delta
from tether.core.outbox import CoalesceWindow, OutboxClosed
from tether.core.run import ReplayLog, ResponseRun
from tether.responses.v1 import events_pb2


def delta(rid: str, text: str, item: str = "msg_1") -> Delta:
    d = Delta("output_text_delta", item, 0, text)
    d.response_id = rid
    return d


def event(rid: str, arm: str) -> events_pb2.ServerEvent:
    ev = events_pb2.ServerEvent(response_id=rid)
    getattr(ev, arm).response.id = rid
    getattr(ev, arm).response.status = "completed" if arm == "completed" else "in_progress"
    return ev


def logged(run: ResponseRun) -> list:
    assert run.log is not None
    return run.log.since(-1)


def texts(run: ResponseRun) -> list[str]:
    return [e.delta if type(e) is Delta else e.WhichOneof("event") for e in logged(run)]


async def test_events_are_numbered_from_zero_and_deltas_merge_within_the_window() -> None:
    run = ResponseRun("resp_1", "t", log=ReplayLog(100, 1 << 20))
    sink = RunLog(run, window=CoalesceWindow.fixed(60.0), max_coalesced_bytes=1 << 20)
    sink.bind(run)
    await sink.put(event("resp_1", "created"))
    await sink.put(delta("resp_1", "a"))  # within the window of `created`: held
    await sink.put(delta("resp_1", "b"))  # more of the same text: merged
    await sink.put(delta("resp_1", "c", item="msg_2"))  # other content: the held one is committed
    await sink.put(event("resp_1", "completed"))  # the text goes before it
    assert texts(run) == ["created", "ab", "c", "completed"]
    assert [e.sequence_number for e in logged(run)] == [0, 1, 2, 3]
    assert run.state.final and run.next_seq == 4


async def test_a_delta_after_an_idle_window_is_committed_at_once_and_a_held_one_at_the_window_end() -> None:
    run = ResponseRun("resp_1", "t", log=ReplayLog(100, 1 << 20))
    sink = RunLog(run, window=CoalesceWindow.fixed(0.05), max_coalesced_bytes=1 << 20)
    await sink.put(delta("resp_1", "first"))  # nothing committed before: no window to wait
    assert texts(run) == ["first"]
    await sink.put(delta("resp_1", "second"))  # within the window: held...
    assert texts(run) == ["first"]
    await asyncio.sleep(0.1)  # ...until its end, with nothing else coming
    assert texts(run) == ["first", "second"]


async def test_a_protobuf_delta_is_logged_as_a_record_and_other_responses_events_are_not_logged() -> None:
    run = ResponseRun("resp_1", "t", log=ReplayLog(100, 1 << 20))
    sink = RunLog(run, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 20)
    ev = events_pb2.ServerEvent(response_id="resp_1")
    ev.output_text_delta.item_id, ev.output_text_delta.delta = "msg_1", "hi"
    await sink.put(ev)
    refusal = events_pb2.ServerEvent()  # an error of no response: no reader here (the run reports it)
    refusal.error.error.code = "invalid_request_error"
    await sink.put(refusal)
    assert [type(e) for e in logged(run)] == [Delta] and texts(run) == ["hi"]


async def test_the_runs_ending_goes_behind_its_held_text_and_nothing_comes_after_close() -> None:
    run = ResponseRun("resp_1", "t", log=ReplayLog(100, 1 << 20))
    sink = RunLog(run, window=CoalesceWindow.fixed(60.0), max_coalesced_bytes=1 << 20)
    sink.bind(run)
    await sink.put(event("resp_1", "created"))
    await sink.put(delta("resp_1", "partial"))
    run.close(None)  # no terminal event came from the turn: it ends cancelled, through the sink
    sink.close()
    assert texts(run) == ["created", "partial", "incomplete"] and run.state.final
    assert [e.sequence_number for e in logged(run)] == [0, 1, 2]
    with pytest.raises(OutboxClosed):
        await sink.put(delta("resp_1", "late"))
