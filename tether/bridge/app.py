"""The bridge's raw ASGI app: one router for HTTP and WebSocket under `/v1`, plus health.

Stack: uvicorn (h11 HTTP) with `ws="websockets-sansio"`, i.e. the `websockets` library's Sans-I/O
`ServerProtocol` driven directly by uvicorn's asyncio protocol. Why this and not the alternatives:

- Maintained and lean: it frames and parses inside the `asyncio.Protocol` callback that received
  the bytes, with no extra task per connection. uvicorn's other `"websockets"` implementation
  wraps `websockets.legacy` (deprecated since websockets 14, slated for removal; uvicorn warns on
  import) and runs a reader task per connection; `wsproto` is not a dependency.
- Measured (`python -m tether_lab.bench_bridge`, loopback, 2 noisy cores): it streams
  server->client frames fastest of the three (~8-10 µs/frame vs ~11-13 for a plain
  `websockets.asyncio.server` and ~12-13 for the legacy wrapper). Its ping-pong round trip is
  ~30-45 µs above the plain server; about 20 µs of that is the per-message read pause below,
  which we keep on purpose. The whole bridge (JSON decode, proto translation, encode, one
  batch per event) streams at ~14-18 µs/event, i.e. ~6-9 µs over the bare ASGI echo, and adds
  ~50-65 µs per round trip over the plain server: noise next to a model's time to first token.
- The ASGI `websocket.http.response` extension, so a refused upgrade still gets a real HTTP
  status and our JSON error body (401 bad key, 429 per-key connection limit, 404, 503 draining)
  instead of a bare 403; Codex maps a non-101 reply to an HTTP error.
- Flow control both ways: reading pauses after each message until the app takes it (a client
  cannot flood the session), and `send` waits while the transport is over its high-water mark (a
  slow reader backs up into the core's bounded outbox, which slows that session's generation).
- permessage-deflate is negotiated when offered (`ServerConfig.ws_compression`), pings follow
  `ServerConfig.ws_ping_interval_s`, and the transport's hard `max_size` is 4x
  `Limits.max_request_bytes`, so the app can answer an oversize frame in-band and keep the socket.
- One listener serves both protocols (Codex falls back from WS to HTTP on the same base URL), and
  a plain ASGI callable needs no web framework: routing is a table of path templates below.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tether.bridge import common, console, h11_transport, turn_state, ws
from tether.bridge.common import BridgeContext, Receive, Send
from tether.bridge.http import ClientGone, HttpHandlers, HttpRequest, send_error
from tether.bridge.origin import OriginPolicy
from tether.errors import METHOD_NOT_ALLOWED, NOT_FOUND, TetherError

# (path template, {method: handler name}, needs auth). `{id}` matches one path segment; the
# fixed names are listed before the template that would also match them.
_ROUTES: list[tuple[tuple[str, ...], dict[str, str], bool]] = [
    (("v1", "responses"), {"POST": "create", "GET": "upgrade_required"}, True),
    (("v1", "responses", "input_tokens"), {"POST": "input_tokens"}, True),
    (("v1", "responses", "compact"), {"POST": "compact"}, True),
    (("v1", "responses", "{id}"), {"GET": "retrieve", "DELETE": "delete"}, True),
    (("v1", "responses", "{id}", "input_items"), {"GET": "input_items"}, True),
    (("v1", "responses", "{id}", "cancel"), {"POST": "cancel"}, True),
    (("v1", "models"), {"GET": "models"}, True),
    (("v1", "conversations"), {"POST": "create_conversation"}, True),
    (
        ("v1", "conversations", "{id}"),
        {"GET": "get_conversation", "POST": "update_conversation", "DELETE": "delete_conversation"},
        True,
    ),
    (("v1", "conversations", "{id}", "items"), {"GET": "conversation_items", "POST": "add_conversation_items"}, True),
    (
        ("v1", "conversations", "{id}", "items", "{item_id}"),
        {"GET": "conversation_item", "DELETE": "delete_conversation_item"},
        True,
    ),
    (("healthz",), {"GET": "healthz"}, False),
    (("readyz",), {"GET": "readyz"}, False),
]
_METRICS_ROUTE = (("metrics",), {"GET": "metrics"}, False)
# Liveness and readiness answer any Host and Origin (probes name the pod's address, and a status
# tells a page nothing); everything else, `/metrics` included, passes `OriginPolicy.check`.
_UNGUARDED = frozenset({("healthz",), ("readyz",)})
WS_PATH = ("v1", "responses")


def _segments(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part)


class BridgeApp:
    """`BridgeApp(ctx)` is an ASGI 3 application."""

    def __init__(self, ctx: BridgeContext) -> None:
        self.ctx = ctx
        self.origins = OriginPolicy.from_config(ctx.server)
        self.http = HttpHandlers(ctx)
        self.routes = list(_ROUTES)
        if ctx.server.metrics_port == 0:
            self.routes.append(_METRICS_ROUTE)
        self.console = console.ConsoleHandlers(ctx) if ctx.server.console else None
        if self.console is not None:
            self.routes.extend(console.ROUTES)
        self.draining = False
        self._turn_state = turn_state.headers(ctx.server)
        self.connections: set[ws.WsConnection] = set()
        self.connections_closed = 0  # ever; the standalone bridge's memory reclaimer reads it
        self._no_connections = asyncio.Event()
        self._no_connections.set()

    @property
    def sticky_headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """`x-codex-turn-state` naming this replica (`tether.bridge.turn_state`), for every HTTP
        response and accepted upgrade; none while draining: the replica is going away, so it must
        not pull a turn's follow-ups back to itself."""
        return () if self.draining else self._turn_state

    def connection_opened(self, conn: ws.WsConnection) -> None:
        self.connections.add(conn)
        self._no_connections.clear()

    def connection_closed(self, conn: ws.WsConnection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.connections_closed += 1
        if not self.connections:
            self._no_connections.set()

    async def wait_connections_closed(self, within_s: float) -> bool:
        """True when no WebSocket connection is left (waiting at most `within_s` seconds)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._no_connections.wait(), max(0.0, within_s))
        return not self.connections

    def match(self, path: str) -> tuple[dict[str, str], dict[str, str], bool] | None:
        segments = _segments(path)
        for template, methods, auth in self.routes:
            if len(template) != len(segments):
                continue
            params: dict[str, str] = {}
            for want, got in zip(template, segments, strict=True):
                if want.startswith("{"):
                    params[want[1:-1]] = got
                elif want != got:
                    break
            else:
                return methods, params, auth
        return None

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)

    async def _websocket(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        try:
            common.check_header_size(scope, self.ctx.server)
            self.origins.check(scope["headers"])  # cross-site WebSocket hijacking, DNS rebinding
        except TetherError as err:
            await receive()  # websocket.connect
            await ws.deny(self.ctx, scope, send, err)
            return
        if _segments(scope["path"]) != WS_PATH:
            await receive()  # websocket.connect
            not_found = TetherError(NOT_FOUND, f"Invalid URL (GET {scope['path']}).")
            await ws.deny(self.ctx, scope, send, not_found)
            return
        await ws.serve(self.ctx, scope, receive, send, self)

    async def _http(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        started = False
        sticky = self.sticky_headers

        async def tracked_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if sticky:
                    message = {**message, "headers": [*message.get("headers", ()), *sticky]}
            await send(message)

        method, path = scope["method"], scope["path"]
        extra: list[tuple[bytes, bytes]] = []
        try:
            common.check_header_size(scope, self.ctx.server)
            if _segments(path) not in _UNGUARDED:
                self.origins.check(scope["headers"])  # cross-site requests, DNS rebinding
            route = self.match(path)
            if route is None:
                raise TetherError(NOT_FOUND, f"Invalid URL ({method} {path}).")
            methods, params, auth = route
            name = methods.get(method)
            if name is None:
                extra.append((b"allow", ", ".join(sorted(methods)).encode()))
                raise TetherError(
                    METHOD_NOT_ALLOWED, f"Method {method} is not allowed on {path}."
                )
            request = HttpRequest(scope, receive, tracked_send, params, body_now=h11_transport.body_writer(send))
            if auth:
                request.tenant = common.authenticate(self.ctx, scope["headers"])
            handlers = self.console if name.startswith("console_") else self.http
            await getattr(handlers, name)(request)
        except ClientGone:
            return
        except Exception as exc:
            err = common.as_tether_error(exc)
            if started:  # too late for a status: the stream just ends
                return
            self.ctx.count_error(err)
            if err.status in (408, 413):  # the body was not read to its end: do not keep the
                extra.append((b"connection", b"close"))  # connection for a next request
            await send_error(send, err, [*extra, *sticky])


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
