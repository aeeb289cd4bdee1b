"""`start_bridge`: serve the bridge app with uvicorn on a socket we bind ourselves.

Binding first (instead of letting uvicorn bind) gives an `OSError` rather than `sys.exit` on a
busy port, and makes `port=0` usable: `BridgeServer.port` is the bound port. uvicorn's `serve()`
is not used because it installs signal handlers; the CLI owns signals and calls `stop()`.

`stop(grace)`: stop accepting, refuse new upgrades (503), let WebSocket connections with responses
in flight finish them (others close at once with `server_shutting_down` + 1001), then close the
rest with 1001 when the grace period ends; in-flight HTTP requests get what is left of the grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from tether.auth import Authenticator
from tether.bridge import ws_transport
from tether.bridge.app import BridgeApp
from tether.bridge.common import BridgeContext, ErrorMetrics, raw_http_error
from tether.config import TetherConfig
from tether.core.api import ResponsesAPI
from tether.errors import REQUEST_TIMEOUT, TetherError
from tether.startup import BRIDGE, check_tls, listen_error

log = logging.getLogger("tether.bridge")

# Transport-level frame cap relative to Limits.max_request_bytes: frames between the two get an
# in-band `request_too_large` and the socket stays open; only beyond this is the socket failed (1009).
WS_HARD_LIMIT_FACTOR = 4


@dataclass
class BridgeServer:
    app: BridgeApp
    host: str
    port: int
    tls: bool
    shutdown_grace_s: float
    _server: uvicorn.Server = field(repr=False)
    _socket: socket.socket = field(repr=False)
    _date_ticker: asyncio.Task[None] = field(repr=False)
    _stopped: bool = False

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/v1"

    async def stop(self, grace: float | None = None) -> None:
        if self._stopped:
            return
        self._stopped = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.shutdown_grace_s if grace is None else grace)
        app, server = self.app, self._server
        app.draining = True
        for listener in getattr(server, "servers", []):
            listener.close()
        for conn in list(app.connections):
            conn.begin_drain()
        if not await app.wait_connections_closed(deadline - loop.time()):
            for conn in list(app.connections):
                conn.force_close()
            await app.wait_connections_closed(2.0)
        server.should_exit = True
        self._date_ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._date_ticker
        server.config.timeout_graceful_shutdown = max(0.5, deadline - loop.time())  # type: ignore[assignment]  # uvicorn types it int; it goes to asyncio.timeout, which takes a float
        await server.shutdown(sockets=[self._socket])


async def _keep_date(server: uvicorn.Server) -> None:
    """Refresh the `Date` header uvicorn puts on every response, once a second. uvicorn's own
    `main_loop` does it by waking every 100 ms (to see `should_exit` too); `stop` ends this one, so
    an idle server wakes once a second for it, not ten times (each wake-up costs a VM ~0.3 ms of
    CPU: most of an idle server's CPU)."""
    while True:
        await server.on_tick(0)  # tick 0: the date (its other checks are for `main_loop`)
        await asyncio.sleep(1.0)


class _DenialLogFilter(logging.Filter):
    """uvicorn 0.54's websockets-sansio protocol logs "ASGI callable returned without completing
    handshake." at ERROR after every upgrade refused through the `websocket.http.response`
    extension (that path never marks the handshake complete). The bridge always either accepts or
    answers with a status, so the line is noise on every 401/429; drop just that message.

    It also logs a text frame that is not UTF-8 with `logger.exception`: a full traceback for a
    client's mistake (the socket is closed with 1007). Keep it as one WARNING line."""

    MESSAGE = "ASGI callable returned without completing handshake."
    INVALID_UTF8 = "Invalid UTF-8 sequence received from client."

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message == self.INVALID_UTF8:
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return message != self.MESSAGE


_REQUEST_TIMEOUT_REPLY = raw_http_error(
    TetherError(REQUEST_TIMEOUT, "The request head was not received in time.")
)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with TCP_NODELAY on every connection (see `_bind`) and a deadline
    for the request head (slow-loris).

    uvicorn bounds the idle time between requests (`timeout_keep_alive`) and the size of an
    incomplete head (`h11_max_incomplete_event_size`), but not the time a head may take: a client
    that connects and sends nothing, or trickles a header byte every few seconds, holds a
    connection (and its file descriptor) forever. Here a timer starts when the connection opens and
    again when a response completes on a kept-alive connection; it is cancelled as soon as h11 has
    parsed a whole request head (including a WebSocket upgrade, whose protocol then takes over).
    If it fires while the head is still incomplete, the client gets a 408 and the socket closes.
    """

    header_timeout_s: float = 10.0

    def connection_made(self, transport) -> None:
        self._head_timer: asyncio.TimerHandle | None = None
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # see _bind: no Nagle on HTTP responses or WS frames
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE:
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        if self.header_timeout_s > 0 and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _disarm_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_REQUEST_TIMEOUT_REPLY)
        self.transport.close()


def _protocol_class(header_timeout_s: float) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": header_timeout_s})


class _ContentLogFilter(logging.Filter):
    """The `websockets` protocol that uvicorn drives logs, at DEBUG on "uvicorn.error", every frame
    it sends or receives (`< TEXT '{"type": "response.create", "input": ...'`) and every handshake
    header (`< Authorization: Bearer ...`): message contents and credentials. Unless the
    configuration asks for contents in the logs (`log_content = true`), drop those records."""

    FORMATS = frozenset({"< %s", "> %s", "< %s: %s", "> %s: %s"})

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in self.FORMATS


def _install_log_filter(log_content: bool = False) -> None:
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DenialLogFilter) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_DenialLogFilter())
    if not log_content and not any(isinstance(f, _ContentLogFilter) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_ContentLogFilter())


def _bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # reuse_port: `tether serve --workers N` processes share the port; the kernel spreads connections.
    sock = socket.create_server((host, port), family=family, backlog=2048, reuse_port=reuse_port)
    # `create_server` makes a socket with proto 0, and asyncio only sets TCP_NODELAY on accepted
    # sockets whose proto is IPPROTO_TCP: without this, Nagle holds every small write that
    # follows an unacknowledged one until the peer's delayed ACK (~40 ms on Linux). Set on the
    # listener (Linux copies it to accepted sockets) and again per connection (GuardedH11Protocol).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    return sock


async def start_bridge(api: ResponsesAPI, authenticator: Authenticator, config: TetherConfig, *,
                       metrics: ErrorMetrics | None = None) -> BridgeServer:  # fmt: skip
    """Serve `api` over HTTP + WebSocket on `config.server.bridge_host:bridge_port` (0 = any free
    port); HTTPS/WSS when `tls_cert` and `tls_key` are both set. `metrics`: where the bridge counts
    the errors it answers, and what its `/metrics` serves (`BridgeContext.metrics`)."""
    sc, limits = config.server, config.limits
    check_tls(sc)
    app = BridgeApp(BridgeContext(api=api, authenticator=authenticator, limits=limits, server=sc, metrics=metrics))
    ping = sc.ws_ping_interval_s if sc.ws_ping_interval_s and sc.ws_ping_interval_s > 0 else None
    ucfg = uvicorn.Config(
        app,
        host=sc.bridge_host,
        port=sc.bridge_port,
        http=_protocol_class(sc.http_header_timeout_s),  # h11 + a request-head deadline (slow-loris bound)
        ws=ws_transport.protocol_class(  # websockets-sansio + write deadline, budget, answered refusals
            send_timeout_s=sc.ws_send_timeout_s,
            hard_max_size=WS_HARD_LIMIT_FACTOR * limits.max_request_bytes,
            inflation_budget_bytes=sc.ws_receive_budget_bytes,
            compress_min_bytes=sc.ws_compress_min_bytes,
        ),
        ws_max_size=WS_HARD_LIMIT_FACTOR * limits.max_request_bytes,
        ws_ping_interval=ping,
        ws_ping_timeout=max(ping, 20.0) if ping else None,
        ws_per_message_deflate=sc.ws_compression,
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        proxy_headers=False,
        timeout_keep_alive=sc.http_keep_alive_s,  # type: ignore[arg-type]  # uvicorn types it int; it goes to loop.call_later, which takes a float
        h11_max_incomplete_event_size=sc.http_max_header_bytes,
        ssl_certfile=sc.tls_cert,
        ssl_keyfile=sc.tls_key,
    )
    ucfg.load()
    _install_log_filter(config.log_content)
    try:
        sock = _bind(sc.bridge_host, sc.bridge_port, reuse_port=sc.workers > 1)
    except OSError as exc:
        raise listen_error(BRIDGE, sc.bridge_host, sc.bridge_port, exc) from None
    server = uvicorn.Server(ucfg)
    try:
        server.lifespan = ucfg.lifespan_class(ucfg)
        await server.startup(sockets=[sock])
    except BaseException:
        sock.close()
        raise
    date_ticker = asyncio.create_task(_keep_date(server), name="bridge-date")
    port = sock.getsockname()[1]
    tls = ucfg.ssl is not None
    log.debug("bridge listening on %s://%s:%d/v1", "https" if tls else "http", sc.bridge_host, port)
    return BridgeServer(
        app=app,
        host=sc.bridge_host,
        port=port,
        tls=tls,
        shutdown_grace_s=sc.shutdown_grace_s,
        _server=server,
        _socket=sock,
        _date_ticker=date_ticker,
    )
