"""What the HTTP and WebSocket sides of the bridge share, so neither carries its own copy.

- `BridgeContext`: the API, the authenticator, the limits and the metrics the bridge counts its
  errors in (`count_error`: every error it answers, once; an `InBandError` was counted by the
  core). (Connections per key are counted once, by the engine's sessions: a WebSocket holds its
  slot exactly as long as its session.)
- `authenticate`: `Authorization: Bearer` -> tenant (401 `TetherError` on failure).
- `decode_object`: size check, depth-limited JSON decode, "must be an object" check; raises the
  same `TetherError`s (`request_too_large`, `invalid_json`, `invalid_type`) on both transports.
- `as_tether_error`: anything raised while serving becomes a `TetherError`; an unexpected
  exception is logged here and reported as a bare 500 `server_error` (no traceback leaks).
- Error rendering: `http_error_body`, `raw_http_error` (a whole HTTP response, for a socket the
  app never saw) (`{"error":{message,type,param,code}}`) and `ws_error_text`
  (the WS envelope `{"type":"error","status",...}`), both through `json_codec` from the same
  `events_pb2.Error`, and `encode_event` for every server event.
- Retry hints: an error with `retry_after_s` (429 `rate_limit_exceeded`) carries them as HTTP
  headers (`retry_after_headers`: `Retry-After` in whole seconds, rounded up, and `retry-after-ms`)
  and, on WebSocket, in the envelope's `error.headers` (the field the SDK's `ResponseWsError`
  defines for "the response headers that were emitted with the error").
- `check_header_size`: the request head (path, query, headers) against
  `ServerConfig.http_max_header_bytes` (h11's own bound only applies while a head is incomplete,
  so a head that arrives in one read is checked here); 431 past it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

from tether.auth import Authenticator
from tether.config import Limits, ServerConfig
from tether.core.api import ResponsesAPI
from tether.core.delta import Delta, Outgoing
from tether.errors import (
    HEADERS_TOO_LARGE,
    INVALID_REQUEST,
    INVALID_TYPE,
    REQUEST_TOO_LARGE,
    SERVER_ERROR,
    TetherError,
)
from tether.protocol import json_codec
from tether.responses.v1 import events_pb2, request_pb2

log = logging.getLogger("tether.bridge")

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class ErrorMetrics(Protocol):
    """Where the bridge counts the errors it answers (`tether_errors_total{code}`) and what its
    `/metrics` serves: the engine's telemetry in-process, `BridgeMetrics` in a bridge of its own."""

    registry: Any

    def error(self, code: str) -> None: ...


class InBandError(TetherError):
    """An `error` event the API sent (counted where it was made: the session core's
    `send_error`), raised to answer it with its HTTP status; `count_error` does not count it again."""


@dataclass
class BridgeContext:
    api: ResponsesAPI
    authenticator: Authenticator
    limits: Limits
    server: ServerConfig
    metrics: ErrorMetrics | None = None

    def count_error(self, err: TetherError) -> None:
        """Count an error the bridge answers (HTTP status, refused handshake, a WebSocket frame
        that never reached the session, an in-band SSE error) in `tether_errors_total`, once:
        errors the core sent in-band (`InBandError`) were counted by the core."""
        if self.metrics is not None and not isinstance(err, InBandError):
            self.metrics.error(err.code)


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of a (lower-case) header from an ASGI scope's header list."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


MULTI_AGENT_BETA = "responses_multi_agent=v1"


