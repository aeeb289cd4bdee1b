"""The metrics endpoint: `metrics_response()` for any HTTP front end, and a tiny standalone asyncio
HTTP server (`start_metrics_server`) for `server.metrics_port != 0`.

The standalone server answers three paths and nothing else, one request per connection:

- `GET /metrics`: the engine's Prometheus registry (text format 0.0.4, or OpenMetrics when the
  scraper asks for it in `Accept`);
- `GET /healthz`: 200 while the process serves (liveness);
- `GET /readyz`: 200 when the engine is ready (store reachable, backends configured, not
  shutting down), else 503. With a `ReadinessChecker` it reports the checker's last result
  (no store round trip per probe); without one it calls `engine.ready()`.

It never touches the API's request path, so a slow scrape cannot delay a turn beyond the event
loop time of rendering the registry (~1 ms for a few hundred series).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from tether.errors import TetherError
from tether.startup import METRICS, listen_error

log = logging.getLogger("tether.metrics_http")

Headers = list[tuple[bytes, bytes]]
_MAX_HEAD = 16 * 1024
_READ_TIMEOUT_S = 5.0
_REASONS = {200: "OK", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request", 503: "Service Unavailable"}


def metrics_response(source: Any = None, accept: str | None = None) -> tuple[int, Headers, bytes]:
    """`(status, headers, body)` for `GET /metrics`.

    `source` is the engine (or anything with `.telemetry.registry`, or a `CollectorRegistry`);
    the bridge passes its metrics' registry (the engine's, or `BridgeMetrics`' in a bridge of its
    own). Without one, this process's default registry (process and Python metrics)."""
    registry = getattr(getattr(source, "telemetry", None), "registry", None)
    if registry is None:
        registry = source if hasattr(source, "collect") else REGISTRY
    encoder, content_type = choose_encoder(accept or "")
    body = encoder(registry)
    return 200, [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())], body


def _json(status: int, body: bytes) -> tuple[int, Headers, bytes]:
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


def healthz_response() -> tuple[int, Headers, bytes]:
    return _json(200, b'{"status":"ok"}')


async def readyz_response(ready: Callable[[], Any] | None) -> tuple[int, Headers, bytes]:
    """200 `{"status":"ready"}` or 503 `{"status":"not_ready"}`; `ready` may be sync or async."""
    ok = True
    if ready is not None:
        try:
            result = ready()
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, 5.0)
            ok = result is None or bool(result)
        except Exception:  # noqa: BLE001 - a failing probe is "not ready", never a 500
            log.warning("readiness check failed", exc_info=True)
            ok = False
    return _json(200, b'{"status":"ready"}') if ok else _json(503, b'{"status":"not_ready"}')


class MetricsServer:
    """`/metrics`, `/healthz`, `/readyz` on their own port. `guard`: called with a `/metrics`
    request's headers (lower-case names); it raises a `TetherError` (403) to refuse the scrape:
    the bridge's `Host`/`Origin` check (`tether.bridge.origin.OriginPolicy.check`)."""

    def __init__(self, source: Any, ready: Callable[[], bool | Awaitable[bool]] | None,
                 guard: Callable[[list[tuple[bytes, bytes]]], None] | None = None) -> None:  # fmt: skip
        self._source = source
        self._ready = ready
        self._guard = guard
        self._server: asyncio.Server | None = None
        self.host = ""
        self.port = 0

    async def start(self, host: str, port: int) -> MetricsServer:
        try:
            self._server = await asyncio.start_server(self._handle, host, port, backlog=128)
        except OSError as exc:
            raise listen_error(METRICS, host, port, exc) from None
        sock = self._server.sockets[0]
        self.host, self.port = host, sock.getsockname()[1]
        log.info("metrics listening on http://%s:%d/metrics", host, self.port)
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
                return
            if len(head) > _MAX_HEAD:
                return
            status, headers, body, method = await self._route(head)
            line = f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n".encode()
            out = [line, *(k + b": " + v + b"\r\n" for k, v in headers), b"connection: close\r\n\r\n"]
            writer.write(b"".join(out))
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except Exception:  # noqa: BLE001 - one bad scrape must not take the listener down
            log.debug("metrics request failed", exc_info=True)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _route(self, head: bytes) -> tuple[int, Headers, bytes, str]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return (*_json(400, b'{"error":"bad request"}'), "GET")
        method, target, _ = parts
        path = target.split("?", 1)[0]
        accept = ""
        fields: list[tuple[bytes, bytes]] = []
        for raw in lines[1:]:
            name, _, value = raw.partition(":")
            fields.append((name.strip().lower().encode("latin-1"), value.strip().encode("latin-1")))
            if name.strip().lower() == "accept":
                accept = value.strip()
        if path not in ("/metrics", "/healthz", "/readyz"):
            return (*_json(404, b'{"error":"not found"}'), method)
        if method not in ("GET", "HEAD"):
            status, headers, body = _json(405, b'{"error":"method not allowed"}')
            return status, [*headers, (b"allow", b"GET, HEAD")], body, method
        if path == "/metrics":
            if self._guard is not None:
                try:
                    self._guard(fields)
                except TetherError as err:
                    return (*_json(err.status, b'{"error":"%s"}' % err.code.encode()), method)
            return (*metrics_response(self._source, accept), method)
        if path == "/healthz":
            return (*healthz_response(), method)
        return (*await readyz_response(self._ready), method)


async def start_metrics_server(
    engine: Any,
    *,
    port: int,
    host: str = "127.0.0.1",
    readiness: Any = None,
    guard: Callable[[list[tuple[bytes, bytes]]], None] | None = None,
) -> MetricsServer:
    """Serve `engine`'s metrics and health on `host:port` (0 = any free port; see `.port`).

    `readiness`: a `tether.observability.health.ReadinessChecker` (its last result is served),
    a callable returning bool or an awaitable of bool, or None for `engine.ready()`. `guard`:
    see `MetricsServer`."""
    if readiness is None:
        ready = getattr(engine, "ready", None)
    elif hasattr(readiness, "is_ready"):
        ready = readiness.is_ready
    else:
        ready = readiness
    return await MetricsServer(engine, ready, guard).start(host, port)
