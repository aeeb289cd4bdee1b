"""The prototype shape (`tether_lab.prototype`): one response across a whole tool loop.

The session calls the strategy's hooks; every engine here is built by the composition root with
the prototype turns (`PrototypeTurns`).
"""

from __future__ import annotations

import asyncio

from tests.support.configs import make_config
from tether.core.engine import Engine
from tether.protocol.json_codec import event_to_json
from tether.protocol.wire import PROTOTYPE_APPEND_INCLUDE
from tether.responses.v1 import items_pb2, service_pb2
from tether.server import build_engine
from tether_lab import prototype

SCRIPT = {
    "sim": {"kind": "simulated", "ttft_ms": 1, "tokens_per_s": 0, "script": "coding_agent.json"},
}
TERMINAL = {"completed", "failed", "incomplete"}


async def _engine(**limits) -> Engine:
    server = {"grpc_port": 0, "bridge_port": 0}
    config = make_config("memory://", backends=SCRIPT, limits=limits or None, server=server)
    return await build_engine(config, strategy=prototype.PrototypeTurns())


def _create(include_proto: bool = True, **fields) -> service_pb2.SessionRequest:
    req = service_pb2.SessionRequest()
    c = req.create
    c.model = "tether-sim"
    c.store = False
    c.input_text = fields.pop("input_text", "fix the handler")
    c.include.append("tether:server_timing")
    if include_proto:
        c.include.append(PROTOTYPE_APPEND_INCLUDE)
    for name in ("read_file", "run_tests", "edit_file"):
        c.tools.add().function.name = name
    for key, value in fields.items():
        setattr(c, key, value)
    return req


def _append(*call_ids: str, extra: items_pb2.Item | None = None) -> service_pb2.SessionRequest:
    req = service_pb2.SessionRequest()
    for cid in call_ids:
        item = req.append.input.add()
        item.function_call_output.call_id = cid
        item.function_call_output.output_text = f"output of {cid}"
    if extra is not None:
        req.append.input.append(extra)
    return req


class Reader:
    def __init__(self, session) -> None:
        self.events = []
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(self._run(session))

    async def _run(self, session) -> None:
        async for batch in session.events():
            for ev in batch:
                self.events.append(ev)
                await self.queue.put(ev)

    async def until(self, pred, wait_s: float = 10):
        while True:
            ev = await asyncio.wait_for(self.queue.get(), wait_s)
            if pred(ev):
                return ev


def _is_awaiting(ev) -> bool:
    return prototype.awaiting_event_json(ev) is not None


def _is_terminal(ev) -> bool:
    return ev.WhichOneof("event") in TERMINAL or ev.WhichOneof("event") == "error"


async def test_one_response_for_the_whole_tool_loop():
    engine = await _engine()
    try:
        session = await engine.open_session("t", transport="test")
        reader = Reader(session)
        await session.send(_create())
        waits = 0
        while True:
            ev = await reader.until(lambda e: _is_awaiting(e) or _is_terminal(e))
            if not _is_awaiting(ev):
                break
            waits += 1
            payload = prototype.awaiting_event_json(ev)
            assert payload["response_id"] == ev.response_id and payload["call_ids"]
            # The awaited calls' items were closed before the wait was announced.
            done_ids = {
                e.output_item_done.item.function_call.call_id
                for e in reader.events
                if e.WhichOneof("event") == "output_item_done"
            }
            assert set(payload["call_ids"]) <= done_ids
            assert prototype.waiting_turns(session) == 1
            await session.send(_append(*payload["call_ids"]))
        assert ev.WhichOneof("event") == "completed", ev
        assert waits == 4  # the script's four tool steps
        assert prototype.waiting_turns(session) == 0
        created = [e for e in reader.events if e.WhichOneof("event") == "created"]
        assert len(created) == 1  # one response for the whole loop
        r = ev.completed.response
        kinds = [item.WhichOneof("item") for item in r.output]
        assert kinds.count("function_call") == 4 and kinds.count("function_call_output") == 4
        assert kinds[-1] == "message"
        # The appended outputs sit right after their calls, in conversation order.
        for i, item in enumerate(r.output):
            if item.WhichOneof("item") == "function_call_output":
                assert r.output[i - 1].function_call.call_id == item.function_call_output.call_id
        # Output indices of the streamed items continue across steps (no restart at 0).
        added = [e.output_item_added.output_index for e in reader.events if e.WhichOneof("event") == "output_item_added"]
        assert added == sorted(added) and len(set(added)) == len(added)
        st = r.server_timing
        assert st.stages_ms["append_wait"] > 0
        total_ms = st.overhead_ms + st.stages_ms["append_wait"] + st.stages_ms["backend_wait"]
        assert st.overhead_ms < total_ms
        # The awaiting event has a JSON form the bridge can send as is.
        awaiting = next(e for e in reader.events if _is_awaiting(e))
        as_json = event_to_json(awaiting, ws=True)
        assert as_json["type"] == prototype.AWAITING_EVENT and "sequence_number" in as_json

        # A continuation of the prototype response is an ordinary chained turn.
        cont = _create(include_proto=False, input_text="thanks", previous_response_id=r.id)
        await session.send(cont)
        ev = await reader.until(_is_terminal)
        assert ev.WhichOneof("event") == "completed", ev
        await session.close()
        reader.task.cancel()
    finally:
        await engine.aclose()


