"""Turn tracing with the OpenTelemetry SDK's InMemorySpanExporter: a turn span per create, parented
by the caller's `traceparent` from gRPC metadata, with one child span per stage."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

import tether.client as tc  # noqa: E402
from tether.observability import tracing  # noqa: E402
from tether_lab.bench_tracing import ensure_hooks  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
STAGE_SPANS = {"validate", "resolve", "classify", "render", "route", "backend", "finalize"}


@pytest.fixture
def exporter():
    ensure_hooks()  # the hook lines the core will carry (a no-op once it does)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(True, tracer_provider=provider)
    yield exporter
    tracing.configure(False)
    provider.shutdown()


def _children(spans, parent):
    return {s.name.removeprefix("tether.stage."): s for s in spans if s.parent and s.parent.span_id == parent.context.span_id}


async def test_turn_spans_follow_grpc_traceparent_with_stage_children(exporter, server):
    async with tc.connect(server.target, metadata=(("traceparent", TRACEPARENT),)) as s:
        first = await (await s.create("tether-sim", "hello")).final_response()
        second = await (await s.create("tether-sim", "more", previous_response_id=first.id)).final_response()
    spans = exporter.get_finished_spans()
    turns = [sp for sp in spans if sp.name == tracing.TURN_SPAN]
    assert [t.attributes["tether.response.id"] for t in turns] == [first.id, second.id]
    for turn, response in zip(turns, (first, second), strict=True):
        assert format(turn.context.trace_id, "032x") == TRACE_ID
        assert format(turn.parent.span_id, "016x") == PARENT_ID and turn.parent.is_remote
        a = turn.attributes
        assert (a["tether.transport"], a["tether.model"], a["tether.response.status"]) == ("grpc", "tether-sim", "completed")
        assert a["tether.usage.input_tokens"] == response.usage.input_tokens
        assert a["tether.usage.cached_tokens"] == response.usage.cached_tokens
        stages = _children(spans, turn)
        assert set(stages) == STAGE_SPANS
        for name, stage in stages.items():
            assert stage.context.trace_id == turn.context.trace_id
            assert turn.start_time <= stage.start_time <= stage.end_time <= turn.end_time, name
            assert stage.end_time - stage.start_time == int(stage.attributes["tether.stage.seconds"] * 1e9)
        backend = _children(spans, stages["backend"])
        assert set(backend) == {"backend_ttft", "stream"}
        assert backend["backend_ttft"].end_time == backend["stream"].start_time
        assert "tether.backend.wait_seconds" in stages["backend"].attributes
    assert turns[1].attributes["tether.previous_response_id"] == first.id


async def test_refused_create_marks_the_turn_span(exporter, server):
    async with tc.connect(server.target) as s:  # no traceparent: the turn is a root span
        refused = await s.create("tether-sim", "x", previous_response_id="resp_missing")
        with pytest.raises(tc.TetherError):
            await refused.final_response()
    [turn] = [sp for sp in exporter.get_finished_spans() if sp.name == tracing.TURN_SPAN]
    assert turn.parent is None
    assert turn.status.status_code == StatusCode.ERROR
    assert "tether.response.id" not in turn.attributes


async def test_stage_attributes_instead_of_spans(exporter, server):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(True, tracer_provider=provider, stage_spans=False)
    async with tc.connect(server.target) as s:
        await (await s.create("tether-sim", "hello")).final_response()
    [turn] = exporter.get_finished_spans()
    assert turn.attributes["tether.stage.backend_ms"] > 0 and "tether.stage.render_ms" in turn.attributes


async def test_off_records_nothing(server):
    ensure_hooks()
    tracing.configure(False)
    assert tracing.turn_span(object()) is tracing.NOOP
    tracing.adopt_parent((("traceparent", TRACEPARENT),))
    async with tc.connect(server.target) as s:
        assert (await (await s.create("tether-sim", "hi")).final_response()).status == "completed"


def test_configure_from_env():
    try:
        assert tracing.configure_from_env({}) is False and not tracing.enabled()
        assert tracing.configure_from_env({"TETHER_TRACING": "console"}) is True and tracing.enabled()
        with pytest.raises(ValueError):
            tracing.configure_from_env({"TETHER_TRACING": "zipkin"})
    finally:
        tracing.configure(False)
