"""Helpers every store engine shares: the API item id of an item, argument checks for
`list_input_items`, in-process paging (memory and Redis), the usage-record field order, the
store's typed lookup error and which store errors are worth retrying."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tether import offload
from tether.responses.v1 import items_pb2

from .base import UsageRecord

T = TypeVar("T")

ORDERS = ("asc", "desc")

# The column / field order every engine stores a UsageRecord in.
USAGE_FIELDS = (
    "tenant",
    "response_id",
    "model",
    "backend",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "status",
    "created_at",
)
_INT_USAGE_FIELDS = frozenset({"input_tokens", "cached_tokens", "output_tokens", "reasoning_tokens"})


async def parse_items(blobs: Sequence[bytes]) -> list[items_pb2.Item]:
    """Stored items parsed; megabytes of them in the offload thread (`tether.offload`), not on
    the event loop every other connection shares."""
    return await offload.run(sum(map(len, blobs)), _parse_items, blobs)


def _parse_items(blobs: Sequence[bytes]) -> list[items_pb2.Item]:
    return [items_pb2.Item.FromString(blob) for blob in blobs]


def item_api_id(item: items_pb2.Item) -> str:
    """The API-visible `id` of an item ("" when it has none): the arm's `id` field, or the `id`
    key of the JSON of an item type the schema does not model."""
    arm = item.WhichOneof("item")
    if arm is None:
        return ""
    body = getattr(item, arm)
    if arm == "other":
        try:
            obj = json.loads(body.json) if body.json else {}
        except ValueError:
            return ""
        value = obj.get("id") if isinstance(obj, dict) else None
        return value if isinstance(value, str) else ""
    return getattr(body, "id", "") or ""


def check_page_args(after: str | None, limit: int, order: str) -> str | None:
    """Validate `list_input_items` arguments (same errors on every engine); returns the
    normalized cursor ("" means no cursor)."""
    if order not in ORDERS:
        raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer, not {limit!r}")
    return after or None


def page(entries: Sequence[tuple[str, T]], after: str | None, limit: int, order: str) -> tuple[list[T], bool]:
    """Page `(item_id, value)` entries (in input order) the way the SQL engines do.

    desc lists newest (last) first. `after` is the API id of the item the previous page ended
    with: the page starts right after its first occurrence in listing order. An `after` that
    matches no item yields an empty page (nothing is known to come after it).
    """
    ordered = list(entries) if order == "asc" else list(reversed(entries))
    start = 0
    if after is not None:
        for index, (item_id, _) in enumerate(ordered):
            if item_id == after:
                start = index + 1
                break
        else:
            return [], False
    window = ordered[start : start + limit + 1]
    return [value for _, value in window[:limit]], len(window) > limit


def usage_to_row(record: UsageRecord) -> tuple:
    return tuple(getattr(record, name) for name in USAGE_FIELDS)


def usage_from_mapping(values: Mapping[str, bytes | str]) -> UsageRecord:
    """Rebuild a UsageRecord from string-ish values (Redis stream fields)."""
    kwargs: dict[str, Any] = {}
    for name in USAGE_FIELDS:
        raw = values[name]
        if isinstance(raw, bytes):
            raw = raw.decode()
        if name in _INT_USAGE_FIELDS:
            kwargs[name] = int(raw)
        elif name == "created_at":
            kwargs[name] = float(raw)
        else:
            kwargs[name] = str(raw)
    return UsageRecord(**kwargs)


class MissingItemError(LookupError):
    """An item key that names no stored item of the tenant.

    Every engine raises it from `put_response` when `input_keys` / `output_keys` name a key that
    is neither stored nor among `new_items` (another tenant's keys included), and then writes
    nothing; so a stored response never holds a dangling reference, even when a delete of its
    parent races the write. `load_context` / `list_input_items` raise it too, rather than return a
    silently shortened context, should a reference dangle anyway (a damaged database)."""

    def __init__(self, tenant: str, response_id: str, key: str) -> None:
        super().__init__(f"response {response_id!r} references missing item key {key!r}")
        self.tenant = tenant
        self.response_id = response_id
        self.key = key


class FencedWrite(RuntimeError):
    """A response write whose fencing token is stale: the stored response was written with a
    higher `ResponseRecord.epoch`, or its run shared between replicas is owned with a higher one
    (another replica ended it for an owner it took for dead, or took it over:
    `tether.core.shared_runs`). Every engine raises it from `put_response`, checked in the same
    write, and then writes nothing: a paused owner that wakes up cannot bring a final response
    back."""

    def __init__(self, tenant: str, response_id: str, epoch: int) -> None:
        super().__init__(f"response {response_id!r} was written by a newer owner than epoch {epoch}")
        self.tenant = tenant
        self.response_id = response_id
        self.epoch = epoch


# Errors of the drivers that mean "try again": the server is unreachable, restarting, overloaded
# or the transaction lost a race; named by module and class so this module imports no driver.
_TRANSIENT_DRIVER_ERRORS = {
    "asyncpg.exceptions": (
        "PostgresConnectionError", "InterfaceError", "TooManyConnectionsError", "CannotConnectNowError",
        "SerializationError", "DeadlockDetectedError", "AdminShutdownError", "CrashShutdownError",
    ),
    "redis.exceptions": ("ConnectionError", "TimeoutError", "BusyLoadingError", "TryAgainError"),
}  # fmt: skip


def is_transient(exc: BaseException) -> bool:
    """Whether a store call that raised `exc` may succeed when tried again.

    Connection and timeout errors are; so is SQLite's "database is locked" (`OperationalError`
    past `busy_timeout`), and the driver errors listed above. Everything else (a missing item,
    a constraint, a bad value, a bug) would fail the same way again, so it is not retried."""
    if isinstance(exc, MissingItemError):
        return False
    if isinstance(exc, (OSError, TimeoutError)):  # ConnectionError is an OSError
        return True
    if isinstance(exc, sqlite3.OperationalError):
        return "locked" in str(exc) or "busy" in str(exc)
    for module, names in _TRANSIENT_DRIVER_ERRORS.items():
        if module in sys.modules:
            classes = tuple(
                getattr(sys.modules[module], name) for name in names if hasattr(sys.modules[module], name)
            )
            if classes and isinstance(exc, classes):
                return True
    return False


def split_query_options(url: str, known: Sequence[str]) -> tuple[str, dict[str, str]]:
    """Pop the query parameters named in `known` off `url`; returns (url without them, options).
    Other parameters stay in the URL for the driver (e.g. PostgreSQL's `sslmode`)."""
    parts = urlsplit(url)
    kept: list[tuple[str, str]] = []
    options: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in known:
            options[name] = value
        else:
            kept.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(kept))), options
