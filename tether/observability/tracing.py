"""OpenTelemetry tracing of turns: one `tether.turn` span per create, one child span per stage.

Off by default, and then every hook is a global check and a shared no-op object (well under a
microsecond per turn: `python -m tether_lab.bench_tracing`). OpenTelemetry is
imported only when tracing is switched on, so it is an optional dependency
(`opentelemetry-api`, plus `opentelemetry-sdk` and an exporter to send spans anywhere).

Switching on: `configure()` (uses the process's global TracerProvider, e.g. one set up by
`opentelemetry-instrument` or the embedding program), `configure(tracer_provider=...)`, or
`configure_from_env()`, which reads TETHER_TRACING: unset/`0`/`off` = off; `1`/`on` = the global
provider; `console` = the SDK printing spans to stderr; `otlp` = the SDK with the OTLP exporter
(`opentelemetry-exporter-otlp`; endpoint from the standard OTEL_EXPORTER_OTLP_* variables).

Hooks (called by the transports, and by the core through its telemetry port: `turn_span`,
`annotate_error` and `annotate_response` are `Observability`'s `turn_span`, `turn_refused` and
`response_finished`; see docs/operating.md for the exact lines):

- `adopt_parent(carrier)`: a transport hands over the caller's trace context: gRPC invocation
  metadata or HTTP/WebSocket headers with W3C `traceparent` / `tracestate`. It is kept in a
  context variable, so every turn started from that task, and from the session's lane tasks it
  creates, becomes a child of the caller's span.
- `with turn_span(facts):` around `Turn.run` (`facts`: the turn's `TurnFacts`, the only thing
  of the turn it reads): starts the turn span (the current span while the
  turn runs, so instrumented HTTP clients of the backends nest under it) and, when the turn
  ends, records its stages as child spans *after the fact* from the StageClock durations,
  laid out back to back in pipeline order (validate, resolve, classify, render, route, backend
  with backend_ttft and stream children, finalize). Durations are exact; start offsets are
  approximate where a stage ran in pieces (validate runs before and after resolve).
- `annotate_response(response)`: as a turn finishes, puts the outcome, usage and ids on the span;
  `annotate_error(code)`: a create refused with an in-band error before `response.created`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any, Literal

from tether.extras import require

TRACER_NAME = "tether"
TURN_SPAN = "tether.turn"
STAGE_ORDER = ("validate", "resolve", "classify", "render", "route", "backend", "mcp", "finalize")


class _State:
    """What tracing needs once on: the tracer and the OpenTelemetry modules (imported lazily)."""

    def __init__(self, tracer_provider: Any = None, stage_spans: bool = True) -> None:
        require("opentelemetry.trace", "tracing")
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.trace = trace
        self.context = context
        self.propagate = propagate
        self.kind = SpanKind.SERVER
        self.internal = SpanKind.INTERNAL
        self.Status, self.StatusCode = Status, StatusCode
        provider = tracer_provider or trace.get_tracer_provider()
        from tether import __version__

        self.tracer = provider.get_tracer(TRACER_NAME, __version__)
        self.stage_spans = stage_spans


_state: _State | None = None
_PARENT: ContextVar[Any] = ContextVar("tether_trace_parent", default=None)


def enabled() -> bool:
    return _state is not None


def configure(enabled: bool = True, *, tracer_provider: Any = None, stage_spans: bool = True) -> None:
    """Switch turn tracing on (with `tracer_provider`, else the global one) or off.

    A span costs ~15 µs in the Python SDK, so a turn with its stage spans costs ~0.2 ms;
    `stage_spans=False` records the stage durations as `tether.stage.<name>_ms` attributes of
    the turn span instead (one span per turn)."""
    global _state
    _state = _State(tracer_provider, stage_spans) if enabled else None


def configure_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Configure from TETHER_TRACING (see the module notes; TETHER_TRACING_STAGE_SPANS=0 records
    stages as attributes instead of child spans); True when tracing is on."""
    env = os.environ if env is None else env
    value = env.get("TETHER_TRACING", "").strip().lower()
    stage_spans = env.get("TETHER_TRACING_STAGE_SPANS", "1").strip().lower() not in ("0", "off", "false", "no")
    if value in ("", "0", "off", "false", "no"):
        configure(False)
        return False
    if value in ("1", "on", "true", "yes"):
        configure(True, stage_spans=stage_spans)
        return True
    require("opentelemetry.sdk.trace", "tracing")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "tether"}))
    if value == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif value == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[no-redef, unused-ignore]  # the other exporter's class of the same name; unused where neither is installed (both Any)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        raise ValueError(f"TETHER_TRACING: expected off, on, console or otlp, got {value!r}")
    configure(True, tracer_provider=provider, stage_spans=stage_spans)
    return True


# -- transport hook -------------------------------------------------------------------------------


def _carrier_dict(carrier: Any) -> dict[str, str]:
    items: Iterable[Any] = carrier.items() if isinstance(carrier, Mapping) else (carrier or ())
    out: dict[str, str] = {}
    for pair in items:
        key, value = pair[0], pair[1]
        if isinstance(key, bytes):
            key = key.decode("latin-1")
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        out[key.lower()] = value
    return out


def adopt_parent(carrier: Any) -> None:
    """Make the caller's trace context (W3C `traceparent`/`tracestate` in gRPC metadata pairs, a
    header mapping or ASGI `(bytes, bytes)` header pairs) the parent of the turns started from
    the current task and the tasks it creates. No-op when tracing is off."""
    st = _state
    if st is None:
        return
    _PARENT.set(st.propagate.extract(_carrier_dict(carrier)))


