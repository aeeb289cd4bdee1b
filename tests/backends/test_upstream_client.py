"""The Chat Completions adapter's connection pool and timeouts (tether/backends/chat/http1.py), at and past each edge,
against real sockets on loopback: `max_connections` with `pool_timeout_s`, `keepalive_timeout_s`,
an upstream that never answers (nor reads the request), and the options' validation."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from tests.fakes import chat_server as fk
from tests.fakes.items import request
from tests.support.tls import self_signed
from tether.backends.base import BackendError, Finish, TextDelta
from tether.backends.registry import build_backend
from tether_lab.upstream import splice

FAST = {"api_key": "test-key", "max_retries": 0, "dialect": "cerebras"}


def backend(base_url: str, **options):
    return build_backend("pool-test", "openai", {"base_url": base_url, **FAST, **options})


async def drain(b, text: str = "hi") -> list:
    return [c async for c in b.stream(request(text))]


async def test_a_busy_pool_waits_then_times_out_past_pool_timeout(fake_chat_server):
    b = backend(fake_chat_server.base_url, max_connections=1, pool_timeout_s=0.2, connect_timeout_s=0.2)
    try:
        fake_chat_server.push(fk.stall(after_chunks=1, seconds=5))
        holder = b.stream(request("hold the only connection"))
        await holder.__anext__()  # streaming: the one connection is taken
        t0 = time.monotonic()
        with pytest.raises(BackendError) as ei:
            await drain(b)
        assert ei.value.code == "backend_timeout"
        assert 0.3 <= time.monotonic() - t0 < 3  # waited out pool + connect (0.4 s), not the stall
        await holder.aclose()
        # The connection is free again: the next call goes through at once.
        chunks = await drain(b)
        assert isinstance(chunks[-1], Finish)
    finally:
        await b.aclose()


async def test_max_connections_streams_beyond_the_cap_wait_their_turn(fake_chat_server):
    b = backend(fake_chat_server.base_url, max_connections=2)
    try:
        fake_chat_server.default = fk.paced(5, 0.02)
        results = await asyncio.gather(*(drain(b) for _ in range(4)))
        assert all(isinstance(r[-1], Finish) for r in results)
        assert len({r.peer for r in fake_chat_server.chat_requests}) <= 2  # never more than 2 sockets
    finally:
        await b.aclose()


async def test_keepalive_timeout_closes_an_idle_connection(fake_chat_server):
    b = backend(fake_chat_server.base_url, keepalive_timeout_s=0.2)
    try:
        await drain(b)
        await drain(b)  # right after: the kept-alive connection
        await asyncio.sleep(0.6)  # past keepalive_timeout_s: closed while idle
        await drain(b)
        peers = [r.peer for r in fake_chat_server.chat_requests]
        assert peers[0] == peers[1] and peers[2] != peers[1]
    finally:
        await b.aclose()


def _silent_server() -> tuple[socket.socket, threading.Event]:
    """Accepts connections and never reads nor answers (until `stop` is set)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()
    held: list[socket.socket] = []

    def run() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                held.append(conn)
            except OSError:
                continue
        for c in held:
            c.close()
        srv.close()

    threading.Thread(target=run, daemon=True).start()
    return srv, stop


@pytest.mark.parametrize("body_mb", [0, 8])
async def test_an_upstream_that_never_answers_nor_reads_times_out(body_mb):
    """A small body is sent, then the head never comes: `stream_idle_timeout_s` (0.4 s). An 8 MB
    body cannot even be written out: the head deadline (pool + connect + write + idle, 1.0 s)."""
    srv, stop = _silent_server()
    b = backend(f"http://127.0.0.1:{srv.getsockname()[1]}/v1", stream_idle_timeout_s=0.4, write_timeout_s=0.2,
                pool_timeout_s=0.2, connect_timeout_s=0.2)
    try:
        t0 = time.monotonic()
        with pytest.raises(BackendError) as ei:
            await drain(b, "x" * (body_mb << 20))
        took = time.monotonic() - t0
        assert ei.value.code == "backend_timeout" and ei.value.retryable
        assert (0.35 if body_mb == 0 else 0.9) <= took < 5
    finally:
        stop.set()
        await b.aclose()


def test_pool_options_are_checked():
    with pytest.raises(ValueError, match="max_connections"):
        backend("http://127.0.0.1:9/v1", max_connections=0)
    with pytest.raises(ValueError, match="max_keepalive_connections"):  # gone: keepalive_timeout_s
        backend("http://127.0.0.1:9/v1", max_keepalive_connections=5)


