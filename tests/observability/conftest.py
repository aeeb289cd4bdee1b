"""The observability suite's server: a real Engine behind a real gRPC server (helpers for
reading its metrics: tests/support/metrics.py)."""

from __future__ import annotations

import pytest

from tests.support.configs import server_config
from tests.support.stacks import Server


@pytest.fixture
async def server(tmp_path):
    srv = await Server(server_config(tmp_path)).start()
    yield srv
    await srv.stop()