def has_multi_agent_beta(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether `OpenAI-Beta` (a comma-separated list, possibly repeated) names the multi-agent beta."""
    return any(key == b"openai-beta" and MULTI_AGENT_BETA in (v.strip() for v in value.decode("latin-1").split(","))
               for key, value in headers)  # fmt: skip


def check_multi_agent_beta(params: request_pb2.ResponseCreateParams, beta: bool) -> None:
    """A JSON create with `multi_agent` enabled needs the beta header (on HTTP the request's, on
    WebSocket mode the upgrade's): else a 400 naming `multi_agent`. gRPC's typed field is its own
    opt-in."""
    if not beta and params.HasField("multi_agent") and params.multi_agent.enabled:
        raise TetherError(INVALID_REQUEST, f"multi_agent needs the header 'OpenAI-Beta: {MULTI_AGENT_BETA}'.",
                          param="multi_agent")  # fmt: skip


def authenticate(ctx: BridgeContext, headers: Iterable[tuple[bytes, bytes]]) -> str:
    return ctx.authenticator.tenant_of([v.decode("latin-1") for k, v in headers if k == b"authorization"])


def too_large(limit: int) -> TetherError:
    return TetherError(
        REQUEST_TOO_LARGE, f"The request is larger than the limit of {limit} bytes."
    )


def check_header_size(scope: dict[str, Any], server: ServerConfig) -> None:
    """Refuse a request head larger than `http_max_header_bytes` (431)."""
    limit = server.http_max_header_bytes
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    for key, value in scope.get("headers") or ():
        size += len(key) + len(value) + 4  # ": " and CRLF
    if size > limit:
        raise TetherError(
            HEADERS_TOO_LARGE, f"The request headers are larger than the limit of {limit} bytes."
        )


def decode_object(data: bytes | str, limits: Limits) -> dict[str, Any]:
    """One JSON object from an HTTP body or a WebSocket text frame."""
    limit = limits.max_request_bytes
    # A str's UTF-8 size is between len and 4*len: encode only when the bound is undecided (and
    # never for a str already longer than the limit: an inflated permessage-deflate frame can be
    # up to the transport cap, and copying it only to measure it doubles its memory).
    if isinstance(data, bytes) or len(data) * 4 <= limit or len(data) > limit:
        size = len(data)
    else:
        size = len(data.encode())
    if size > limit:
        raise too_large(limit)
    obj = json_codec.loads(data, max_depth=limits.max_json_depth)
    if not isinstance(obj, dict):
        raise TetherError(INVALID_TYPE, f"Expected a JSON object, got {_json_kind(obj)}.")
    return obj


def _json_kind(obj: object) -> str:
    if isinstance(obj, list):
        return "an array"
    if isinstance(obj, str):
        return "a string"
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "a boolean"
    return "a number"


def as_tether_error(exc: BaseException) -> TetherError:
    if isinstance(exc, TetherError):
        return exc
    log.error("unexpected error in the bridge", exc_info=exc)
    return TetherError(SERVER_ERROR, "The server had an error while processing your request.")


def http_error_body(err: TetherError) -> bytes:
    return json_codec.dumps(json_codec.error_to_http_json(err.to_proto()))


def raw_http_error(err: TetherError) -> bytes:
    """A whole `connection: close` HTTP/1.1 response with the JSON error body, for a socket the
    ASGI app never saw (a request head that timed out, an upgrade that could not be parsed)."""
    body = http_error_body(err)
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
        % (err.status, HTTPStatus(err.status).phrase.encode(), len(body), body)
    )


def error_event(err: TetherError, stream_id: str = "", event_id: str = "") -> events_pb2.ServerEvent:
    return events_pb2.ServerEvent(
        stream_id=stream_id, error=events_pb2.ErrorEvent(error=err.to_proto(), event_id=event_id)
    )


def retry_after_headers(seconds: float | None) -> list[tuple[bytes, bytes]]:
    """`Retry-After` (whole seconds, rounded up, so a client never retries early) and the
    finer `retry-after-ms` that the OpenAI SDKs read first; none when there is no hint."""
    if not seconds or seconds <= 0:
        return []
    return [
        (b"retry-after", str(max(1, math.ceil(seconds))).encode()),
        (b"retry-after-ms", str(max(1, math.ceil(seconds * 1000))).encode()),
    ]


def event_json(ev: Outgoing, *, ws: bool) -> dict:
    """One outgoing event as its JSON object; a merged `Delta` is encoded from its text directly."""
    if type(ev) is Delta:
        return json_codec.arm_to_json(ev.arm, ev, ev.sequence_number, ev.stream_id, ev.agent)
    obj = json_codec.event_to_json(ev, ws=ws)
    if ws and ev.HasField("error") and ev.error.error.retry_after_s > 0:
        obj["error"]["headers"] = {
            k.decode(): v.decode() for k, v in retry_after_headers(ev.error.error.retry_after_s)
        }
    return obj


def encode_event(ev: Outgoing, *, ws: bool) -> bytes:
    return json_codec.dumps(event_json(ev, ws=ws))


def ws_error_text(err: TetherError, stream_id: str = "", event_id: str = "") -> str:
    return encode_event(error_event(err, stream_id, event_id), ws=True).decode()
