"""Logs on stderr, for people and for machines: `[server] log_format` (`--log-format`) "text" is
one readable line per record (`16:02:11 warning tether.server: message key=value ...`), "json"
one JSON object per line with the `extra` fields as keys, and "auto" (the default) picks text
when stderr is a terminal and JSON otherwise (a file, a pipe, a container's log driver).

Message contents and credentials are not logged by default: the core logs ids, counts and codes,
never item text, and `RedactingFilter` masks anything that looks like a bearer token or API key
that still slips into a record (config `log_content = true` turns the masking off for debugging).
"""

from __future__ import annotations

import logging
import re
import sys
import time

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_SECRET_RE = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}|\b(sk|tk)-[A-Za-z0-9_-]{8,}")


def redact(text: str) -> str:
    return _SECRET_RE.sub(lambda m: (m.group(1) or "") + "[REDACTED]", text)


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if record.args:
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args) if isinstance(record.args, tuple) else record.args
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
