"""API errors with stable codes: one exception type, and one catalogue that says, for each code,
its HTTP status, its gRPC status, its OpenAI error `type` and the `error.code` a failed Response
shows in JSON.

Every transport reports a `TetherError` the same way: the session core turns it into an in-band
`error` event (or `response.failed`), the bridge into the HTTP/WS error envelope with the code's
HTTP status, the gRPC service into the code's gRPC status plus `tether-error-code` trailing
metadata (`tether.protocol.wire`). A raise site names the code only; its statuses come from
`CATALOGUE`, so one code has one status on every transport. (`status=` on `TetherError` is for
an error rebuilt from what a peer sent, e.g. `error_from_rpc`, and for the simulated backend's
scripted upstream faults; nothing else passes it.)

How the statuses were chosen (the table is in docs/errors.md, checked against `CATALOGUE` by
tests/protocol/test_errors.py):

- OpenAI's own behaviour first: a request the API cannot take is 400 `invalid_request_error`,
  including `model_not_found`, `previous_response_not_found` and `context_length_exceeded`
  (the Responses API answers an unknown model with 400, unlike Chat Completions' 404); a missing
  or wrong key is 401 `authentication_error`; a lookup of a stored object by id that finds nothing
  is 404; rate and queue limits are 429 `rate_limit_error`; WebSocket mode's
  `websocket_stream_limit_reached` and `websocket_connection_limit_reached` are 400 (the
  protocol's and Codex's fixtures).
- Limits on the size of a whole request are 413 (`request_too_large`: an HTTP body or a WS frame
  over `max_request_bytes`, or an upstream's 413); a limit on one item of a valid request is 400
  with its own code (`item_too_large`, `param: input[i]`), like OpenAI's per-field limits.
- A feature a request asks of the backend that it cannot give is 400 `unsupported_feature`
  (naming the field); a feature this deployment does not offer at all (the console's token
  minting on a forwarding bridge) is 501 `not_implemented`.
- The gRPC status follows the HTTP status (400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404
  NOT_FOUND, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504/408 DEADLINE_EXCEEDED, other 5xx
  INTERNAL), except `request_too_large`, which is RESOURCE_EXHAUSTED like gRPC's own refusal of
  a message over `grpc.max_receive_message_length`, so a gRPC client sees one status for "too
  large" whichever side caught it.
- A failed Response (`response.failed`, a JSON body, `GET /v1/responses/{id}`) is typed by the
  API, and by validating clients such as the openai SDK's models, with a closed list of codes. So
  its JSON `error.code` is the row's `response_code` (`invalid_prompt` when the request as sent is
  refused, `rate_limit_exceeded` for rate, queue and concurrency limits, `server_error` for the
  rest: the server, its backend or the connection ended the turn) and `error.tether_code` keeps
  the precise code (`tether.protocol.json_codec`). Errors outside a Response (`error` events,
  HTTP error bodies) carry the precise code itself, as OpenAI's do; so do protobuf and gRPC,
  where `tether.client` redoes a turn that failed with `server_shutting_down` or
  `websocket_connection_limit_reached`.
- Codes the client raises itself (`connection_lost`, `max_turns_exceeded`) and the metrics
  label `client_gone` are never sent by a server; they have rows so every code is in one table.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.responses.v1 import events_pb2

# Stable error codes (the catalogue below; docs/errors.md).
INVALID_REQUEST = "invalid_request"
INVALID_JSON = "invalid_json"
INVALID_TYPE = "invalid_type"
MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
UNKNOWN_PARAMETER = "unknown_parameter"
UNSUPPORTED_PARAMETER = "unsupported_parameter"
UNKNOWN_EVENT_TYPE = "unknown_event_type"
MODEL_NOT_FOUND = "model_not_found"
INVALID_ITEM = "invalid_item"
UNKNOWN_CALL_ID = "unknown_call_id"
PREVIOUS_RESPONSE_NOT_FOUND = "previous_response_not_found"
RESPONSE_NOT_FOUND = "response_not_found"
PREVIOUS_RESPONSE_IN_PROGRESS = "previous_response_in_progress"
REPLAY_UNAVAILABLE = "replay_unavailable"
CONVERSATION_NOT_FOUND = "conversation_not_found"
ITEM_NOT_FOUND = "item_not_found"
BACKGROUND_NOT_SUPPORTED = "background_not_supported"
INVALID_STREAM_ID = "invalid_stream_id"
STREAM_LIMIT_REACHED = "websocket_stream_limit_reached"
CONNECTION_LIMIT_REACHED = "websocket_connection_limit_reached"
IDLE_TIMEOUT = "idle_timeout"
REQUEST_TOO_LARGE = "request_too_large"
ITEM_TOO_LARGE = "item_too_large"
TOO_MANY_ITEMS = "too_many_items"
CONVERSATION_TOO_LARGE = "conversation_too_large"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
QUEUE_FULL = "too_many_queued_responses"
QUEUED_BYTES_FULL = "too_many_queued_bytes"
PENDING_INJECTS_FULL = "too_many_pending_injects"
CONTENT_BLOCKED = "content_blocked"
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
INVALID_API_KEY = "invalid_api_key"
PERMISSION_DENIED = "permission_denied"
SERVER_ERROR = "server_error"
SERVER_SHUTTING_DOWN = "server_shutting_down"
RUN_ORPHANED = "run_orphaned"
UPSTREAM_UNAVAILABLE = "upstream_unavailable"
BACKEND_ERROR = "backend_error"
BACKEND_TIMEOUT = "backend_timeout"
BACKEND_AUTH_FAILED = "backend_auth_failed"
BACKEND_PAYMENT_REQUIRED = "backend_payment_required"
BACKEND_UNAVAILABLE = "backend_unavailable"
CANCELLED = "cancelled"
# Not sent to anyone: the label of a turn whose client went away (WS reset, HTTP stream closed,
# gRPC cancel or deadline) in tether_turns_total{outcome} and tether_errors_total{code}.
CLIENT_GONE = "client_gone"
UNSUPPORTED = "unsupported_feature"
NOT_IMPLEMENTED = "not_implemented"
# The HTTP front end's own (routing and HTTP/1.1 limits).
NOT_FOUND = "not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
UPGRADE_REQUIRED = "upgrade_required"
HEADERS_TOO_LARGE = "request_header_fields_too_large"
REQUEST_TIMEOUT = "request_timeout"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
HOST_NOT_ALLOWED = "host_not_allowed"
ORIGIN_NOT_ALLOWED = "origin_not_allowed"
MCP_SERVER_NOT_ALLOWED = "mcp_server_not_allowed"
MCP_CREDENTIALS_UNAVAILABLE = "mcp_credentials_unavailable"
# Raised by the typed client (tether.client) itself, never by a server.
CONNECTION_LOST = "connection_lost"
MAX_TURNS_EXCEEDED = "max_turns_exceeded"


@dataclass(frozen=True)
class ErrorKind:
    """What a code means on each transport."""

    http: int  # the HTTP status (and the WS envelope's `status`, and `Error.status` in protobuf)
    grpc: str  # the `grpc.StatusCode` member a gRPC call ends with
    type: str  # the OpenAI error `type`
    response_code: str  # `error.code` of a failed Response in JSON: a value of the API's closed list
    when: str  # when it is raised (docs/errors.md)


_BAD = "invalid_request_error"
_AUTH = "authentication_error"
_RATE = "rate_limit_error"
_SERVER = "server_error"

# `response_code`: the API types a Response's `error.code` as a closed list (the openai SDK's
# `ResponseError.code` Literal), of which three fit Tether's codes. The request as sent is refused:
_PROMPT = "invalid_prompt"
# a rate, queue or concurrency limit (retry later):
_RATE_LIMITED = "rate_limit_exceeded"
# everything else: the server, its backend, or the connection ended the turn (redo it):
_SERVER_SIDE = "server_error"

CATALOGUE: dict[str, ErrorKind] = {
    INVALID_REQUEST: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "a field's value is not acceptable (param names it)"),
    INVALID_JSON: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "the body or frame is not JSON (or nests deeper than max_json_depth)"),
    INVALID_TYPE: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "a value has the wrong JSON type"),
    MISSING_REQUIRED_PARAMETER: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "a required field is missing"),
    UNKNOWN_PARAMETER: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "a field the API does not define"),
    UNSUPPORTED_PARAMETER: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "a field the API defines and Tether does not honour"),
    UNKNOWN_EVENT_TYPE: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "a WebSocket event `type` that is not a client event"),
    MODEL_NOT_FOUND: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "no backend serves the model (or the upstream said 404)"),
    INVALID_ITEM: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "an input item is malformed or out of place"),
    UNKNOWN_CALL_ID: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "a tool output answers no open call"),
    PREVIOUS_RESPONSE_NOT_FOUND: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "previous_response_id is neither cached nor stored"),
    RESPONSE_NOT_FOUND: ErrorKind(404, "NOT_FOUND", _BAD, _PROMPT, "retrieve, delete or cancel of an unknown response id"),
    PREVIOUS_RESPONSE_IN_PROGRESS: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "previous_response_id names a response still in flight past continuation_wait_s"),
    REPLAY_UNAVAILABLE: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "stream=true retrieve of a response whose events are not retained"),
    CONVERSATION_NOT_FOUND: ErrorKind(404, "NOT_FOUND", _BAD, _PROMPT, "an unknown conversation id"),
    ITEM_NOT_FOUND: ErrorKind(404, "NOT_FOUND", _BAD, _PROMPT, "an unknown conversation item id"),
    BACKGROUND_NOT_SUPPORTED: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "background = true on a WebSocket, a gRPC Session or CreateResponse"),
    INVALID_STREAM_ID: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "a stream_id outside 1-256 of [A-Za-z0-9_.-]"),
    STREAM_LIMIT_REACHED: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _RATE_LIMITED, "a connection's named stream_ids past max_lanes"),
    CONNECTION_LIMIT_REACHED: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _SERVER_SIDE, "the connection reached connection_lifetime_s"),
    IDLE_TIMEOUT: ErrorKind(408, "DEADLINE_EXCEEDED", _BAD, _SERVER_SIDE, "no client event for idle_timeout_s"),
    REQUEST_TOO_LARGE: ErrorKind(413, "RESOURCE_EXHAUSTED", _BAD, _PROMPT, "a body, frame or template expansion over max_request_bytes, a create larger than a queued-bytes budget, or an upstream 413"),
    ITEM_TOO_LARGE: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "one input item over max_item_bytes"),
    TOO_MANY_ITEMS: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "more than max_input_items items"),
    CONVERSATION_TOO_LARGE: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "a conversation past max_conversation_items or max_conversation_bytes"),
    CONTEXT_LENGTH_EXCEEDED: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "the rendered context is over the model's window"),
    QUEUE_FULL: ErrorKind(429, "RESOURCE_EXHAUSTED", _RATE, _RATE_LIMITED, "a lane already holds max_queued_responses"),
    QUEUED_BYTES_FULL: ErrorKind(429, "RESOURCE_EXHAUSTED", _RATE, _RATE_LIMITED, "pending creates past max_queued_bytes_per_connection, _per_key or _per_process"),
    PENDING_INJECTS_FULL: ErrorKind(429, "RESOURCE_EXHAUSTED", _RATE, _RATE_LIMITED, "a connection already holds max_pending_injects injects waiting for their responses to end"),
    CONTENT_BLOCKED: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "the safety classifier refused the new input"),
    RATE_LIMIT_EXCEEDED: ErrorKind(429, "RESOURCE_EXHAUSTED", _RATE, _RATE_LIMITED, "a per-key rate or connection limit, or an upstream 429"),
    INVALID_API_KEY: ErrorKind(401, "UNAUTHENTICATED", _AUTH, _PROMPT, "a missing, repeated or unknown API key"),
    PERMISSION_DENIED: ErrorKind(403, "PERMISSION_DENIED", "permission_error", _PROMPT, "the console's server view without an admin key"),
    SERVER_ERROR: ErrorKind(500, "INTERNAL", _SERVER, _SERVER_SIDE, "a bug: anything unexpected (logged; no traceback leaks)"),
    SERVER_SHUTTING_DOWN: ErrorKind(503, "UNAVAILABLE", _SERVER, _SERVER_SIDE, "SIGTERM: the server takes no new work"),
    RUN_ORPHANED: ErrorKind(500, "INTERNAL", _SERVER, _SERVER_SIDE, "the replica running a response stopped heartbeating for run_orphan_after_s (Redis/PostgreSQL store)"),
    UPSTREAM_UNAVAILABLE: ErrorKind(503, "UNAVAILABLE", _SERVER, _SERVER_SIDE, "a standalone bridge's upstream Tether went away"),
    BACKEND_ERROR: ErrorKind(502, "INTERNAL", _SERVER, _SERVER_SIDE, "the model backend failed (after its retries)"),
    BACKEND_TIMEOUT: ErrorKind(504, "DEADLINE_EXCEEDED", _SERVER, _SERVER_SIDE, "the model backend did not answer in time"),
    BACKEND_AUTH_FAILED: ErrorKind(502, "INTERNAL", _SERVER, _SERVER_SIDE, "the model backend refused Tether's own key"),
    BACKEND_PAYMENT_REQUIRED: ErrorKind(502, "FAILED_PRECONDITION", _SERVER, _SERVER_SIDE, "the model backend's account is out of credit or quota (upstream HTTP 402): the operator must pay, not retry"),
    BACKEND_UNAVAILABLE: ErrorKind(503, "UNAVAILABLE", _SERVER, _SERVER_SIDE, "the model backend said it is overloaded or down (upstream HTTP 503) past its retries; retry_after when it said when"),
    CANCELLED: ErrorKind(499, "CANCELLED", _BAD, _SERVER_SIDE, "the client cancelled the response"),
    CLIENT_GONE: ErrorKind(499, "CANCELLED", _BAD, _SERVER_SIDE, "never sent: the metrics label of a turn whose client left"),
    UNSUPPORTED: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "the backend cannot do what a field asks (param names it)"),
    NOT_IMPLEMENTED: ErrorKind(501, "UNIMPLEMENTED", _SERVER, _SERVER_SIDE, "a feature this deployment does not offer"),
    NOT_FOUND: ErrorKind(404, "NOT_FOUND", _BAD, _PROMPT, "an HTTP path the server does not serve"),
    METHOD_NOT_ALLOWED: ErrorKind(405, "UNIMPLEMENTED", _BAD, _PROMPT, "an HTTP method the path does not take"),
    UPGRADE_REQUIRED: ErrorKind(426, "FAILED_PRECONDITION", _BAD, _PROMPT, "a plain GET on the WebSocket endpoint"),
    HEADERS_TOO_LARGE: ErrorKind(431, "RESOURCE_EXHAUSTED", _BAD, _PROMPT, "a request head over http_max_header_bytes"),
    REQUEST_TIMEOUT: ErrorKind(408, "DEADLINE_EXCEEDED", _BAD, _SERVER_SIDE, "a request head or body slower than its timeout"),
    UNSUPPORTED_MEDIA_TYPE: ErrorKind(415, "INVALID_ARGUMENT", _BAD, _PROMPT, "a JSON POST body whose Content-Type is not application/json"),
    HOST_NOT_ALLOWED: ErrorKind(403, "PERMISSION_DENIED", "permission_error", _PROMPT, "an HTTP Host outside server.allowed_hosts (loopback names when bound to loopback)"),
    ORIGIN_NOT_ALLOWED: ErrorKind(403, "PERMISSION_DENIED", "permission_error", _PROMPT, "a browser Origin that is not the server's own, loopback or in server.allowed_origins"),
    MCP_SERVER_NOT_ALLOWED: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "an `mcp` tool's server_url outside [mcp] allowed_servers (or MCP is off)"),
    MCP_CREDENTIALS_UNAVAILABLE: ErrorKind(500, "INTERNAL", _SERVER, _SERVER_SIDE, "a queued background run taken over by a replica without the shared server.reasoning_key that sealed its MCP credentials"),
    CONNECTION_LOST: ErrorKind(503, "UNAVAILABLE", _SERVER, _SERVER_SIDE, "client only: the connection broke and could not be resumed"),
    MAX_TURNS_EXCEEDED: ErrorKind(400, "INVALID_ARGUMENT", _BAD, _PROMPT, "client only: the tool loop ran out of turns"),
}


def kind_of(code: str) -> ErrorKind:
    """The catalogue row of `code` (KeyError for a code that has none: a bug at the raise site)."""
    return CATALOGUE[code]


def error_type_for(status: int) -> str:
    """The OpenAI error `type` of an HTTP status, for an error rebuilt without one (a peer that
    sent a status but no type, or a code this catalogue does not know)."""
    if status >= 500:
        return _SERVER
    return {401: _AUTH, 403: "permission_error", 429: _RATE}.get(status, _BAD)


_RESPONSE_CODES = frozenset(k.response_code for k in CATALOGUE.values())


def response_code(code: str) -> str:
    """What a failed Response's JSON `error.code` says for Tether's `code` (the precise code goes
    next to it as `error.tether_code`; proto and gRPC carry the precise code only). A code this
    catalogue does not know reads as `server_error`, unless it already is one of the API's."""
    kind = CATALOGUE.get(code)
    if kind is not None:
        return kind.response_code
    return code if code in _RESPONSE_CODES else _SERVER_SIDE


