"""The CI slice of the load campaign (`python -m tether_lab.load`): 50 WebSocket connections of
which 10 run tool-loop rollouts, plus 2 gRPC sessions, for a few seconds against a `tether serve`
subprocess. Asserts only what must hold at any scale: no errors, and every store=true response
retrievable afterwards, and the server's memory reclaimer ran once the connections closed. The full
campaign's figures (memory back near the baseline included) are in docs/reliability.md."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tether_lab.load import load_server, run_load


def test_tiny_load_campaign(tmp_path: Path) -> None:
    with load_server(tmp_path, reclaim_interval_s=0.5) as server:
        out = asyncio.run(
            run_load(server, connections=50, rolling=10, grpc_sessions=2, duration_s=3.0, reclaim_interval_s=0.5)
        )
        assert server.terminate(60) == 0
    assert out["connections_opened"] == 50
    assert out["errors"] == 0, (out["error_classes"], out["error_examples"])
    assert out["turns"] > 0 and out["stored_responses"] > 0
    assert out["stored_missing"] == 0
    assert out["overhead_ms"]["samples"] > 0
    assert out["reclaimed_by_server"]
