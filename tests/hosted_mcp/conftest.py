"""Fixtures for the MCP suite: a real MCP server (tests/fakes/mcp_server.py, streamable HTTP on
127.0.0.1) and a real Tether stack (bridge + gRPC, memory store, instant simulated model) whose
`[mcp]` allows that server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.bridge.helpers import KEY_A, KEY_B
from tests.fakes.mcp_server import McpTestServer
from tests.support.configs import instant_config
from tests.support.stacks import Stack, running_stack
from tether.auth import Authenticator
from tether.config import TetherConfig


def mcp_config(**mcp: Any) -> TetherConfig:
    cfg = instant_config()
    cfg.mcp.allowed_servers = ["127.0.0.1"]
    cfg.mcp.allow_private_networks = ["127.0.0.0/8"]
    for key, value in mcp.items():
        setattr(cfg.mcp, key, value)
    return cfg


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[McpTestServer]:
    with McpTestServer() as server:
        yield server


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack(Authenticator({KEY_A: "a", KEY_B: "b"}), config=mcp_config()) as s:
        yield s


def mcp_tool(server: McpTestServer, label: str = "dice", **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, "server_url": server.url, "require_approval": "never", **fields}
