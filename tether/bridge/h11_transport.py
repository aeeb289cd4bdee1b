"""The HTTP/1.1 transport under the bridge's streamed responses: a body chunk written without an
await, for an SSE event written in the step that produced it (`tether.core.outbox.InlineWriter`,
through `http._SseWriter.write_now`).

uvicorn's ASGI `send` for h11 awaits only while the transport's writes are paused; otherwise it
frames the chunk (h11) and writes it. `body_writer` does the same for a response whose headers
are out and that is not complete, synchronously, and declines (writes nothing) whenever `send`
would wait or do anything else (paused writes, a gone client, a HEAD request): the caller then
takes `send`'s path.

A chunk of a chunked body is framed here (`chunk`), not by `h11.Connection.send`: for body data
in the `SEND_BODY` state h11 changes no state and only frames it, and its generic event path cost
~2.5 µs per SSE event, a quarter of the Python a streamed token costs. `chunked` says when that
holds (the response's framing is h11's `ChunkedWriter`); any other framing (an HTTP/1.0 client's
close-delimited body) still goes through h11."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import h11
from h11._writers import ChunkedWriter  # private: `chunked` is tested against h11 (tests/bridge)
from uvicorn.protocols.http.h11_impl import RequestResponseCycle


def chunked(conn: h11.Connection) -> bool:
    """Whether `conn` frames our body data as HTTP/1.1 chunks and nothing else (`chunk` may)."""
    return conn.our_state is h11.SEND_BODY and type(getattr(conn, "_writer", None)) is ChunkedWriter


def chunk(body: bytes) -> bytes:
    """`body` as one chunk of a chunked body, as h11's `ChunkedWriter` frames it (nothing when empty)."""
    return b"%x\r\n%s\r\n" % (len(body), body) if body else b""


def body_writer(send: Any) -> Callable[[bytes], bool] | None:
    """A synchronous writer of body chunks for the response `send` (uvicorn's h11 cycle) sends,
    or None when `send` is something else (another server, a wrapper)."""
    cycle = getattr(send, "__self__", None)
    if not isinstance(cycle, RequestResponseCycle) or cycle.scope["method"] == "HEAD":
        return None

    def write_now(body: bytes) -> bool:
        if cycle.flow.write_paused or cycle.disconnected or not cycle.response_started or cycle.response_complete:
            return False
        conn = cycle.conn
        if chunked(conn):
            if body:
                cycle.transport.write(chunk(body))
        else:
            cycle.transport.write(conn.send(event=h11.Data(data=body)))
        return True

    return write_now
