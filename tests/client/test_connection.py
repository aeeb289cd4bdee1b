"""How the client routes one connection's events to its creates, without a socket: an in-memory
bidi call records exactly what the client writes and delivers exactly the events a test feeds,
and an owner records what the connection hands back to its session. (grpcio-testing's fake
channel is blocking and cannot carry the grpc.aio client: see docs/architecture.md, "Design notes".)"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from tether import errors
from tether.client._connection import Connection, ConnectionLost
from tether.client._streams import Pending, ResponseStream
from tether.errors import TetherError
from tether.responses.v1 import events_pb2, request_pb2, response_pb2, service_pb2


class MemoryCall:
    """The part of `grpc.aio.StreamStreamCall` a `Connection` uses, in memory."""

    def __init__(self) -> None:
        self.written: list[service_pb2.SessionRequest] = []
        self._incoming: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = False

    async def write(self, request: service_pb2.SessionRequest) -> None:
        self.written.append(request)

    async def read(self) -> Any:
        return await self._incoming.get()

    def cancel(self) -> bool:
        self.cancelled = True
        self._incoming.put_nowait(grpc.aio.EOF)
        return True

    def deliver(self, *events: events_pb2.ServerEvent) -> None:
        self._incoming.put_nowait(service_pb2.SessionResponse(events=list(events)))


class RecordingOwner:
    def __init__(self) -> None:
        self.closed = False
        self.resubmitted: list[Pending] = []
        self.resumed: list[Pending] = []
        self.completed: list[tuple[str, str]] = []
        self.unrouted_events: list[events_pb2.ServerEvent] = []
        self.ending: list[str] = []
        self.ended = 0

    def resubmit(self, p: Pending, *, delay: float | None, cause: TetherError | None = None) -> None:
        self.resubmitted.append(p)

    def lane_completed(self, lane: str, response_id: str) -> None:
        self.completed.append((lane, response_id))

    def resume(self, p: Pending, *, cause: TetherError) -> None:
        self.resumed.append(p)

    def unrouted(self, ev: events_pb2.ServerEvent) -> None:
        self.unrouted_events.append(ev)

    def connection_ending(self, conn: Connection, err: TetherError) -> None:
        self.ending.append(err.code)

    def connection_ended(self, conn: Connection) -> None:
        self.ended += 1


async def _no_cancel(p: Pending) -> None:
    raise AssertionError("not used here")


def create(lane: str, text: str) -> ResponseStream:
    params = request_pb2.ResponseCreateParams(model="m", stream_id=lane, instructions=text)
    return ResponseStream(lane, params, _no_cancel)


def created(lane: str, rid: str) -> events_pb2.ServerEvent:
    return events_pb2.ServerEvent(stream_id=lane, response_id=rid, created=events_pb2.ResponseEvent(
        response=response_pb2.Response(id=rid, status="in_progress")))


def completed(lane: str, rid: str) -> events_pb2.ServerEvent:
    return events_pb2.ServerEvent(stream_id=lane, response_id=rid, completed=events_pb2.ResponseEvent(
        response=response_pb2.Response(id=rid, status="completed")))


def error(lane: str, code: str) -> events_pb2.ServerEvent:
    return events_pb2.ServerEvent(stream_id=lane, error=events_pb2.ErrorEvent(error=TetherError(code, code).to_proto()))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def sent(call: MemoryCall) -> list[tuple[str, str]]:
    """What the client wrote: (a create's lane, its instructions) or ("cancel", response id)."""
    out = []
    for r in call.written:
        if r.HasField("create"):
            out.append((r.create.stream_id, r.create.instructions))
        else:
            out.append(("cancel", r.cancel.response_id))
    return out


@pytest.fixture
async def wired() -> Any:
    call, owner = MemoryCall(), RecordingOwner()
    conn = Connection(owner, call, 1)  # type: ignore[arg-type]
    yield call, owner, conn
    conn.cancel()
    await asyncio.gather(conn.reader, return_exceptions=True)


async def test_one_unacknowledged_create_per_lane(wired: Any) -> None:
    call, owner, conn = wired
    a1, a2, b1 = create("a", "a1"), create("a", "a2"), create("b", "b1")
    for s in (a1, a2, b1):
        conn.submit(s.pending)
    await settle()
    assert sent(call) == [("a", "a1"), ("b", "b1")]  # a2 waits for a1's acknowledgement
    call.deliver(created("a", "resp_1"))
    await settle()
    assert sent(call) == [("a", "a1"), ("b", "b1"), ("a", "a2")]
    assert (a1.id, a2.id, b1.id) == ("resp_1", None, None)
    call.deliver(completed("a", "resp_1"), created("b", "resp_2"), created("a", "resp_3"))
    await settle()
    assert (await a1.final_response()).status == "completed"
    assert (b1.id, a2.id) == ("resp_2", "resp_3")
    assert owner.completed == [("a", "resp_1")]


async def test_an_error_without_a_response_id_answers_the_lanes_pending_create(wired: Any) -> None:
    call, owner, conn = wired
    first, second = create("", "first"), create("", "second")
    conn.submit(first.pending)
    conn.submit(second.pending)
    call.deliver(error("", errors.PREVIOUS_RESPONSE_NOT_FOUND))
    await settle()
    with pytest.raises(TetherError) as refused:
        await first.final_response()
    assert (refused.value.code, refused.value.status) == (errors.PREVIOUS_RESPONSE_NOT_FOUND, 400)
    assert sent(call) == [("", "first"), ("", "second")]  # the lane moves on
    assert owner.resubmitted == [] and owner.unrouted_events == []


async def test_a_cancel_before_the_acknowledgement_is_sent_with_it(wired: Any) -> None:
    call, owner, conn = wired
    stream = create("x", "slow")
    conn.submit(stream.pending)
    stream.pending.cancel_requested = True
    call.deliver(created("x", "resp_9"))
    await settle()
    assert sent(call) == [("x", "slow"), ("cancel", "resp_9")]


async def test_the_server_going_away_hands_an_unstarted_create_back(wired: Any) -> None:
    call, owner, conn = wired
    generating, unstarted = create("a", "generating"), create("b", "unstarted")
    conn.submit(generating.pending)
    conn.submit(unstarted.pending)
    call.deliver(created("a", "resp_1"), error("b", errors.SERVER_SHUTTING_DOWN))
    await settle()
    assert owner.resubmitted == [unstarted.pending] and owner.ending == [errors.SERVER_SHUTTING_DOWN]
    assert conn.draining and not conn.closed  # resp_1 may still finish here
    call.cancel()  # the server ends the call before resp_1 finished
    await settle()
    with pytest.raises(ConnectionLost) as lost:
        await generating.final_response()
    assert (lost.value.code, lost.value.reason) == (errors.CONNECTION_LOST, errors.SERVER_SHUTTING_DOWN)
    assert owner.ended == 1 and owner.resumed == []  # announced: not resumed


async def test_an_unannounced_drop_hands_a_stored_generating_response_to_be_resumed(wired: Any) -> None:
    call, owner, conn = wired
    stored, unstored = create("a", "stored"), create("b", "unstored")
    unstored.params.store = False
    conn.submit(stored.pending)
    conn.submit(unstored.pending)
    call.deliver(created("a", "resp_1"), created("b", "resp_2"))
    await settle()
    call.cancel()  # the connection drops; the server said nothing
    await settle()
    assert owner.resumed == [stored.pending] and not stored.done
    with pytest.raises(ConnectionLost):
        await unstored.final_response()
