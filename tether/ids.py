"""Identifiers. Every id carries 128 random bits (secrets), so ids are unguessable handles."""

from __future__ import annotations

import secrets


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
