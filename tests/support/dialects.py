"""One chat-completions backend per dialect against the fake upstream (tests/fakes/chat_server.py):
what the dialect tests send and read back."""

from __future__ import annotations

import pytest

from tests.fakes import chat_server as fk
from tests.fakes.items import request
from tether.backends.registry import build_backend


@pytest.fixture(name="server")
async def dialect_server():
    """`server`: a lenient fake upstream that reports itself as vLLM; each test picks the dialect."""
    with fk.FakeChatServer(api_key=None, strict=False, lifetime_s=60, owned_by="vllm") as s:
        yield s


async def call(server, dialect, *items, options=None, **kw):
    """Every chunk a backend of `dialect` streams for a request of `items`."""
    b = build_backend("x", "openai", {"base_url": server.base_url, "dialect": dialect, **(options or {})})
    try:
        return [c async for c in b.stream(request(*items, **kw))]
    finally:
        await b.aclose()
