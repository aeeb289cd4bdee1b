"""Test doubles shared by the suites (loopback only).

- `chat_server.FakeChatServer`: a fake Chat Completions upstream speaking Cerebras's wire format,
  with scenario builders (`text`, `tool_calls`, `rate_limited`, `stall`, ...). See its docstring.
- `fake_chat_server`: a pytest fixture (import it into a conftest: `from tests.fakes import
  fake_chat_server  # noqa: F401`), a started server with api_key "test-key", closed afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.chat_server import (
    ABORT,
    BUILTIN_SCENARIOS,
    Call,
    FakeChatServer,
    Pause,
    RecordedRequest,
    Reply,
    bad_request,
    completion,
    http_error,
    length,
    mid_stream_error,
    no_done,
    rate_limited,
    sequence,
    slow,
    stall,
    text,
    text_tokens,
    tool_calls,
    unavailable,
    usage_separate,
)

FAKE_API_KEY = "test-key"


@pytest.fixture
def fake_chat_server() -> Iterator[FakeChatServer]:
    with FakeChatServer(api_key=FAKE_API_KEY, lifetime_s=60) as server:
        yield server


__all__ = [
    "ABORT",
    "BUILTIN_SCENARIOS",
    "FAKE_API_KEY",
    "Call",
    "FakeChatServer",
    "Pause",
    "RecordedRequest",
    "Reply",
    "bad_request",
    "completion",
    "fake_chat_server",
    "http_error",
    "length",
    "mid_stream_error",
    "no_done",
    "rate_limited",
    "sequence",
    "slow",
    "stall",
    "text",
    "text_tokens",
    "tool_calls",
    "unavailable",
    "usage_separate",
]