def markdown_table() -> str:
    """The catalogue as the table of docs/errors.md."""
    lines = ["| code | HTTP | gRPC | type | response | when |", "|---|---|---|---|---|---|"]
    for code, k in CATALOGUE.items():
        lines.append(f"| `{code}` | {k.http} | `{k.grpc}` | `{k.type}` | `{k.response_code}` | {k.when} |")
    return "\n".join(lines) + "\n"


class TetherError(Exception):
    """An error a client can act on: stable `code`, HTTP-equivalent `status`, offending `param`.

    `status` and `type` come from the code's `CATALOGUE` row; pass them only for an error rebuilt
    from what a peer sent (whose code may be one this catalogue does not know)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        status: int | None = None,
        type: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        if status is None:
            kind = kind_of(code)
            self.status = kind.http
            self.type = type or kind.type
        else:
            self.status = status
            self.type = type or error_type_for(status)
        self.retry_after = retry_after

    def to_proto(self) -> events_pb2.Error:
        return events_pb2.Error(
            type=self.type, code=self.code, message=self.message, param=self.param or "", status=self.status,
            retry_after_s=self.retry_after or 0.0,
        )

    @classmethod
    def from_proto(cls, err: events_pb2.Error) -> TetherError:
        status = err.status or (CATALOGUE[err.code].http if err.code in CATALOGUE else 400)
        return cls(
            err.code, err.message, param=err.param or None, status=status, type=err.type or None,
            retry_after=err.retry_after_s or None,
        )

    def __repr__(self) -> str:
        return f"TetherError({self.code!r}, {self.message!r}, status={self.status})"
