"""The upstream client's response parsing (tether/backends/chat/http1.py) without sockets: bytes
fed as a connection would feed them, split anywhere, and what the caller reads."""

from __future__ import annotations

import gzip

import pytest

from tether.backends.chat.http1 import (
    MAX_HEAD_BYTES,
    READ_HIGH_WATER,
    ConnectionClosed,
    HttpError,
    ProtocolViolation,
    Response,
)


class FakeConnection:
    """What a Response asks of its connection."""

    def __init__(self) -> None:
        self.paused = False
        self.released: list[bool] = []

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def response_released(self, response: Response, reusable: bool) -> None:
        self.released.append(reusable)


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
SSE_BODY = [b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n', b'data: {"choices":[]}\n\n', b"data: [DONE]\n\n"]


async def _feed(raw: bytes, splits: list[int]) -> tuple[Response, FakeConnection, bytes]:
    conn = FakeConnection()
    response = Response(conn)  # type: ignore[arg-type]
    last = 0
    for cut in [*splits, len(raw)]:
        response._feed(raw[last:cut])
        last = cut
    await response._head_done
    body = await response.read()
    response.release()
    return response, conn, body


async def test_a_chunked_stream_read_whole_however_it_is_split() -> None:
    raw = SSE_HEAD + _chunked(*SSE_BODY)
    for cut in range(1, len(raw)):  # every two-piece split, then bytes one at a time
        response, conn, body = await _feed(raw, [cut])
        assert body == b"".join(SSE_BODY), cut
        assert response.status == 200 and response.headers["content-type"] == "text/event-stream"
        assert conn.released == [True]  # read to its end on HTTP/1.1: the connection is reused
    _, conn, body = await _feed(raw, list(range(1, len(raw))))
    assert body == b"".join(SSE_BODY) and conn.released == [True]


async def test_reads_of_one_whole_chunk_each_deliver_it_as_any_split_does() -> None:
    """A streaming server's usual read is one whole chunk (skips the chunk loop); a read that is
    anything else (an extension, a chunk and part of the next, the last chunk) goes the loop's way."""
    response = Response(FakeConnection())  # type: ignore[arg-type]
    response._feed(SSE_HEAD)
    await response._head_done
    for piece in [*SSE_BODY, b"a" * 300, b"\r\n"]:
        response._feed(b"%x\r\n%s\r\n" % (len(piece), piece))
        assert response.read_nowait() == piece
    response._feed(b"00A\r\n0123456789\r\n")  # leading zeros, upper case
    assert response.read_nowait() == b"0123456789"
    response._feed(b"5;ext=1\r\nhello\r\n")
    assert response.read_nowait() == b"hello"
    response._feed(b"3\r\nabc\r\n2\r\nde")
    assert response.read_nowait() == b"abcde"
    response._feed(b"\r\n")
    assert response.read_nowait() == b""
    response._feed(b"3\r\nxyzXX")  # a chunk without its CRLF: the loop skips two bytes, as before
    assert response.read_nowait() == b"xyz"
    response._feed(b"0\r\n\r\n")
    assert response.read_nowait() is None  # the body ended


async def test_chunk_extensions_and_trailers_are_read_past() -> None:
    raw = SSE_HEAD + b"5;name=value\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"
    _, conn, body = await _feed(raw, [len(SSE_HEAD) + 3])
    assert body == b"hello" and conn.released == [True]


async def test_content_length_bodies_and_what_follows_them() -> None:
    _, conn, body = await _feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", [20])
    assert body == b"hello" and conn.released == [True]
    _, conn, body = await _feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA", [])
    assert body == b"hello" and conn.released == [False]  # a server that says more is not reused
    _, conn, body = await _feed(b"HTTP/1.1 204 No Content\r\n\r\n", [])
    assert body == b"" and conn.released == [True]
    _, conn, body = await _feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", [])
    assert body == b"ok" and conn.released == [False]


async def test_a_body_to_the_connections_end() -> None:
    conn = FakeConnection()
    response = Response(conn)  # type: ignore[arg-type]
    response._feed(b"HTTP/1.0 200 OK\r\n\r\nall of it")
    await response._head_done
    response._connection_ended(None)
    assert await response.read() == b"all of it"
    response.release()
    assert conn.released == [False]


async def test_gzip_and_informational_heads() -> None:
    packed = gzip.compress(b"".join(SSE_BODY))
    raw = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
           + _chunked(packed[:7], packed[7:]))  # fmt: skip
    response, _, body = await _feed(raw, [10, 30])
    assert response.status == 200 and body == b"".join(SSE_BODY)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"SMTP ready\r\n\r\n", "HTTP/1.x"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "header"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
        (SSE_HEAD + b"zz\r\nhello\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nnope", "decode"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * MAX_HEAD_BYTES, "head over"),
    ],
)
async def test_malformed_answers_are_protocol_violations(raw: bytes, error: str) -> None:
    response = Response(FakeConnection())  # type: ignore[arg-type]
    response._feed(raw)
    with pytest.raises(ProtocolViolation, match=error):
        await response._head_done
        await response.read()


async def test_a_connection_that_ends_mid_body_fails_the_read() -> None:
    conn = FakeConnection()
    response = Response(conn)  # type: ignore[arg-type]
    response._feed(SSE_HEAD + b"5\r\nhel")
    await response._head_done
    assert await response.__anext__() == b"hel"
    response._connection_ended(ConnectionResetError("reset"))
    with pytest.raises(ConnectionClosed):
        await response.__anext__()
    response.release()
    assert conn.released == [False]


async def test_reading_pauses_while_the_caller_lags_and_resumes_when_it_reads() -> None:
    conn = FakeConnection()
    response = Response(conn)  # type: ignore[arg-type]
    response._feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    await response._head_done
    piece = b"x" * 65536
    for _ in range(READ_HIGH_WATER // len(piece) + 1):
        response._feed(_chunked(piece)[:-5])  # one chunk at a time, no end yet
    assert conn.paused
    assert len(await response.__anext__()) > READ_HIGH_WATER
    assert not conn.paused
    response.close()  # ends the pending read: the caller sees why
    with pytest.raises(HttpError):
        await response.__anext__()
    assert conn.released == [False]


def test_header_lines_cannot_be_split_and_urls_must_be_http() -> None:
    from tether.backends.chat.http1 import UpstreamPool

    opts = {"max_connections": 1, "keepalive_timeout_s": 1, "connect_timeout_s": 1, "pool_timeout_s": 1}
    with pytest.raises(ValueError, match="invalid HTTP header"):
        UpstreamPool("http://127.0.0.1:9/v1", headers={"x-extra": "a\r\nx-injected: 1"}, **opts)
    with pytest.raises(ValueError, match="http:// or https://"):
        UpstreamPool("ftp://127.0.0.1/v1", **opts)
    with pytest.raises(ValueError, match="only http:// proxies"):
        UpstreamPool("http://127.0.0.1:9/v1", proxy="socks5://127.0.0.1:1080", **opts)
