"""A real Tether (Engine + grpc.aio server on 127.0.0.1) that a test can stop and start again on
the same port, with a SQLite store that outlives the restarts."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import make_config
from tether.auth import Authenticator
from tether.config import TetherConfig
from tether.core.engine import Engine
from tether.service.grpc_server import GrpcServer, start_grpc_server

FAST = {"kind": "simulated", "ttft_ms": 1, "tokens_per_s": 0, "tick_ms": 1, "output_tokens": 12}


class Server:
    def __init__(self, config: TetherConfig, authenticator: Authenticator | None = None) -> None:
        self.config = config
        self.auth = authenticator or Authenticator({})
        self.engine: Engine | None = None
        self.grpc: GrpcServer | None = None
        self.port = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Server:
        self.config.server.grpc_port = self.port
        self.engine = await Engine.start(self.config)
        self.grpc = await start_grpc_server(self.engine, self.config, self.auth)
        self.port = self.grpc.port
        return self

    async def stop(self, grace: float = 0.0) -> None:
        if self.grpc is None or self.engine is None:
            return
        await self.grpc.health.enter_graceful_shutdown()
        await self.engine.shutdown(grace)
        await self.grpc.stop(grace)
        await self.engine.aclose()
        self.grpc = self.engine = None


def server_config(tmp_path, *, backends: dict[str, Any] | None = None, models: dict[str, Any] | None = None,
                  **limits: Any) -> TetherConfig:
    return make_config(
        f"sqlite:///{tmp_path}/tether.db",
        backends=backends or {"sim": FAST},
        models=models,
        limits={"coalesce_ms": 0, **limits},
    )


@pytest.fixture
async def server(tmp_path):
    srv = await Server(server_config(tmp_path)).start()
    yield srv
    await srv.stop()
