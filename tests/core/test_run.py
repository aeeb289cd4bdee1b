"""The response run without sockets: its state machine, sequence numbers, the bounded replay log,
subscribers reading `after=n`, and the registry's retention and background bounds."""

from __future__ import annotations

import asyncio
import itertools
import tracemalloc

import pytest

from tether import errors
from tether.core.delta import Delta
from tether.core.outbox import CoalesceWindow, Outbox
from tether.core.run import (
    FINAL,
    WAKE_PER_PASS,
    ReplayGap,
    ReplayLog,
    ResponseRun,
    Runs,
    RunState,
    next_run_state,
)
from tether.errors import TetherError
from tether.responses.v1 import events_pb2, response_pb2


def _event(arm: str, status: str = "in_progress", rid: str = "resp_1") -> events_pb2.ServerEvent:
    ev = events_pb2.ServerEvent(response_id=rid)
    r = getattr(ev, arm).response
    r.id, r.status = rid, status
    return ev


def _delta(text: str, rid: str = "resp_1") -> Delta:
    d = Delta("output_text_delta", "msg_1", 0, text)
    d.response_id = rid
    return d


def _runs(**kw: object) -> Runs:
    args = dict(max_events=100, max_bytes=1 << 20, retention_s=60.0, max_finished=10, background_per_tenant=2,
                background_per_process=3)  # fmt: skip
    args.update(kw)
    return Runs(**args)  # type: ignore[arg-type]


# -- the state machine --------------------------------------------------------------------------


def test_every_transition_of_the_table() -> None:
    allowed = {
        (RunState.QUEUED, RunState.IN_PROGRESS), (RunState.QUEUED, RunState.FAILED),
        (RunState.QUEUED, RunState.CANCELLED),
        *((RunState.IN_PROGRESS, final) for final in FINAL),
    }  # fmt: skip
    for current, wanted in itertools.product(RunState, RunState):
        got = next_run_state(current, wanted)
        assert got is (wanted if (current, wanted) in allowed else current), (current, wanted)


def test_final_states_never_move_and_queued_cannot_complete_without_running() -> None:
    for final in FINAL:
        assert all(next_run_state(final, wanted) is final for wanted in RunState)
    assert next_run_state(RunState.QUEUED, RunState.COMPLETED) is RunState.QUEUED
    assert next_run_state(RunState.IN_PROGRESS, RunState.QUEUED) is RunState.IN_PROGRESS


def test_events_drive_the_state_and_number_contiguously() -> None:
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20), state=RunState.QUEUED)
    entries = [_event("created"), _event("in_progress"), _delta("a"), _delta("b"), _event("completed", "completed")]
    ended = [run.stamp(e, None if isinstance(e, Delta) else e.WhichOneof("event")) for e in entries]
    assert ended == [False, False, False, False, True]
    assert [e.sequence_number for e in entries] == [0, 1, 2, 3, 4]
    assert run.state is RunState.COMPLETED and run.response.status == "completed"


def test_a_cancelled_response_ends_the_run_cancelled() -> None:
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    run.stamp(_event("created"), "created")
    run.stamp(_event("incomplete", "cancelled"), "incomplete")
    assert run.state is RunState.CANCELLED


async def test_close_ends_a_run_without_terminal_event_with_one() -> None:
    failed = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20), response=response_pb2.Response(id="resp_1", status="queued"),
                         state=RunState.QUEUED)  # fmt: skip
    failed.close(TetherError(errors.MODEL_NOT_FOUND, "no such model"))
    assert failed.state is RunState.FAILED and failed.settled
    (last,) = failed.log.since(-1)
    assert last.WhichOneof("event") == "failed" and last.failed.response.error.code == errors.MODEL_NOT_FOUND

    cancelled = ResponseRun("resp_2", log=ReplayLog(100, 1 << 20), state=RunState.QUEUED)
    cancelled.close(None)
    assert cancelled.state is RunState.CANCELLED and cancelled.snapshot().status == "cancelled"
    (last,) = cancelled.log.since(-1)
    assert last.WhichOneof("event") == "incomplete"  # no response.cancelled event exists


