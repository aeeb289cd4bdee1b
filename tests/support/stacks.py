"""Real servers for in-process tests, built by the composition root (`tether.server.start`):
`Stack` (an Engine behind a real bridge and gRPC server on 127.0.0.1:0, with the official SDK and a
raw WebSocket client at hand) and `Server` (an Engine behind a real grpc.aio server that a test
can stop and start again on the same port)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from openai import AsyncOpenAI
from websockets.asyncio.client import connect

from tests.bridge.helpers import KEY_A
from tests.support.configs import instant_config
from tether import server
from tether.auth import Authenticator
from tether.bridge import BridgeServer
from tether.config import TetherConfig
from tether.core.engine import Engine
from tether.service.grpc_server import GrpcServer


class Stack:
    """An engine with the bridge and the gRPC service in front of it."""

    def __init__(self, engine: Engine, bridge: BridgeServer, config: TetherConfig, grpc_port: int = 0) -> None:
        self.engine = engine
        self.bridge = bridge
        self.config = config
        self.grpc_port = grpc_port

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
    """`config` (default: `instant_config(backend, **limits)`) served by the composition root."""
    config = config or instant_config(backend, **limits)
    config.server.bridge = True
    running = await server.start(config, authenticator=authenticator)
    try:
        yield Stack(running.engine, running.bridge, config, running.grpc_port)  # type: ignore[arg-type]
    finally:
        await running.stop(0.5)



class Server:
    def __init__(self, config: TetherConfig, authenticator: Authenticator | None = None) -> None:
        self.config = config
        self.auth = authenticator or Authenticator({})
        self.engine: Engine | None = None
        self.grpc: GrpcServer | None = None
        self.running: server.Running | None = None
        self.port = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Server:
        self.config.server.grpc_port = self.port
        self.config.server.bridge = False
        self.running = await server.start(self.config, authenticator=self.auth)
        self.engine, self.grpc = self.running.engine, self.running.grpc
        self.port = self.grpc.port
        return self

    async def stop(self, grace: float = 0.0) -> None:
        if self.running is None:
            return
        await self.running.stop(grace)
        self.running = self.grpc = self.engine = None
