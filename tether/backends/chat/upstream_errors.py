"""Upstream failures: error bodies -> `BackendError` with Tether's codes, sanitised text, retry hints,
and the retry policy (a copy of the Cerebras/OpenAI SDK rules, applied only before the first
byte of a stream, minus failures that would fail the same way again).

Sanitising keeps an upstream message's meaning ("Automatic streaming tool choice is not
supported", "context window exceeded") and drops what only describes the server's insides: file
paths, stack traces, documentation URLs, over-long dumps.
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from collections.abc import Mapping
from typing import Any

import orjson

from tether import errors
from tether.backends.base import BackendError

MAX_MESSAGE_CHARS = 400

_TRACEBACK = re.compile(r"Traceback \(most recent call last\):.*", re.S)
_FILE_LINE = re.compile(r'\s*File "[^"]*", line \d+[^\n]*')
_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:\\|/)(?:[\w.@+-]+[/\\])+[\w.@+-]*")
_URL = re.compile(r"\s*(?:For further information visit )?https?://\S+")
_SPACES = re.compile(r"\s+")
# Words of a message that explain a failure as a property of the request: the same body fails again.
_DETERMINISTIC = re.compile(
    r"validation error|not supported|unsupported|invalid|must be|is required|exceed|too long|"
    r"context window|context length|unknown (?:field|parameter|property)|not allowed",
    re.I,
)


def sanitize(message: str) -> str:
    """The upstream's message without paths, stack traces or URLs, on one line, bounded."""
    text = _TRACEBACK.sub("", message)
    text = _FILE_LINE.sub("", text)
    text = _URL.sub("", text)
    text = _PATH.sub("<path>", text)
    text = _SPACES.sub(" ", text).strip()
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1] + "…"
    return text or "no error message"


def deterministic(status: int, message: str, upstream_type: str | None = None) -> bool:
    """The failure is a property of the request (a validation error the server reports as 500,
    an unsupported option): retrying the same body cannot help."""
    if status in (408, 409, 429, 502, 503, 504):
        return False
    return upstream_type == "invalid_request_error" or bool(_DETERMINISTIC.search(message))


def _detail_text(detail: Any) -> str:
    """FastAPI/pydantic `detail` lists as "loc: msg; ..." (vLLM, llama-cpp-python 422s)."""
    if isinstance(detail, list):
        parts = []
        for d in detail:
            if isinstance(d, dict):
                loc = ".".join(str(x) for x in d.get("loc") or () if x != "body")
                parts.append(f"{loc}: {d.get('msg', '')}" if loc else str(d.get("msg", "")))
        return "; ".join(parts) or "no error message"
    return str(detail)


