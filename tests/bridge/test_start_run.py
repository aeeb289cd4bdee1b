"""Creates that no session of the client's carries (HTTP `POST /v1/responses`, gRPC
`CreateResponse`, background mode), through a real server and real clients: each is checked once,
at its entry (`Engine.start_run`), pumped once, in the core (the transports read its end record),
and a background run is no connection: no session, no outbox, no reader task."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from tether.core import pump
from tether.core.stages import validate
from tether.responses.v1 import request_pb2, service_pb2, service_pb2_grpc
from tether.service.grpc_server import start_grpc_server

from .helpers import KEY_A, wait_for

SLOW = {"tokens_per_s": 400, "output_tokens": 400}  # ~1 s of generation


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The model of every params check from now on (the real check, counted)."""
    seen: list[str] = []
    real = validate.validate_params

    def counted(params: request_pb2.ResponseCreateParams, *args: Any, **kwargs: Any) -> None:
        seen.append(params.model)
        real(params, *args, **kwargs)

    monkeypatch.setattr(validate, "validate_params", counted)
    return seen


@pytest.fixture
def one_response_pumps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[pump.Pump]]:
    """Every pump made for a one-response stream from now on."""
    made: list[pump.Pump] = []
    real = pump.Pump.__init__

    def init(self: pump.Pump, until: pump.Until = pump.Until.SOURCE_END, *args: Any, **kwargs: Any) -> None:
        real(self, until, *args, **kwargs)
        if until is pump.Until.RESPONSE_END:
            made.append(self)

    monkeypatch.setattr(pump.Pump, "__init__", init)
    yield made


async def test_http_creates_are_checked_once_and_pumped_once(make_stack: Any, checks: list[str],
                                                             one_response_pumps: list[pump.Pump]) -> None:  # fmt: skip
    async with make_stack() as stack, stack.client() as client:
        done = await client.responses.create(model="sim-model", input="hello")
        assert done.status == "completed"
        assert checks == ["sim-model"] and len(one_response_pumps) == 1
        async with await client.responses.create(model="sim-model", input="again", stream=True) as stream:
            events = [ev async for ev in stream]
        assert events[-1].type == "response.completed"
        assert checks == ["sim-model"] * 2 and len(one_response_pumps) == 2


async def test_a_refused_http_create_is_checked_once_and_answered_with_its_status(make_stack: Any,
                                                                                 checks: list[str]) -> None:  # fmt: skip
    import openai

    async with make_stack() as stack, stack.client() as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="sim-model", input="x", temperature=7)
        assert refused.value.code == "invalid_value" or refused.value.status_code == 400
        assert checks == ["sim-model"]
        with pytest.raises(openai.BadRequestError):  # streamed: the status too, before any event
            await client.responses.create(model="sim-model", input="x", temperature=7, stream=True)
        assert checks == ["sim-model"] * 2
        assert not stack.engine.sessions  # the one-turn sessions are gone


async def test_a_grpc_create_is_checked_once_and_a_refusal_is_its_one_message(make_stack: Any, authenticator: Any,
                                                                              checks: list[str],
                                                                              one_response_pumps: list[pump.Pump]) -> None:  # fmt: skip
    async with make_stack() as stack:
        server = await start_grpc_server(stack.engine, stack.config, authenticator)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = service_pb2_grpc.ResponsesServiceStub(channel)
                md = (("authorization", f"Bearer {KEY_A}"),)
                params = request_pb2.ResponseCreateParams(model="sim-model", input_text="hello", store=False)
                messages = [m async for m in stub.CreateResponse(service_pb2.CreateResponseRequest(params=params), metadata=md)]
                events = [ev for m in messages for ev in m.events]
                assert events[0].WhichOneof("event") == "created" and events[-1].WhichOneof("event") == "completed"
                assert checks == ["sim-model"] and len(one_response_pumps) == 1
                bad = request_pb2.ResponseCreateParams(model="sim-model", input_text="x", temperature=7)
                messages = [m async for m in stub.CreateResponse(service_pb2.CreateResponseRequest(params=bad), metadata=md)]
                assert [[ev.WhichOneof("event") for ev in m.events] for m in messages] == [["error"]]
                assert checks == ["sim-model"] * 2
        finally:
            await server.stop(0)


async def test_a_background_run_is_checked_once_and_is_no_session(make_stack: Any, checks: list[str]) -> None:
    async with make_stack(backend=SLOW) as stack, stack.client() as client:
        engine = stack.engine
        created = await client.responses.create(model="sim-model", input="hello", background=True)
        await wait_for(lambda: (run := engine.runs.get("a", created.id)) is not None and run.next_seq > 5)
        # Running: no session of any kind, and no task but its own (no lane worker, no outbox reader).
        assert not engine.sessions and engine.sessions_closed == 0
        names = {t.get_name() for t in asyncio.all_tasks()}
        assert f"tether-bg-{created.id}" in names
        assert not any(n.startswith(("tether-lane-", "tether-watch-", "tether-detached-")) for n in names), names
        stream = await client.responses.retrieve(created.id, stream=True)
        events = [ev async for ev in stream]
        assert [ev.sequence_number for ev in events] == list(range(len(events)))  # 0..n, no gap
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert events[-1].response.id == created.id and events[-1].response.created_at == created.created_at
        assert checks == ["sim-model"]  # at its entry, not again by its turn
        assert engine.sessions_closed == 0


async def test_a_background_run_that_its_turn_refuses_fails_with_the_error(make_stack: Any) -> None:
    """A refusal only the turn can find (its previous response is unknown) fails the run; its
    `error` event belongs to no connection and is not logged: the run's terminal event carries it."""
    async with make_stack() as stack, stack.client() as client:
        created = await client.responses.create(model="sim-model", input="x", background=True,
                                                previous_response_id="resp_unknown")  # fmt: skip
        stream = await client.responses.retrieve(created.id, stream=True)
        events = [ev async for ev in stream]
        assert [ev.type for ev in events] == ["response.failed"] and events[0].sequence_number == 0
        assert events[0].response.status == "failed" and "resp_unknown" in events[0].response.error.message
