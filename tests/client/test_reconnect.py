"""Reconnects: explicit, after a server restart, and on the server's in-band "connection ending"
errors; chains continue through the store (store=true hydration)."""

from __future__ import annotations

import asyncio

import pytest

import tether.client as tc
from tests.support.configs import FAST, server_config
from tests.support.stacks import Server
from tether import errors

QUICK_RETRY = tc.RetryPolicy(max_attempts=12, initial_backoff_s=0.02, max_backoff_s=0.3)


async def _wait_for(predicate, *, steps: int = 500) -> None:
    for _ in range(steps):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_explicit_reconnect_continues_from_the_store(server):
    async with tc.connect(server.target) as s:
        first = await (await s.create("tether-sim", "remember 42")).final_response()
        await s.reconnect()
        second = await (await s.create("tether-sim", "what was it?", previous_response_id=first.id)).final_response()
        assert second.status == "completed" and second.previous_response_id == first.id
        assert second.usage.cached_tokens == 0  # hydrated on the new connection, not cached
        assert s.reconnects == 1
        third = await (await s.create("tether-sim", "again", previous_response_id=second.id)).final_response()
        assert third.usage.cached_tokens > 0  # and cached on it from then on
    hydrations = server.engine.telemetry.hydrations.labels("found")._value.get()
    assert hydrations == 1


async def test_server_restart_fails_the_generating_response_and_resends_the_queued_one(tmp_path):
    backends = {"slow": {**FAST, "ttft_ms": 10_000}, "sim": FAST}
    models = {"slow": {"backend": "slow"}, "*": {"backend": "sim"}}
    srv = await Server(server_config(tmp_path, backends=backends, models=models)).start()
    try:
        async with tc.connect(srv.target, retry=QUICK_RETRY) as s:
            first = await (await s.create("tether-sim", "remember 42")).final_response()
            generating = await s.create("slow", "take your time")
            await generating.wait_created()
            queued = await s.create("tether-sim", "next", previous_response_id=first.id)  # behind it, same lane
            await srv.stop(grace=0)
            with pytest.raises(tc.ConnectionLost) as lost:
                await generating.final_response()
            assert lost.value.reason == errors.SERVER_SHUTTING_DOWN and lost.value.status == 503
            await srv.start()  # same port, same store
            resumed = await queued.final_response()
            assert resumed.status == "completed" and resumed.previous_response_id == first.id
            assert resumed.usage.cached_tokens == 0  # the chain came back from the store
            assert s.reconnects >= 1 and s.resent_creates >= 1
            # run_tool_loop redoes a turn whose connection was lost; plain creates work again.
            assert (await (await s.create("tether-sim", "hello")).final_response()).status == "completed"
    finally:
        await srv.stop()


async def test_connection_lifetime_reconnects_and_resends(tmp_path):
    backends = {"slow": {**FAST, "ttft_ms": 1500}, "sim": FAST}
    models = {"slow": {"backend": "slow"}, "*": {"backend": "sim"}}
    srv = await Server(server_config(
        tmp_path, backends=backends, models=models, connection_lifetime_s=0.2, lifetime_grace_s=30,
    )).start()
    try:
        async with tc.connect(srv.target, retry=QUICK_RETRY) as s:
            # Lane "a" is generating when the lifetime ends: it may finish on the old connection.
            long = await s.lane("a").create("slow", "a long one")
            await long.wait_created()
            await asyncio.sleep(0.5)  # past the lifetime: the server now refuses new creates in-band
            other = await s.lane("b").create("tether-sim", "meanwhile")
            answered = await other.final_response()  # websocket_connection_limit_reached -> resent
            assert answered.status == "completed"
            assert s.resent_creates == 1 and s.reconnects == 1
            assert s.last_connection_error.code == errors.CONNECTION_LIMIT_REACHED
            assert (await long.final_response()).status == "completed"  # finished within the grace
            chained = await s.create("tether-sim", "continue", previous_response_id=answered.id)
            assert (await chained.final_response()).status == "completed"
    finally:
        await srv.stop()


