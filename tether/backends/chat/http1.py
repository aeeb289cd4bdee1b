"""The Chat Completions adapter's HTTP/1.1 client: one keep-alive pool per upstream.

Why its own: every create makes one upstream request, and through aiohttp's `ClientSession` a
streamed POST cost ~90 µs more CPU than a plain asyncio exchange of the same bytes (134 vs 45 µs,
client and a paced upstream in one process, warm caches); under 100 simultaneous creates that
was ~0.2 ms of each create's ~1.1 ms, all of it before the request leaves, so it delayed every
later create's first token. What an upstream API needs is small, and all of it is here:

- a pool per upstream: at most `max_connections` open (callers beyond wait up to the pool
  timeout), idle ones reused last-in first-out and closed after `keepalive_timeout_s`;
- `http` and `https` (TLS with the system's CAs, `SSL_CERT_FILE` honoured), the connect bounded
  by `connect_timeout_s`;
- an HTTP proxy from the environment (the caller reads it once): absolute-form requests for
  `http`, a `CONNECT` tunnel for `https`, `Proxy-Authorization` from the proxy URL's user info;
- response bodies framed by `Content-Length`, chunked transfer coding, or the connection's end;
  `gzip` / `deflate` bodies decoded (none is asked for: no `Accept-Encoding` goes out);
- a response head of at most `MAX_HEAD_BYTES`; reading pauses while `READ_HIGH_WATER` bytes
  wait for the caller.

No redirects (an API call that is redirected is a configuration error, answered as the status
it is) and no cookies. A transport failure is an `HttpError`, of a class that names it; a deadline is the caller's
(`asyncio.timeout`), except the pool wait plus connect (`pool_timeout_s + connect_timeout_s`,
TimeoutError).

A `Response` is read with `read()` or `async for piece in response` (each piece what one network
read completed, as aiohttp's `iter_any`), and released by `async with response` (or `release()`):
its connection goes back to the pool when the body was read to its end, else it is closed.
A caller that handles the body in the step that read it (a streamed token written to its client
without a task switch) sets `listen(callback)`: the callback runs in the connection's
`data_received` once per network read (and when the body ends or fails), and takes what is there
with `read_nowait()`.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import urllib.parse
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from typing import cast

MAX_HEAD_BYTES = 64 * 1024
READ_HIGH_WATER = 1 << 20
_NO_BODY = frozenset({204, 304})


class HttpError(Exception):
    """The upstream's transport failed. Its class names the failure (callers that report only the
    class to a client say what happened without the upstream's address)."""


class ConnectFailed(HttpError):
    """No connection: refused, unreachable, a name that does not resolve, a proxy that refused."""


class CertificateRejected(ConnectFailed):
    """TLS: the upstream's certificate did not verify against the trusted CAs."""


class ConnectionClosed(HttpError):
    """The upstream closed or reset the connection before the response ended."""


class ProtocolViolation(HttpError):
    """The upstream's answer is not well-formed HTTP/1.x (or a body that does not decode)."""


def _check_header(name: str, value: str) -> None:
    if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
        raise ValueError(f"invalid HTTP header {name!r}")


