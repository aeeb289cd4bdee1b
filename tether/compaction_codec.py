"""The payload of a `compaction` item.

`encrypted_content` holds base64url(JSON {"v":1,"summary":...,"keep":n}): the summary of the
compacted context and how many items just before the compaction item stay verbatim. It is not
encrypted (Tether has no secret to hide it from its own operator); clients treat it as opaque.
`effective_context` applies the rule every consumer shares: a compaction item replaces what came
before it, except the `keep` items right before it, which follow it verbatim. A compaction item
tagged with an `agent` compacts that agent's context only (a multi-agent response,
`tether.core.multi_agent`): it starts no window of the chain.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import orjson

from tether.responses.v1 import items_pb2

T = TypeVar("T")


@dataclass(frozen=True)
class CompactionPayload:
    summary: str
    keep: int = 0


def encode_payload(summary: str, keep: int = 0) -> str:
    raw = orjson.dumps({"v": 1, "summary": summary, "keep": keep})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def is_tether_payload(content: str) -> bool:
    """Whether `content` is a payload Tether made (another server's compaction blob is not: its
    summary cannot be read, so the history it replaced would silently vanish)."""
    try:
        data = orjson.loads(base64.urlsafe_b64decode(content + "=" * (-len(content) % 4)))
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        return False
    return isinstance(data, dict) and data.get("v") == 1 and isinstance(data.get("summary"), str)


def decode_payload(content: str) -> CompactionPayload:
    """Decode a payload; foreign or damaged content becomes an empty summary (never a crash)."""
    try:
        raw = base64.urlsafe_b64decode(content + "=" * (-len(content) % 4))
        data = orjson.loads(raw)
        return CompactionPayload(str(data.get("summary", "")), max(0, int(data.get("keep", 0))))
    except (binascii.Error, ValueError, TypeError, AttributeError, orjson.JSONDecodeError):
        return CompactionPayload("", 0)


def starts_window(item: items_pb2.Item) -> bool:
    """Whether `item` replaces the context before it: a compaction item, not one of an agent's."""
    return item.WhichOneof("item") == "compaction" and not item.HasField("agent")


def effective_context(entries: Sequence[T], item_of=lambda e: e) -> list[T]:
    """The model-visible context of `entries` (items, or objects holding one via `item_of`)."""
    last = -1
    for i in range(len(entries) - 1, -1, -1):
        if starts_window(item_of(entries[i])):
            last = i
            break
    if last < 0:
        return list(entries)
    item: items_pb2.Item = item_of(entries[last])
    keep = decode_payload(item.compaction.encrypted_content).keep
    kept = [e for e in entries[max(0, last - keep) : last] if item_of(e).WhichOneof("item") != "compaction"]
    return [entries[last], *kept, *entries[last + 1 :]]


def encode_summary(summary: str) -> str:
    """A payload with nothing kept verbatim (backends and tests that only carry a summary)."""
    return encode_payload(summary, 0)


def decode_summary(content: str) -> str:
    return decode_payload(content).summary
