"""Shared fixtures: a real Engine behind a real grpc.aio server on 127.0.0.1:0 (built by the
composition root, `tether.server.start`), real channels."""

from __future__ import annotations

import os

# The tests start real `tether serve` processes from this (gRPC-using) process; a fork whose child
# runs Python before exec (`preexec_fn`) runs gRPC's fork handlers, and with fork support on, the
# child's restarted poller can find its epoll fd closed by close_fds and abort (grpc/grpc#43055:
# "tether serve exited with -6 ... epoll_wait error: Bad file descriptor"). Set before grpc loads.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402
import pytest

from tests.support.configs import make_config
from tether import server
from tether.auth import Authenticator
from tether.config import TetherConfig


@pytest.fixture
def config(tmp_path) -> TetherConfig:
    return make_config(f"sqlite:///{tmp_path}/tether.db")


@pytest.fixture
def authenticator() -> Authenticator:
    return Authenticator({})


@pytest.fixture
async def running(config, authenticator):
    config.server.bridge = False
    running = await server.start(config, authenticator=authenticator)
    yield running
    await running.stop(0)


@pytest.fixture
def engine(running):
    return running.engine


@pytest.fixture
def grpc_server(running):
    return running.grpc


@pytest.fixture
async def channel(grpc_server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_server.port}") as ch:
        yield ch