class Response:
    """One response: `status`, `headers` (names lowercased), then the body (module docstring)."""

    __slots__ = ("status", "headers", "_conn", "_head", "_head_done", "_body_state", "_length", "_chunk_left",
                 "_cbuf", "_decoder", "_pieces", "_buffered", "_eof", "_error", "_waiter", "_keep_alive",
                 "_released", "_paused", "_listener")  # fmt: skip

    def __init__(self, conn: _Connection) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._conn = conn
        self._head = bytearray()
        self._head_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._body_state = 0  # 0: head, 1: body, 2: body ended
        self._length: int | None = None  # Content-Length bytes still to come; -1: chunked; None: to the end
        self._chunk_left = -1  # chunked: bytes of the current chunk (+2 for its CRLF) still to come; -1 at a size line
        self._cbuf = bytearray()  # chunked: an incomplete size line
        self._decoder: zlib._Decompress | None = None  # for a gzip/deflate body
        self._pieces: deque[bytes] = deque()
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._keep_alive = False
        self._released = False
        self._paused = False
        self._listener: Callable[[], None] | None = None

    # -- the caller's side ----------------------------------------------------------------------

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def __aiter__(self) -> Response:
        return self

    async def __anext__(self) -> bytes:
        while True:
            data = self.read_nowait()
            if data:
                return data
            if data is None:
                raise StopAsyncIteration
            await self.wait()

    async def wait(self) -> None:
        """Until body bytes arrive, or the body ends or fails (returns at once if one has)."""
        if self._pieces or self._eof or self._error is not None:
            return
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def read_nowait(self) -> bytes | None:
        """The body bytes that have arrived and were not read yet (b"" when none have), None once
        the body has ended and all of it was read; raises the HttpError that ended it early."""
        pieces = self._pieces
        if pieces:
            data = pieces.popleft() if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            self._buffered = 0
            if self._paused:
                self._paused = False
                self._conn.resume_reading()
            return data
        if self._error is not None:
            raise self._error
        return None if self._eof else b""

    def listen(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` in the step that received body bytes (once per network read), or
        learnt that the body ended or failed; None stops it (module docstring)."""
        self._listener = callback

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([piece async for piece in self])

    def release(self) -> None:
        """Done with it: the connection goes back to the pool (body read to its end), else closes."""
        if not self._released:
            self._released = True
            self._conn.response_released(self, self._eof and self._error is None and self._keep_alive)

    def close(self) -> None:
        """End it now: a pending read ends with HttpError, the connection closes."""
        self._fail(HttpError("response closed"))
        self.release()
        self._notify()

    # -- the connection's side ------------------------------------------------------------------

    def _notify(self) -> None:
        listener = self._listener
        if listener is not None:
            listener()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None and not self._eof:
            self._error = exc
        if not self._head_done.done():
            self._head_done.set_exception(exc)
            self._head_done.exception()  # retrieved: a caller that timed out does not log it
        self._wake()

    def _feed(self, data: bytes) -> None:
        if self._body_state == 1:
            self._body(data)
        elif self._body_state == 0:
            self._head += data
            self._maybe_head()
        # after the body: bytes the server should not have sent; the connection is not reused
        else:
            self._keep_alive = False

    def _maybe_head(self) -> None:
        while self._body_state == 0:
            head = self._head
            end = head.find(b"\r\n\r\n")
            if end < 0:
                if len(head) > MAX_HEAD_BYTES:
                    self._fail(ProtocolViolation(f"upstream response head over {MAX_HEAD_BYTES} bytes"))
                return
            raw, rest = bytes(head[:end]), bytes(head[end + 4 :])
            self._head = bytearray()
            try:
                informational = self._parse_head(raw)
            except HttpError as exc:
                self._fail(exc)
                return
            if informational:  # 100 Continue and friends: the real head follows
                self._head += rest
                continue
            self._body_state = 1
            self._head_done.set_result(None)
            if self._length == 0 or self.status in _NO_BODY:
                self._end_body()
            elif rest:
                self._body(rest)

    def _parse_head(self, raw: bytes) -> bool:
        lines = raw.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolViolation("upstream did not answer HTTP/1.x")
        status = int(parts[1])
        if 100 <= status < 200:
            return True
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolViolation("upstream sent a malformed header line")
            key = name.strip().lower().decode("latin-1")
            text = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self.status, self.headers = status, headers
        connection = headers.get("connection", "").lower()
        self._keep_alive = parts[0] == b"HTTP/1.1" and "close" not in connection
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._length = -1  # chunked framing (`_dechunk`)
        elif "content-length" in headers:
            try:
                self._length = int(headers["content-length"])
            except ValueError:
                raise ProtocolViolation("upstream sent an invalid Content-Length") from None
            if self._length < 0:
                raise ProtocolViolation("upstream sent an invalid Content-Length")
        elif status not in _NO_BODY:  # the body runs to the connection's end (`_length` None)
            self._keep_alive = False
        encoding = headers.get("content-encoding", "").lower()
        if encoding == "gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj()
        return False

    def _body(self, data: bytes) -> None:
        length = self._length
        if length == -1:
            self._dechunk(data)
        elif length is None:  # to the connection's end
            self._deliver(data)
        else:
            if len(data) > length:
                data, self._keep_alive = data[:length], False
            self._length = length - len(data)
            self._deliver(data)
            if self._length == 0:
                self._end_body()

    def _dechunk(self, data: bytes) -> None:
        buf = self._cbuf
        if self._chunk_left == -1 and not buf:
            # The common read: one whole chunk (a streaming server writes each event as one),
            # delivered as the loop below would deliver it, without the loop.
            end = data.find(b"\r\n")
            if 0 < end <= 16 and data.endswith(b"\r\n"):
                try:
                    size = int(data[:end], 16)
                except ValueError:
                    size = 0  # the loop below says what is wrong with it
                if size > 0 and len(data) == end + size + 4:
                    self._deliver(data[end + 2 : -2])
                    return
        if buf:
            buf += data
            data = bytes(buf)
            buf.clear()
        pos, n = 0, len(data)
        while pos < n:
            left = self._chunk_left
            if left < 0:  # a size line
                end = data.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > 1024:
                        self._fail(ProtocolViolation("upstream sent a malformed chunk size"))
                        return
                    buf += data[pos:]
                    return
                line = data[pos:end]
                pos = end + 2
                if left == -2:  # trailers, up to the empty line
                    if not line:
                        self._end_body()
                        if pos < n:
                            self._keep_alive = False
                        return
                    continue
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self._fail(ProtocolViolation("upstream sent a malformed chunk size"))
                    return
                self._chunk_left = -2 if size == 0 else size + 2
                continue
            take = min(left, n - pos)
            payload = left - 2  # this chunk's data still to come (its CRLF after it)
            if payload > 0:
                piece = data[pos : pos + min(take, payload)]
                if piece:
                    self._deliver(piece)
            pos += take
            self._chunk_left = left = left - take
            if left == 0:
                self._chunk_left = -1

    def _deliver(self, data: bytes) -> None:
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error:
                self._fail(ProtocolViolation("upstream sent a body that does not decode"))
                return
            if not data:
                return
        self._pieces.append(data)
        self._buffered += len(data)
        if self._buffered > READ_HIGH_WATER and not self._paused:
            self._paused = True
            self._conn.pause_reading()
        self._wake()

    def _end_body(self) -> None:
        self._body_state = 2
        if self._decoder is not None:
            rest = self._decoder.flush()
            if rest:
                self._pieces.append(rest)
        self._eof = True
        self._wake()

    def _connection_ended(self, exc: BaseException | None) -> None:
        if self._body_state == 1 and self._length is None and exc is None:  # a body to the end: ended
            self._end_body()
            return
        if self._body_state < 2:
            self._fail(ConnectionClosed(f"upstream connection closed{f': {exc}' if exc else ''}"))


class _Connection(asyncio.Protocol):
    """One socket to the upstream (or its proxy), carrying one response at a time."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.open = False
        self.idle_timer: asyncio.TimerHandle | None = None
        self.tunnel: asyncio.Future[bytes] | None = None  # a CONNECT's answer head, while one is asked

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.open = cast(asyncio.Transport, transport), True  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is not None:
            response._feed(data)
            response._notify()
        elif self.tunnel is not None and not self.tunnel.done():
            self.tunnel.set_result(data)
        else:  # nothing was asked: a server that talks out of turn is not reused
            self.close()

    def eof_received(self) -> bool:
        return False  # close: a half-closed upstream connection is of no further use

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.tunnel is not None and not self.tunnel.done():
            self.tunnel.set_exception(ConnectFailed(f"proxy connection closed{f': {exc}' if exc else ''}"))
        response, self.response = self.response, None
        if response is not None:
            response._connection_ended(exc)
            response._notify()
        self.pool.connection_closed(self)

    def pause_reading(self) -> None:
        if self.transport is not None and self.open:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self.open:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.open = False

    def response_released(self, response: Response, reusable: bool) -> None:
        if self.response is not response:
            return
        self.response = None
        self.pool.put_back(self, reusable and self.open)


class UpstreamPool:
    """The connections to one origin (module docstring). `request` sends one request and returns
    its `Response` once the head is in."""

    def __init__(self, base_url: str, *, max_connections: int, keepalive_timeout_s: float,
                 connect_timeout_s: float, pool_timeout_s: float, proxy: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:  # fmt: skip
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an upstream URL must be http:// or https:// with a host, got {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if default_port else f"{host}:{self.port}"
        self.max_connections = max(1, max_connections)
        self.keepalive_timeout_s = keepalive_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.pool_timeout_s = pool_timeout_s
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self._proxy: tuple[str, int, str | None] | None = None
        if proxy:
            p = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            if p.scheme != "http" or not p.hostname:
                raise ValueError(f"only http:// proxies are supported, got {proxy!r}")
            auth = None
            if p.username is not None:
                user = urllib.parse.unquote(p.username)
                secret = urllib.parse.unquote(p.password or "")
                auth = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
            self._proxy = (p.hostname, p.port or 80, auth)
        fixed = dict(headers or {})
        for name, value in fixed.items():
            _check_header(name, value)
        self._headers = fixed
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._slots = 0  # connections open or being opened
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._closed = False

    # -- connections ----------------------------------------------------------------------------

    async def _acquire(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.idle_timer is not None:
                conn.idle_timer.cancel()
                conn.idle_timer = None
            if conn.open:
                return conn
        if self._slots >= self.max_connections:
            waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                given = await waiter
            except BaseException:
                handed = waiter.result() if waiter.done() and not waiter.cancelled() else None
                if handed is not None:  # a connection came as it was cancelled: for the next one
                    self.put_back(handed, True)
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                else:  # woken with a free slot that it will not use: pass it on
                    self._slots -= 1
                    self._grant()
                raise
            if given is not None:
                return given
        else:
            self._slots += 1
        try:
            return await self._connect()
        except BaseException:
            self._slots -= 1
            self._grant()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(self)
        where = (self._proxy[0], self._proxy[1]) if self._proxy else (self.host, self.port)
        tls = self._ssl if self._proxy is None else None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                transport, _ = await loop.create_connection(lambda: conn, where[0], where[1], ssl=tls,
                                                            server_hostname=self.host if tls else None)  # fmt: skip
                if conn.transport is None:  # uvloop calls connection_made in a later step
                    conn.connection_made(transport)
                if self._proxy is not None and self._ssl is not None:
                    await self._tunnel(conn)
        except ssl.SSLCertVerificationError as exc:
            conn.close()
            raise CertificateRejected(f"{self.host}:{self.port}: {exc.verify_message}") from exc
        except OSError as exc:
            conn.close()
            raise ConnectFailed(f"cannot connect to {where[0]}:{where[1]}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        self._open.add(conn)
        return conn

    async def _tunnel(self, conn: _Connection) -> None:
        """CONNECT through the proxy, then TLS to the upstream inside the tunnel."""
        assert self._proxy is not None and self._ssl is not None and conn.transport is not None
        loop = asyncio.get_running_loop()
        target = f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"
        auth = f"proxy-authorization: {self._proxy[2]}\r\n" if self._proxy[2] else ""
        head = bytearray()
        while True:
            conn.tunnel = loop.create_future()
            if not head:
                conn.transport.write(f"CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n{auth}\r\n".encode())
            head += await conn.tunnel
            if b"\r\n\r\n" in head:
                break
            if len(head) > MAX_HEAD_BYTES:
                raise ConnectFailed("proxy answer head too long")
        conn.tunnel = None
        status = head.split(b"\r\n", 1)[0].split(b" ")
        if len(status) < 2 or status[1] != b"200":
            first = head.split(b"\r\n", 1)[0].decode("latin-1")
            raise ConnectFailed(f"the proxy refused the tunnel: {first}")
        transport = await loop.start_tls(conn.transport, conn, self._ssl, server_hostname=self.host)
        if transport is None:
            raise ConnectFailed("TLS through the proxy failed")
        conn.transport = transport
        conn.open = True

    def _grant(self) -> None:
        """A slot is free: the next waiter opens a connection with it."""
        while self._waiters and self._slots < self.max_connections:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._slots += 1
                waiter.set_result(None)

    def put_back(self, conn: _Connection, reusable: bool) -> None:
        """A response is done with `conn`: to the next waiter, to the idle list, or closed."""
        if not reusable or self._closed:
            conn.close()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.idle_timer = asyncio.get_running_loop().call_later(self.keepalive_timeout_s, conn.close)
        self._idle.append(conn)

    def connection_closed(self, conn: _Connection) -> None:
        if conn in self._open:
            self._open.discard(conn)
            self._slots -= 1
            if conn in self._idle:
                self._idle.remove(conn)
            if conn.idle_timer is not None:
                conn.idle_timer.cancel()
            self._grant()

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._open):
            conn.close()
        self._idle.clear()

    # -- requests -------------------------------------------------------------------------------

    async def request(self, method: str, url: str, *, body: bytes = b"",
                      headers: Mapping[str, str] | None = None) -> Response:  # fmt: skip
        """Send `method url` (an absolute URL of this origin) with `body`; its response once the
        head is in. HttpError for a transport failure; TimeoutError past the pool + connect time."""
        parts = urllib.parse.urlsplit(url)
        target = url if self._proxy is not None and self.scheme == "http" else (parts.path or "/") + (
            f"?{parts.query}" if parts.query else "")  # fmt: skip
        lines = [f"{method} {target} HTTP/1.1\r\nhost: {self.authority}\r\n"]
        merged = dict(self._headers)  # checked once, when the pool was made
        for name, value in (headers or {}).items():
            _check_header(name, value)
            merged[name.lower()] = value
        if self._proxy is not None and self.scheme == "http" and self._proxy[2]:
            merged["proxy-authorization"] = self._proxy[2]
        for name, value in merged.items():
            lines.append(f"{name}: {value}\r\n")
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"content-length: {len(body)}\r\n")
        lines.append("\r\n")
        async with asyncio.timeout(self.pool_timeout_s + self.connect_timeout_s):
            conn = await self._acquire()
        response = Response(conn)
        conn.response = response
        assert conn.transport is not None
        conn.transport.write("".join(lines).encode("latin-1") + body)
        try:
            await response._head_done
        except BaseException:
            response.close()
            raise
        return response
