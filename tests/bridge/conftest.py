"""Fixtures for the bridge suite: a real Engine (memory store, instant simulated backend) behind a
real bridge on 127.0.0.1:0, and clients: the official SDK and a raw `websockets` client.

Two API keys: `sk-a` (tenant "a") and `sk-b` (tenant "b").
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import connect

from tether.auth import Authenticator
from tether.bridge import BridgeServer, start_bridge
from tether.config import BackendSpec, Route, TetherConfig
from tether.core.engine import Engine

from .helpers import KEY_A, KEY_B

FAST_BACKEND = {"ttft_ms": 0, "tokens_per_s": 0, "output_tokens": 12, "tick_ms": 1}


def make_config(backend: dict[str, Any] | None = None, **limits: Any) -> TetherConfig:
    """Memory store, an instant simulated backend (`backend` overrides its options), `limits`."""
    cfg = TetherConfig()
    cfg.store = "memory://"
    cfg.backends = {"sim": BackendSpec(kind="simulated", options={**FAST_BACKEND, **(backend or {})})}
    cfg.models = {"sim-model": Route(backend="sim"), "*": Route(backend="sim")}
    cfg.server.bridge_host = "127.0.0.1"
    cfg.server.bridge_port = 0
    cfg.server.grpc_host = "127.0.0.1"
    cfg.server.grpc_port = 0
    cfg.server.shutdown_grace_s = 2.0
    cfg.server.metrics_port = 0
    cfg.limits.coalesce_ms = 0
    for key, value in limits.items():
        setattr(cfg.limits, key, value)
    return cfg


@pytest.fixture
def authenticator() -> Authenticator:
    return Authenticator({KEY_A: "a", KEY_B: "b"})


class Stack:
    """An engine and a bridge in front of it."""

    def __init__(self, engine: Engine, bridge: BridgeServer, config: TetherConfig) -> None:
        self.engine = engine
        self.bridge = bridge
        self.config = config

    @property
    def port(self) -> int:
        return self.bridge.port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    def client(self, key: str = KEY_A) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.base_url, api_key=key, max_retries=0)

    def ws(self, key: str | None = KEY_A, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        kwargs.setdefault("compression", None)
        kwargs.setdefault("max_size", None)
        return connect(self.ws_url, additional_headers=headers, **kwargs)


@contextlib.asynccontextmanager
async def running_stack(
    authenticator: Authenticator, backend: dict[str, Any] | None = None, *, config: TetherConfig | None = None,
    **limits: Any,
) -> AsyncIterator[Stack]:
    """`config` (default: `make_config(backend, **limits)`) served by an engine and a bridge."""
    config = config or make_config(backend, **limits)
    engine = await Engine.start(config)
    try:
        bridge = await start_bridge(engine, authenticator, config)
        try:
            yield Stack(engine, bridge, config)
        finally:
            await bridge.stop(0.5)
    finally:
        await engine.aclose()


@pytest.fixture
async def stack(authenticator: Authenticator) -> AsyncIterator[Stack]:
    async with running_stack(authenticator) as s:
        yield s


@pytest.fixture
def make_stack(authenticator: Authenticator) -> Callable[..., Any]:
    """`async with make_stack(backend={...}, max_lanes=2) as stack:` for other settings."""
    return lambda backend=None, **limits: running_stack(authenticator, backend, **limits)


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[AsyncOpenAI]:
    async with stack.client() as c:
        yield c