async def test_close_after_a_produced_terminal_event_only_settles() -> None:
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    run.terminal_produced = True  # queued in an outbox, not numbered yet
    run.close(None)
    assert run.state is RunState.IN_PROGRESS and run.settled and len(run.log) == 0


# -- the replay log -------------------------------------------------------------------------------


def test_replay_log_is_bounded_by_events_and_bytes() -> None:
    log = ReplayLog(max_events=3, max_bytes=1 << 20)
    run = ResponseRun("resp_1", log=log)
    for text in "abcde":
        run.stamp(_delta(text), None)
    assert len(log) == 3 and log.first_seq == 2
    assert [e.sequence_number for e in log.since(1)] == [2, 3, 4]
    assert [e.sequence_number for e in log.since(3)] == [4]
    assert log.since(4) == []
    with pytest.raises(ReplayGap):
        log.since(0)

    by_bytes = ReplayLog(max_events=100, max_bytes=10)
    run = ResponseRun("resp_2", log=by_bytes)
    for _ in range(4):
        run.stamp(_delta("xxxx"), None)  # 4 bytes each: 12 > 10 drops the oldest
    assert len(by_bytes) == 2 and by_bytes.nbytes == 8 and by_bytes.first_seq == 2


def test_a_read_of_the_replay_log_copies_only_the_new_events() -> None:
    """A follower's read costs what it returns, not the log's length: reading the newest event
    of a 20,000-event log allocates a one-element list, not a copy of the log (hundreds of
    followers read on every wake-up)."""
    log = ReplayLog(max_events=20_000, max_bytes=1 << 30)
    run = ResponseRun("resp_1", log=log)
    for _ in range(20_000 + 500):  # past the bound: the oldest were dropped, the rest kept in order
        run.stamp(_delta("x"), None)
    assert len(log) == 20_000 and log.first_seq == 500
    assert [e.sequence_number for e in log.since(20_497)] == [20_498, 20_499]
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        for after in range(20_400, 20_499):
            assert len(log.since(after)) == 20_499 - after
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - start < 20_000 * 8 // 4, f"a read allocated {peak - start} bytes (a copy of the log: 160 kB)"


async def test_subscribers_replay_after_n_then_follow_live_until_the_end() -> None:
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    run.stamp(_event("created"), "created")
    run.stamp(_delta("a"), None)

    async def read(after: int) -> list[int]:
        return [e.sequence_number async for batch in run.follow(after) for e in batch]

    early, late = asyncio.create_task(read(-1)), asyncio.create_task(read(0))
    await asyncio.sleep(0)
    run.stamp(_delta("b"), None)
    await asyncio.sleep(0)
    run.stamp(_event("completed", "completed"), "completed")
    assert await early == [0, 1, 2, 3]
    assert await late == [1, 2, 3]
    assert await read(3) == []  # caught up with an ended run: nothing more


async def test_a_cancelled_subscriber_does_not_stop_the_others() -> None:
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    run.stamp(_event("created"), "created")

    async def read() -> list[int]:
        return [e.sequence_number async for batch in run.follow(0) for e in batch]

    gone, stays = asyncio.create_task(read()), asyncio.create_task(read())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    run.stamp(_event("completed", "completed"), "completed")
    assert await stays == [1]


# -- the outbox numbers through the run -----------------------------------------------------------


async def test_the_outbox_numbers_merged_deltas_once_and_logs_what_left() -> None:
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    box.bind(run)
    await box.put(_event("created"))
    for text in "abc":
        await box.put(_delta(text))
    await box.put(_event("completed", "completed"))
    batch = await box.get_batch(lazy_deltas=True)
    assert [e.sequence_number for e in batch] == [0, 1, 2]
    assert [e.sequence_number for e in run.log.since(-1)] == [0, 1, 2] and run.log.since(0)[0].delta == "abc"
    assert run.state is RunState.COMPLETED


