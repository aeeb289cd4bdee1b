"""The metrics a 20-call tool-loop rollout over gRPC leaves behind, scraped from the standalone
metrics server: every counter moves by exactly the expected amount."""

from __future__ import annotations

import asyncio
import json

import pytest

import tether.client as tc
from tests.support.configs import FAST, server_config
from tests.support.metrics import http_get, samples, value
from tests.support.stacks import Server
from tether.core.engine import Engine
from tether.observability.health import ReadinessChecker
from tether.observability.metrics_http import metrics_response, start_metrics_server

CALLS = 20
TURNS = CALLS + 1
CACHE_CAPACITY = 8
STAGES = ("validate", "resolve", "classify", "render", "route", "backend", "backend_ttft", "backend_wait", "stream")


def rollout_script(tmp_path) -> str:
    path = tmp_path / "rollout.json"
    steps = [{"reasoning_tokens": 4, "tool_calls": [{"name": "run", "arguments": {"step": i}}]} for i in range(CALLS)]
    path.write_text(json.dumps({"steps": steps, "after": {"text": "All twenty steps done."}}))
    return str(path)


@pytest.fixture
async def rollout_server(tmp_path):
    backends = {"sim": {**FAST, "script": rollout_script(tmp_path)}}
    srv = await Server(server_config(tmp_path, backends=backends, cache_responses_per_connection=CACHE_CAPACITY)).start()
    metrics = await start_metrics_server(srv.engine, port=0)
    yield srv, metrics
    await metrics.stop()
    await srv.stop()


async def _wait_for(predicate) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_twenty_call_rollout_moves_every_counter_exactly(rollout_server):
    srv, metrics = rollout_server
    engine: Engine = srv.engine
    responses = []
    ran: list[int] = []
    async with tc.connect(srv.target) as s:
        final = await s.run_tool_loop(
            "tether-sim", "Do the twenty steps.", tools={"run": lambda step: ran.append(step) or f"step {step} ok"},
            max_turns=TURNS, on_event=lambda ev: responses.append(ev.completed.response) if ev.HasField("completed") else None,
        )
    assert tc.output_text(final) == "All twenty steps done." and ran == list(range(CALLS))
    assert len(responses) == TURNS
    await engine.post.flush()
    await _wait_for(lambda: engine.telemetry.connections.labels("grpc")._value.get() == 0)

    status, headers, body = await http_get(metrics.port, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    scrape = samples(body.decode())

    assert value(scrape, "tether_connections_opened_total", transport="grpc") == 1
    assert value(scrape, "tether_connections", transport="grpc") == 0
    assert value(scrape, "tether_turns_total", transport="grpc", outcome="completed") == TURNS
    assert value(scrape, "tether_turn_seconds_count", transport="grpc") == TURNS
    assert value(scrape, "tether_turn_overhead_seconds_count", transport="grpc") == TURNS
    assert value(scrape, "tether_cache_hits_total") == CALLS
    assert value(scrape, "tether_cache_misses_total") == 0
    assert value(scrape, "tether_cache_evictions_total", reason="connection_capacity") == TURNS - CACHE_CAPACITY
    assert value(scrape, "tether_hydrations_total", result="found") == 0
    assert value(scrape, "tether_hydrations_total", result="missing") == 0
    for stage in STAGES:
        assert value(scrape, "tether_stage_seconds_count", stage=stage) == TURNS, stage
    assert value(scrape, "tether_stage_seconds_count", stage="post_inference") == TURNS
    assert value(scrape, "tether_tokens_total", kind="input") == sum(r.usage.input_tokens for r in responses)
    assert value(scrape, "tether_tokens_total", kind="cached") == sum(r.usage.cached_tokens for r in responses)
    assert value(scrape, "tether_tokens_total", kind="output") == sum(r.usage.output_tokens for r in responses)
    assert value(scrape, "tether_tokens_total", kind="reasoning") == CALLS * 4
    assert value(scrape, "tether_tokens_total", kind="cached") > 0
    assert not [k for k in scrape if k[0] == "tether_errors_total"]
    assert value(scrape, "tether_active_responses") == 0
    assert value(scrape, "process_cpu_seconds_total") > 0

    # A refused create counts its error code; a reconnecting continuation counts a hydration.
    async with tc.connect(srv.target) as s:
        refused = await s.create("tether-sim", "x", previous_response_id="resp_unknown")
        with pytest.raises(tc.TetherError):
            await refused.final_response()
        more = await s.create("tether-sim", [tc.function_call_output(tc.function_calls(responses[-2])[0].call_id, "again")],
                              previous_response_id=responses[-2].id)
        assert (await more.final_response()).status == "completed"
    scrape = samples(metrics_response(engine)[2].decode())
    assert value(scrape, "tether_errors_total", code="previous_response_not_found") == 1
    assert value(scrape, "tether_hydrations_total", result="missing") == 1
    assert value(scrape, "tether_hydrations_total", result="found") == 1
    assert value(scrape, "tether_cache_misses_total") == 2
    assert value(scrape, "tether_connections_opened_total", transport="grpc") == 2


async def test_openmetrics_health_and_routing(rollout_server):
    srv, metrics = rollout_server
    status, headers, body = await http_get(
        metrics.port, "/metrics", headers="accept: application/openmetrics-text; version=1.0.0\r\n"
    )
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    assert (await http_get(metrics.port, "/healthz"))[:1] == (200,)
    status, _, body = await http_get(metrics.port, "/readyz")
    assert (status, body) == (200, b'{"status":"ready"}')
    assert (await http_get(metrics.port, "/nope"))[0] == 404
    status, headers, _ = await http_get(metrics.port, "/metrics", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    status, headers, body = await http_get(metrics.port, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


async def test_readyz_follows_the_checker(rollout_server):
    srv, _ = rollout_server
    state = {"ok": True}

    async def check() -> bool:
        return state["ok"]

    checker = ReadinessChecker(check=check, services=())
    server = await start_metrics_server(srv.engine, port=0, readiness=checker)
    try:
        assert (await http_get(server.port, "/readyz"))[0] == 503  # no check has run yet
        await checker.check_once()
        assert (await http_get(server.port, "/readyz"))[0] == 200
        state["ok"] = False
        await checker.check_once()
        assert (await http_get(server.port, "/readyz"))[0] == 503
    finally:
        await server.stop()


def test_metrics_response_without_an_engine():
    status, headers, body = metrics_response(object())
    assert status == 200 and b"python_info" in body  # the process's default registry


async def test_active_responses_gauge_during_a_turn(tmp_path):
    srv = await Server(server_config(tmp_path, backends={"sim": {**FAST, "ttft_ms": 300}})).start()
    try:
        async with tc.connect(srv.target) as s:
            stream = await s.create("tether-sim", "slow")
            await stream.wait_created()
            assert srv.engine.telemetry.active_responses._value.get() == 1
            await stream.final_response()
        assert srv.engine.telemetry.active_responses._value.get() == 0
    finally:
        await srv.stop()
