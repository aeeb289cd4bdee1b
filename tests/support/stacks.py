"""Real servers for in-process tests: `Stack` (an Engine behind a real bridge on 127.0.0.1:0,
with the official SDK and a raw WebSocket client at hand) and `Server` (an Engine behind a real
grpc.aio server that a test can stop and start again on the same port)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from openai import AsyncOpenAI
from websockets.asyncio.client import connect

from tests.bridge.helpers import KEY_A
from tests.support.configs import instant_config
from tether.auth import Authenticator
from tether.bridge import BridgeServer, start_bridge
from tether.config import TetherConfig
from tether.core.engine import Engine
from tether.service.grpc_server import GrpcServer, start_grpc_server


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
    """`config` (default: `instant_config(backend, **limits)`) served by an engine and a bridge."""
    config = config or instant_config(backend, **limits)
    engine = await Engine.start(config)
    try:
        bridge = await start_bridge(engine, authenticator, config)
        try:
            yield Stack(engine, bridge, config)
        finally:
            await bridge.stop(0.5)
    finally:
        await engine.aclose()



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