# -- the registry ---------------------------------------------------------------------------------


def test_only_stored_responses_are_registered_and_logged() -> None:
    runs = _runs()
    stored = runs.open("t", response_pb2.Response(id="resp_s", store=True), control=None)
    unstored = runs.open("t", response_pb2.Response(id="resp_u", store=False), control=None)
    assert stored.recorded and not unstored.recorded
    assert runs.get("t", "resp_s") is stored and runs.get("t", "resp_u") is None
    assert runs.get("other-tenant", "resp_s") is None


def test_finished_runs_are_kept_for_the_retention_then_dropped() -> None:
    now = [0.0]
    runs = _runs(retention_s=10.0, max_finished=2, clock=lambda: now[0])
    for i in range(3):
        run = runs.open("t", response_pb2.Response(id=f"resp_{i}", store=True), control=None)
        run.stamp(_event("completed", "completed", f"resp_{i}"), "completed")
    assert runs.get("t", "resp_0") is None  # past max_finished
    assert runs.get("t", "resp_2") is not None
    now[0] = 11.0
    assert runs.get("t", "resp_2") is None  # past the retention


def test_background_admission_is_bounded_per_tenant_and_per_process() -> None:
    runs = _runs(background_per_tenant=2, background_per_process=3)
    reserved = [runs.reserve("a", response_pb2.Response(id=f"resp_a{i}", status="queued")) for i in range(2)]
    with pytest.raises(TetherError) as per_key:
        runs.admit_background("a")
    assert per_key.value.code == errors.RATE_LIMIT_EXCEEDED and per_key.value.status == 429
    runs.admit_background("b")  # another key still fits
    runs.reserve("b", response_pb2.Response(id="resp_b0", status="queued"))
    with pytest.raises(TetherError) as per_process:
        runs.admit_background("c")
    assert "this server" in per_process.value.message
    assert runs.background_counts() == (3, 0)
    reserved[0].close(None)  # cancelled while queued: its slot is free again
    runs.admit_background("a")
    assert runs.background_counts() == (2, 0)


