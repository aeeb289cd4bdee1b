"""Prometheus metrics for one engine (a private registry, so several engines can coexist in one
process, e.g. in tests). The session core calls these small methods; nothing else knows metric
names. Exposed at `/metrics` on the bridge (`metrics_port = 0`) or on the standalone metrics
server (`server.metrics_port`); see `tether.observability.metrics_http` and docs/operating.md.

Stage names in `tether_stage_seconds{stage}` are the StageClock's (`tether.core.timing`):
resolve, validate, classify, render, route, backend (model time: TTFT + streaming),
backend_ttft, backend_wait (time blocked on the upstream), finalize, plus two derived here:
`stream` (backend - backend_ttft: generation after the first token) and `post_inference` (the
store/ledger write, off the critical path).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from tether.core.timing import StageClock
from tether.memory import allocator_in_use

_STAGE_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_TURN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, fds
        PlatformCollector(registry=r)  # python_info
        self.connections = Gauge("tether_connections", "Open sessions", ["transport"], registry=r)
        self.connections_total = Counter("tether_connections_opened", "Sessions opened", ["transport"], registry=r)
        self.active_responses = Gauge(
            "tether_active_responses", "Turns in progress (validating, generating or finishing)", registry=r
        )
        self.turns = Counter("tether_turns", "Finished responses", ["transport", "outcome"], registry=r)
        self.turn_seconds = Histogram(
            "tether_turn_seconds", "Wall time of a turn, create to terminal event", ["transport"],
            buckets=_TURN_BUCKETS, registry=r,
        )
        self.cache_hits = Counter("tether_cache_hits", "previous_response_id found in the connection cache", registry=r)
        self.cache_misses = Counter("tether_cache_misses", "previous_response_id not in the connection cache", registry=r)
        self.cache_evictions = Counter("tether_cache_evictions", "Cached response states evicted", ["reason"], registry=r)
        self.hydrations = Counter("tether_hydrations", "Responses loaded from the store", ["result"], registry=r)
        self.stage_seconds = Histogram(
            "tether_stage_seconds", "Time per pipeline stage", ["stage"], buckets=_STAGE_BUCKETS, registry=r
        )
        self.overhead_seconds = Histogram(
            "tether_turn_overhead_seconds", "Per-turn server time not spent waiting on the backend",
            ["transport"], buckets=_STAGE_BUCKETS, registry=r,
        )
        self.tokens = Counter("tether_tokens", "Tokens", ["kind"], registry=r)
        self.usage_sources = Counter(
            "tether_usage_source", "Turns by where each usage figure came from (upstream or tether)",
            ["kind", "source"], registry=r,
        )
        self.errors = Counter("tether_errors", "Errors by code", ["code"], registry=r)
        self.backend_retries = Counter("tether_backend_retries", "Upstream retries", ["backend"], registry=r)
        self.compactions = Counter("tether_compactions", "Automatic compactions", registry=r)
        self.safety_findings = Counter("tether_safety_findings", "Safety classifier findings", ["kind"], registry=r)
        self.memory_reclaims = Counter(
            "tether_memory_reclaims", "Runs of gc + malloc_trim after connections closed", registry=r
        )
        self.memory_reclaimed_bytes = Counter(
            "tether_memory_reclaimed_bytes", "Resident memory given back to the OS by those runs", registry=r
        )
        self.memory_reclaim_seconds = Counter("tether_memory_reclaim_seconds", "Time spent in those runs", registry=r)
        self.allocator = Gauge("tether_allocator_info", "The memory allocator in use (value 1)", ["allocator"], registry=r)
        self.allocator.labels(allocator_in_use()).set(1)
        # Pre-create the label sets every scrape should show, so dashboards see zeros, not gaps.
        for kind in ("input", "cached", "output", "reasoning"):
            self.tokens.labels(kind)
        for result in ("found", "missing"):
            self.hydrations.labels(result)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- hooks called by the core -----------------------------------------------------------------

    def session_opened(self, transport: str) -> None:
        self.connections.labels(transport).inc()
        self.connections_total.labels(transport).inc()

    def session_closed(self, transport: str) -> None:
        self.connections.labels(transport).dec()

    def memory_reclaimed(self, seconds: float, released_bytes: int) -> None:
        self.memory_reclaims.inc()
        self.memory_reclaimed_bytes.inc(released_bytes)
        self.memory_reclaim_seconds.inc(seconds)

    def turn_started(self) -> None:
        self.active_responses.inc()

    def turn_ended(self) -> None:
        self.active_responses.dec()

    @contextmanager
    def active_turn(self) -> Iterator[None]:
        """Counts a turn in `tether_active_responses` while the block runs (however it ends)."""
        self.active_responses.inc()
        try:
            yield
        finally:
            self.active_responses.dec()

    def turn_finished(self, transport: str, outcome: str, clock: StageClock, usage, sources=None) -> None:
        self.turns.labels(transport, outcome).inc()
        stages = clock.stages
        observe = self.stage_seconds.labels
        for stage, seconds in stages.items():
            observe(stage).observe(seconds)
        if "backend" in stages and "backend_ttft" in stages:
            observe("stream").observe(max(0.0, stages["backend"] - stages["backend_ttft"]))
        self.overhead_seconds.labels(transport).observe(clock.overhead())
        self.turn_seconds.labels(transport).observe(clock.elapsed())
        self.tokens.labels("input").inc(usage.input_tokens)
        self.tokens.labels("cached").inc(usage.cached_tokens)
        self.tokens.labels("output").inc(usage.output_tokens)
        self.tokens.labels("reasoning").inc(usage.reasoning_tokens)
        for kind, source in (sources or {}).items():
            self.usage_sources.labels(kind, source).inc()

    def post_inference(self, seconds: float) -> None:
        self.stage_seconds.labels("post_inference").observe(seconds)

    def cache_lookup(self, *, hit: bool) -> None:
        (self.cache_hits if hit else self.cache_misses).inc()

    def cache_eviction(self, reason: str) -> None:
        self.cache_evictions.labels(reason).inc()

    def hydration(self, found: bool) -> None:
        self.hydrations.labels("found" if found else "missing").inc()

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def compaction(self) -> None:
        self.compactions.inc()

    def retry_hook(self, backend: str):
        """A zero-argument callback counting one upstream retry of `backend`."""
        counter = self.backend_retries.labels(backend)
        return lambda *_: counter.inc()

    def safety_finding(self, kind: str) -> None:
        self.safety_findings.labels(kind).inc()
