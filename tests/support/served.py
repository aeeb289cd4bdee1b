"""`served(config, keys)`: a real Engine behind a real bridge on 127.0.0.1:0, for suites that need
their own configuration (real backends, fakes of an upstream)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from tether import server
from tether.auth import Authenticator
from tether.config import TetherConfig
from tether.core.engine import Engine


@dataclass
class Served:
    engine: Engine
    port: int  # the bridge's
    grpc_port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def loopback(config: TetherConfig) -> TetherConfig:
    """Bind both listeners to 127.0.0.1:0, short shutdown, no delta coalescing."""
    config.server.bridge_host = config.server.grpc_host = "127.0.0.1"
    config.server.bridge_port = config.server.grpc_port = 0
    config.server.shutdown_grace_s = 2.0
    config.limits.coalesce_ms = 0
    return config


@contextlib.asynccontextmanager
async def served(config: TetherConfig, keys: Mapping[str, str]) -> AsyncIterator[Served]:
    config.server.bridge = True
    running = await server.start(config, authenticator=Authenticator(dict(keys)))
    try:
        yield Served(running.engine, running.bridge_port or 0, running.grpc_port)
    finally:
        await running.stop(0.5)
