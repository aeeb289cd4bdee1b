"""Logs on stderr, for people and for machines: `[server] log_format` (`--log-format`) "text" is
one readable line per record (`16:02:11 warning tether.server: message key=value ...`), "json"
one JSON object per line with the `extra` fields as keys, and "auto" (the default) picks text
when stderr is a terminal and JSON otherwise (a file, a pipe, a container's log driver).

Message contents and credentials are not logged by default: the core logs ids, counts and codes,
never item text, and `RedactingFilter` masks anything that looks like a bearer token or API key
that still slips into a record (config `log_content = true` turns the masking off for debugging).
`redact_url` is the one way a configured URL (a store, a backend replica) is shown anywhere: logs,
error messages, metric labels.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_SECRET_RE = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}|\b(sk|tk)-[A-Za-z0-9_-]{8,}")


# Query parameters whose value is a credential (`?token=`, `api_key`, `access_token`, `sig`, ...).
_SECRET_PARAM = r"token|key|secret|pass|pwd|auth|sig|credential|session|cookie"
_SECRET_PARAM_RE = re.compile(f"(?i){_SECRET_PARAM}")
# The same two places inside any text (a library's log line naming a URL): userinfo, secret params.
_URL_USERINFO_RE = re.compile(r"(?<=://)[^/\s@]+@")
_URL_PARAM_RE = re.compile(rf"(?i)([?&][^=&\s]*(?:{_SECRET_PARAM})[^=&\s]*=)[^&\s#\"']*")


def redact(text: str) -> str:
    """`text` with bearer tokens, API keys and the credentials of any URL in it masked."""
    text = _SECRET_RE.sub(lambda m: (m.group(1) or "") + "[REDACTED]", text)
    if "://" in text:
        text = _URL_USERINFO_RE.sub("***@", text)
    if "=" in text:
        text = _URL_PARAM_RE.sub(r"\1***", text)
    return text


def redact_url(url: str) -> str:
    """`url` with its credentials replaced by `***`: the password of the userinfo (a user name
    alone too, since `https://TOKEN@host` puts the token there), and the value of every query
    parameter whose name says it is a secret. Host, port, path and other parameters stay, so the
    URL still says where it points."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            user, colon, _ = userinfo.partition(":")
            netloc = f"{user}:***@{hostport}" if colon else f"***@{hostport}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(_SECRET_PARAM_RE.search(k) for k, _ in pairs):
                query = "&".join(f"{k}=***" if _SECRET_PARAM_RE.search(k) else f"{k}={v}" for k, v in pairs)
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<unparseable URL>"


class RedactingFilter(logging.Filter):
    """Masks secrets in the rendered message: arguments of any type (httpx logs a URL object, not
    a string) are formatted first, then the whole text is redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: leave it to the handler's own error path
            return True
        record.msg, record.args = redact(message), None
        return True


FORMATS = ("auto", "json", "text")


def resolve_format(fmt: str, stream: object = None) -> str:
    """"json" or "text" for the setting `fmt` ("auto": text on a terminal) and `stream` (stderr)."""
    if fmt not in FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt != "auto":
        return fmt
    isatty = getattr(sys.stderr if stream is None else stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


class TextFormatter(logging.Formatter):
    """`HH:MM:SS level logger: message key=value ...`, the `extra` fields after the message."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname.lower():<7} {record.name}: {record.getMessage()}"
        fields = [f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")]
        if fields:
            line += "  " + " ".join(fields)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": round(time.time(), 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(data, default=str).decode()


def setup_logging(level: str = "info", fmt: str = "auto", redact_content: bool = True) -> None:
    """Log records at `level` and above to stderr in `fmt` (see `resolve_format`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if resolve_format(fmt) == "json" else TextFormatter())
    if redact_content:
        handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
