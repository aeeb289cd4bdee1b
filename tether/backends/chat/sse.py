"""Incremental text/event-stream decoding (bytes in any split -> `(event, data)` pairs)."""

from __future__ import annotations

from tether import errors
from tether.backends.base import BackendError

# The largest SSE line, and the largest event's data, a decoder accepts by default (a backend's
# `max_event_bytes` option sets it): a streamed chunk of a Chat Completions server is a few
# hundred bytes; one that sends its whole answer in one chunk still fits.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class SSEDecoder:
    """Incremental text/event-stream decoder: `feed(bytes)` -> completed `(event, data)` pairs.

    Handles frames split anywhere across reads, CRLF or LF line ends, comment lines (`: keep-alive`),
    multi-line data. `event` is None for plain `data:` frames. llama.cpp's `error: {...}` lines are
    reported as event "error". A read that is one whole `data:` event (a streaming server's usual
    write: one chunk per token) is decoded without the line loop.

    Linear in the bytes fed however the stream is split: a line that is still incomplete is kept
    as a list of its pieces (joined once, when its end comes), and each read is searched for line
    ends only in its own bytes. A line, or an event's data, longer than `max_event_bytes` raises
    `BackendError` (`backend_error`) as soon as it passes the size, so an upstream cannot make the
    server hold or scan an unbounded line.
    """

    __slots__ = ("_parts", "_partial", "_event", "_data", "_data_bytes", "max_event_bytes")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._parts: list[bytes] = []  # the pieces of the incomplete last line
        self._partial = 0  # their length
        self._event: str | None = None
        self._data: list[bytes] = []
        self._data_bytes = 0

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        end = chunk.find(b"\n")
        if (
            end == len(chunk) - 2  # the common read: one whole `data: ...` event, LF line ends
            and chunk[end + 1 :] == b"\n"
            and chunk[:6] == b"data: "
            and not self._parts
            and not self._data
            and self._event is None
            and chunk[end - 1 : end] != b"\r"
            and end <= self.max_event_bytes
        ):
            return [(None, chunk[6:end])]  # what the lines below make of it, without them
        out: list[tuple[str | None, bytes]] = []
        if end < 0:
            self._hold(chunk)
            return out
        if self._parts:
            self._parts.append(chunk[:end])
            line = b"".join(self._parts)
            self._parts, self._partial = [], 0
        else:
            line = chunk[:end]
        self._check(len(line))
        self._line(line, out)
        lines = chunk[end + 1 :].split(b"\n")
        tail = lines.pop()
        for line in lines:
            self._check(len(line))
            self._line(line, out)
        if tail:
            self._hold(tail)
        return out

    def flush(self) -> list[tuple[str | None, bytes]]:
        """End of stream: a final frame without its blank line still counts."""
        out: list[tuple[str | None, bytes]] = []
        if self._parts:
            line = b"".join(self._parts)
            self._parts, self._partial = [], 0
            self._line(line, out)
        self._line(b"", out)
        return out

    def _hold(self, piece: bytes) -> None:
        self._parts.append(piece)
        self._partial += len(piece)
        self._check(self._partial)

    def _check(self, size: int) -> None:
        if size > self.max_event_bytes:
            raise BackendError(
                errors.BACKEND_ERROR,
                f"upstream sent a server-sent-events line over {self.max_event_bytes} bytes (max_event_bytes)",
            )

    def _line(self, line: bytes, out: list[tuple[str | None, bytes]]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            if self._data:
                out.append((self._event, self._data[0] if len(self._data) == 1 else b"\n".join(self._data)))
            self._event = None
            self._data = []
            self._data_bytes = 0
            return
        if line[:1] == b":":
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data" or name == b"error":
            self._data_bytes += len(value) + 1
            if self._data_bytes > self.max_event_bytes:
                raise BackendError(
                    errors.BACKEND_ERROR,
                    f"upstream sent a server-sent event with over {self.max_event_bytes} bytes of data (max_event_bytes)",
                )
            self._data.append(value)
            if name == b"error":
                self._event = "error"
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
