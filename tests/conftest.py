"""Shared fixtures: a real Engine, a real grpc.aio server on 127.0.0.1:0, real channels."""

from __future__ import annotations

import grpc
import pytest

from tests.support.configs import make_config
from tether.auth import Authenticator
from tether.config import TetherConfig
from tether.core.engine import Engine
from tether.service.grpc_server import start_grpc_server


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
