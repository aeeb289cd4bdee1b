"""Cross-transport parity: one scripted scenario (a tool-call turn, then a text turn) over gRPC
(raw stub), WebSocket (SDK) and HTTP/SSE (SDK) gives the same event types in the same order
(runs of one delta type collapsed: coalescing may split deltas differently) and the same final
Response JSON (ids and timestamps aside).

The second turn replays the whole context instead of using previous_response_id, so the three
transports see exactly the same input whatever they cache."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from tests.support.stacks import Stack
from tether.protocol import json_codec
from tether.responses.v1 import service_pb2, service_pb2_grpc

from .helpers import KEY_A, WEATHER_TOOL, check_sse_events, collapse_deltas, one_response

Turn = tuple[list[str], dict[str, Any]]  # (collapsed event types, final Response JSON)

USER = {"type": "message", "role": "user", "content": "What is the weather in Paris?"}
VOLATILE = {"id", "created_at", "completed_at", "backend_timing"}


def turn_body(turn: int, first: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "sim-model", "tools": [WEATHER_TOOL], "instructions": "Be brief."}
    if turn == 0:
        body["input"] = [USER]
    else:
        assert first is not None
        call = first["output"][0]
        body["input"] = [
            USER,
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": '{"temp_c": 21}'},
        ]
    return body


def normalize(obj: Any, *, stateless: bool = False) -> Any:
    """Drop ids and timestamps. `stateless`: also drop `cached_tokens`, which counts the reuse of
    the connection cache, something only the persistent transports (gRPC session, WS) have."""
    drop = VOLATILE | {"cached_tokens"} if stateless else VOLATILE
    if isinstance(obj, dict):
        return {
            k: ("call" if k == "call_id" else normalize(v, stateless=stateless))
            for k, v in obj.items()
            if k not in drop
        }
    if isinstance(obj, list):
        return [normalize(v, stateless=stateless) for v in obj]
    return obj


async def over_grpc(port: int) -> list[Turn]:
    out: list[Turn] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.ResponsesServiceStub(channel)
        call = stub.Session(metadata=(("authorization", f"Bearer {KEY_A}"),))
        first = None
        for turn in range(2):
            request = json_codec.client_event_from_json({"type": "response.create", **turn_body(turn, first)})
            await call.write(request)
            types, final = [], None
            while final is None:
                batch: service_pb2.SessionResponse = await call.read()
                for ev in batch.events:
                    types.append(json_codec.event_type(ev))
                    arm = ev.WhichOneof("event")
                    assert arm != "error", ev
                    if arm in ("completed", "failed", "incomplete"):
                        final = json_codec.response_to_json(getattr(ev, arm).response)
            out.append((collapse_deltas(types), final))
            first = final
        call.cancel()
    return out


async def over_ws(stack: Stack) -> list[Turn]:
    out: list[Turn] = []
    async with stack.client() as client, client.responses.connect() as conn:
        first = None
        for turn in range(2):
            await conn.send({"type": "response.create", **turn_body(turn, first)})  # type: ignore[typeddict-item]
            events, last = await one_response(conn)
            final = last.response.to_dict()
            out.append((collapse_deltas(ev.type for ev in events), final))
            first = final
    return out


async def over_sse(stack: Stack) -> list[Turn]:
    out: list[Turn] = []
    async with stack.client() as client:
        first = None
        for turn in range(2):
            stream: AsyncIterator[Any] = await client.responses.create(stream=True, **turn_body(turn, first))
            events = [ev async for ev in stream]
            check_sse_events(ev.to_dict() for ev in events)
            final = events[-1].response.to_dict()
            out.append((collapse_deltas(ev.type for ev in events), final))
            # The non-streamed create returns the same Response as the stream's terminal event.
            plain = await client.responses.create(**turn_body(turn, first))
            assert normalize(plain.to_dict()) == normalize(final)
            first = final
    return out


async def test_same_events_and_response_on_every_transport(stack: Stack, grpc_port: int) -> None:
    results = {
        "grpc": await over_grpc(grpc_port),
        "ws": await over_ws(stack),
        "sse": await over_sse(stack),
    }
    reference = results["grpc"]
    assert reference[0][1]["output"][0]["type"] == "function_call"
    assert reference[1][1]["output"][0]["type"] == "message"
    assert reference[0][0] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert reference[1][0] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    # The persistent transports reuse the first turn's prefix on the second.
    assert reference[1][1]["usage"]["input_tokens_details"]["cached_tokens"] > 0
    for name, turns in results.items():
        for i, (types, final) in enumerate(turns):
            assert types == reference[i][0], f"{name} turn {i}"
            stateless = name == "sse"
            assert normalize(final, stateless=stateless) == normalize(reference[i][1], stateless=stateless), (
                f"{name} turn {i}"
            )