def parse_error_body(raw: bytes | Any) -> tuple[str, str | None, str | None]:
    """(message, type, code) from either `{message,type,param,code}` or `{"error":{...}}` (or text)."""
    obj = raw
    if isinstance(raw, bytes | bytearray | str):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else raw
            return text.strip()[:500] or "no error body", None, None
    if not isinstance(obj, dict):
        return str(obj)[:500], None, None
    err = obj.get("error")
    if isinstance(err, str):
        return err, None, None
    if isinstance(err, dict):
        obj = err
    message = obj.get("message") or (_detail_text(obj["detail"]) if obj.get("detail") else "no error message")
    code = obj.get("code")
    etype = obj.get("type")
    return str(message), (str(etype) if etype else None), (str(code) if code is not None else None)


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """`retry-after-ms`, else `retry-after` (seconds or an HTTP date), in seconds; None if absent."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if ra:
        try:
            return float(ra)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(ra)
            except (TypeError, ValueError):
                return None
            return when.timestamp() - (time.time() if now is None else now)
    return None


def error_from_status(
    status: int,
    message: str,
    upstream_code: str | None = None,
    retry_after: float | None = None,
    upstream_type: str | None = None,
) -> BackendError:
    """Map an upstream HTTP status (or a mid-stream `status_code`) to Tether's BackendError, with
    the upstream's text sanitised. `retryable` says whether sending the same body again may work:
    never for a failure the body explains as a property of the request (see `deterministic`)."""
    message = sanitize(message)
    if status in (400, 422):
        low = message.lower()
        if upstream_code == "context_length_exceeded" or "context length" in low or "maximum context" in low or "context window" in low:
            return BackendError(errors.CONTEXT_LENGTH_EXCEEDED, f"upstream: {message}")
        return BackendError(errors.INVALID_REQUEST, f"upstream rejected the request: {message}")
    if status in (401, 403):
        return BackendError(
            errors.BACKEND_AUTH_FAILED, f"upstream refused the server's credentials (HTTP {status}): {message}"
        )
    if status == 402:
        return BackendError(
            errors.BACKEND_PAYMENT_REQUIRED, f"upstream refused for payment (HTTP 402): {message}"
        )
    if status == 404:
        return BackendError(errors.MODEL_NOT_FOUND, f"upstream: not found (HTTP 404): {message}")
    if status == 408:
        return BackendError(
            errors.BACKEND_TIMEOUT, f"upstream timed out (HTTP 408): {message}",  retryable=True
        )
    if status == 413:
        return BackendError(errors.REQUEST_TOO_LARGE, f"upstream: request too large: {message}")
    if status in (429, 503):  # busy: retried, and the client is told when to come back
        code, what = (errors.RATE_LIMIT_EXCEEDED, "rate limit") if status == 429 else (
            errors.BACKEND_UNAVAILABLE, "unavailable (HTTP 503)")  # fmt: skip
        return BackendError(code, f"upstream {what}: {message}", retry_after=retry_after, retryable=True)
    return BackendError(
        errors.BACKEND_ERROR,
        f"upstream error (HTTP {status}): {message}",
        retryable=(status >= 500 or status == 409) and not deterministic(status, message, upstream_type),
    )


def should_retry(error: BackendError, headers: Mapping[str, str]) -> bool:
    """The SDKs' rule (`x-should-retry` wins; else 408/409/429/5xx), except that a failure the
    body explains as a property of the request (`deterministic`) is never retried."""
    flag = headers.get("x-should-retry")
    if flag == "true":
        return True
    if flag == "false":
        return False
    return error.retryable


def retry_delay(
    retries_so_far: int,
    headers: Mapping[str, str] | None = None,
    *,
    initial: float = 0.5,
    maximum: float = 8.0,
) -> float:
    """The SDK's delay: the server's retry-after(-ms) when 0..60 s, else min(initial*2**n, max) * U(0.75, 1)."""
    if headers is not None:
        ra = retry_after_seconds(headers)
        if ra is not None and 0 <= ra <= 60:
            return ra
    return min(initial * 2.0**retries_so_far, maximum) * (1 - 0.25 * random.random())


RATELIMIT_RESETS = (
    ("x-ratelimit-remaining-tokens-minute", "x-ratelimit-reset-tokens-minute"),
    ("x-ratelimit-remaining-requests-minute", "x-ratelimit-reset-requests-minute"),
    ("x-ratelimit-remaining-tokens-hour", "x-ratelimit-reset-tokens-hour"),
    ("x-ratelimit-remaining-requests-hour", "x-ratelimit-reset-requests-hour"),
    ("x-ratelimit-remaining-tokens-day", "x-ratelimit-reset-tokens-day"),
    ("x-ratelimit-remaining-requests-day", "x-ratelimit-reset-requests-day"),
)


def rate_limit_wait(headers: Mapping[str, str]) -> float | None:
    """How long a 429 asks the client to wait: `retry-after(-ms)` when sent, else the reset time
    (float seconds) of the exhausted `x-ratelimit-*` bucket (Cerebras sends these on every
    response), else the soonest reset announced; None without any hint."""
    explicit = retry_after_seconds(headers)
    if explicit is not None:
        return max(0.0, explicit)
    exhausted: list[float] = []
    announced: list[float] = []
    for remaining, reset in RATELIMIT_RESETS:
        try:
            seconds = float(headers[reset])
        except (KeyError, ValueError):
            continue
        announced.append(seconds)
        if headers.get(remaining, "").strip() in ("0", "0.0"):
            exhausted.append(seconds)
    if exhausted:
        return max(0.0, max(exhausted))
    return max(0.0, min(announced)) if announced else None
