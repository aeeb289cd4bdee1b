"""WebSocket mode: one socket = one core session, JSON text frames both ways.

Inbound: each text frame goes through `common.decode_object` (size limit at the app level, so an
oversize frame is an in-band `request_too_large` and the socket stays open; depth-limited JSON)
and `json_codec.client_event_from_json`, then `session.send`. A frame that fails to decode gets an
`error` event in the WS envelope, echoing the frame's `stream_id` when it names a lane, so the
SDK's lane wrapper delivers it to the right lane; the session and its state are untouched. A large
frame is decoded in the offload thread (`tether.offload`), not on the event loop.

Outbound: the core's pump (`tether.core.pump`) moves the batches of `session.events()` into this
connection, which writes each event as one text frame. While the pump waits for the next batch, a
token delta is written by its producer instead, in the step the upstream woke it
(`WsConnection.write_now`, `tether.core.outbox`: one pass per token), through the transport's
synchronous framing (`ws_transport.GuardedWebSocketProtocol.send_text_now`). How the stream
ended is the pump's answer: the session ended after `server_shutting_down` -> close 1001 (going
away); it ended otherwise (lifetime limit, idle timeout) -> 1000. When the client goes away, `session.close()` cancels
whatever the session was generating and frees its state.

Draining (server stop): a connection with no response in flight closes at once (an `error`
`server_shutting_down`, then 1001); one with responses in flight closes when they end, or when the
grace period runs out. What is in flight is the pump's count (the session's runs), not this
module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tether import offload
from tether.bridge import common, console
from tether.bridge.common import BridgeContext, Receive, Send
from tether.bridge.ws_transport import TEXT_UTF8, GuardedWebSocketProtocol
from tether.config import Limits
from tether.core.api import SessionHandle
from tether.core.delta import Delta, Outgoing
from tether.core.pump import Pump, PumpEnd
from tether.errors import INVALID_REQUEST, INVALID_STREAM_ID, SERVER_SHUTTING_DOWN, TetherError
from tether.observability import tracing
from tether.protocol import json_codec

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
_LANE = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# Best effort for frames that did not decode (bad JSON, too deep, too large): the lane they name.
_LANE_IN_TEXT = re.compile(r'"stream_id"\s*:\s*"([A-Za-z0-9_.-]{1,256})"')
_LANE_IN_BYTES = re.compile(_LANE_IN_TEXT.pattern.encode())


async def deny(
    ctx: BridgeContext, scope: dict[str, Any], send: Send, err: TetherError,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """Refuse an upgrade with an HTTP status and the JSON error body (before the 101); counted."""
    ctx.count_error(err)
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})  # the server can only answer 403
        return
    body = common.http_error_body(err)
    extra = list(headers)
    if err.status == 401:
        extra.append((b"www-authenticate", b"Bearer"))
    extra.extend(common.retry_after_headers(err.retry_after))
    await send(
        {
            "type": "websocket.http.response.start",
            "status": err.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body})


class WsConnection:
    def __init__(self, ctx: BridgeContext, receive: Receive, send: Send, session: SessionHandle) -> None:
        self._ctx = ctx
        self._receive = receive
        self._send = send
        self._session = session
        self._send_lock = asyncio.Lock()
        self._closed = False  # our close frame is out (or the client is gone)
        self._stop = asyncio.Event()  # the server wants this connection closed
        self._pump = Pump(in_flight=session.responses_in_flight)
        self.close_code: int | None = None
        # The protocol under `send`, when it can write a frame without an await (`write_now`).
        protocol = getattr(send, "__self__", None)
        self._protocol = protocol if isinstance(protocol, GuardedWebSocketProtocol) else None
        self.multi_agent_beta = False  # the upgrade named the multi-agent beta (`OpenAI-Beta`)

    # -- server side controls -------------------------------------------------------------

    def begin_drain(self) -> None:
        """Close once no response is in flight (at once when none is)."""
        if self._pump.drain():
            self._stop.set()

    def force_close(self) -> None:
        self._stop.set()

    # -- the connection -------------------------------------------------------------------

    async def run(self) -> None:
        reader = asyncio.create_task(self._read_frames(), name="ws-read")
        writer = asyncio.create_task(self._write_events(), name="ws-write")
        stopper = asyncio.create_task(self._stop.wait(), name="ws-stop")
        tasks = {reader, writer, stopper}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if reader in done and not reader.cancelled() and reader.exception() is None and reader.result():
                # The session refused a send (it closed): its events end next; then close.
                done, _ = await asyncio.wait({writer, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if stopper in done and writer not in done:
                await _cancel(writer, reader)
                await self._close(CLOSE_GOING_AWAY, _shutting_down())
        finally:
            await _cancel(*tasks)
            self._closed = True
            await self._session.close()

    async def _read_frames(self) -> bool:
        """Client frames -> session. False: the client left; True: the session stopped taking input."""
        ctx, session = self._ctx, self._session
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                self._closed = True
                return False
            text = message.get("text")
            if text is None:  # a large text message comes as its UTF-8 bytes (ws_transport.TEXT_UTF8)
                text = message.get(TEXT_UTF8)
            if text is None:
                await self._send_error(TetherError(INVALID_REQUEST, "Binary frames are not supported: send JSON text frames."))
                continue
            # A large frame is decoded off the event loop (tether.offload): parsing megabytes
            # of JSON into a request held every other connection of the process for as long.
            request, err, lane, event_id = await offload.run(len(text), _decode_event, text, ctx.limits)
            if err is None and request.WhichOneof("event") == "create":
                try:
                    common.check_multi_agent_beta(request.create, self.multi_agent_beta)
                except TetherError as exc:
                    err, lane, event_id = exc, request.create.stream_id, request.event_id
            if err is not None:
                await self._send_error(err, lane, event_id)
                continue
            try:
                await session.send(request, nbytes=len(text))
            except TetherError:
                return True

    async def _write_events(self) -> None:
        inline = self._protocol is not None and self._session.write_inline(self)
        try:
            end = await self._pump.run(self._session.events(lazy_deltas=True), self)
        finally:
            if inline:
                self._session.write_inline(None)
        if end is PumpEnd.DRAINED:
            await self._close(CLOSE_GOING_AWAY, _shutting_down())
        elif end is not PumpEnd.WRITER_GONE:
            await self._close(CLOSE_GOING_AWAY if end is PumpEnd.SHUTTING_DOWN else CLOSE_NORMAL)

    async def write(self, batch: Sequence[Outgoing]) -> bool:
        """One batch of the pump: a text frame per event, written together. False: the client is gone."""
        frames = [common.encode_event(ev, ws=True) for ev in batch]
        send, protocol = self._send, self._protocol
        async with self._send_lock:
            if self._closed:
                return False
            if protocol is not None and protocol.send_texts_now(frames):
                return True  # one write for the batch
            for data in frames:
                if protocol is None or not protocol.send_text_now(data):
                    await send({"type": "websocket.send", "text": data.decode()})
        return True

    def write_now(self, delta: Delta) -> bool:
        """A delta in its producer's step (`tether.core.outbox.InlineWriter`): encoded and framed
        at once, unless a write of ours is under way (order) or the transport declines."""
        protocol = self._protocol
        if self._closed or protocol is None or self._send_lock.locked():
            return False
        return protocol.send_text_now(common.encode_event(delta, ws=True))

    async def _send_error(self, err: TetherError, stream_id: str = "", event_id: str = "") -> None:
        self._ctx.count_error(err)
        text = common.ws_error_text(err, stream_id, event_id)
        async with self._send_lock:
            if not self._closed:
                await self._send({"type": "websocket.send", "text": text})

    async def _close(self, code: int, err: TetherError | None = None) -> None:
        async with self._send_lock:
            if self._closed:
                return
            self._closed = True
            self.close_code = code
            if err is not None:
                self._ctx.count_error(err)
            with contextlib.suppress(Exception):  # the client may be gone already
                if err is not None:
                    await self._send({"type": "websocket.send", "text": common.ws_error_text(err)})
                await self._send({"type": "websocket.close", "code": code})


def _decode_event(text: str | bytes, limits: Limits) -> tuple[Any, TetherError | None, str, str]:
    """(the client event, None, "", ""), or (None, the error, the lane and the event_id to echo)."""
    obj: Any = None
    try:
        obj = common.decode_object(text, limits)
        return json_codec.client_event_from_json(obj), None, "", ""
    except Exception as exc:  # noqa: BLE001 - handed back to the reader, which answers it
        err = common.as_tether_error(exc)
        event_id = obj.get("event_id") if isinstance(obj, dict) else None
        return None, err, _lane_of(obj, err, text), event_id if isinstance(event_id, str) else ""


def _lane_of(obj: Any, err: TetherError, text: str | bytes) -> str:
    """The lane to echo on a request error: the frame's `stream_id`, when it is a valid one.

    A named lane's waiter (the SDK's `lane.get_final_response()`) only sees errors that carry its
    `stream_id`, so even an undecodable frame gets the lane its text names, found by a regex (a
    C-speed scan; it may pick a `"stream_id"` nested deeper when the top level has none)."""
    if err.code == INVALID_STREAM_ID:
        return ""
    if obj is None:
        if isinstance(text, bytes):
            found_bytes = _LANE_IN_BYTES.search(text)
            return found_bytes.group(1).decode() if found_bytes else ""
        found = _LANE_IN_TEXT.search(text)
        return found.group(1) if found else ""
    sid = obj.get("stream_id") if isinstance(obj, dict) else None
    return sid if isinstance(sid, str) and _LANE.fullmatch(sid) else ""


def _shutting_down() -> TetherError:
    return TetherError(SERVER_SHUTTING_DOWN, "The server is shutting down.")


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def serve(ctx: BridgeContext, scope: dict[str, Any], receive: Receive, send: Send, app: Any) -> None:
    """One WebSocket request: auth, limits, upgrade, then the connection until either side ends."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if app.draining:
        await deny(ctx, scope, send, _shutting_down())
        return
    try:
        tenant, subprotocol = console.ws_credentials(app.console, ctx, scope)
        # The engine counts connections per key (Limits.max_connections_per_key): a 429 here.
        session = await ctx.api.open_session(tenant, transport="websocket")
    except Exception as exc:
        await deny(ctx, scope, send, common.as_tether_error(exc))
        return
    tracing.adopt_parent(scope["headers"])
    conn = WsConnection(ctx, receive, send, session)
    conn.multi_agent_beta = common.has_multi_agent_beta(scope["headers"])
    try:
        await send({"type": "websocket.accept", "subprotocol": subprotocol, "headers": app.sticky_headers})
    except BaseException:
        await session.close()
        raise
    app.connection_opened(conn)
    try:
        await conn.run()
    finally:
        app.connection_closed(conn)
