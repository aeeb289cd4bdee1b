"""The CI slice of `tether fuzz`: 300 generated and mutated inputs per surface (WebSocket frames,
HTTP requests, gRPC session messages and raw bytes) against a `tether serve` subprocess, with a
fixed seed. The full campaign (>= 10,000 per surface) and its figures are in docs/reliability.md.

Strict: every input must be answered, no finding of any kind, no error line in the server's log.
Every finding the fuzzer ever reported is fixed (docs/reliability.md, "Findings"); a new one fails
this test with its signature and an example.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tether.lab.fuzz import FUZZ_KEY, Report, Target, own_server, run_campaign

ITERATIONS = 300
SEED = 20260


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    tmp = Path(tmp_path_factory.mktemp("fuzz"))
    with own_server(tmp) as server:
        target = Target(f"127.0.0.1:{server.bridge_port}", server.grpc_target, FUZZ_KEY)
        result = asyncio.run(
            run_campaign(
                target,
                iterations=ITERATIONS,
                seed=SEED,
                server=server,
                warmup=0,
                huge_rate=0.0,
                deadline_s=15.0,
                raw_deadline_s=1.0,
            )  # fmt: skip
        )
        result.health["exit_code"] = server.terminate(60)
    return result


@pytest.mark.parametrize("surface", ["ws", "http", "grpc"])
def test_every_input_is_answered_and_well_formed(report: Report, surface: str) -> None:
    stats = report.surfaces[surface]
    assert stats.inputs == ITERATIONS
    assert not stats.findings, (dict(stats.signatures), stats.examples)
    assert sum(stats.outcomes.values()) == ITERATIONS, dict(stats.outcomes)


def test_server_healthy_after_and_memory_bounded(report: Report) -> None:
    assert report.health["ok"], report.health
    assert report.health["exit_code"] == 0
    assert not report.rss.get("growth_exceeded"), report.rss
    assert not report.server_log_errors, (dict(report.server_log_signatures), report.server_log_examples)