async def test_without_the_include_a_turn_completes_at_the_tool_call():
    engine = await _engine()
    try:
        session = await engine.open_session("t", transport="test")
        reader = Reader(session)
        await session.send(_create(include_proto=False))
        ev = await reader.until(_is_terminal)
        assert ev.WhichOneof("event") == "completed"
        assert ev.completed.response.output[-1].WhichOneof("item") == "function_call"
        assert not any(_is_awaiting(e) for e in reader.events)
        await session.close()
    finally:
        await engine.aclose()


async def test_append_for_unknown_calls_falls_through_and_bad_items_get_an_error():
    engine = await _engine()
    try:
        session = await engine.open_session("t", transport="test")
        reader = Reader(session)
        await session.send(_create())
        ev = await reader.until(_is_awaiting)
        call_ids = prototype.awaiting_event_json(ev)["call_ids"]
        # Answers no waiting call: not for the prototype turn.
        assert not prototype.deliver_append(session, _append("call_nope").append)
        # Answers the call but carries an invalid item: in-band error, the response keeps waiting.
        bad = items_pb2.Item()
        bad.message.role = "robot"
        bad.message.content.add().input_text.text = "hi"
        await session.send(_append(*call_ids, extra=bad))
        err = await reader.until(lambda e: e.WhichOneof("event") == "error")
        assert err.error.error.code == "invalid_item"
        assert prototype.waiting_turns(session) == 1
        await session.send(_append(*call_ids))
        nxt = await reader.until(lambda e: _is_awaiting(e) or _is_terminal(e))
        assert _is_awaiting(nxt)  # the loop went on to the next tool call
        await session.close()
    finally:
        await engine.aclose()


async def test_no_append_times_out():
    engine = await _engine(idle_timeout_s=0.3)
    try:
        session = await engine.open_session("t", transport="test")
        reader = Reader(session)
        await session.send(_create())
        ev = await reader.until(_is_terminal)
        assert ev.WhichOneof("event") == "failed"
        assert ev.failed.response.error.code == "idle_timeout"
        assert prototype.waiting_turns(session) == 0
        await session.close()
    finally:
        await engine.aclose()


async def test_cancel_while_waiting():
    engine = await _engine()
    try:
        session = await engine.open_session("t", transport="test")
        reader = Reader(session)
        await session.send(_create())
        ev = await reader.until(_is_awaiting)
        cancel = service_pb2.SessionRequest()
        cancel.cancel.response_id = ev.response_id
        await session.send(cancel)
        end = await reader.until(_is_terminal)
        assert end.WhichOneof("event") == "incomplete"
        assert end.incomplete.response.status == "cancelled"
        assert not end.incomplete.response.HasField("incomplete_details")
        assert prototype.waiting_turns(session) == 0
        # The session goes on.
        await session.send(_create(include_proto=False, input_text="again"))
        assert (await reader.until(_is_terminal)).WhichOneof("event") == "completed"
        await session.close()
    finally:
        await engine.aclose()
