"""Fixtures for the console suite: a real Engine (memory store, simulated backend) behind a real
bridge on 127.0.0.1:0 with the console on.

Keys: `sk-a` (tenant "a"), `sk-b` (tenant "b"), `sk-admin` (tenant "ops", a console admin).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tether.auth import Authenticator
from tether.bridge import BridgeServer, start_bridge
from tether.config import TetherConfig
from tether.core.engine import Engine

from ..bridge.conftest import make_config

KEY_A, KEY_B, KEY_ADMIN = "sk-a", "sk-b", "sk-admin"
KEYS = {KEY_A: "a", KEY_B: "b", KEY_ADMIN: "ops"}


class ConsoleStack:
    def __init__(self, engine: Engine, bridge: BridgeServer, config: TetherConfig) -> None:
        self.engine, self.bridge, self.config = engine, bridge, config

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.bridge.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.bridge.port}/v1/responses"

    @property
    def console(self) -> Any:
        return self.bridge.app.console


@contextlib.asynccontextmanager
async def console_stack(
    authenticator: Authenticator | None = None, backend: dict[str, Any] | None = None, **server: Any
) -> AsyncIterator[ConsoleStack]:
    config = make_config({"output_tokens": 80, **(backend or {})})  # the whole explanation
    config.server.console_admin_tenants = "ops"
    for key, value in server.items():
        setattr(config.server, key, value)
    engine = await Engine.start(config)
    try:
        bridge = await start_bridge(engine, authenticator or Authenticator(KEYS), config)
        try:
            yield ConsoleStack(engine, bridge, config)
        finally:
            await bridge.stop(0.5)
    finally:
        await engine.aclose()


@pytest.fixture
async def stack() -> AsyncIterator[ConsoleStack]:
    async with console_stack() as s:
        yield s
