"""Shared pieces of the hardening suite: one engine behind the bridge AND the gRPC service (so a
test can use the same ids on every transport), a controllable backend, small I/O helpers.

Two API keys: `sk-a` (tenant "a") and `sk-b` (tenant "b").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import grpc
import httpx
import orjson

from tests.bridge.helpers import (
    KEY_A,
    KEY_B,
    check_ws_events,
    recv_json,
    recv_response,
    send_json,
)
from tests.support.configs import instant_config
from tests.support.grpc_client import RawSession
from tether import server
from tether.auth import Authenticator
from tether.backends.base import BackendBase, BackendRequest, Finish, TextDelta, Usage
from tether.backends.registry import register_backend
from tether.config import BackendSpec, Route, TetherConfig
from tether.core.engine import Engine

__all__ = [
    "KEY_A",
    "KEY_B",
    "CREATE",
    "FullStack",
    "full_stack",
    "instant_config",
    "recv_json",
    "recv_response",
    "send_json",
    "check_ws_events",
    "ws_error",
    "metric",
    "Firehose",
    "recv_turn",
    "local_adapter",
    "slow_reader",
]

CREATE: dict[str, Any] = {"type": "response.create", "model": "sim-model", "input": "hi", "store": False}


def ws_error(ev: dict[str, Any], code: str, status: int | None = None) -> dict[str, Any]:
    """Assert `ev` is a WS `error` envelope with `code` (and `status`); returns its `error` body."""
    assert ev["type"] == "error", ev
    assert ev["error"]["code"] == code, ev
    if status is not None:
        assert ev["status"] == status, ev
    check_ws_events([ev])  # strict SDK parse of the envelope
    return ev["error"]


async def recv_turn(conn: Any, within: float = 30.0) -> list[dict[str, Any]]:
    """`recv_response` (every frame parsed strictly with the SDK's types, the whole turn checked
    by the event-sequence oracle) with room for a turn through a slow or faulty upstream."""
    return await recv_response(conn, within)


def metric(engine: Engine, name: str, **labels: str) -> float:
    """A sample from the engine's own Prometheus registry (0 when the series does not exist)."""
    value = engine.telemetry.registry.get_sample_value(name, labels)
    return value or 0.0


@dataclasses.dataclass
class FullStack:
    engine: Engine
    bridge: Any
    grpc: Any
    config: TetherConfig

    @property
    def port(self) -> int:
        return self.bridge.port

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    def ws(
        self, key: str | None = KEY_A, *, extra_headers: dict[str, str] | None = None, **kwargs: Any
    ) -> Any:
        from websockets.asyncio.client import connect

        headers = {"Authorization": f"Bearer {key}"} if key else {}
        headers.update(extra_headers or {})
        kwargs.setdefault("compression", None)
        kwargs.setdefault("max_size", None)
        return connect(self.ws_url, additional_headers=headers, **kwargs)

    def http(self, key: str | None = KEY_A) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", headers=headers, timeout=20.0)

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc.port}")

    def session(self, channel: grpc.aio.Channel, key: str | None = KEY_A) -> RawSession:
        return RawSession(channel, api_key=key)


@contextlib.asynccontextmanager
async def full_stack(
    config: TetherConfig | None = None, keys: dict[str, str] | None = None
) -> AsyncIterator[FullStack]:
    """An engine with both front ends: the bridge (HTTP + WS) and the gRPC service."""
    config = config or instant_config()
    auth = Authenticator({KEY_A: "a", KEY_B: "b"} if keys is None else keys)
    config.server.bridge = True
    with local_adapters(spec.kind for spec in config.backends.values()):
        running = await server.start(config, authenticator=auth)
    try:
        yield FullStack(running.engine, running.bridge, running.grpc, config)
    finally:
        await running.stop(0.5)


# Backend adapters only these tests use: registered while an engine is built, then removed, so
# the process-wide registry (which tests/backends checks) never sees them otherwise.
TEST_ADAPTERS: dict[str, type] = {}


def local_adapter(cls: type) -> type:
    TEST_ADAPTERS[cls.kind] = cls  # type: ignore[attr-defined]
    return cls


@contextlib.contextmanager
def local_adapters(kinds: Any) -> Any:
    from tether.backends import registry

    added = [kind for kind in set(kinds) if kind in TEST_ADAPTERS and kind not in registry.backend_kinds()]
    for kind in added:
        register_backend(TEST_ADAPTERS[kind])
    try:
        yield
    finally:
        for kind in added:
            registry._ADAPTERS.pop(kind, None)


def with_models(config: TetherConfig, models: dict[str, dict[str, Any]]) -> TetherConfig:
    config.models = {name: Route(**spec) for name, spec in models.items()}
    return config


def with_backend(config: TetherConfig, name: str, kind: str, **options: Any) -> TetherConfig:
    config.backends[name] = BackendSpec(kind=kind, options=options)
    return config


# -- a client that reads slowly, or not at all --------------------------------------------------


async def slow_reader(stack: FullStack, key: str = KEY_A) -> tuple[Any, Any]:
    """A WebSocket client with a 4 KiB receive buffer and a queue of one message, whose server
    end has a 4 KiB send buffer: what it does not read backs up at once. Returns the client
    connection and the server's protocol object for it."""
    from websockets.asyncio.client import connect

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", stack.port))
    conn = await connect(
        stack.ws_url, sock=sock, additional_headers={"Authorization": f"Bearer {key}"},
        compression=None, max_size=None, max_queue=1,
    )  # fmt: skip
    port = sock.getsockname()[1]
    [proto] = [p for p in stack.bridge._server.server_state.connections if getattr(p, "client", None) and p.client[1] == port]
    proto.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return conn, proto


# -- a backend whose pace the test controls ---------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class FirehoseConfig:
    chunks: int = 1000  # text deltas per response
    chunk_bytes: int = 1024  # characters per delta


class Firehose(BackendBase):
    """`chunks` deltas of `chunk_bytes` characters as fast as the consumer takes them. Counts what
    was pulled (`Firehose.pulled[name]`), so a test can see a generation wait on its reader."""

    kind: ClassVar[str] = "hardening_firehose"
    Config: ClassVar[type] = FirehoseConfig
    pulled: ClassVar[dict[str, int]] = {}
    open_streams: ClassVar[dict[str, int]] = {}

    def __init__(self, name: str, config: FirehoseConfig | None = None) -> None:
        self.name = name
        self.config = config or FirehoseConfig()
        Firehose.pulled[name] = 0
        Firehose.open_streams[name] = 0

    async def stream(self, request: BackendRequest) -> AsyncIterator[Any]:
        c = self.config
        piece = ("lorem ipsum " * (c.chunk_bytes // 12 + 1))[: c.chunk_bytes]
        Firehose.open_streams[self.name] += 1
        try:
            for _ in range(c.chunks):
                Firehose.pulled[self.name] += 1
                yield TextDelta(piece)
                await asyncio.sleep(0)
            yield Finish("stop", Usage(input_tokens=request.input_tokens, output_tokens=c.chunks))
        finally:
            Firehose.open_streams[self.name] -= 1



local_adapter(Firehose)


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()