def inject(metadata: Any = ()) -> list[tuple[str, str]]:
    """`metadata` plus the current trace context as W3C headers (for an outgoing gRPC call, e.g.
    `RemoteResponsesAPI` forwarding a bridge request's trace to the engine). Unchanged when off."""
    out = list(metadata)
    st = _state
    if st is not None:
        carrier: dict[str, str] = {}
        st.propagate.inject(carrier, context=_PARENT.get())
        out.extend(carrier.items())
    return out


# -- turn hooks -----------------------------------------------------------------------------------


class _NoopTurn:
    __slots__ = ()

    def __enter__(self) -> _NoopTurn:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


NOOP = _NoopTurn()


class _LiveTurn:
    __slots__ = ("_st", "_facts", "_span", "_token", "_start_ns")

    def __init__(self, st: _State, facts: Any) -> None:
        self._st = st
        self._facts = facts

    def __enter__(self) -> _LiveTurn:
        st, facts = self._st, self._facts
        self._start_ns = time.time_ns() - int(facts.clock.elapsed() * 1e9)
        attrs = {
            "tether.transport": facts.transport,
            "tether.session.id": facts.session_id,
            "tether.model": facts.model,
            "tether.stream_id": facts.stream_id,
            "tether.store": facts.store,
        }
        if facts.previous_response_id:
            attrs["tether.previous_response_id"] = facts.previous_response_id
        self._span = st.tracer.start_span(
            TURN_SPAN, context=_PARENT.get(), kind=st.kind, attributes=attrs, start_time=self._start_ns
        )
        self._token = st.context.attach(st.trace.set_span_in_context(self._span))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        st, span, facts = self._st, self._span, self._facts
        st.context.detach(self._token)
        if facts.response_id:
            span.set_attribute("tether.response.id", facts.response_id)
        if exc is not None:
            span.record_exception(exc)
            span.set_status(st.Status(st.StatusCode.ERROR, type(exc).__name__))
        elif not facts.response_id:  # refused before `created` (an in-band error answered it)
            span.set_status(st.Status(st.StatusCode.ERROR, "refused"))
        record_stages(span, facts.clock.stages, self._start_ns)
        span.end()
        return False


def turn_span(facts: Any) -> Any:
    """`with turn_span(facts):` around a turn (`facts`: its `tether.core.telemetry.TurnFacts`:
    transport, session id, stream id, model, store, previous_response_id, the stage clock, the
    response id once known); a shared no-op when tracing is off."""
    st = _state
    if st is None:
        return NOOP
    return _LiveTurn(st, facts)


def annotate_response(response: Any) -> None:
    """Put the finished Response's outcome and usage on the current turn span."""
    st = _state
    if st is None:
        return
    span = st.trace.get_current_span()
    if not span.is_recording():
        return
    u = response.usage
    span.set_attributes({
        "tether.response.id": response.id,
        "tether.response.status": response.status,
        "tether.usage.input_tokens": u.input_tokens,
        "tether.usage.cached_tokens": u.cached_tokens,
        "tether.usage.output_tokens": u.output_tokens,
    })
    if response.status == "failed":
        span.set_status(st.Status(st.StatusCode.ERROR, response.error.code))


def annotate_error(code: str) -> None:
    """Mark the current turn span as answered with an in-band `error` (a refused create)."""
    st = _state
    if st is None:
        return
    span = st.trace.get_current_span()
    if span.is_recording():
        span.set_attribute("tether.error.code", code)
        span.set_status(st.Status(st.StatusCode.ERROR, code))


def record_stages(span: Any, stages: Mapping[str, float], start_ns: int) -> None:
    """Child spans of `span` for the StageClock durations (`stages`: name -> seconds), laid out
    back to back from `start_ns` in pipeline order, each ended with an explicit end time. The
    backend span gets `backend_ttft` and `stream` children; `backend_wait` (time blocked on
    the upstream) becomes an attribute."""
    st = _state
    if st is None or not stages:
        return
    if not st.stage_spans:
        span.set_attributes({f"tether.stage.{name}_ms": seconds * 1000 for name, seconds in stages.items()})
        return
    tracer, parent = st.tracer, st.trace.set_span_in_context(span)
    t = start_ns
    for name in STAGE_ORDER:
        seconds = stages.get(name)
        if seconds is None:
            continue
        end = t + int(seconds * 1e9)
        attrs: dict[str, Any] = {"tether.stage": name, "tether.stage.seconds": seconds}
        if name == "backend" and "backend_wait" in stages:
            attrs["tether.backend.wait_seconds"] = stages["backend_wait"]
        child = tracer.start_span(f"tether.stage.{name}", context=parent, kind=st.internal, attributes=attrs, start_time=t)
        if name == "backend" and "backend_ttft" in stages:
            inner = st.trace.set_span_in_context(child)
            ttft_end = min(end, t + int(stages["backend_ttft"] * 1e9))
            for sub, s0, s1 in (("backend_ttft", t, ttft_end), ("stream", ttft_end, end)):
                tracer.start_span(
                    f"tether.stage.{sub}", context=inner, kind=st.internal,
                    attributes={"tether.stage": sub, "tether.stage.seconds": (s1 - s0) / 1e9}, start_time=s0,
                ).end(end_time=s1)
        child.end(end_time=end)
        t = end
