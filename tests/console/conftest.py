"""Fixtures for the console suite: the bridge suite's real Engine (memory store, simulated
backend) behind a real bridge on 127.0.0.1:0, with the console on.

Keys: `sk-a` (tenant "a"), `sk-b` (tenant "b"), `sk-admin` (tenant "ops", a console admin).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tether.auth import Authenticator

from ..bridge.conftest import Stack, make_config, running_stack

KEY_A, KEY_B, KEY_ADMIN = "sk-a", "sk-b", "sk-admin"
KEYS = {KEY_A: "a", KEY_B: "b", KEY_ADMIN: "ops"}


class ConsoleStack(Stack):
    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
    async with running_stack(authenticator or Authenticator(KEYS), config=config) as stack:
        yield ConsoleStack(stack.engine, stack.bridge, stack.config)


@pytest.fixture
async def stack() -> AsyncIterator[ConsoleStack]:
    async with console_stack() as s:
        yield s
