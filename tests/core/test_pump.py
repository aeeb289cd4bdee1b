"""The pump without sockets: a recording writer sees the exact batches, and the pump says how the
stream ended (terminal, refused, aborted, shutting down, drained, source ended, writer gone)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from tether.core.delta import Delta, Outgoing
from tether.core.outbox import CoalesceWindow, Outbox
from tether.core.pump import (
    Pump,
    PumpEnd,
    PumpState,
    ResponseEnd,
    connection_error,
    deliver,
    next_pump_state,
    one_response,
)
from tether.core.run import ResponseRun
from tether.errors import IDLE_TIMEOUT, INVALID_REQUEST, SERVER_ERROR, SERVER_SHUTTING_DOWN, TetherError
from tether.responses.v1 import events_pb2


def created(rid: str) -> events_pb2.ServerEvent:
    ev = events_pb2.ServerEvent(response_id=rid)
    ev.created.response.id = rid
    return ev


def delta(rid: str, text: str) -> Delta:
    d = Delta("output_text_delta", "msg_1", 0, text)
    d.response_id = rid
    return d


def terminal(rid: str, arm: str = "completed") -> events_pb2.ServerEvent:
    ev = events_pb2.ServerEvent(response_id=rid)
    getattr(ev, arm).response.id = rid
    getattr(ev, arm).response.status = "completed" if arm == "completed" else arm
    return ev


def error(code: str, rid: str = "") -> events_pb2.ServerEvent:
    ev = events_pb2.ServerEvent(response_id=rid)
    ev.error.error.CopyFrom(TetherError(code, "m").to_proto())
    return ev


async def batches(*items: Sequence[Outgoing]) -> AsyncIterator[Sequence[Outgoing]]:
    for batch in items:
        yield batch


class Recorder:
    """A writer that keeps every batch it is handed; `gone_after`: refuse from that batch on."""

    def __init__(self, gone_after: int | None = None) -> None:
        self.batches: list[list[Outgoing]] = []
        self.gone_after = gone_after
        self.wrote = asyncio.Event()

    async def write(self, batch: Sequence[Outgoing]) -> bool:
        if self.gone_after is not None and len(self.batches) >= self.gone_after:
            return False
        self.batches.append(list(batch))
        self.wrote.set()
        return True

    async def next_write(self) -> None:
        await self.wrote.wait()
        self.wrote.clear()


# -- one-response streams ------------------------------------------------------------------------


async def one(*items: Sequence[Outgoing]) -> tuple[list[Sequence[Outgoing]], ResponseEnd]:
    """`one_response` over `items`: the batches it yields, and its end record (the last thing it yields)."""
    out: list = [x async for x in one_response(batches(*items))]
    assert all(not isinstance(x, ResponseEnd) for x in out[:-1]) and isinstance(out[-1], ResponseEnd)
    return out[:-1], out[-1]


async def test_a_one_response_stream_ends_at_its_terminal_event_and_cuts_the_batch_there():
    c, d, done, late = created("r"), delta("r", "hi"), terminal("r"), error(SERVER_ERROR)
    got, end = await one([c, d], [done, late], [created("s")])
    assert end.end is PumpEnd.TERMINAL and end.event is done
    assert got == [[c, d], [done]]
    assert end.response is done.completed.response
    assert end.error is None


async def test_a_failed_or_incomplete_response_ends_as_terminal_too():
    for arm in ("failed", "incomplete"):
        _, end = await one([created("r")], [terminal("r", arm)])
        assert end.end is PumpEnd.TERMINAL
        assert end.response is not None and end.response.status == arm


async def test_an_error_instead_of_the_response_is_refused_and_left_to_the_transport():
    refusal = error(INVALID_REQUEST)
    got, end = await one([refusal])
    assert got == []  # in no batch: the transport answers it (an HTTP status, an in-band event)
    assert end.end is PumpEnd.REFUSED and end.error is refusal.error.error and end.response is None


async def test_a_connection_scoped_error_after_the_response_began_aborts_it_once_written():
    c, crash = created("r"), error(SERVER_ERROR)
    got, end = await one([c], [delta("r", "x"), crash])
    assert end.end is PumpEnd.ABORTED
    assert got[-1][-1] is crash
    assert end.error is crash.error.error and end.response is None


async def test_an_error_naming_the_response_along_the_way_does_not_end_it():
    c, scoped, done = created("r"), error(INVALID_REQUEST, rid="r"), terminal("r")
    got, end = await one([c, scoped], [done])
    assert end.end is PumpEnd.TERMINAL
    assert got == [[c, scoped], [done]]


async def test_a_one_response_stream_without_its_end_is_source_ended():
    _, end = await one([created("r")], [delta("r", "x")])
    assert end.end is PumpEnd.SOURCE_ENDED and end.response is None and end.error is None


async def test_deliver_writes_the_batches_and_returns_the_end_record_as_it_is():
    c, done = created("r"), terminal("r")
    writer = Recorder()
    end = await deliver(one_response(batches([c], [done])), writer)
    assert writer.batches == [[c], [done]] and end.end is PumpEnd.TERMINAL and end.event is done
    refused = await deliver(one_response(batches([error(INVALID_REQUEST)])), writer)
    assert refused.end is PumpEnd.REFUSED and len(writer.batches) == 2  # nothing written for it
    gone = await deliver(one_response(batches([c], [done])), Recorder(gone_after=0))
    assert gone.end is PumpEnd.WRITER_GONE
    assert (await deliver(batches([c]), Recorder())).end is PumpEnd.SOURCE_ENDED  # a stream with no end record


# -- session streams -----------------------------------------------------------------------------


async def test_a_session_that_ends_shutting_down_says_so():
    bye = error(SERVER_SHUTTING_DOWN)
    writer = Recorder()
    pump = Pump()
    end = await pump.run(batches([created("r"), terminal("r")], [bye]), writer)
    assert end is PumpEnd.SHUTTING_DOWN
    assert writer.batches == [[created("r"), terminal("r")], [bye]]
    assert pump.error is bye.error.error


async def test_a_session_ended_otherwise_is_source_ended_with_its_last_error():
    pump = Pump()
    assert await pump.run(batches([error(SERVER_SHUTTING_DOWN, rid="r")], [error(IDLE_TIMEOUT)]), Recorder()) \
        is PumpEnd.SOURCE_ENDED  # fmt: skip
    assert pump.error is not None and pump.error.code == IDLE_TIMEOUT
    quiet = Pump()
    assert await quiet.run(batches(), Recorder()) is PumpEnd.SOURCE_ENDED and quiet.error is None


async def test_a_request_scoped_shutting_down_error_earlier_is_not_the_end_reason():
    pump = Pump()
    assert await pump.run(batches([error(SERVER_SHUTTING_DOWN)], [created("r")]), Recorder()) \
        is PumpEnd.SOURCE_ENDED  # fmt: skip


async def test_a_writer_that_is_gone_stops_the_pump():
    writer = Recorder(gone_after=1)
    pump = Pump()
    assert await pump.run(batches([created("r")], [delta("r", "x")], [terminal("r")]), writer) is PumpEnd.WRITER_GONE
    assert len(writer.batches) == 1


# -- draining ------------------------------------------------------------------------------------


async def _drain_outbox(box: Outbox) -> AsyncIterator[Sequence[Outgoing]]:
    while batch := await box.get_batch(lazy_deltas=True):
        yield batch


async def test_draining_ends_once_the_sessions_runs_have_ended():
    # A real outbox with a bound run: what is in flight comes from the run, not from event arms.
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    box.bind(ResponseRun("r"))
    assert box.runs_in_flight() == 1  # bound just before its `created` is queued
    writer = Recorder()
    pump = Pump(in_flight=box.runs_in_flight)
    running = asyncio.create_task(pump.run(_drain_outbox(box), writer))
    await box.put(created("r"))
    await writer.next_write()
    assert pump.drain() is False and pump.state is PumpState.DRAINING
    await box.put(delta("r", "x"))
    await writer.next_write()
    assert not running.done()
    await box.put(terminal("r"))
    assert await running is PumpEnd.DRAINED
    assert [ev.WhichOneof("event") for ev in writer.batches[-1] if type(ev) is not Delta] == ["completed"]
    assert box.runs_in_flight() == 0


async def test_draining_with_nothing_in_flight_says_stop_now():
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    pump = Pump(in_flight=box.runs_in_flight)
    assert pump.drain() is True
    assert pump.drain() is True  # asked twice: no change


async def test_a_source_that_cannot_count_has_its_responses_counted_from_the_events():
    gate: asyncio.Queue[Sequence[Outgoing]] = asyncio.Queue()

    async def remote() -> AsyncIterator[Sequence[Outgoing]]:
        while True:
            yield await gate.get()

    writer = Recorder()
    pump = Pump(in_flight=lambda: None)
    running = asyncio.create_task(pump.run(remote(), writer))
    gate.put_nowait([created("r"), created("s")])
    await writer.next_write()
    assert pump.in_flight == 2 and pump.drain() is False
    gate.put_nowait([terminal("r")])
    await writer.next_write()
    assert not running.done() and pump.in_flight == 1
    gate.put_nowait([delta("s", "x"), terminal("s", "incomplete")])
    assert await running is PumpEnd.DRAINED


async def test_a_pump_that_was_not_told_what_is_in_flight_cannot_be_drained():
    with pytest.raises(ValueError):
        Pump().drain()


async def test_a_drain_after_the_end_changes_nothing():
    pump = Pump(in_flight=lambda: 0)
    assert await pump.run(batches(), Recorder()) is PumpEnd.SOURCE_ENDED
    assert pump.drain() is True and pump.state is PumpState.ENDED and pump.end is PumpEnd.SOURCE_ENDED


def test_pump_states_only_go_forward():
    assert next_pump_state(PumpState.RUNNING, PumpState.DRAINING) is PumpState.DRAINING
    assert next_pump_state(PumpState.DRAINING, PumpState.ENDED) is PumpState.ENDED
    with pytest.raises(ValueError):
        next_pump_state(PumpState.ENDED, PumpState.RUNNING)
    with pytest.raises(ValueError):
        next_pump_state(PumpState.DRAINING, PumpState.RUNNING)


def test_connection_error_is_an_error_naming_no_response():
    assert connection_error(error(SERVER_SHUTTING_DOWN)) is not None
    assert connection_error(error(SERVER_SHUTTING_DOWN, rid="r")) is None
    assert connection_error(created("r")) is None
    assert connection_error(delta("r", "x")) is None
