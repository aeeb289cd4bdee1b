"""The HTTP/1.1 transport under the bridge's streamed responses: a body chunk written without an
await, for an SSE event written in the step that produced it (`tether.core.outbox.InlineWriter`,
through `http._SseWriter.write_now`).

uvicorn's ASGI `send` for h11 awaits only while the transport's writes are paused; otherwise it
frames the chunk (h11) and writes it. `body_writer` does the same for a response whose headers
are out and that is not complete, synchronously, and declines (writes nothing) whenever `send`
would wait or do anything else (paused writes, a gone client, a HEAD request): the caller then
takes `send`'s path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import RequestResponseCycle


def body_writer(send: Any) -> Callable[[bytes], bool] | None:
    """A synchronous writer of body chunks for the response `send` (uvicorn's h11 cycle) sends,
    or None when `send` is something else (another server, a wrapper)."""
    cycle = getattr(send, "__self__", None)
    if not isinstance(cycle, RequestResponseCycle) or cycle.scope["method"] == "HEAD":
        return None

    def write_now(body: bytes) -> bool:
        if cycle.flow.write_paused or cycle.disconnected or not cycle.response_started or cycle.response_complete:
            return False
        cycle.transport.write(cycle.conn.send(event=h11.Data(data=body)))
        return True

    return write_now
