"""Shared fixtures: a real Engine, a real grpc.aio server on 127.0.0.1:0, real channels."""

from __future__ import annotations

import grpc
import pytest

from tether.auth import Authenticator
from tether.config import TetherConfig, from_dict
from tether.core.engine import Engine
from tether.service.grpc_server import start_grpc_server


def make_config(store: str = "memory://", *, backends: dict | None = None, models: dict | None = None,
                limits: dict | None = None, **top) -> TetherConfig:
    """A test configuration: fast simulated model, ephemeral ports, given store."""
    data = {
        "store": store,
        "backends": backends or {"sim": {"kind": "simulated", "ttft_ms": 1, "tokens_per_s": 20000}},
        "server": {"grpc_port": 0, "bridge_port": 0, "shutdown_grace_s": 5},
        "limits": {"coalesce_ms": 2, **(limits or {})},
        **top,
    }
    if models is not None:
        data["models"] = models
    return from_dict(data)


@pytest.fixture
def config(tmp_path) -> TetherConfig:
    return make_config(f"sqlite:///{tmp_path}/tether.db")


@pytest.fixture
async def engine(config):
    eng = await Engine.start(config)
    yield eng
    await eng.aclose()


@pytest.fixture
def authenticator() -> Authenticator:
    return Authenticator({})


@pytest.fixture
async def grpc_server(engine, config, authenticator):
    server = await start_grpc_server(engine, config, authenticator)
    yield server
    await server.stop(0)


@pytest.fixture
async def channel(grpc_server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_server.port}") as ch:
        yield ch
