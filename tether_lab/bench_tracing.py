"""What turn tracing costs: µs per turn with tracing off and on.

    python -m tether_lab.bench_tracing [--turns 2000]

Two measurements:

1. hooks: the per-turn hook calls alone (`turn_span` enter/exit around a turn with a realistic
   StageClock, `annotate_response`), off vs on (OpenTelemetry SDK, BatchSpanProcessor with an
   exporter that drops spans, so export I/O is not counted);
2. turns: whole turns through an in-process Engine (instant simulated backend, memory store,
   20-turn chains on one session), alternating off and on rounds; the median paired
   difference is the end-to-end cost, the absolute figure is the server's own per-turn time.

Until the transport and turn hooks are wired into the core (docs/operating.md), `ensure_hooks()`
wraps `Session._lane_loop`'s call to `Turn.run` the same way the hook will (the tests use it too).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from typing import Any

from tether import eventloop
from tether.observability import tracing


def ensure_hooks() -> list[str]:
    """Install the tracing hooks the core does not call yet; returns what was installed."""
    from tether.core import session as session_mod
    from tether.core import turn as turn_mod
    from tether.service import grpc_server

    installed = []
    if "turn_span" not in inspect.getsource(session_mod) + inspect.getsource(turn_mod):
        turn_cls = turn_mod.Turn
        if not getattr(turn_cls.run, "_tether_traced", False):
            original_run, original_finish = turn_cls.run, turn_cls._finish

            async def run(self: Any) -> None:
                with tracing.turn_span(self):
                    await original_run(self)

            async def _finish(self: Any, prepared: Any, *args: Any, **kwargs: Any) -> None:
                tracing.annotate_response(prepared.response)  # fields final except status/usage
                await original_finish(self, prepared, *args, **kwargs)
                tracing.annotate_response(prepared.response)

            run._tether_traced = True  # type: ignore[attr-defined]
            turn_cls.run, turn_cls._finish = run, _finish  # type: ignore[method-assign]
            installed.append("turn")
    if "adopt_parent" not in inspect.getsource(grpc_server):
        servicer = grpc_server.ResponsesServicer
        if not getattr(servicer.Session, "_tether_traced", False):
            original_session = servicer.Session

            async def Session(self: Any, request_iterator: Any, context: Any):  # noqa: N802 - gRPC method name
                tracing.adopt_parent(context.invocation_metadata())
                inner = original_session(self, request_iterator, context)
                try:
                    async for response in inner:
                        yield response
                finally:
                    await inner.aclose()

            Session._tether_traced = True  # type: ignore[attr-defined]
            servicer.Session = Session  # type: ignore[method-assign]
            installed.append("grpc")
    return installed


def _sdk_provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65536))
    return provider


def bench_hooks(turns: int) -> dict[str, float]:
    from tether.core.telemetry import TurnFacts
    from tether.core.timing import StageClock
    from tether.responses.v1 import response_pb2

    response = response_pb2.Response(id="resp_1", status="completed")
    response.usage.input_tokens, response.usage.output_tokens = 1200, 80

    def facts() -> TurnFacts:
        clock = StageClock()
        clock.stages.update({
            "validate": 2e-5, "resolve": 1e-6, "classify": 1e-5, "render": 3e-5, "route": 1e-6,
            "backend": 0.2, "backend_ttft": 0.05, "backend_wait": 0.19, "finalize": 4e-5,
        })
        f = TurnFacts("grpc", "sess_1", "", "tether-sim", True, "resp_0", clock)
        f.response_id = "resp_1"
        return f

    fakes = [facts() for _ in range(turns)]

    def run() -> float:
        t0 = time.perf_counter()
        for turn in fakes:
            with tracing.turn_span(turn):
                tracing.annotate_response(response)
        return (time.perf_counter() - t0) / turns * 1e6

    out = {}
    tracing.configure(False)
    run()
    out["off"] = min(run() for _ in range(5))
    provider = _sdk_provider()
    tracing.configure(True, tracer_provider=provider)
    run()
    out["on"] = min(run() for _ in range(5))
    tracing.configure(False)
    provider.shutdown()
    return out


async def _turns_per_round(turns: int, chain: int = 20) -> float:
    """µs per turn over `turns` creates on one in-process session, in chains of `chain` turns
    (a rollout: each continues the previous with previous_response_id)."""
    from tether.config import BackendSpec, TetherConfig
    from tether.responses.v1 import service_pb2
    from tether.server import build_engine

    config = TetherConfig()
    config.store = "memory://"
    config.backends = {"sim": BackendSpec(options={"ttft_ms": 0, "tokens_per_s": 0, "output_tokens": 20})}
    config.limits.coalesce_ms = 0
    engine = await build_engine(config)
    try:
        session = await engine.open_session("", transport="grpc")
        events = session.events()
        previous = ""
        t0 = time.perf_counter()
        for i in range(turns):
            request = service_pb2.SessionRequest()
            request.create.model = "tether-sim"
            request.create.input_text = f"turn {i}"
            request.create.store = False
            request.create.previous_response_id = previous if i % chain else ""
            await session.send(request)
            done = False
            while not done:
                for ev in await anext(events):
                    if ev.HasField("completed"):
                        previous, done = ev.completed.response.id, True
        elapsed = time.perf_counter() - t0
        await session.close()
        return elapsed / turns * 1e6
    finally:
        await engine.aclose()


def bench_turns(turns: int, rounds: int = 5) -> dict[str, float]:
    """Rounds alternate off / on / on without stage spans (so drift hits all three); medians,
    and the median paired differences against the neighbouring off round."""
    ensure_hooks()
    provider = _sdk_provider()
    runs: dict[str, list[float]] = {"off": [], "on": [], "on_turn_only": []}
    eventloop.run(_turns_per_round(min(turns, 200)))  # warm-up
    for _ in range(rounds):
        for label, enabled, stage_spans in (("off", False, True), ("on", True, True), ("on_turn_only", True, False)):
            tracing.configure(enabled, tracer_provider=provider if enabled else None, stage_spans=stage_spans)
            runs[label].append(eventloop.run(_turns_per_round(turns)))
    tracing.configure(False)
    provider.shutdown()
    out = {label: statistics.median(values) for label, values in runs.items()}
    for label in ("on", "on_turn_only"):
        out[f"{label}_delta"] = statistics.median(b - a for a, b in zip(runs["off"], runs[label], strict=True))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tether_lab.bench_tracing")
    parser.add_argument("--turns", type=int, default=1000)
    args = parser.parse_args(argv)
    hooks = bench_hooks(args.turns * 10)
    print(f"hooks only:  off {hooks['off']:.3f} µs/turn   on {hooks['on']:.1f} µs/turn (turn span + 9 stage spans)")
    turns = bench_turns(args.turns)
    print(
        f"whole turns (in-process engine, instant backend): off {turns['off']:.0f} µs/turn; "
        f"on {turns['on']:.0f} (+{turns['on_delta']:.0f}); "
        f"on, stages as attributes {turns['on_turn_only']:.0f} (+{turns['on_turn_only_delta']:.0f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