async def test_close_commits_its_terminal_event_behind_the_events_still_in_the_outbox() -> None:
    box = Outbox(max_events=16, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    box.bind(run)
    await box.put(_event("created"))
    await box.put(_delta("a"))
    run.close(None)  # the turn was cancelled before its own terminal event
    assert run.state is RunState.CANCELLED and run.settled  # the run decides, when the ending is committed
    assert [e.sequence_number for e in run.log.since(-1)] == [0, 1, 2]
    assert box.runs_in_flight() == 1  # its ending has not left this outbox yet
    batch = await box.get_batch(lazy_deltas=True)
    assert [e.sequence_number for e in batch] == [0, 1, 2] and batch[-1].incomplete.response.status == "cancelled"
    assert box.runs_in_flight() == 0


def test_finished_runs_are_bounded_by_their_bytes_per_process() -> None:
    runs = _runs(finished_bytes=100, max_finished=100)
    for i in range(3):
        run = runs.open("t", response_pb2.Response(id=f"resp_{i}", store=True), control=None)
        run.stamp(_delta("x" * 45, f"resp_{i}"), None)  # 45 bytes of log each
        run.stamp(_event("completed", "completed", f"resp_{i}"), "completed")
    kept = [i for i in range(3) if runs.get("t", f"resp_{i}") is not None]
    assert kept == [2]  # ~65 bytes each: two would pass 100; the oldest went first
    assert runs.get("t", "resp_2") is not None
    runs.forget("t", "resp_2")  # a deleted response's log goes at once
    assert runs.get("t", "resp_2") is None


async def test_each_subscriber_batches_what_was_logged_since_its_last_batch() -> None:
    """A subscriber keeping up gets each event as it is logged; one that comes late (or reads
    slowly) gets everything logged meanwhile as one batch: its own view, same numbers."""
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    run.stamp(_event("created"), "created")
    live: list[list[int]] = []

    async def keep_up() -> None:
        async for batch in run.follow(-1):
            live.append([e.sequence_number for e in batch])

    reader = asyncio.create_task(keep_up())
    await asyncio.sleep(0.01)
    for text in "abcd":
        run.stamp(_delta(text), None)
        await asyncio.sleep(0.01)  # the live subscriber takes each one before the next
    run.stamp(_event("completed", "completed"), "completed")
    await reader
    late = [[e.sequence_number for e in batch] async for batch in run.follow(0)]
    assert live == [[0], [1], [2], [3], [4], [5]]
    assert late == [[1, 2, 3, 4, 5]]


def test_a_disowned_run_is_forgotten_in_flight_or_finished_and_frees_its_background_slot() -> None:
    """A run whose shared writes were fenced off (another replica ended it or took it over) is no
    longer this process's: neither in flight nor among the finished runs (its local log and
    ending are not the run's), and its background admission is given back."""
    runs = _runs()
    queued = runs.reserve("t", response_pb2.Response(id="resp_q", status="queued"))
    assert runs.background_counts() == (1, 0)
    runs.disown(queued)
    assert runs.get("t", "resp_q") is None and runs.background_counts() == (0, 0)
    runs.admit_background("t")  # its slot is free again
    finished = runs.open("t", response_pb2.Response(id="resp_f", store=True), None)
    finished.close(TetherError(errors.SERVER_ERROR, "ended here"))
    assert runs.get("t", "resp_f") is finished and finished.state is RunState.FAILED
    runs.disown(finished)
    assert runs.get("t", "resp_f") is None
    queued.close(None)  # its late ending changes nothing here
    assert runs.get("t", "resp_q") is None and runs.background_counts() == (0, 0)


def _bound_box(max_events: int = 16) -> tuple[Outbox, ResponseRun]:
    box = Outbox(max_events=max_events, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    box.bind(run)
    return box, run


async def test_an_event_is_numbered_and_logged_when_its_producer_puts_it() -> None:
    box, run = _bound_box()
    await box.put(_event("created"))
    await box.put(_delta("a"))
    await box.put(_delta("b"))  # joins the tail: nobody has read it
    logged = run.log.since(-1)  # before the connection read anything
    assert [e.sequence_number for e in logged] == [0, 1] and logged[1].delta == "ab"
    batch = await box.get_batch(lazy_deltas=True)
    assert [(e.sequence_number, type(e) is Delta) for e in batch] == [(0, False), (1, True)]
    assert batch[1] is logged[1]  # the connection sends the entry the log holds


async def test_a_follower_that_reads_the_tail_freezes_it_for_everyone() -> None:
    box, run = _bound_box()
    follower = run.follow()
    await box.put(_delta("a"))
    assert [(e.sequence_number, e.delta) for e in await anext(follower)] == [(0, "a")]
    await box.put(_delta("b"))  # the tail was read: an entry of its own
    assert [(e.sequence_number, e.delta) for e in await anext(follower)] == [(1, "b")]
    batch = await box.get_batch(lazy_deltas=True)
    assert [(e.sequence_number, e.delta) for e in batch] == [(0, "a"), (1, "b")]  # the same numbers
    await box.put(_delta("c"))
    await box.put(_delta("d"))  # the batch froze "b": "c" is new, "d" joins it
    assert [(e.sequence_number, e.delta) for e in run.log.since(1)] == [(2, "cd")]
    await follower.aclose()


async def test_a_discarding_outbox_commits_to_its_runs_and_never_blocks_its_producer() -> None:
    box, run = _bound_box(max_events=1)
    await box.put(_event("created"))
    box.discard()  # its client went away
    async with asyncio.timeout(1):
        for i in range(5):
            await box.put(_event("in_progress"))
            await box.put(_delta(str(i)))
        await box.put(_event("completed", "completed"))
    assert [e.sequence_number for e in run.log.since(-1)] == list(range(12))
    assert run.state is RunState.COMPLETED and box.runs_in_flight() == 0


# -- frames: encoded once per run, in the log's byte bound ----------------------------------------


class _Encoder:
    """A stand-in wire encoding of `size` bytes per entry that counts its calls."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls = 0

    def __call__(self, entry: object) -> bytes:
        self.calls += 1
        return b"%d:" % entry.sequence_number + b"f" * (self.size - len(b"%d:" % entry.sequence_number))  # type: ignore[attr-defined]


async def test_an_entry_is_encoded_once_for_all_the_followers_of_its_run() -> None:
    """Every follower of a run sends the same bytes for an event (its number is fixed once it
    is logged): the first to ask encodes it, the others get that very frame from the log."""
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    encode = _Encoder(10)
    run.stamp(_event("created"), "created")
    sent: list[list[bytes]] = [[] for _ in range(50)]

    async def follow(out: list[bytes]) -> None:
        async for batch in run.follow(-1):
            out.extend(batch.log.frame(e, encode) for e in batch)

    readers = [asyncio.create_task(follow(out)) for out in sent]
    await asyncio.sleep(0)
    for text in "abc":
        run.stamp(_delta(text), None)
        await asyncio.sleep(0)
    run.stamp(_event("completed", "completed"), "completed")
    await asyncio.gather(*readers)
    assert encode.calls == 5  # one per event, not one per event and follower
    assert all(len(out) == 5 and all(f is g for f, g in zip(out, sent[0], strict=True)) for out in sent)
    late = [f async for batch in run.follow(1) for f in (batch.log.frame(e, encode) for e in batch)]
    assert encode.calls == 5 and late == sent[0][2:]


def test_cached_frames_count_in_the_log_bytes_at_and_past_the_bound() -> None:
    encode = _Encoder(10)

    run = ResponseRun("resp_1")

    def logged(max_bytes: int, *texts: str) -> tuple[ReplayLog, list[Delta]]:
        nonlocal run
        log = ReplayLog(100, max_bytes)
        run = ResponseRun("resp_1", log=log)
        deltas = [_delta(t) for t in texts]
        for d in deltas:
            run.stamp(d, None)
        return log, deltas

    # At the bound: two 1-byte entries and their 10-byte frames fill 22 bytes exactly.
    log, (a, b) = logged(22, "a", "b")
    assert log.frame(a, encode) == encode(a) and log.frame(b, encode) == encode(b)
    assert log.nbytes == 22 and len(log) == 2 and log.first_seq == 0
    calls = encode.calls
    log.frame(a, encode), log.frame(b, encode)
    assert encode.calls == calls  # both cached
    # Past it by one byte: caching the newest frame drops the oldest entry with its frame.
    log, (a, b) = logged(21, "a", "b")
    log.frame(a, encode), log.frame(b, encode)
    assert log.nbytes == 11 and len(log) == 1 and log.first_seq == 1
    with pytest.raises(ReplayGap):
        log.since(-1)
    # A frame that could never fit (with its entry, 11 > 10 bytes) is returned, not kept.
    log, (a,) = logged(10, "a")
    calls = encode.calls
    assert log.frame(a, encode) == encode(a) and log.nbytes == 1
    log.frame(a, encode)
    assert encode.calls == calls + 3
    # One that the newer entries leave no room for drops nothing: never the entry itself nor a newer one.
    log, (a, b) = logged(15, "a", "b" * 5)
    log.frame(a, encode)
    assert log.nbytes == 6 and len(log) == 2 and log.first_seq == 0
    # Appends drop the oldest entries with their frames, all in the same bound.
    log, (a, b) = logged(30, "a", "b")
    log.frame(a, encode), log.frame(b, encode)
    run.stamp(_delta("c" * 9), None)  # 22 + 9 > 30: the oldest entry and its frame go
    assert log.nbytes == 20 and log.first_seq == 1
    # The frames are those of one encoding: another one is encoded each time, never kept.
    other = _Encoder(4)
    log.frame(b, other), log.frame(b, other)
    assert other.calls == 2 and log.nbytes == 20 and log.frame(b, encode) == encode(b)


def test_frames_cached_for_a_finished_run_count_in_the_process_bound() -> None:
    """A finished run followed late gets its frames cached then: they count against
    `replay_bytes_per_process` too (the oldest finished runs go), until its run is dropped."""
    runs = _runs(finished_bytes=200, max_finished=100)
    finished = []
    for i in range(2):
        run = runs.open("t", response_pb2.Response(id=f"resp_{i}", store=True), control=None)
        run.stamp(_delta("x" * 45, f"resp_{i}"), None)
        run.stamp(_event("completed", "completed", f"resp_{i}"), "completed")
        finished.append(run)
    assert all(runs.get("t", r.id) is r for r in finished)  # ~65 bytes each
    log = finished[1].log
    assert log is not None
    encode = _Encoder(40)
    for entry in log.since(-1):
        log.frame(entry, encode)  # +80 bytes: 210 > 200, the oldest finished run goes
    assert runs.get("t", "resp_0") is None and runs.get("t", "resp_1") is finished[1]
    runs.forget("t", "resp_1")
    assert log.on_resize is None  # its later frames are nobody's count any more
    run = runs.open("t", response_pb2.Response(id="resp_2", store=True), control=None)
    run.stamp(_delta("x" * 160, "resp_2"), None)  # ~180 bytes: 80 more would pass 200
    run.stamp(_event("completed", "completed", "resp_2"), "completed")
    assert runs.get("t", "resp_2") is run  # the count went back to 0 with the runs dropped


async def test_a_run_wakes_at_most_wake_per_pass_subscribers_per_pass_of_the_loop() -> None:
    """Hundreds of followers woken by one event write their batches over several passes of the
    loop, `WAKE_PER_PASS` per pass, so no one pass holds all their writes; all get every event."""
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    run.stamp(_event("created"), "created")
    got = [0] * (2 * WAKE_PER_PASS + 10)

    async def follow(i: int) -> None:
        async for batch in run.follow(0):
            got[i] += len(batch)

    readers = [asyncio.create_task(follow(i)) for i in range(len(got))]
    await asyncio.sleep(0)
    run.stamp(_delta("a"), None)
    served = []
    for _ in range(4):
        await asyncio.sleep(0)  # one pass: the next group takes its batch
        served.append(sum(got))
    assert served == [WAKE_PER_PASS, 2 * WAKE_PER_PASS, len(got), len(got)]
    gone = readers[-1]
    gone.cancel()  # a subscriber that goes away holds up nobody
    run.stamp(_event("completed", "completed"), "completed")
    await asyncio.gather(*readers[:-1])
    assert got[:-1] == [2] * (len(got) - 1)


async def test_a_follower_gets_what_was_logged_while_it_wrote_its_batch_ending_included() -> None:
    """A follower's batch is written while the follower waits at its `yield`: what the run
    logged meanwhile, its ending included, comes next, without another event to wake it."""
    run = ResponseRun("resp_1", log=ReplayLog(100, 1 << 20))
    run.stamp(_event("created"), "created")
    follower = run.follow()
    assert [e.sequence_number for e in await anext(follower)] == [0]
    run.stamp(_delta("a"), None)  # while the follower's transport writes event 0
    run.stamp(_event("completed", "completed"), "completed")
    async with asyncio.timeout(1):
        assert [e.sequence_number for e in await anext(follower)] == [1, 2]
        with pytest.raises(StopAsyncIteration):
            await anext(follower)
