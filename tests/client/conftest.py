"""A real Tether (Engine + grpc.aio server on 127.0.0.1) that a test can stop and start again on
the same port, with a SQLite store that outlives the restarts."""

from __future__ import annotations

import pytest

from tests.support.configs import server_config
from tests.support.stacks import Server


@pytest.fixture
async def server(tmp_path):
    srv = await Server(server_config(tmp_path)).start()
    yield srv
    await srv.stop()