async def test_a_proxy_named_by_the_environment_carries_the_calls(fake_chat_server, monkeypatch):
    """HTTP_PROXY is honoured (read once, when the backend is made), NO_PROXY exempts a host."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{fake_chat_server.port}")
    b = backend("http://upstream.invalid/v1")  # only the proxy can reach it
    try:
        with pytest.raises(BackendError):
            await drain(b)  # the fake answers the proxy-form request with 404: it got the call
        assert fake_chat_server.requests[-1].path == "http://upstream.invalid/v1/chat/completions"
    finally:
        await b.aclose()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen = len(fake_chat_server.requests)
    b = backend(f"http://127.0.0.1:{port}/v1")
    try:
        with pytest.raises(BackendError) as ei:
            await drain(b)
        assert ei.value.code == "backend_error" and len(fake_chat_server.requests) == seen  # direct: refused
    finally:
        await b.aclose()


async def test_a_slow_consumer_is_not_an_idle_upstream(fake_chat_server):
    """The idle timeout counts only while the stream waits for the upstream: a consumer that takes
    longer than it between runs (a slow client, a full outbox) does not time the stream out."""
    b = backend(fake_chat_server.base_url, stream_idle_timeout_s=0.3)
    try:
        fake_chat_server.push(fk.paced(4, 0.01))
        got = []
        async for chunk in b.stream(request("hi")):
            got.append(chunk)
            await asyncio.sleep(0.4)
        assert isinstance(got[-1], Finish) and len(got) == 5
        fake_chat_server.push(fk.stall(after_chunks=1, seconds=5))
        t0 = time.monotonic()
        with pytest.raises(BackendError) as ei:
            await drain(b)
        assert ei.value.code == "backend_timeout" and 0.25 <= time.monotonic() - t0 < 3
    finally:
        await b.aclose()


async def _tls_chat_server(cert: Path, key: Path, seen: list[bytes]) -> asyncio.Server:
    """An https upstream that answers every request with a one-token chat stream (chunked), on
    one kept-alive connection; `seen` gets each request's head."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen.append(head)
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                await reader.readexactly(length)
                events = [fk._frame_bytes(fk.chunk({"content": "secure"})), fk._frame_bytes(fk.chunk({}, "stop")),
                          b"data: [DONE]\n\n"]  # fmt: skip
                body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + body)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    return await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)


async def _connect_proxy(asked: list[bytes]) -> asyncio.Server:
    """An HTTP proxy that serves CONNECT only: `asked` gets each request line."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0]
        asked.append(line)
        host, _, port = line.split(b" ")[1].decode().rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await splice(reader, writer, up_reader, up_writer)

    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def test_an_https_upstream_directly_and_through_a_connect_proxy(tmp_path, monkeypatch):
    """TLS verified with the system's CAs (here `SSL_CERT_FILE`, the test's own certificate),
    kept alive across calls; with HTTPS_PROXY the calls go through a CONNECT tunnel, TLS inside."""
    cert, key = self_signed(tmp_path)
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    seen: list[bytes] = []
    asked: list[bytes] = []
    upstream = await _tls_chat_server(cert, key, seen)
    proxy = await _connect_proxy(asked)
    port = upstream.sockets[0].getsockname()[1]
    try:
        b = backend(f"https://localhost:{port}/v1")
        try:
            for _ in range(2):
                chunks = await drain(b)
                assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["secure"]
                assert isinstance(chunks[-1], Finish)
            posts = [h for h in seen if h.startswith(b"POST /v1/chat/completions HTTP/1.1")]
            assert len(posts) == 2 and f"host: localhost:{port}".encode() in posts[0]
        finally:
            await b.aclose()
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}")
        b = backend(f"https://localhost:{port}/v1")
        try:
            for _ in range(2):
                chunks = await drain(b)
                assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["secure"]
            assert asked == [f"CONNECT localhost:{port} HTTP/1.1".encode()]  # one tunnel, kept alive
            assert len([h for h in seen if h.startswith(b"POST /v1/chat/completions HTTP/1.1")]) == 4
        finally:
            await b.aclose()
        monkeypatch.delenv("SSL_CERT_FILE")  # not trusted: refused, as a connection failure
        monkeypatch.delenv("HTTPS_PROXY")
        b = backend(f"https://localhost:{port}/v1")
        try:
            with pytest.raises(BackendError) as ei:
                await drain(b)
            assert ei.value.code == "backend_error" and "CertificateRejected" in ei.value.message
            assert len([h for h in seen if h.startswith(b"POST")]) == 4  # nothing went out
        finally:
            await b.aclose()
    finally:
        upstream.close()
        proxy.close()
