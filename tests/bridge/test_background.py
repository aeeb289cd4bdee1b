"""Responses that outlive their connection, through a real server and the official openai SDK:
background mode (create, poll, stream, resume, cancel), a client that goes away mid-turn, and a
continuation of a response still in flight on another connection."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import httpx
import openai
import pytest

from tests.support.grpc_client import RawSession
from tether.core.delta import Delta
from tether.protocol.wire import SSE_DONE

from .helpers import KEY_A, check_sse_events, recv_json, send_json, wait_for

SLOW = {"tokens_per_s": 400, "output_tokens": 400}  # ~1 s of generation
FINAL = ("completed", "failed", "incomplete", "cancelled")


async def poll(client: openai.AsyncOpenAI, response_id: str, timeout: float = 10.0) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            got = await client.responses.retrieve(response_id)
            if got.status in FINAL:
                return got
            await asyncio.sleep(0.02)


# -- background mode ------------------------------------------------------------------------------


async def test_background_create_returns_queued_then_polls_to_completed(make_stack: Any) -> None:
    async with make_stack(backend=SLOW) as stack, stack.client() as client:
        created = await client.responses.create(model="sim-model", input="hello", background=True)
        assert created.status in ("queued", "in_progress") and created.background
        polled = await client.responses.retrieve(created.id)
        assert polled.status in ("queued", "in_progress")  # a run in flight is never a 404
        done = await poll(client, created.id)
        assert done.status == "completed" and done.background and len(done.output_text) > 0
        other = stack.client("sk-b")
        with pytest.raises(openai.NotFoundError):  # runs are tenant-scoped like stored responses
            await other.responses.retrieve(created.id)
        await other.close()


async def test_background_stream_replays_after_n_then_follows_live(make_stack: Any) -> None:
    async with make_stack(backend=SLOW) as stack, stack.client() as client:
        created = await client.responses.create(model="sim-model", input="hello", background=True)
        await wait_for(lambda: (run := stack.engine.runs.get("a", created.id)) is not None and run.next_seq > 5)
        stream = await client.responses.retrieve(created.id, stream=True, starting_after=2)
        events = [ev async for ev in stream]
        seqs = [ev.sequence_number for ev in events]
        assert seqs == list(range(3, 3 + len(events)))  # no gap, no duplicate
        assert events[-1].type == "response.completed"
        text = "".join(ev.delta for ev in events if ev.type == "response.output_text.delta")
        assert text and events[-1].response.output_text.endswith(text)
        # From the start, once it has ended: the whole log, the same numbers.
        whole = [ev async for ev in await client.responses.retrieve(created.id, stream=True)]
        assert [ev.sequence_number for ev in whole] == list(range(len(whole)))
        assert whole[0].type == "response.created" and whole[-1].sequence_number == events[-1].sequence_number


async def test_background_with_stream_true_streams_the_run(make_stack: Any) -> None:
    async with make_stack(backend={"output_tokens": 20}) as stack, stack.client() as client:
        stream = await client.responses.create(model="sim-model", input="hello", background=True, stream=True)
        events = [ev async for ev in stream]
        assert events[0].type == "response.created" and events[0].response.background
        assert events[-1].type == "response.completed"
        assert [ev.sequence_number for ev in events] == list(range(len(events)))


async def test_cancel_is_idempotent_and_a_finished_response_is_not_cancellable(make_stack: Any) -> None:
    async with make_stack(backend={"tokens_per_s": 100, "output_tokens": 5000}) as stack, stack.client() as client:
        created = await client.responses.create(model="sim-model", input="hello", background=True)
        await wait_for(lambda: stack.engine.runs.get("a", created.id).next_seq > 3)
        cancelled = await client.responses.cancel(created.id)
        assert cancelled.status == "cancelled" and cancelled.id == created.id
        again = await client.responses.cancel(created.id)
        assert again.status == "cancelled"
        stored = await client.responses.retrieve(created.id)
        assert stored.status == "cancelled" and stored.output  # stored with the output so far

        finished = await client.responses.create(model="sim-model", input="hi", max_output_tokens=16)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.cancel(finished.id)
        assert "already ended" in refused.value.message
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel("resp_unknown")


async def test_cancel_of_a_queued_background_response(make_stack: Any) -> None:
    async with make_stack(backend={"tokens_per_s": 100, "output_tokens": 5000}, max_background_running=1) as stack:
        async with stack.client() as client:
            first = await client.responses.create(model="sim-model", input="one", background=True)
            second = await client.responses.create(model="sim-model", input="two", background=True)
            assert (await client.responses.retrieve(second.id)).status == "queued"
            assert (await client.responses.cancel(second.id)).status == "cancelled"
            await client.responses.cancel(first.id)
            assert (await client.responses.retrieve(second.id)).status == "cancelled"


async def test_background_needs_store_and_is_bounded_per_key(make_stack: Any) -> None:
    async with make_stack(backend={"tokens_per_s": 100, "output_tokens": 5000}, max_background_per_key=1) as stack:
        async with stack.client() as client:
            with pytest.raises(openai.BadRequestError) as no_store:
                await client.responses.create(model="sim-model", input="x", background=True, store=False)
            assert no_store.value.body["param"] == "store"
            await client.responses.create(model="sim-model", input="x", background=True)
            with pytest.raises(openai.RateLimitError) as limited:
                await client.responses.create(model="sim-model", input="x", background=True)
            assert "(limit 1)" in limited.value.message
            async with stack.client("sk-b") as other:  # another key has its own bound
                await other.responses.create(model="sim-model", input="x", background=True)


async def test_background_over_websocket_is_refused_with_a_true_message(stack: Any) -> None:
    async with stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "hi", "background": True})
        ev = await recv_json(conn)
        assert ev["type"] == "error" and ev["error"]["code"] == "background_not_supported"
        assert "POST /v1/responses over HTTP" in ev["error"]["message"]


# -- a dropped client loses nothing ---------------------------------------------------------------


async def _drop_ws_mid_turn(stack: Any) -> tuple[str, int]:
    """A WebSocket create (store=true) whose client goes away after a few deltas: (id, last seq)."""
    async with stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "long", "store": True})
        response_id, seq = "", -1
        while True:
            ev = await recv_json(conn)
            if ev["type"] == "response.created":
                response_id = ev["response"]["id"]
            seq = ev["sequence_number"]
            if ev["type"] == "response.output_text.delta" and seq >= 6:
                return response_id, seq


async def test_a_websocket_client_that_goes_away_mid_turn_loses_nothing(make_stack: Any) -> None:
    async with make_stack(backend=SLOW) as stack, stack.client() as client:
        response_id, seen = await _drop_ws_mid_turn(stack)
        got = await client.responses.retrieve(response_id)  # never a 404 for an id the client saw
        assert got.status == "in_progress"
        rest = [ev async for ev in await client.responses.retrieve(response_id, stream=True, starting_after=seen)]
        assert [ev.sequence_number for ev in rest] == list(range(seen + 1, seen + 1 + len(rest)))
        assert rest[-1].type == "response.completed"
        done = await poll(client, response_id)
        assert done.status == "completed" and len(done.output_text) > 0
        await wait_for(lambda: not stack.engine.sessions)
        assert stack.engine.runs.counts["detached"] == 1


async def test_shutdown_cuts_a_detached_response_which_is_still_stored(make_stack: Any) -> None:
    async with make_stack(backend={"tokens_per_s": 100, "output_tokens": 5000}) as stack, stack.client() as client:
        response_id, _ = await _drop_ws_mid_turn(stack)
        await stack.engine.shutdown(grace=0)
        await stack.engine.post.flush()
        stored = await stack.engine.store.get_response("a", response_id)
        assert stored.status == "failed" and stored.error.code == "server_shutting_down" and stored.output
        events = [ev async for ev in await client.responses.retrieve(response_id, stream=True)]
        assert events[-1].type == "response.failed"


async def test_on_client_gone_cancel_stores_the_output_so_far(make_stack: Any) -> None:
    async with make_stack(backend=SLOW, on_client_gone="cancel") as stack, stack.client() as client:
        response_id, _ = await _drop_ws_mid_turn(stack)
        done = await poll(client, response_id)
        assert done.status == "cancelled" and done.output  # what was generated is kept
        events = [ev async for ev in await client.responses.retrieve(response_id, stream=True)]
        assert events[-1].type == "response.incomplete" and events[-1].response.status == "cancelled"


async def test_an_sse_client_that_goes_away_mid_turn_loses_nothing(make_stack: Any) -> None:
    async with make_stack(backend=SLOW) as stack, stack.client() as client:
        stream = await client.responses.create(model="sim-model", input="long", stream=True)
        response_id, seen = "", -1
        async for ev in stream:
            if ev.type == "response.created":
                response_id = ev.response.id
            seen = ev.sequence_number
            if seen >= 6:
                break
        await stream.close()
        rest = [ev async for ev in await client.responses.retrieve(response_id, stream=True, starting_after=seen)]
        assert rest[0].sequence_number == seen + 1 and rest[-1].type == "response.completed"
        assert (await poll(client, response_id)).status == "completed"
        whole = [ev async for ev in await client.responses.retrieve(response_id, stream=True)]
        check_sse_events(ev.model_dump() for ev in whole)  # strict SDK parse and the sequence oracle


async def test_a_grpc_session_that_goes_away_mid_turn_loses_nothing(make_stack: Any) -> None:
    async with make_stack(backend=SLOW) as stack, stack.client() as client:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
            session = RawSession(channel, KEY_A)
            await session.create(model="sim-model", input="long", store=True)
            response_id, seen = "", -1
            while seen < 6:
                ev = await session.next_event()
                if ev.WhichOneof("event") == "created":
                    response_id = ev.created.response.id
                seen = ev.sequence_number
            session.call.cancel()
        rest = [ev async for ev in await client.responses.retrieve(response_id, stream=True, starting_after=seen)]
        assert rest[0].sequence_number == seen + 1 and rest[-1].type == "response.completed"
        assert (await poll(client, response_id)).status == "completed"


async def test_a_continuation_waits_for_its_parent_in_flight_on_another_connection(make_stack: Any) -> None:
    async with make_stack(backend=SLOW) as stack, stack.client() as client:
        parent = await client.responses.create(model="sim-model", input="one", background=True)
        child = await client.responses.create(model="sim-model", input="two", previous_response_id=parent.id)
        assert child.status == "completed"
        assert (await client.responses.retrieve(parent.id)).status == "completed"
        items = await client.responses.input_items.list(child.id, order="asc")
        assert len(items.data) >= 3  # the parent's input and output came with it


async def test_a_continuation_that_waited_too_long_gets_a_clear_error(make_stack: Any) -> None:
    slow = {"tokens_per_s": 100, "output_tokens": 5000}
    async with make_stack(backend=slow, continuation_wait_s=0.2) as stack, stack.client() as client:
        parent = await client.responses.create(model="sim-model", input="one", background=True)
        with pytest.raises(openai.BadRequestError) as waited:
            await client.responses.create(model="sim-model", input="two", previous_response_id=parent.id)
        assert waited.value.code == "previous_response_in_progress"
        await client.responses.cancel(parent.id)


async def test_resume_of_an_unknown_or_unretained_response(make_stack: Any) -> None:
    async with make_stack(replay_max_events=4) as stack, stack.client() as client:
        with pytest.raises(openai.BadRequestError) as unknown:
            await client.responses.retrieve("resp_unknown", stream=True)
        assert unknown.value.code == "replay_unavailable"
        done = await client.responses.create(model="sim-model", input="hi")
        with pytest.raises(openai.BadRequestError) as trimmed:  # its log keeps only the last 4 events
            await client.responses.retrieve(done.id, stream=True, starting_after=0)
        assert trimmed.value.code == "replay_unavailable"
        last = stack.engine.runs.get("a", done.id).next_seq - 1
        tail = [ev async for ev in await client.responses.retrieve(done.id, stream=True, starting_after=last - 2)]
        assert [ev.sequence_number for ev in tail] == [last - 1, last]


async def test_the_followers_of_a_run_share_one_encoding_of_each_event(make_stack: Any) -> None:
    """Every SSE follower of a run sends the same bytes for an event; the run's log encodes it
    once and keeps that frame in its byte bound: its bytes are its entries' plus one stream's
    frames, whether the followers read live or after the end."""
    async with make_stack(backend=SLOW) as stack, stack.client() as client:
        created = await client.responses.create(model="sim-model", input="hello", background=True)
        run = stack.engine.runs.get("a", created.id)
        headers = {"Authorization": f"Bearer {KEY_A}"}
        async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=10) as h:

            async def follow() -> bytes:
                return (await h.get(f"/responses/{created.id}", params={"stream": "true"})).content

            live = await asyncio.gather(*(follow() for _ in range(5)))
            late = [await follow() for _ in range(2)]
        assert run.state.final and all(body == live[0] for body in [*live, *late])
        assert live[0].endswith(SSE_DONE)
        entries = run.log.since(-1)
        assert entries[0].sequence_number == 0 and len(entries) == run.next_seq
        logged = sum(e.size if type(e) is Delta else e.ByteSize() for e in entries)
        assert run.log.nbytes == logged + len(live[0]) - len(SSE_DONE)


async def test_runs_are_counted_in_the_metrics(make_stack: Any) -> None:
    async with make_stack(backend={"tokens_per_s": 100, "output_tokens": 5000}, max_background_running=1) as stack:
        async with stack.client() as client:
            first = await client.responses.create(model="sim-model", input="one", background=True)
            await client.responses.create(model="sim-model", input="two", background=True)
            await wait_for(lambda: stack.engine.runs.get("a", first.id).next_seq > 2)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}") as h:
                text = (await h.get("/metrics")).text
            assert 'tether_background_runs{state="queued"} 1.0' in text
            assert 'tether_background_runs{state="running"} 1.0' in text
            await client.responses.cancel(first.id)
            async for _ in await client.responses.retrieve(first.id, stream=True):
                pass
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}") as h:
                text = (await h.get("/metrics")).text
            for line in ('tether_runs_total{event="background"} 2.0', 'tether_runs_total{event="cancelled"} 1.0',
                         'tether_runs_total{event="resumed"} 1.0'):  # fmt: skip
                assert line in text, line


async def test_shutdown_fails_queued_and_running_background_responses(make_stack: Any) -> None:
    async with make_stack(backend={"tokens_per_s": 100, "output_tokens": 5000}, max_background_running=1) as stack:
        async with stack.client() as client:
            running = await client.responses.create(model="sim-model", input="one", background=True)
            queued = await client.responses.create(model="sim-model", input="two", background=True)
            await wait_for(lambda: stack.engine.runs.get("a", running.id).next_seq > 2)
            await stack.engine.shutdown(grace=0)
            for response_id in (running.id, queued.id):
                got = await client.responses.retrieve(response_id)
                assert got.status == "failed" and got.error.code == "server_error", response_id
            assert (await stack.engine.store.get_response("a", running.id)).error.code == "server_shutting_down"
            assert stack.engine.runs.background_counts() == (0, 0)


async def test_shutdown_lets_a_running_background_response_finish_within_the_grace(make_stack: Any) -> None:
    """A running background response is a turn like any other at shutdown: it gets the grace to
    finish (and is cut past it, above), it is not cut at once as if its client had gone."""
    async with make_stack(backend=SLOW) as stack, stack.client() as client:
        running = await client.responses.create(model="sim-model", input="one", background=True)
        await wait_for(lambda: stack.engine.runs.get("a", running.id).next_seq > 2)
        async with asyncio.timeout(5):
            await stack.engine.shutdown(grace=5)
        got = await client.responses.retrieve(running.id)
        assert got.status == "completed" and got.output_text, got
        assert stack.engine.runs.background_counts() == (0, 0) and not stack.engine.sessions


async def test_a_stored_response_on_a_websocket_is_cancelled_from_http(make_stack: Any) -> None:
    async with make_stack(backend=SLOW) as stack, stack.client() as client, stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "long", "store": True})
        created = await recv_json(conn)
        assert created["type"] == "response.created"
        cancelled = await client.responses.cancel(created["response"]["id"])
        assert cancelled.status == "cancelled"
        while (ev := await recv_json(conn))["type"] != "response.incomplete":
            pass
        assert ev["response"]["status"] == "cancelled"  # the client on the socket sees it end


async def test_a_background_create_is_no_connection(make_stack: Any) -> None:
    """With one connection per key allowed and a WebSocket of that key open, a background create
    of the same key still runs to its end: it counts against the background limits only."""
    async with make_stack(backend=SLOW, max_connections_per_key=1) as stack, stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "hi", "store": False})
        while (await recv_json(conn))["type"] != "response.completed":
            pass
        async with stack.client() as client:
            created = await client.responses.create(model="sim-model", input="hello", background=True)
            done = await poll(client, created.id)
            assert done.status == "completed", done.error
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "again", "store": False})
        while (await recv_json(conn))["type"] != "response.completed":  # the WebSocket is still served
            pass


async def test_one_key_cannot_take_every_background_slot(make_stack: Any) -> None:
    """Two slots: key A's long runs hold at most one (`background_key_share` 0.5), so key B's
    short run starts at once and ends while A's are still running or queued."""
    async with make_stack(backend={"tokens_per_s": 100, "output_tokens": 5000}, max_background_running=2) as stack:
        async with stack.client() as a, stack.client("sk-b") as b:
            long_runs = [await a.responses.create(model="sim-model", input=f"long {i}", background=True)
                         for i in range(3)]  # fmt: skip
            states = [(await a.responses.retrieve(r.id)).status for r in long_runs]
            assert states.count("in_progress") + states.count("queued") == 3 and "queued" in states
            short = await b.responses.create(model="sim-model", input="short", background=True,
                                             max_output_tokens=16)  # fmt: skip
            done = await poll(b, short.id, timeout=5.0)
            assert done.status in ("completed", "incomplete")
            assert [(await a.responses.retrieve(r.id)).status for r in long_runs].count("queued") >= 1
            for r in long_runs:
                await a.responses.cancel(r.id)
