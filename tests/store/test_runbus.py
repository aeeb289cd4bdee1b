"""The run bus (`tether.store.runbus`) on real Redis and PostgreSQL: two replicas (two stores on
the same data, two buses) sharing runs, and the core's side of it (`tether.core.shared_runs`).

Each test gets its own Redis key prefix / PostgreSQL schema (tests/store/conftest.py); a server
that does not answer skips (fails under TETHER_TEST_REQUIRE_SERVERS=1).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tether import errors
from tether.core.delta import Delta
from tether.core.run import ReplayGap, ResponseRun, RunState
from tether.core.shared_runs import SharedRuns
from tether.responses.v1 import events_pb2, response_pb2
from tether.store._common import FencedWrite
from tether.store.base import ResponseRecord
from tether.store.factory import run_bus_for

from .conftest import _spec

T = "tenant-a"


@pytest.fixture(params=["redis", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Any):
    return _spec(request.param, request, tmp_path)


class Replicas:
    def __init__(self, spec: Any, **options: Any) -> None:
        self.spec = spec
        self.options = {"orphan_after_s": 5.0, "max_events": 20_000, "retention_s": 60.0, "live_ttl_s": 600.0,
                        **options}  # fmt: skip
        self.stores: list[Any] = []
        self.buses: list[Any] = []

    async def bus(self, *, start: bool = True, on_cancel: Any = lambda tenant, run_id: None, **options: Any) -> Any:
        store = self.spec.new()
        await store.open()
        self.stores.append(store)
        bus = run_bus_for(store, **{**self.options, **options})
        assert bus is not None
        if start:
            await bus.start(on_cancel)
            self.buses.append(bus)
        return bus

    async def close(self) -> None:
        for bus in self.buses:
            await bus.close()
        for store in self.stores:
            await store.close()


@pytest.fixture
async def replicas(spec: Any):
    r = Replicas(spec)
    try:
        yield r
    finally:
        await r.close()


def _event(seq: int, arm: str = "output_text_delta", rid: str = "resp_1", text: str = "") -> bytes:
    ev = events_pb2.ServerEvent(response_id=rid, sequence_number=seq)
    if arm == "output_text_delta":
        ev.output_text_delta.delta = f"t{seq}{text}"
    else:
        getattr(ev, arm).response.id = rid
        getattr(ev, arm).response.status = "completed" if arm == "completed" else "in_progress"
    return ev.SerializeToString()


def _response(status: str, rid: str = "resp_1") -> bytes:
    return response_pb2.Response(id=rid, status=status).SerializeToString()


async def test_events_published_by_one_replica_are_read_and_followed_on_another(replicas: Replicas) -> None:
    a, b = await replicas.bus(), await replicas.bus()
    await a.publish(T, "resp_1", [(n, _event(n)) for n in range(5)], state="in_progress",
                    response=_response("in_progress"), epoch=1, next_seq=5)  # fmt: skip
    info = await b.info(T, "resp_1")
    assert info is not None
    assert (info.owner, info.state, info.next_seq, info.owner_alive) == (a.replica, "in_progress", 5, True)
    assert response_pb2.Response.FromString(info.response).status == "in_progress"
    assert [s for s, _ in await b.read(T, "resp_1", -1, 0)] == [0, 1, 2, 3, 4]
    assert [s for s, _ in await b.read(T, "resp_1", 2, 0)] == [3, 4]
    assert await b.read(T, "resp_1", 4, 0) == []
    assert await b.info("another-tenant", "resp_1") is None  # tenants never see each other's runs

    waiting = asyncio.create_task(b.read(T, "resp_1", 4, 5.0))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await a.publish(T, "resp_1", [(5, _event(5))], state="in_progress", response=None, epoch=1, next_seq=6)
    got = await waiting
    assert [s for s, _ in got] == [5] and time.monotonic() - started < 1.0  # woken, not polled


async def test_a_final_run_never_changes(replicas: Replicas) -> None:
    a, b = await replicas.bus(), await replicas.bus()
    await a.publish(T, "resp_1", [(0, _event(0, "completed"))], state="completed", response=_response("completed"),
                    epoch=1, next_seq=1)  # fmt: skip
    await a.publish(T, "resp_1", [(1, _event(1))], state="in_progress", response=_response("in_progress"), epoch=1, next_seq=2)
    info = await b.info(T, "resp_1")
    assert info is not None and (info.state, info.next_seq) == ("completed", 1)
    assert [s for s, _ in await b.read(T, "resp_1", -1, 0)] == [0]
    assert not await b.fail_orphan(T, "resp_1", 1, _event(1, "failed"), _response("failed"))


async def test_the_shared_log_is_bounded_by_max_bytes(replicas: Replicas) -> None:
    """`replay_max_bytes` bounds the shared log too: 400 events of ~1 KiB under a 64 KiB bound
    keep about 64 KiB of the newest (Redis exactly; PostgreSQL within a quarter of the bound),
    and a resume from before them is a gap."""
    a = await replicas.bus(max_bytes=64 * 1024)
    b = await replicas.bus()
    pad = "x" * 1000
    for start in range(0, 400, 4):
        await a.publish(T, "resp_1", [(n, _event(n, text=pad)) for n in range(start, start + 4)], state="in_progress",
                        response=_response("in_progress") if start == 0 else None, epoch=1, next_seq=start + 4)  # fmt: skip
    retained = await b.read(T, "resp_1", -1, 0)
    size = sum(len(e) for _, e in retained)
    assert 48 * 1024 <= size <= 64 * 1024 + 16 * 1024 + 4 * 1100, size
    assert [s for s, _ in retained] == list(range(retained[0][0], 400))
    with pytest.raises(ReplayGap):
        await SharedRuns(b, orphan_after_s=5.0).follow(T, "resp_1", 0)


async def test_the_shared_log_is_bounded_by_max_events_and_a_gap_is_reported(replicas: Replicas) -> None:
    a = await replicas.bus(max_events=300)
    b = await replicas.bus(max_events=300)
    for start in range(0, 1000, 10):
        await a.publish(T, "resp_1", [(n, _event(n)) for n in range(start, start + 10)], state="in_progress",
                        response=_response("in_progress") if start == 0 else None, epoch=1, next_seq=start + 10)  # fmt: skip
    retained = await b.read(T, "resp_1", -1, 0)
    first = retained[0][0]
    assert 300 <= len(retained) <= 300 + 256 and [s for s, _ in retained] == list(range(first, 1000))
    shared = SharedRuns(b, orphan_after_s=5.0)
    with pytest.raises(ReplayGap):
        await shared.follow(T, "resp_1", 0)
    events = await shared.follow(T, "resp_1", 998)
    assert events is not None
    assert [e.sequence_number for e in await anext(events)] == [999]


async def test_a_cancel_asked_on_one_replica_reaches_the_owner(replicas: Replicas) -> None:
    asked: list[tuple[str, str]] = []
    got = asyncio.Event()

    def on_cancel(tenant: str, run_id: str) -> None:
        asked.append((tenant, run_id))
        got.set()

    await replicas.bus(on_cancel=on_cancel)
    b = await replicas.bus()
    await b.cancel(T, "resp_1")
    await asyncio.wait_for(got.wait(), 5.0)
    assert asked == [(T, "resp_1")]


async def test_a_run_whose_owner_stopped_heartbeating_ends_failed_once(replicas: Replicas) -> None:
    owner = await replicas.bus(start=False)  # never heartbeats: as good as killed
    b = await replicas.bus()
    await owner.publish(T, "resp_1", [(n, _event(n)) for n in range(3)], state="in_progress",
                        response=_response("in_progress"), epoch=1, next_seq=3)  # fmt: skip
    orphaned: list[str] = []
    shared = SharedRuns(b, orphan_after_s=5.0, on_event=orphaned.append)
    events = await shared.follow(T, "resp_1", -1)
    assert events is not None
    seen = [e async for batch in events for e in batch]
    assert [e.sequence_number for e in seen] == [0, 1, 2, 3]
    last = seen[-1]
    assert last.WhichOneof("event") == "failed" and last.failed.response.error.code == errors.RUN_ORPHANED
    info = await shared.info(T, "resp_1")
    assert info is not None and info.state == "failed" and shared.snapshot("resp_1", info).status == "failed"
    assert orphaned == ["orphaned"]
    assert not await b.fail_orphan(T, "resp_1", 3, _event(3, "failed"), _response("failed"))  # once only
    # the owner comes back: its late events and state are refused (fenced) by the shared log
    assert not await owner.publish(T, "resp_1", [(3, _event(3))], state="in_progress", response=None, epoch=1,
                                   next_seq=4)  # fmt: skip
    assert not await owner.publish(T, "resp_1", [(3, _event(3, "completed"))], state="completed",
                                   response=_response("completed"), epoch=1, next_seq=4)  # fmt: skip
    assert [s for s, _ in await b.read(T, "resp_1", -1, 0)] == [0, 1, 2, 3]
    info = await b.info(T, "resp_1")
    assert info is not None and (info.state, info.next_seq) == ("failed", 4)


async def test_a_run_publishes_one_write_per_batch_of_numbered_events(replicas: Replicas) -> None:
    class Counting:  # the real bus, its publishes counted
        def __init__(self, bus: Any) -> None:
            self.bus, self.calls = bus, []

        def __getattr__(self, name: str) -> Any:
            return getattr(self.bus, name)

        async def publish(self, tenant: str, run_id: str, events: Any, **kw: Any) -> bool:
            self.calls.append(len(events))
            return bool(await self.bus.publish(tenant, run_id, events, **kw))

    a, b = await replicas.bus(), await replicas.bus()
    counting = Counting(a)
    shared = SharedRuns(counting, orphan_after_s=5.0)  # type: ignore[arg-type]
    run = ResponseRun("resp_1", T, response=response_pb2.Response(id="resp_1", status="in_progress"))
    shared.attach(run)
    created = events_pb2.ServerEvent(response_id="resp_1")
    created.created.response.id, created.created.response.status = "resp_1", "in_progress"
    run.stamp(created, "created")
    for n in range(20):  # one outbox batch: numbered in one step of the loop
        d = Delta("output_text_delta", "msg_1", 0, f"t{n} ")
        d.response_id = "resp_1"
        run.stamp(d, None)
    await shared.drain()
    assert counting.calls == [21]
    done = events_pb2.ServerEvent(response_id="resp_1")
    done.completed.response.id, done.completed.response.status = "resp_1", "completed"
    run.stamp(done, "completed")
    await shared.drain()
    assert counting.calls == [21, 1] and run.state is RunState.COMPLETED
    info = await b.info(T, "resp_1")
    assert info is not None and (info.state, info.next_seq) == ("completed", 22)
    events = [events_pb2.ServerEvent.FromString(e) for _, e in await b.read(T, "resp_1", -1, 0)]
    assert [e.sequence_number for e in events] == list(range(22))
    assert "".join(e.output_text_delta.delta for e in events[1:21]) == "".join(f"t{n} " for n in range(20))


async def test_a_queued_run_of_a_silent_replica_is_claimed_by_one_replica_once(replicas: Replicas) -> None:
    dead = await replicas.bus(start=False)  # never heartbeats
    alive = await replicas.bus()
    b, c = await replicas.bus(), await replicas.bus()
    params = b"serialized-params"
    await dead.publish(T, "resp_q", [], state="queued", response=_response("queued", "resp_q"), epoch=1, next_seq=0,
                       params=params)  # fmt: skip
    await alive.publish(T, "resp_kept", [], state="queued", response=_response("queued", "resp_kept"), epoch=1, next_seq=0,
                        params=params)  # fmt: skip
    assert await b.claim(0) == []
    first, second = await asyncio.gather(b.claim(8), c.claim(8))
    claimed = first + second
    assert [(x.tenant, x.run_id, x.params) for x in claimed] == [(T, "resp_q", params)]  # once; not resp_kept
    assert response_pb2.Response.FromString(claimed[0].response).status == "queued"
    winner = b if first else c
    info = await alive.info(T, "resp_q")
    assert info is not None and info.owner == winner.replica and info.owner_alive and info.state == "queued"
    shared = SharedRuns(alive, orphan_after_s=5.0)
    assert (await shared.info(T, "resp_q")).state == "queued"  # queued: taken over, never orphaned
    assert await b.claim(8) == [] and await c.claim(8) == []
    # The claim raised the run's epoch: the old owner, back from a pause, is fenced off; the new one writes.
    assert claimed[0].epoch == 2
    assert not await dead.publish(T, "resp_q", [(0, _event(0))], state="in_progress", response=None, epoch=1,
                                  next_seq=1)  # fmt: skip
    assert await winner.publish(T, "resp_q", [(0, _event(0))], state="in_progress", response=None,
                                epoch=claimed[0].epoch, next_seq=1)  # fmt: skip
    assert (await alive.info(T, "resp_q")).owner == winner.replica


@pytest.mark.parametrize("value", [0, -1])
def test_run_orphan_after_s_must_be_positive(value: float) -> None:
    from tether.config import from_dict

    assert from_dict({"limits": {"run_orphan_after_s": 0.1}}).limits.run_orphan_after_s == 0.1
    with pytest.raises(ValueError, match="limits.run_orphan_after_s"):
        from_dict({"limits": {"run_orphan_after_s": value}})


async def test_memory_and_sqlite_stores_keep_runs_in_one_process(tmp_path: Any) -> None:
    from tether.store.memory import MemoryStore
    from tether.store.sqlite import SqliteStore

    options = {"orphan_after_s": 5.0, "max_events": 10, "retention_s": 1.0, "live_ttl_s": 1.0}
    assert run_bus_for(MemoryStore(), **options) is None
    assert run_bus_for(SqliteStore(str(tmp_path / "x.db")), **options) is None


async def test_an_owner_whose_run_another_replica_ended_is_fenced_once_and_stops_writing(replicas: Replicas) -> None:
    """The core's side of fencing: the owner's next write after another replica ended its run
    is refused; the mirror calls `on_fenced` once, counts it, and writes nothing more; and the
    owner's response write is refused by the store (the run's epoch is now higher)."""
    owner_bus = await replicas.bus(start=False)  # stops heartbeating: as good as paused
    other_bus = await replicas.bus()
    store = replicas.stores[0]
    fenced: list[ResponseRun] = []
    counted: list[str] = []
    owner = SharedRuns(owner_bus, orphan_after_s=5.0, on_event=counted.append, on_fenced=fenced.append)
    run = ResponseRun("resp_f", T, response=response_pb2.Response(id="resp_f", status="in_progress", store=True))
    owner.attach(run)
    created = events_pb2.ServerEvent(response_id="resp_f")
    created.created.response.id, created.created.response.status = "resp_f", "in_progress"
    run.stamp(created, "created")
    await owner.drain()
    other = SharedRuns(other_bus, orphan_after_s=5.0)
    info = await other.info(T, "resp_f")  # the owner is silent: the other replica ends the run
    assert info is not None and info.state == "failed"
    for n in range(3):  # the owner wakes up and goes on
        d = Delta("output_text_delta", "msg_1", 0, f"t{n} ")
        d.response_id = "resp_f"
        run.stamp(d, None)
        await owner.drain()
    assert fenced == [run] and counted == ["fenced"] and run.mirror is not None and run.mirror.fenced
    assert [s for s, _ in await other_bus.read(T, "resp_f", -1, 0)] == [0, 1]  # created, then the failure
    stale = ResponseRecord(tenant=T, response=response_pb2.Response(id="resp_f", status="completed"), input_keys=(),
                           output_keys=(), new_items=(), epoch=run.epoch)  # fmt: skip
    with pytest.raises(FencedWrite):
        await store.put_response(stale)
    assert await store.get_response(T, "resp_f") is None
    other_response = ResponseRecord(tenant=T, response=response_pb2.Response(id="resp_g", status="completed"),
                                    input_keys=(), output_keys=(), new_items=(), epoch=1)  # fmt: skip
    await store.put_response(other_response)  # a run the bus does not know: written
