"""The wire contract: what the server's transports and every client agree on, in one place.

The proto files define the messages; this module holds the rest of the contract that travels
with them and that each side would otherwise spell for itself:

- which events end a response (`TERMINAL_ARMS` in protobuf, `TERMINAL_EVENT_TYPES` in JSON), how
  an SSE stream says it has ended (`SSE_DONE`), and which stream a fragment of text
  (`DELTA_ARMS`: the server's outbox merges them, the lab counts them and times the first one);
- Tether's own `include` strings;
- the gRPC metadata keys: the API key, and the trailing metadata that carries a `TetherError`
  across a gRPC status (`tether-error-code`, `-param`, `-status`);
- the gRPC status an error ends a call with (`grpc_status_for`: its code's row in
  `tether.errors.CATALOGUE`), and how a client rebuilds the error from a status (`error_from_rpc`:
  the trailing metadata, or for a peer that sent none the status's HTTP equivalent and a default
  code);
- how a client builds its channel (`open_channel`: message size limits, TLS roots).

The error codes and their statuses themselves are `tether.errors.CATALOGUE`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from tether.errors import (
    CATALOGUE,
    INVALID_API_KEY,
    INVALID_REQUEST,
    RATE_LIMIT_EXCEEDED,
    RESPONSE_NOT_FOUND,
    SERVER_ERROR,
    UPSTREAM_UNAVAILABLE,
    TetherError,
)

# -- events ---------------------------------------------------------------------------------------

# The `ServerEvent` oneof arms after which a response sends nothing more.
TERMINAL_ARMS = frozenset({"completed", "failed", "incomplete"})
# The same events as JSON `type`s.
TERMINAL_EVENT_TYPES = frozenset(f"response.{arm}" for arm in TERMINAL_ARMS)
# The last frame of an SSE stream whose last event ended it (a terminal event, or an `error`),
# as the Open Responses specification frames it: openai-python and openai-node stop at it, Codex
# skips a data line that is not JSON (and stops after `response.completed` anyway). A stream cut
# before its end (the server went away) has none: [DONE] means nothing is missing.
SSE_DONE = b"data: [DONE]\n\n"
# The `ServerEvent` oneof arms that stream a fragment of text in their `delta` field.
DELTA_ARMS = frozenset(
    {
        "output_text_delta",
        "refusal_delta",
        "reasoning_text_delta",
        "function_call_arguments_delta",
        "custom_tool_call_input_delta",
        "mcp_call_arguments_delta",
        "reasoning_summary_text_delta",
    }
)

# -- include strings ------------------------------------------------------------------------------

SERVER_TIMING_INCLUDE = "tether:server_timing"  # per-stage server timings on the final response
PROTOTYPE_APPEND_INCLUDE = "tether:prototype_append"  # the response.append prototype shape

# -- gRPC metadata --------------------------------------------------------------------------------

AUTHORIZATION_KEY = "authorization"  # value: "Bearer <api key>"
ERROR_CODE_KEY = "tether-error-code"
ERROR_PARAM_KEY = "tether-error-param"
ERROR_STATUS_KEY = "tether-error-status"


def bearer(api_key: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that authenticates as `api_key`."""
    return ((AUTHORIZATION_KEY, f"Bearer {api_key}"),)


def error_metadata(exc: TetherError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries `exc` across a gRPC status (see `error_from_rpc`)."""
    return ((ERROR_CODE_KEY, exc.code), (ERROR_PARAM_KEY, exc.param or ""), (ERROR_STATUS_KEY, str(exc.status)))


# -- statuses -------------------------------------------------------------------------------------

# An HTTP-equivalent status -> the gRPC status, for an error whose code has no catalogue row (one
# rebuilt from a peer that speaks a newer catalogue); a known code uses its row.
GRPC_STATUS_BY_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ABORTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

# A gRPC status without Tether's trailing metadata (a proxy, or the channel itself) -> the
# HTTP-equivalent status (anything else: 500).
HTTP_STATUS_BY_GRPC: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}

# The error code to report when the server sent no `tether-error-code`.
DEFAULT_CODE_BY_HTTP = {
    400: INVALID_REQUEST,
    401: INVALID_API_KEY,
    404: RESPONSE_NOT_FOUND,
    429: RATE_LIMIT_EXCEEDED,
    503: UPSTREAM_UNAVAILABLE,
}


def grpc_status_for(err: TetherError) -> grpc.StatusCode:
    """The gRPC status `err` ends a call with: its code's catalogue row."""
    kind = CATALOGUE.get(err.code)
    if kind is not None:
        return grpc.StatusCode[kind.grpc]
    if err.status in GRPC_STATUS_BY_HTTP:
        return GRPC_STATUS_BY_HTTP[err.status]
    return grpc.StatusCode.INTERNAL if err.status >= 500 else grpc.StatusCode.INVALID_ARGUMENT


def error_from_rpc(exc: grpc.aio.AioRpcError) -> TetherError:
    """Rebuild the `TetherError` a Tether server reported as a gRPC status."""
    meta: dict[str, str] = {}
    for key, value in exc.trailing_metadata() or ():
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        meta[key.lower()] = value
    status = HTTP_STATUS_BY_GRPC.get(exc.code(), 500)
    raw_status = meta.get(ERROR_STATUS_KEY, "")
    if raw_status.isdigit():
        status = int(raw_status)
    code = meta.get(ERROR_CODE_KEY) or DEFAULT_CODE_BY_HTTP.get(status, SERVER_ERROR)
    message = exc.details() or exc.code().name.lower()
    return TetherError(code, message, param=meta.get(ERROR_PARAM_KEY) or None, status=status)


# -- channels -------------------------------------------------------------------------------------

# Large inputs and long stored responses travel as single messages.
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
)


def open_channel(
    target: str, *, tls_ca: str | None = None, tls: bool = False, options: Sequence[tuple[str, Any]] = CHANNEL_OPTIONS
) -> grpc.aio.Channel:
    """A channel to a Tether server. `tls_ca`: a PEM file of the roots to trust (implies TLS);
    `tls=True` without it uses the system roots."""
    if tls_ca or tls:
        roots = Path(tls_ca).read_bytes() if tls_ca else None
        creds = grpc.ssl_channel_credentials(root_certificates=roots)
        return grpc.aio.secure_channel(target, creds, options=list(options))
    return grpc.aio.insecure_channel(target, options=list(options))
