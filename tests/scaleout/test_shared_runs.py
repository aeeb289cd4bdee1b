"""Two Tether replicas on one real Redis and on one real PostgreSQL: a run on either is answered
by both (docs/background.md, "Many replicas").

Real parts only: two `tether serve` subprocesses (ports 0) sharing a store private to the test
(a PostgreSQL schema / a Redis key prefix), driven with the official openai SDK. A background
response created on A is retrieved, resumed from a sequence number and cancelled on B; then
`kill -9` of the replica running a response: the other replica's subscriber gets `failed`
(`run_orphaned`) within `run_orphan_after_s` and a poll interval, and a background response
still queued there is taken over by the other replica and completes. Then SIGSTOP of the owner
past `run_orphan_after_s` and SIGCONT: fencing keeps the run the other replica ended final (the
owner's later writes are refused, counted, and it stops generating).

Needs PostgreSQL (TETHER_TEST_PG_URL) and Redis (TETHER_TEST_REDIS_URL); a missing one skips
with the reason (fails under TETHER_TEST_REQUIRE_SERVERS=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import openai
import pytest
from openai import AsyncOpenAI

from tether_lab.processes import ServerProcess
from tether_lab.scaleout import pg_reachable, redis_reachable, scratch_store, write_config

from .conftest import unavailable

MODEL = "tether-sim"
ORPHAN_AFTER_S = 2.0
_FENCED = 'tether_runs_total{event="fenced"}'
_WRITE_REFUSED = 'tether_post_inference_failures_total{reason="fenced"}'
SLOW = {"ttft_ms": 0, "tokens_per_s": 40, "output_tokens": 4000, "tick_ms": 1}  # ~100 s unless stopped


@pytest.fixture(scope="module", params=["redis", "postgres"])
def pair(request, tmp_path_factory):
    kind = request.param
    why = pg_reachable() if kind == "postgres" else redis_reachable()
    if why:
        unavailable(why)
    workdir = tmp_path_factory.mktemp(f"shared-runs-{kind}")
    with scratch_store(kind, workdir) as url:
        cfg = write_config(workdir / "tether.toml", url, sim=SLOW)
        args = ["--set", f"limits.run_orphan_after_s={ORPHAN_AFTER_S}", "--set", "limits.max_background_running=1"]
        a = ServerProcess(cfg, workdir, name="replica-a", args=args)
        b = ServerProcess(cfg, workdir, name="replica-b", args=args)
        try:
            a.start()
            b.start()
            yield a, b
        finally:
            for r in (a, b):
                r.stop(timeout=15)


def _ensure_up(replica: ServerProcess) -> None:
    """Restart a replica an earlier test killed (on the ports it had: ready when /readyz says so)."""
    if replica.proc is None or replica.proc.poll() is not None:
        replica.start()
        replica.wait_ready()


def _client(replica: ServerProcess) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=replica.api_url, api_key="unused-when-open", max_retries=0)


async def _until_in_progress(client: AsyncOpenAI, response_id: str) -> None:
    for _ in range(200):
        if (await client.responses.retrieve(response_id)).status == "in_progress":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{response_id} never in_progress")


async def test_a_run_on_one_replica_is_retrieved_resumed_and_cancelled_on_another(pair) -> None:
    a, b = pair
    on_a, on_b = _client(a), _client(b)
    created = await on_a.responses.create(model=MODEL, input="write a long story", background=True)
    assert created.status == "queued"
    seen_on_b = await on_b.responses.retrieve(created.id)  # B knows it at once, from the store
    assert seen_on_b.id == created.id and seen_on_b.status in ("queued", "in_progress")
    await _until_in_progress(on_b, created.id)

    # Resume on B from event 2: the numbers go on from 3, contiguous, while A generates.
    stream = await on_b.responses.retrieve(created.id, stream=True, starting_after=2)
    numbers = []
    async for event in stream:
        numbers.append(event.sequence_number)
        if len(numbers) == 8:
            break
    await stream.close()
    assert numbers == list(range(3, 11))

    started = time.monotonic()
    cancelled = await on_b.responses.cancel(created.id)
    assert cancelled.status == "cancelled", cancelled
    assert time.monotonic() - started < 5
    assert (await on_b.responses.cancel(created.id)).status == "cancelled"  # idempotent, still on B
    assert (await on_a.responses.retrieve(created.id)).status == "cancelled"

    # The whole log from B: 0..n without a gap, the terminal event last.
    replay = await on_b.responses.retrieve(created.id, stream=True)
    events = [event async for event in replay]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.queued" or events[0].type == "response.created"
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "cancelled"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text  # the output generated before the cancel travelled with the log


async def test_a_killed_replica_s_run_fails_for_the_other_replica_s_subscriber(pair) -> None:
    a, b = pair
    _ensure_up(a)
    on_a, on_b = _client(a), _client(b)
    created = await on_a.responses.create(model=MODEL, input="write a long story", background=True)
    await _until_in_progress(on_b, created.id)
    stream = await on_b.responses.retrieve(created.id, stream=True)
    events = []
    killed_at = None
    async for event in stream:
        events.append(event)
        if killed_at is None and event.type == "response.output_text.delta":
            a.kill()  # kill -9: no goodbye of any kind
            killed_at = time.monotonic()
    assert killed_at is not None
    took = time.monotonic() - killed_at
    last = events[-1]
    assert last.type == "response.failed", last
    # The Response's error codes are OpenAI's closed list: `run_orphaned` (docs/errors.md) is
    # `server_error` there, and the message says what happened.
    assert last.response.error.code == "server_error"
    assert "stopped" in last.response.error.message
    assert took < ORPHAN_AFTER_S + 2.0, f"failed after {took:.2f} s"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    retrieved = await on_b.responses.retrieve(created.id)
    assert retrieved.status == "failed" and retrieved.error.code == "server_error"
    with pytest.raises(Exception, match="400|cannot cancel|Cannot cancel"):  # ended: not cancellable
        await on_b.responses.cancel(created.id)


async def test_a_queued_run_of_a_killed_replica_is_taken_over_and_completes(pair) -> None:
    a, b = pair
    _ensure_up(a)
    on_a, on_b = _client(a), _client(b)
    busy = await on_a.responses.create(model=MODEL, input="write a long story", background=True)
    await _until_in_progress(on_b, busy.id)  # A's one background slot (max_background_running=1)
    waiting = await on_a.responses.create(model=MODEL, input="a short one", background=True, max_output_tokens=16)
    assert (await on_b.responses.retrieve(waiting.id)).status == "queued"
    a.kill()
    killed_at = time.monotonic()
    while (status := (await on_b.responses.retrieve(waiting.id)).status) in ("queued", "in_progress"):
        assert time.monotonic() - killed_at < ORPHAN_AFTER_S + 10, f"still {status}"
        await asyncio.sleep(0.1)
    took = time.monotonic() - killed_at
    done = await on_b.responses.retrieve(waiting.id)
    assert done.status in ("completed", "incomplete"), done
    assert done.output_text  # generated on B
    assert took < ORPHAN_AFTER_S + 6, f"taken over and done after {took:.2f} s"
    replay = await on_b.responses.retrieve(waiting.id, stream=True)
    events = [event async for event in replay]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type in ("response.completed", "response.incomplete")
    orphaned = await on_b.responses.retrieve(busy.id)  # the run in progress on A: failed, not rerun
    assert orphaned.status == "failed" and orphaned.error.code == "server_error"


async def test_a_replica_that_stops_hands_its_queued_runs_over(pair) -> None:
    a, b = pair
    _ensure_up(a)
    on_a, on_b = _client(a), _client(b)
    busy = await on_a.responses.create(model=MODEL, input="write a long story", background=True)
    await _until_in_progress(on_b, busy.id)
    waiting = await on_a.responses.create(model=MODEL, input="a short one", background=True, max_output_tokens=16)
    assert a.terminate(timeout=30) == 0  # SIGTERM: a rolling restart
    deadline = time.monotonic() + 15
    while (status := (await on_b.responses.retrieve(waiting.id)).status) in ("queued", "in_progress"):
        assert time.monotonic() < deadline, f"still {status}"
        await asyncio.sleep(0.1)
    assert status in ("completed", "incomplete") and (await on_b.responses.retrieve(waiting.id)).output_text
    stopped = await on_b.responses.retrieve(busy.id)  # the one running on A was cut by its shutdown
    assert stopped.status == "failed", stopped


async def test_a_websocket_turn_on_one_replica_is_resumed_and_cancelled_on_another(pair) -> None:
    a, b = pair
    _ensure_up(a)
    on_b = _client(b)
    async with _client(a).responses.connect() as conn:
        await conn.response.create(model=MODEL, input="write a long story", store=True)
        seen = []
        async for event in conn:
            seen.append(event)
            if sum(e.type == "response.output_text.delta" for e in seen) == 5:
                break
        response_id = next(e.response.id for e in seen if e.type == "response.created")
        for _ in range(100):  # published after each batch leaves A: visible on B within moments
            with contextlib.suppress(openai.NotFoundError):
                if (await on_b.responses.retrieve(response_id)).status == "in_progress":
                    break
            await asyncio.sleep(0.02)
        stream = await on_b.responses.retrieve(response_id, stream=True, starting_after=1)
        from_b = []
        async for event in stream:
            from_b.append(event)
            if len(from_b) == len(seen) - 2:
                break
        await stream.close()
        assert [(e.sequence_number, e.type) for e in from_b] == [(e.sequence_number, e.type) for e in seen[2:]]

        cancelled = await on_b.responses.cancel(response_id)
        assert cancelled.status == "cancelled"
        async for event in conn:  # the WebSocket client on A sees its response end, cancelled
            if event.type in ("response.completed", "response.incomplete", "response.failed"):
                assert event.type == "response.incomplete" and event.response.status == "cancelled"
                break


async def test_a_continuation_on_one_replica_waits_for_its_parent_running_on_another(pair) -> None:
    a, b = pair
    _ensure_up(a)
    on_a, on_b = _client(a), _client(b)
    parent = await on_a.responses.create(model=MODEL, input="a short one", background=True, max_output_tokens=40)
    child = await on_b.responses.create(model=MODEL, input="go on", previous_response_id=parent.id,
                                        max_output_tokens=5)  # fmt: skip
    assert child.status in ("completed", "incomplete") and child.previous_response_id == parent.id
    assert (await on_b.responses.retrieve(parent.id)).status in ("completed", "incomplete")


async def test_a_paused_owner_cannot_bring_a_final_run_back(pair) -> None:
    """SIGSTOP the owner past `run_orphan_after_s`: the other replica ends its run `failed`
    (`run_orphaned`). SIGCONT: the owner's later events, state and store write are refused by the
    store (fencing) and counted, it stops generating, and both replicas answer `failed` with the
    same output, not the owner's `completed`."""
    a, b = pair
    _ensure_up(a)
    on_a, on_b = _client(a), _client(b)
    before = a.metrics()
    fenced_before, refused_before = before.get(_FENCED, 0), before.get(_WRITE_REFUSED, 0)
    created = await on_a.responses.create(model=MODEL, input="write a long story", background=True)
    await _until_in_progress(on_b, created.id)
    await asyncio.sleep(0.3)  # some output
    a.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(ORPHAN_AFTER_S + 0.5)
        orphaned = await on_b.responses.retrieve(created.id)  # the owner is silent: B ends the run
        assert orphaned.status == "failed" and orphaned.error.code == "server_error", orphaned
    finally:
        a.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 5
    while (seen_on_a := await on_a.responses.retrieve(created.id)).status == "in_progress":
        assert time.monotonic() < deadline, "the owner never saw that its run had ended"
        await asyncio.sleep(0.05)
    assert a.metrics().get(_FENCED, 0) == fenced_before + 1, "the refused write was not counted"
    while a.metrics().get(_WRITE_REFUSED, 0) == refused_before:  # the owner's store write: refused, counted
        assert time.monotonic() < deadline + 5, "the owner's store write was not refused"
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # the owner generated nothing more, and its store write did not land
    for replica in (on_a, on_b):
        got = await replica.responses.retrieve(created.id)
        assert got.status == "failed" and got.error.code == "server_error", got
        assert got.output_text == orphaned.output_text
    assert seen_on_a.status == "failed"
    replay = await on_b.responses.retrieve(created.id, stream=True)
    events = [event async for event in replay]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.failed" and not any(e.type == "response.completed" for e in events)


async def test_a_paused_owner_stops_a_run_that_produced_nothing_meanwhile(pair) -> None:
    """The same pause, with a run that produces no event after it (a 30 s time to first token):
    the owner learns at its first check after the stall, not at its next event."""
    a, b = pair
    _ensure_up(a)
    on_a, on_b = _client(a), _client(b)
    quiet = "tether-lab/bugfix20@40@30000:30000"  # the simulated model waits 30 s before its first token
    fenced_before = a.metrics().get(_FENCED, 0)
    created = await on_a.responses.create(model=quiet, input="think first", background=True)
    await _until_in_progress(on_b, created.id)
    a.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(ORPHAN_AFTER_S + 0.5)
        assert (await on_b.responses.retrieve(created.id)).status == "failed"
    finally:
        a.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    while (status := (await on_a.responses.retrieve(created.id)).status) == "in_progress":
        assert time.monotonic() - resumed < 3, "the owner kept a run another replica had ended"
        await asyncio.sleep(0.05)
    assert status == "failed"
    assert a.metrics().get(_FENCED, 0) == fenced_before + 1
