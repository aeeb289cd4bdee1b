"""Identifiers. Every id carries 128 random bits (secrets), so ids are unguessable handles."""

from __future__ import annotations

import re
import secrets

# What an id a client names (a response, a conversation, an item) may look like before it is used
# in a store key: Tether's own ids and any client-chosen item id of letters, digits, `_`, `-`, `.`.
# Anything else (`resp_x:ev`, a NUL, a megabyte) cannot name anything: the caller answers 404 at
# once, and no store key is ever built from it (`<id>:ev` would name another kind of Redis key).
_SHAPE = re.compile(r"[A-Za-z0-9_.-]{1,256}")


def well_formed(value: str) -> bool:
    """Whether `value` has the shape of an id (see `_SHAPE`)."""
    return _SHAPE.fullmatch(value) is not None


def new_id(prefix: str) -> str:
    """`prefix_` followed by 32 hex digits (128 random bits), e.g. `resp_9f…`."""
    return f"{prefix}_{secrets.token_hex(16)}"


def response_id() -> str:
    return new_id("resp")


def message_id() -> str:
    return new_id("msg")


def function_call_id() -> str:
    return new_id("fc")


def custom_tool_call_id() -> str:
    return new_id("ctc")


def call_id() -> str:
    return new_id("call")


def reasoning_id() -> str:
    return new_id("rs")


def compaction_id() -> str:
    return new_id("cmp")
