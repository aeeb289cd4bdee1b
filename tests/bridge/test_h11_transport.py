"""A streamed body's chunks framed by the bridge (`tether.bridge.h11_transport`): the bytes h11
would write, only where h11 would frame chunks (its private `ChunkedWriter`, checked here against
the installed h11), and a stream read whole over HTTP/1.1 (chunked, framed by the bridge) and
HTTP/1.0 (close-delimited: h11 frames it)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import h11
import orjson

from tether.bridge.h11_transport import chunk, chunked

from .helpers import KEY_A, sse_frames


def _responding(version: bytes = b"1.1", headers: tuple[tuple[str, str], ...] = ()) -> h11.Connection:
    """A server connection that took a request over HTTP/`version` and started its response."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"POST /v1/responses HTTP/%s\r\nhost: x\r\ncontent-length: 0\r\n\r\n" % version)
    assert type(conn.next_event()) is h11.Request and type(conn.next_event()) is h11.EndOfMessage
    conn.send(h11.Response(status_code=200, headers=[("content-type", "text/event-stream"), *headers]))
    return conn


def test_a_chunk_is_framed_as_h11_frames_it() -> None:
    conn = _responding()
    assert chunked(conn)
    for size in (0, 1, 15, 16, 255, 256, 4096, 70_000):
        body = bytes(i % 251 for i in range(size))
        assert chunk(body) == conn.send(h11.Data(data=body)), size
    assert chunked(conn)  # data changes no state


def test_only_a_chunked_body_in_progress_is_framed_by_the_bridge() -> None:
    assert not chunked(_responding(b"1.0"))  # close-delimited: the body is written as it is
    assert not chunked(_responding(headers=(("content-length", "5"),)))
    conn = h11.Connection(h11.SERVER)
    assert not chunked(conn)  # no response started
    done = _responding()
    done.send(h11.EndOfMessage())
    assert not chunked(done)


async def _raw_stream(base_url: str, version: str) -> tuple[bytes, bytes]:
    """A streamed create over one raw connection: the response head and its body bytes as sent."""
    url = urlsplit(base_url)
    body = orjson.dumps({"model": "sim-model", "input": "hi", "stream": True})
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(f"POST {url.path}/responses HTTP/{version}\r\nhost: {url.netloc}\r\nauthorization: Bearer {KEY_A}\r\n"
                 f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
    head = await reader.readuntil(b"\r\n\r\n")
    rest = b""
    while data := await asyncio.wait_for(reader.read(65536), 10):
        rest += data
        if version == "1.1" and rest.endswith(b"0\r\n\r\n"):
            break
    writer.close()
    return head, rest


def _dechunk(data: bytes) -> bytes:
    out, i = b"", 0
    while True:
        j = data.index(b"\r\n", i)
        size = int(data[i:j], 16)
        if size == 0:
            assert data[j:] == b"\r\n\r\n"
            return out
        out += data[j + 2 : j + 2 + size]
        assert data[j + 2 + size : j + 4 + size] == b"\r\n"
        i = j + 4 + size


async def test_a_stream_reads_whole_over_http_1_1_and_http_1_0(stack: Any) -> None:
    texts = {}
    for version in ("1.1", "1.0"):
        head, rest = await _raw_stream(stack.base_url, version)
        assert b" 200 " in head.split(b"\r\n", 1)[0]
        chunked_body = b"transfer-encoding: chunked" in head.lower()
        assert chunked_body == (version == "1.1")
        frames = sse_frames((_dechunk(rest) if chunked_body else rest).decode())
        assert frames[-1][0] == "response.completed"
        seqs = [obj["sequence_number"] for _, obj in frames]
        assert seqs == list(range(len(seqs)))
        texts[version] = "".join(obj["delta"] for name, obj in frames if name == "response.output_text.delta")
        assert texts[version] == frames[-1][1]["response"]["output"][0]["content"][0]["text"]
    assert texts["1.1"] and texts["1.0"]
