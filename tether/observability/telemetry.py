"""`Observability`: the core's `Telemetry` port (`tether.core.telemetry`) as Prometheus metrics
(`Metrics`) plus the OpenTelemetry turn spans (`tracing`, a no-op unless tracing is on)."""

from __future__ import annotations

from tether.observability import tracing
from tether.observability.metrics import Metrics


class Observability(Metrics):
    turn_span = staticmethod(tracing.turn_span)
    turn_refused = staticmethod(tracing.annotate_error)
    response_finished = staticmethod(tracing.annotate_response)
