"""Incremental text/event-stream decoding (bytes in any split -> `(event, data)` pairs)."""

from __future__ import annotations


class SSEDecoder:
    """Incremental text/event-stream decoder: `feed(bytes)` -> completed `(event, data)` pairs.

    Handles frames split anywhere across reads, CRLF or LF line ends, comment lines (`: keep-alive`),
    multi-line data. `event` is None for plain `data:` frames. llama.cpp's `error: {...}` lines are
    reported as event "error".
    """

    __slots__ = ("_buf", "_event", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        buf = self._buf + chunk if self._buf else chunk
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[tuple[str | None, bytes]] = []
        for line in lines:
            self._line(line, out)
        return out

    def flush(self) -> list[tuple[str | None, bytes]]:
        """End of stream: a final frame without its blank line still counts."""
        out: list[tuple[str | None, bytes]] = []
        if self._buf:
            line, self._buf = self._buf, b""
            self._line(line, out)
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[tuple[str | None, bytes]]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            if self._data:
                out.append((self._event, self._data[0] if len(self._data) == 1 else b"\n".join(self._data)))
            self._event = None
            self._data = []
            return
        if line[:1] == b":":
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"error":
            self._event = "error"
            self._data.append(value)