async def test_connection_end_between_turns_is_followed_by_a_fresh_one(tmp_path):
    # The lifetime must outlast a turn on a loaded machine: at 0.1 s the fresh connection could
    # end too before the second turn's answer (a second reconnect).
    srv = await Server(server_config(tmp_path, connection_lifetime_s=0.5, lifetime_grace_s=0)).start()
    try:
        async with tc.connect(srv.target, retry=QUICK_RETRY) as s:
            first = await (await s.create("tether-sim", "one")).final_response()
            await _wait_for(lambda: s.last_connection_error is not None)
            second = await (await s.create("tether-sim", "two", previous_response_id=first.id)).final_response()
            assert second.status == "completed" and s.reconnects == 1
    finally:
        await srv.stop()


async def test_unavailable_server_is_retried_then_reported(tmp_path):
    srv = Server(server_config(tmp_path))
    await srv.start()
    target = srv.target
    await srv.stop()
    with pytest.raises(tc.TetherError) as down:
        await tc.connect(target, retry=tc.RetryPolicy(max_attempts=3, initial_backoff_s=0.01))
    assert down.value.status == 503

    async def start_later() -> None:
        await asyncio.sleep(0.2)
        await srv.start()

    starter = asyncio.create_task(start_later())
    try:
        async with tc.connect(target, retry=QUICK_RETRY) as s:  # retries UNAVAILABLE until it is up
            assert (await (await s.create("tether-sim", "hi")).final_response()).status == "completed"
    finally:
        await starter
        await srv.stop()


async def test_tool_loop_redoes_a_turn_lost_with_its_connection(tmp_path):
    import json

    def script(ttft_ms: int):
        path = tmp_path / f"script-{ttft_ms}.json"
        path.write_text(json.dumps({"steps": [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]},
            {"ttft_ms": ttft_ms, "text": "All done."},
        ]}))
        return {"sim": {**FAST, "script": str(path)}}

    srv = await Server(server_config(tmp_path, backends=script(10_000))).start()
    created: list[str] = []
    try:
        async with tc.connect(srv.target, retry=QUICK_RETRY) as s:
            loop = asyncio.create_task(s.run_tool_loop(
                "tether-sim", "go", tools={"read_file": lambda path: "x = 1"},
                on_event=lambda ev: created.append(ev.response_id) if ev.HasField("created") else None,
            ))
            await _wait_for(lambda: len(created) == 2)  # turn 2 is generating (slowly)
            await srv.stop(grace=0)
            srv.config.backends = server_config(tmp_path, backends=script(1)).backends
            await srv.start()
            final = await loop
            assert tc.output_text(final) == "All done."
            assert len(created) == 3 and s.reconnects >= 1  # turn 2 was sent again and answered
    finally:
        await srv.stop()


async def test_a_stored_response_resumes_after_its_connection_drops(tmp_path):
    """The server drops the connection mid-response: the stored response runs on, and the typed
    client follows it from the last event it saw (`StreamResponse`): every sequence number once,
    no gap; a response that is not stored still ends with `ConnectionLost`."""
    slow = {"sim": {**FAST, "tokens_per_s": 400, "output_tokens": 400}}
    srv = await Server(server_config(tmp_path, backends=slow)).start()
    try:
        async with tc.connect(srv.target, retry=QUICK_RETRY) as s:
            stream = await s.create("tether-sim", "long")
            seqs = []
            while len(seqs) < 6:
                seqs.append((await anext(stream)).sequence_number)
            for session in list(srv.engine.sessions):  # the server ends the connection
                await session.close()
            seqs += [ev.sequence_number async for ev in stream]
            assert seqs == list(range(len(seqs))) and stream.resumed == 1
            assert stream.response.status == "completed" and len(tc.output_text(stream.response)) > 0

            unstored = await s.create("tether-sim", "long", store=False)
            await unstored.wait_created()
            for session in list(srv.engine.sessions):
                await session.close()
            with pytest.raises(tc.ConnectionLost):
                await unstored.final_response()
    finally:
        await srv.stop()
