"""Helpers shared by the bridge tests (raw WebSocket I/O, strict SDK parsing, polling, a tool)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from openai.types.responses import ResponseStreamEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter
from websockets.asyncio.client import ClientConnection

from tether.protocol.wire import SSE_DONE

from ..support.validator import validate_events

KEY_A, KEY_B = "sk-a", "sk-b"
TERMINAL = ("response.completed", "response.failed", "response.incomplete")

# Strict (validating) parses with the SDK's own types: the SDK itself constructs events without
# validation, so this is the stronger check that every event matches what it declares.
_WS_EVENT = TypeAdapter(ResponsesServerEvent)
_SSE_EVENT = TypeAdapter(ResponseStreamEvent)


def check_ws_events(events: Iterable[dict[str, Any]]) -> None:
    """Every event parses strictly; a stream that reached its terminal event also passes the
    project's event-sequence oracle (`tests.support.validator`)."""
    events = list(events)
    for ev in events:
        _WS_EVENT.validate_python(ev)
    if events and is_terminal(events[-1]):
        validate_events(events)


def sse_frames(body: str) -> list[tuple[str, dict[str, Any]]]:
    """The `(event name, JSON)` frames of a whole SSE body, and how it ends: `data: [DONE]` exactly
    once, as the last frame, right after the event that ended the stream (a terminal event or an
    `error`); a body whose last event is neither has none."""
    blocks = [block for block in body.split("\n\n") if block.strip()]
    done = blocks[-1] == SSE_DONE.decode().strip() if blocks else False
    frames = []
    for block in blocks[:-1] if done else blocks:
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        frames.append((lines[0][7:], orjson.loads(lines[1][6:])))
    ended = bool(frames) and (is_terminal(frames[-1][1]) or frames[-1][1]["type"] == "error")
    assert done == ended, f"[DONE] {'after' if done else 'missing after'} {frames[-1][0] if frames else 'nothing'}"
    return frames


def check_sse_events(events: Iterable[dict[str, Any]]) -> None:
    events = list(events)
    for ev in events:
        _SSE_EVENT.validate_python(ev)
    if events and is_terminal(events[-1]):
        validate_events(events)


async def send_json(conn: ClientConnection, obj: Any) -> None:
    await conn.send(orjson.dumps(obj).decode())


async def recv_json(conn: ClientConnection, within: float = 10.0) -> dict[str, Any]:
    raw = await asyncio.wait_for(conn.recv(), within)
    assert isinstance(raw, str), "server frames must be text"
    return orjson.loads(raw)


async def recv_until(
    conn: ClientConnection, done: Callable[[dict[str, Any]], bool], within: float = 10.0
) -> list[dict[str, Any]]:
    """Frames up to and including the first for which `done` is true."""
    out = []
    while True:
        ev = await recv_json(conn, within)
        out.append(ev)
        if done(ev):
            return out


def is_terminal(ev: dict[str, Any]) -> bool:
    return ev["type"] in TERMINAL


async def recv_response(conn: ClientConnection, within: float = 10.0) -> list[dict[str, Any]]:
    """Frames up to the next terminal event or `error`, checked strictly against the SDK types."""
    events = await recv_until(conn, lambda e: is_terminal(e) or e["type"] == "error", within)
    check_ws_events(events)
    return events


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> Awaitable[None]:
    """Poll a condition of server state (e.g. "the session was freed") until it holds."""

    async def poll() -> None:
        while not predicate():  # noqa: ASYNC110 - server state has no event to await
            await asyncio.sleep(0.01)

    return asyncio.wait_for(poll(), timeout)


def collapse_deltas(types: Iterable[str]) -> list[str]:
    """Event types with runs of the same `*.delta` type merged (coalescing may split differently)."""
    out: list[str] = []
    for t in types:
        if t.endswith(".delta") and out and out[-1] == t:
            continue
        out.append(t)
    return out


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


async def one_response(conn: Any) -> tuple[list[Any], Any]:
    """Events of one response from an SDK WebSocket connection (SDK-parsed, then re-checked
    strictly) and its terminal event."""
    events = []
    async for ev in conn:
        events.append(ev)
        if ev.type in TERMINAL or ev.type == "error":
            break
    check_ws_events(ev.to_dict() for ev in events)
    return events, events[-1]
