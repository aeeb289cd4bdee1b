"""The console's server view: one JSON snapshot of the metrics the engine already keeps
(`tether.observability.metrics.Metrics`), for admin keys only; the page polls it and derives rates (turns/s,
per-stage latency over the last interval) from two snapshots.

Counters are cumulative, as Prometheus exposes them, so the snapshot is a plain read of the
registry and a page that misses a poll loses nothing. Cache hit ratio and mean stage times are
also given cumulatively, for a page that has seen only one snapshot.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any


def snapshot(registry: Any, *, now: float | None = None) -> dict[str, Any]:
    """Read `registry` (a prometheus_client CollectorRegistry holding tether_* metrics)."""
    connections: dict[str, float] = {}
    turns: dict[str, float] = defaultdict(float)
    errors: dict[str, float] = {}
    stage_sum: dict[str, float] = {}
    stage_count: dict[str, float] = {}
    scalars: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "tether_connections":
                connections[labels.get("transport", "")] = value
            elif name == "tether_turns_total":
                turns[labels.get("outcome", "")] += value
            elif name == "tether_errors_total":
                errors[labels.get("code", "")] = value
            elif name == "tether_stage_seconds_sum":
                stage_sum[labels["stage"]] = value
            elif name == "tether_stage_seconds_count":
                stage_count[labels["stage"]] = value
            elif name in (
                "tether_active_responses",
                "tether_cache_hits_total",
                "tether_cache_misses_total",
                "process_resident_memory_bytes",
                "process_cpu_seconds_total",
            ):
                scalars[name] = value
    hits = scalars.get("tether_cache_hits_total", 0.0)
    misses = scalars.get("tether_cache_misses_total", 0.0)
    stages = {
        stage: {
            "count": stage_count.get(stage, 0.0),
            "sum_s": total,
            "mean_ms": 1000 * total / stage_count[stage] if stage_count.get(stage) else None,
        }
        for stage, total in sorted(stage_sum.items())
    }
    return {
        "time": time.time() if now is None else now,
        "connections": connections,
        "active_responses": scalars.get("tether_active_responses", 0.0),
        "turns": dict(turns),
        "turns_total": sum(turns.values()),
        "cache": {"hits": hits, "misses": misses, "hit_ratio": hits / (hits + misses) if hits + misses else None},
        "errors": errors,
        "stages": stages,
        "process": {
            "resident_bytes": scalars.get("process_resident_memory_bytes"),
            "cpu_s": scalars.get("process_cpu_seconds_total"),
        },
    }
