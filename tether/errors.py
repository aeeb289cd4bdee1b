"""API errors with stable codes: one exception type, one catalogue of codes, one status mapping.

Every transport reports a `TetherError` the same way: the session core turns it into an in-band
`error` event (or `response.failed`), the bridge into the HTTP/WS error envelope, gRPC unary RPCs
into a status plus `tether-error-code` trailing metadata.
"""

from __future__ import annotations

from tether.responses.v1 import events_pb2

# Stable error codes (documented in the README's error table).
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
CONVERSATION_NOT_FOUND = "conversation_not_found"
ITEM_NOT_FOUND = "item_not_found"
BACKGROUND_NOT_SUPPORTED = "background_not_supported"
INVALID_STREAM_ID = "invalid_stream_id"
STREAM_LIMIT_REACHED = "websocket_stream_limit_reached"
CONNECTION_LIMIT_REACHED = "websocket_connection_limit_reached"
IDLE_TIMEOUT = "idle_timeout"
REQUEST_TOO_LARGE = "request_too_large"
TOO_MANY_ITEMS = "too_many_items"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
QUEUE_FULL = "too_many_queued_responses"
CONTENT_BLOCKED = "content_blocked"
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
INVALID_API_KEY = "invalid_api_key"
SERVER_ERROR = "server_error"
SERVER_SHUTTING_DOWN = "server_shutting_down"
BACKEND_ERROR = "backend_error"
BACKEND_TIMEOUT = "backend_timeout"
BACKEND_AUTH_FAILED = "backend_auth_failed"
CANCELLED = "cancelled"
# Not sent to anyone: the label of a turn whose client went away (WS reset, HTTP stream closed,
# gRPC cancel or deadline) in tether_turns_total{outcome} and tether_errors_total{code}.
CLIENT_GONE = "client_gone"
UNSUPPORTED = "unsupported_feature"

_TYPE_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type_for(status: int) -> str:
    if status >= 500:
        return "server_error"
    return _TYPE_BY_STATUS.get(status, "invalid_request_error")


class TetherError(Exception):
    """An error a client can act on: stable `code`, HTTP-equivalent `status`, offending `param`."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        type: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
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
        return cls(
            err.code, err.message, param=err.param or None, status=err.status or 400, type=err.type or None,
            retry_after=err.retry_after_s or None,
        )

    def __repr__(self) -> str:
        return f"TetherError({self.code!r}, {self.message!r}, status={self.status})"
