"""WebSocket mode through the official SDK: `client.responses.connect()` and the lane wrapper."""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI
from openai.lib.responses_websocket import (
    AsyncResponsesWebSocketSession,
    ResponsesWebSocketError,
    ResponsesWebSocketLimits,
)

from .helpers import WEATHER_TOOL, one_response

LIMITS = ResponsesWebSocketLimits(
    max_lanes=8, max_events_per_lane=1024, max_events=4096, max_bytes_per_lane=1 << 24, max_bytes=1 << 25
)


async def test_tool_loop_with_previous_response_id_store_false(client: AsyncOpenAI) -> None:
    async with client.responses.connect() as conn:
        await conn.response.create(
            model="sim-model", input="What is the weather in Paris?", tools=[WEATHER_TOOL], store=False
        )
        events, done = await one_response(conn)
        assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
        assert done.type == "response.completed"
        call = done.response.output[0]
        assert call.type == "function_call" and call.name == "get_weather"
        assert done.response.store is False
        # Sequence numbers restart per response and are contiguous.
        assert [e.sequence_number for e in events] == list(range(len(events)))

        await conn.response.create(
            model="sim-model",
            previous_response_id=done.response.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}],
            tools=[WEATHER_TOOL],
            store=False,
        )
        events, second = await one_response(conn)
        assert second.type == "response.completed"
        assert second.response.previous_response_id == done.response.id
        assert second.response.output[0].type == "message"
        assert second.response.output_text
        # The cached chain is reused: the continuation counts the earlier turn as cached input.
        assert second.response.usage.input_tokens_details.cached_tokens > 0

        await conn.response.create(
            model="sim-model", previous_response_id=second.response.id, input="Thanks!", store=False
        )
        _, third = await one_response(conn)
        assert third.type == "response.completed"
        assert third.response.previous_response_id == second.response.id


async def test_warmup_then_continuation(client: AsyncOpenAI) -> None:
    async with client.responses.connect() as conn:
        await conn.send(
            {
                "type": "response.create",
                "model": "sim-model",
                "input": "You are terse.",
                "generate": False,
                "store": False,
            }
        )
        events, warm = await one_response(conn)
        assert [e.type for e in events] == ["response.created", "response.in_progress", "response.completed"]
        assert warm.response.output == []

        await conn.response.create(
            model="sim-model", previous_response_id=warm.response.id, input="Say something.", store=False
        )
        _, turn = await one_response(conn)
        assert turn.type == "response.completed"
        assert turn.response.previous_response_id == warm.response.id
        assert turn.response.output_text


async def test_two_lanes_concurrently(client: AsyncOpenAI) -> None:
    async with client.responses.connect() as conn:
        async with AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session:
            left, right = session.lane("left"), session.lane("right")
            await left.send({"type": "response.create", "model": "sim-model", "input": "one"})
            await right.send({"type": "response.create", "model": "sim-model", "input": "two"})
            a, b = await asyncio.gather(left.get_final_response(), right.get_final_response())
            assert a.status == b.status == "completed"
            assert a.id != b.id
            # A lane forks from another lane's response (lineage is previous_response_id only).
            await right.send(
                {
                    "type": "response.create",
                    "model": "sim-model",
                    "input": "fork",
                    "previous_response_id": a.id,
                }
            )
            fork = await right.get_final_response()
            assert fork.previous_response_id == a.id


async def test_error_is_echoed_on_its_lane(client: AsyncOpenAI) -> None:
    async with client.responses.connect() as conn:
        async with AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session:
            lane = session.lane("agent_1")
            await lane.send(
                {
                    "type": "response.create",
                    "model": "sim-model",
                    "input": "continue",
                    "previous_response_id": "resp_does_not_exist",
                    "store": False,
                }
            )
            with pytest.raises(ResponsesWebSocketError) as info:
                await lane.get_final_response()
            event = info.value.event
            assert event.status == 400
            assert event.error.code == "previous_response_not_found"
            assert event.stream_id == "agent_1"
            # The lane (and the socket) still work afterwards.
            await lane.send({"type": "response.create", "model": "sim-model", "input": "fresh start"})
            assert (await lane.get_final_response()).status == "completed"


async def test_bridge_decode_error_is_echoed_on_its_lane(client: AsyncOpenAI) -> None:
    """A frame the bridge itself rejects (wrong field type) still reaches the named lane."""
    async with client.responses.connect() as conn:
        async with AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session:
            lane = session.lane("typed")
            await lane.send(
                {"type": "response.create", "model": "sim-model", "input": "x", "temperature": "hot"}
            )
            with pytest.raises(ResponsesWebSocketError) as info:
                await lane.get_final_response()
            assert info.value.event.error.code == "invalid_type"
            assert info.value.event.error.param == "temperature"
