"""The WebSocket protocol under the bridge: uvicorn's websockets-sansio protocol plus the guards
that act on the transport itself, where the ASGI app cannot reach.

- **A refused handshake is answered.** The `websockets` parser has its own head limits (a line
  of 8 KiB, 128 headers); past them it gives up on the request without a reply, and uvicorn
  then waits forever on a socket the head deadline no longer covers (it stopped at the end of
  the head). Here any request it cannot parse gets 431 `request_header_fields_too_large`
  (a limit) or 400 `invalid_request`, and the socket closes.
- **Writes have a deadline.** A peer that stops reading fills the socket buffers, then the
  transport's: writes pause, and a graceful close never completes because the close frame (and
  whatever is still buffered) cannot be flushed. Every `ws_send_timeout_s` the connection looks
  at its unsent bytes: when writes are paused or the transport is closing, nothing more can be
  added, so their count can only fall while the peer reads. If it did not fall since the
  previous look, which found the connection stuck too, the transport is aborted (so after 1 to 2
  periods without progress). `connection_lost` then ends the ASGI connection (the app's blocked
  `send` raises, its `receive` gets `websocket.disconnect`), which closes the session and frees
  its per-key connection slot. (A high-water mark of ~0 would make every stall visible as a
  pause without polling, but makes each send wait for the socket to drain: -40% turns/s in the
  load campaign. A timer per connection per period costs nothing measurable.)
- **No reading while writes are paused.** `websockets` answers every ping with a pong on its own;
  a peer that floods pings and never reads would grow the unsent pongs without bound. While
  writes are paused, reading is paused too (the peer's sends back up into its own buffers), and
  if that lasts, the write deadline above closes the connection.
- **Small messages go out uncompressed.** With permessage-deflate negotiated, a message shorter
  than `ws_compress_min_bytes` is sent as it is (RSV1 unset: RFC 7692 lets any message be
  uncompressed, and every client reads it). A token delta is ~150 bytes: deflating it cost ~11% of
  the server's CPU per streamed token from a paced upstream and saves ~100 bytes; the large
  messages (the response objects, whole items) are still compressed.
- **A text message is framed here.** On an open connection with nothing but the small-message
  deflate above, a text message is a 2-10 byte header and the UTF-8 text, or its deflated bytes
  (the connection's own compressor, as `websockets` would call it): `send` writes that itself
  instead of going through `websockets`' frame objects and uvicorn's generic path (the framing
  was ~10% of the server's CPU per streamed token, and ~80 µs per compressed response object,
  three of them per create). Anything else (a fragmented send, binary data, debug logging, a
  closing connection) takes the generic path. `send_text_now` is the same framing without an await, for a message written in
  the step that produced it (`tether.core.outbox.InlineWriter`): it declines (writes nothing) when
  writes are paused or the message needs the generic path, and the caller queues it instead.
- **Large text messages are not decoded here.** A text message of `tether.offload.OFF_LOOP_BYTES`
  or more reaches the app as its UTF-8 bytes (`TEXT_UTF8`), which decodes it with its JSON in the
  offload thread: decoding megabytes to text on the loop held every other connection.
- **One inflation budget for the process.** permessage-deflate inflates a message inside the
  protocol, before the app sees it, up to the transport cap (`max_size`, 4 x
  `Limits.max_request_bytes`). `InflationBudget` caps the bytes of all messages that are being
  received or wait for the app, across connections: a connection may receive a message only as
  large as what is left of the budget (beyond it: close 1009), so concurrent bombs cost at most
  the budget, not a cap per connection.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from typing import Any

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import SecurityError
from websockets.extensions.permessage_deflate import PerMessageDeflate, ServerPerMessageDeflateFactory
from websockets.frames import OP_BINARY, OP_TEXT, Frame
from websockets.protocol import OPEN

from tether import offload
from tether.bridge import common
from tether.errors import HEADERS_TOO_LARGE, INVALID_REQUEST, TetherError

log = logging.getLogger("tether.bridge")

# The key of a `websocket.receive` message that carries a large text message as its UTF-8 bytes:
# decoding megabytes to a str is the app's work (tether/bridge/ws.py), done off the event loop
# with the JSON (`tether.offload`). Invalid UTF-8 there is an `invalid_json` error, not a close.
TEXT_UTF8 = "tether.text_utf8"

# A message this small is received even when the inflation budget is spent: it costs little,
# and refusing it would close ordinary connections whenever one peer sends a bomb.
_ALWAYS_ALLOWED_BYTES = 1024 * 1024


class InflationBudget:
    """Bytes of WebSocket messages held between the protocol and the app, process-wide."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def left(self) -> int:
        return max(0, self.limit - self.held)


