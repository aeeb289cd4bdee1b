"""The CI slice of `tether fuzz`: 300 generated and mutated inputs per surface (WebSocket frames,
HTTP requests, gRPC session messages and raw bytes) against a `tether serve` subprocess, with a
fixed seed. The full campaign (>= 10,000 per surface) and its figures are in docs/reliability.md.

Every finding must be a known one: `KNOWN_FINDINGS` maps each root-cause signature the fuzzer
reports to its entry in docs/reliability.md ("Findings"), where the core fix is written down.
Remove an entry once its fix has landed; a new signature fails this test.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tether.lab.fuzz import FUZZ_KEY, Report, Target, own_server, run_campaign

ITERATIONS = 300
SEED = 20260

# signature prefix -> finding in docs/reliability.md
KNOWN_FINDINGS = {
    "hang|grpc-raw-session": "F1: an undecodable Session message silently stops the stream's reader",
    "server_error|error-event": "F2: a backend exception ends the turn with server_error ...",
    "sequence|no-terminal-after-server-error": "F2: ... and without a terminal event",
    "sequence|no-terminal": "F2 (the same, seen in an SSE stream)",
    "http_5xx|500:server_error": "F2 (a non-streamed HTTP create of such a turn; the log check pins the cause)",
    "malformed|sdk:response.text.": "F4: unvalidated enum/shape fields echoed in the Response",
    "malformed|sdk:text.": "F4",
    "malformed|sdk:response.reasoning.": "F4",
    "malformed|sdk:reasoning.": "F4",
    "malformed|sdk:response.truncation": "F4",
    "malformed|sdk:truncation": "F4",
    "malformed|sdk:response.service_tier": "F4",
    "malformed|sdk:service_tier": "F4",
    "malformed|sdk:response.tool_choice": "F4",
    "malformed|sdk:tool_choice": "F4",
}
KNOWN_LOG = {
    "grpc._cython.cygrpc: google.protobuf.message.DecodeError": "F1: undecodable unary requests logged as errors",
    "tether.session: AttributeError at simulated.py:example_from_schema": "F2 (simulated backend, bad schema)",
    "tether.session: TypeError at simulated.py:example_from_schema": "F2",
    "tether.session: JSONDecodeError at simulated.py": "F2",
    "tether.session: orjson.JSONDecodeError at simulated.py": "F2",
}


def _known(sig: str, table: dict[str, str]) -> bool:
    return any(sig.startswith(prefix) for prefix in table)


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
    assert sum(stats.outcomes.values()) + sum(stats.findings[c] for c in ("hang", "closed")) >= ITERATIONS - 5
    unknown = {sig: n for sig, n in stats.signatures.items() if not _known(sig, KNOWN_FINDINGS)}
    assert not unknown, (unknown, stats.examples)


def test_server_healthy_after_and_memory_bounded(report: Report) -> None:
    assert report.health["ok"], report.health
    assert report.health["exit_code"] == 0
    assert not report.rss.get("growth_exceeded"), report.rss
    unknown = {sig: n for sig, n in report.server_log_signatures.items() if not _known(sig, KNOWN_LOG)}
    assert not unknown, (unknown, report.server_log_examples)