class _DeflateLargeMessages(PerMessageDeflate):
    """permessage-deflate that sends a whole message shorter than `min_bytes` uncompressed."""

    min_bytes = 0

    def encode(self, frame: Frame) -> Frame:
        if frame.fin and len(frame.data) < self.min_bytes and frame.opcode in (OP_TEXT, OP_BINARY):
            return frame  # RSV1 unset: an uncompressed message; the compressor's context is untouched
        return super().encode(frame)


class _SmallUncompressedFactory(ServerPerMessageDeflateFactory):
    """uvicorn's permessage-deflate offer handling, negotiating `_DeflateLargeMessages`."""

    def __init__(self, min_bytes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.min_bytes = min_bytes

    def process_request_params(self, params: Any, accepted_extensions: Any) -> Any:
        response, extension = super().process_request_params(params, accepted_extensions)
        extension.__class__ = _DeflateLargeMessages  # same state; only `encode` differs
        extension.min_bytes = self.min_bytes  # type: ignore[attr-defined]  # its class is _DeflateLargeMessages now
        return response, extension


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """See the module docstring. Class attributes are set per server by `protocol_class`."""

    send_timeout_s: float = 30.0
    hard_max_size: int = 0
    budget: InflationBudget = InflationBudget(0)
    compress_min_bytes: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.compress_min_bytes > 0:
            self.conn.available_extensions = [
                _SmallUncompressedFactory(self.compress_min_bytes, **_deflate_settings(f))
                if isinstance(f, ServerPerMessageDeflateFactory) else f
                for f in self.conn.available_extensions  # type: ignore[union-attr]  # uvicorn passes a list (maybe empty)
            ]

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._held = 0  # bytes of received messages not yet taken by the app (our budget share)
        self._stuck_with: int | None = None  # unsent bytes at the last look, if it found us stuck
        self._watch = self.loop.call_later(self.send_timeout_s, self._check_stall)

    def data_received(self, data: bytes) -> None:
        if self.handshake_complete and self.budget.limit:
            share = max(_ALWAYS_ALLOWED_BYTES, self._held + self.budget.left())
            self.conn.max_message_size = min(self.hard_max_size, share)
        super().data_received(data)
        if not self.handshake_initiated and self.conn.handshake_exc is not None:
            self._refuse_handshake(self.conn.handshake_exc.__cause__)

    def handle_handshake_exception(self) -> None:
        # uvicorn >= 0.55 answers an unparsable upgrade itself (a bare 400, or the 414/431 that
        # websockets >= 17 queues); the answer stays ours: JSON, with the limit's own code.
        self._refuse_handshake(self.conn.handshake_exc.__cause__ if self.conn.handshake_exc else None)

    def _refuse_handshake(self, cause: BaseException | None) -> None:
        if self.transport.is_closing():
            return
        self.handshake_initiated = self.handshake_complete = self.close_sent = True
        if isinstance(cause, SecurityError):  # a line over 8 KiB or more than 128 headers
            err = TetherError(
                HEADERS_TOO_LARGE, f"The request headers are too large: {cause}."
            )
            reply = common.raw_http_error(err)
        else:
            err = TetherError(
                INVALID_REQUEST, "The WebSocket upgrade request could not be parsed."
            )
            reply = common.raw_http_error(err)
        self.transport.write(reply)
        self.transport.close()

    # -- small text messages, framed here ----------------------------------------------------------

    def _text_frame(self, data: bytes) -> bytes | None:
        """The whole frame of an unfragmented text message of UTF-8 `data` (compressed by the
        connection's permessage-deflate when it is at least `min_bytes`), or None when the message
        must take the generic path."""
        conn = self.conn
        if conn.state is not OPEN or conn.expect_continuation_frame or conn.debug or self.close_sent:
            return None
        first = 0x81  # FIN + text; server frames are not masked
        extensions = conn.extensions
        if extensions:
            deflate = extensions[0]
            if len(extensions) != 1 or type(deflate) is not _DeflateLargeMessages:
                return None
            if len(data) >= deflate.min_bytes:
                # The connection's own compressor (its context carries over between messages,
                # whichever path sends them), as the generic path would call it.
                data = deflate.encode(Frame(OP_TEXT, data)).data  # type: ignore[assignment]  # bytes or a memoryview: written as is
                first = 0xC1  # + RSV1: a compressed message
        size = len(data)
        if size < 126:
            header = bytes((first, size))
        elif size < 65536:
            header = struct.pack("!BBH", first, 126, size)
        else:
            header = struct.pack("!BBQ", first, 127, size)
        return header + data

    def _open_for_writes(self) -> bool:
        """Open, past the handshake, and writes not paused (the client reads)."""
        return (self.handshake_complete and self.initial_response is None and not self.disconnected
                and self.writable.is_set())  # fmt: skip

    def send_text_now(self, data: bytes) -> bool:
        """Write one text message (its UTF-8 `data`) at once when the framing above applies and
        writes are not paused; False: nothing was written (the caller takes `send`'s path)."""
        if not self._open_for_writes():
            return False
        frame = self._text_frame(data)
        if frame is None:
            return False
        self.transport.write(frame)
        return True

    def send_texts_now(self, messages: Sequence[bytes]) -> bool:
        """Write text messages (each its UTF-8 bytes) at once, in one write (one system call for
        a batch of events), when the framing above applies and writes are not paused; False:
        nothing was written. All or nothing: whether a message can be framed here depends only
        on the connection's state, which framing does not change, so it is decided by the first."""
        if len(messages) < 2:
            return bool(messages) and self.send_text_now(messages[0])
        if not self._open_for_writes():
            return False
        first = self._text_frame(messages[0])
        if first is None:
            return False
        frames = [first]
        for data in messages[1:]:
            frame = self._text_frame(data)
            assert frame is not None  # the same state as the first's
            frames.append(frame)
        self.transport.write(b"".join(frames))
        return True

    async def send(self, message: Any) -> None:
        text = message.get("text") if message["type"] == "websocket.send" and self.handshake_complete else None
        if text is not None and message.get("bytes") is None and self.initial_response is None:
            await self.writable.wait()
            if self.disconnected:
                raise ClientDisconnected()
            frame = self._text_frame(text.encode())
            if frame is not None:
                self.transport.write(frame)
                return
        await super().send(message)

    # -- the inflation budget ---------------------------------------------------------------------

    def send_receive_event_to_app(self) -> None:
        size = sum(len(frame) for frame in self.frames)
        if self.curr_msg_data_type == "text" and size >= offload.OFF_LOOP_BYTES and not self.close_sent:
            # Not decoded here, on the loop: the app decodes it with its JSON, off the loop.
            data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
            self.frames = []
            self.queue.put_nowait({"type": "websocket.receive", "text": None, TEXT_UTF8: data})  # type: ignore[arg-type]  # ours: the text left as UTF-8 bytes
        else:
            super().send_receive_event_to_app()
        if self.queue.qsize() and not self.close_sent:
            self._held += size
            self.budget.held += size

    async def receive(self) -> Any:
        message = await super().receive()
        self._release_held()
        if not self.read_paused and not self.writable.is_set():
            self.transport.pause_reading()  # uvicorn resumed reading; writes are still paused
        return message

    def _release_held(self) -> None:
        self.budget.held -= self._held
        self._held = 0

    # -- writes: pause reading, deadline ----------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self.read_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def _check_stall(self) -> None:
        size = self.transport.get_write_buffer_size()
        stuck = size > 0 and (not self.writable.is_set() or self.transport.is_closing())
        if stuck and self._stuck_with is not None and size >= self._stuck_with:
            log.warning(
                "aborting a WebSocket whose peer stopped reading",
                extra={"unsent_bytes": size, "timeout_s": self.send_timeout_s},
            )
            self.transport.abort()
            return
        self._stuck_with = size if stuck else None
        self._watch = self.loop.call_later(self.send_timeout_s, self._check_stall)

    def connection_lost(self, exc: Exception | None) -> None:
        self._watch.cancel()
        self._release_held()
        super().connection_lost(exc)


def _deflate_settings(factory: ServerPerMessageDeflateFactory) -> dict[str, Any]:
    """The negotiation settings uvicorn gave its factory, to make ours the same."""
    return {
        "server_no_context_takeover": factory.server_no_context_takeover,
        "client_no_context_takeover": factory.client_no_context_takeover,
        "server_max_window_bits": factory.server_max_window_bits,
        "client_max_window_bits": factory.client_max_window_bits,
        "compress_settings": factory.compress_settings,
        "require_client_max_window_bits": factory.require_client_max_window_bits,
    }


def protocol_class(
    *, send_timeout_s: float, hard_max_size: int, inflation_budget_bytes: int, compress_min_bytes: int = 0
) -> type:
    """The protocol class for one bridge server, with its limits (uvicorn instantiates it)."""
    attrs = {
        "send_timeout_s": send_timeout_s,
        "hard_max_size": hard_max_size,
        "budget": InflationBudget(inflation_budget_bytes),
        "compress_min_bytes": compress_min_bytes,
    }
    return type("GuardedWebSocketProtocol", (GuardedWebSocketProtocol,), attrs)
