"""Prometheus metrics for one engine (a private registry, so several engines can coexist in one
process, e.g. in tests). It implements the metric half of the core's `Telemetry` port
(`tether.core.telemetry`, through `tether.observability.telemetry.Observability`); nothing else knows
metric names. Exposed at `/metrics` on the bridge (`metrics_port = 0`) or on the standalone metrics
server (`server.metrics_port`); see `tether.observability.metrics_http` and docs/operating.md.

Stage names in `tether_stage_seconds{stage}` are the turn's stage timers':
resolve, validate, classify, render, route, backend (model time: TTFT + streaming),
backend_ttft, backend_wait (time blocked on the upstream), mcp (remote MCP servers), finalize, plus two
derived here:
`stream` (backend - backend_ttft: generation after the first token) and `post_inference` (the
store/ledger write, off the critical path).

`BridgeMetrics` is the registry of a bridge in a process of its own (`tether bridge --upstream`):
the errors it answers and the process, nothing of an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from tether.errors import CLIENT_GONE
from tether.eventloop import running_loop
from tether.process_memory import allocator_in_use

_STAGE_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_TURN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def _errors_counter(registry: CollectorRegistry) -> Counter:
    return Counter("tether_errors", "Errors by code", ["code"], registry=registry)


def _event_loop_info(registry: CollectorRegistry) -> None:
    """`tether_event_loop_info{event_loop}`: the loop this process serves on (`server.event_loop`).
    A registry is built by the composition root inside that loop, so it is read from the loop."""
    gauge = Gauge(
        "tether_event_loop_info", "The event loop in use (value 1)", ["event_loop"], registry=registry
    )
    gauge.labels(running_loop()).set(1)


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
        self.errors = _errors_counter(r)
        self.backend_retries = Counter("tether_backend_retries", "Upstream retries", ["backend"], registry=r)
        self.post_failures = Counter(
            "tether_post_inference_failures",
            "Failed store/ledger write attempts: retried (transient), repaired (a referenced item was deleted "
            "meanwhile; written again self-contained), fenced (refused: another replica had ended the response), "
            "permanent (the response is not stored)",
            ["reason"], registry=r,
        )  # fmt: skip
        self.compactions = Counter(
            "tether_compactions", "Compactions (in a turn or POST /v1/responses/compact)", registry=r
        )
        self.compaction_tokens = Counter(
            "tether_compaction_tokens", "Tokens of compactions' model calls (also in tether_tokens)", ["kind"],
            registry=r,
        )
        self.safety_findings = Counter("tether_safety_findings", "Safety classifier findings", ["kind"], registry=r)
        self.memory_reclaims = Counter(
            "tether_memory_reclaims", "Runs of gc + malloc_trim after connections closed", registry=r
        )
        self.memory_reclaimed_bytes = Counter(
            "tether_memory_reclaimed_bytes", "Resident memory given back to the OS by those runs", registry=r
        )
        self.memory_reclaim_seconds = Counter("tether_memory_reclaim_seconds", "Time spent in those runs", registry=r)
        # Backend pools (tether/backends/pool.py): one label set per (backend, replica).
        self.replica_in_flight = Gauge(
            "tether_replica_in_flight", "Model calls in flight on a pool replica", ["backend", "replica"], registry=r
        )
        self.replica_calls = Counter(
            "tether_replica_calls",
            "Model calls per pool replica by outcome: ok, failover (failed before its first chunk), error, cancelled",
            ["backend", "replica", "outcome"], registry=r,
        )
        self.replica_up = Gauge(
            "tether_replica_up", "1 while a pool replica is routable, 0 while ejected", ["backend", "replica"], registry=r
        )
        self.replica_tokens = Counter(
            "tether_replica_prompt_tokens", "Prompt tokens sent to a pool replica, by kind (prompt, cached)",
            ["backend", "replica", "kind"], registry=r,
        )
        # The event loop's lateness (tether/observability/loop_lag.py): what one request's CPU
        # work on the loop costs every other connection.
        self.loop_lag = Histogram(
            "tether_event_loop_lag_seconds", "How late the loop-lag probe woke up (the loop was blocked)",
            buckets=_LAG_BUCKETS, registry=r,
        )
        self.loop_lag_max = Gauge(
            "tether_event_loop_lag_max_seconds", "The longest loop lag since the previous scrape", registry=r
        )
        # Remote MCP servers (tether/mcp, docs/mcp.md); `server` is the create's server_label.
        self.mcp_calls = Counter("tether_mcp_calls", "MCP tool calls by server label and outcome",
                                 ["server", "outcome"], registry=r)  # fmt: skip
        self.mcp_call_seconds = Histogram("tether_mcp_call_seconds", "Latency of MCP tool calls", ["server"],
                                          buckets=_STAGE_BUCKETS, registry=r)  # fmt: skip
        self.mcp_listings = Counter("tether_mcp_listings", "MCP tool listings by server label and outcome",
                                    ["server", "outcome"], registry=r)  # fmt: skip
        self.mcp_sessions_open = Gauge("tether_mcp_sessions_open", "MCP sessions open (kept per connection)",
                                       registry=r)  # fmt: skip
        self.mcp_approvals = Counter("tether_mcp_approvals", "MCP approvals: requested, approved, denied",
                                     ["event"], registry=r)  # fmt: skip
        for event in ("requested", "approved", "denied"):
            self.mcp_approvals.labels(event)
        self.runs = Counter(
            "tether_runs", "Response runs by event: background (created), resumed (stream retrieves), "
            "cancelled (cancels of runs in flight), detached (a client went away, its stored response ran on), orphaned (a run whose replica stopped, failed), "
            "taken_over (a queued background run of a replica that stopped, run here), fenced (a run of this "
            "replica that another one had ended or taken over: its writes refused, stopped here)",
            ["event"], registry=r,
        )
        self.background_runs = Gauge("tether_background_runs", "Background responses now, by state (queued, running)",
                                     ["state"], registry=r)  # fmt: skip
        self.loop_busy_max = Gauge(
            "tether_event_loop_busy_max_seconds",
            "The most CPU time the loop used between two probe wake-ups, since the previous scrape", registry=r,
        )
        self.allocator = Gauge("tether_allocator_info", "The memory allocator in use (value 1)", ["allocator"], registry=r)
        self.allocator.labels(allocator_in_use()).set(1)
        _event_loop_info(r)
        # Pre-create the label sets every scrape should show, so dashboards see zeros, not gaps.
        for kind in ("input", "cached", "output", "reasoning"):
            self.tokens.labels(kind)
        for kind in ("input", "output"):
            self.compaction_tokens.labels(kind)
        for result in ("found", "missing"):
            self.hydrations.labels(result)
        for reason in ("retried", "repaired", "permanent"):
            self.post_failures.labels(reason)
        for event in ("background", "resumed", "cancelled", "detached", "orphaned", "taken_over"):
            self.runs.labels(event)
        for state in ("queued", "running"):
            self.background_runs.labels(state)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def watch_background(self, counts: Callable[[], tuple[int, int]]) -> None:
        """Read `tether_background_runs` at each scrape from `counts()`: (queued, running)."""
        self.background_runs.labels("queued").set_function(lambda: counts()[0])
        self.background_runs.labels("running").set_function(lambda: counts()[1])

    def run_event(self, kind: str) -> None:
        self.runs.labels(kind).inc()

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

    def watch_loop(self, probe: Any) -> Callable[[float, float], None]:
        """Report a loop-lag probe (tether/observability/loop_lag.py): its peaks since the last
        read are what each scrape shows; the returned callback takes every measurement."""
        self.loop_lag_max.set_function(probe.peak)
        self.loop_busy_max.set_function(probe.busy_peak)
        return lambda lag, busy: self.loop_lag.observe(lag)

    @contextmanager
    def active_turn(self) -> Iterator[None]:
        """Counts a turn in `tether_active_responses` while the block runs (however it ends)."""
        self.active_responses.inc()
        try:
            yield
        finally:
            self.active_responses.dec()

    def turn_finished(self, transport: str, outcome: str, stages: Mapping[str, float], overhead_s: float,
                      elapsed_s: float, usage, sources=None) -> None:  # fmt: skip
        self.turns.labels(transport, outcome).inc()
        observe = self.stage_seconds.labels
        for stage, seconds in stages.items():
            observe(stage).observe(seconds)
        if "backend" in stages and "backend_ttft" in stages:
            observe("stream").observe(max(0.0, stages["backend"] - stages["backend_ttft"]))
        self.overhead_seconds.labels(transport).observe(overhead_s)
        self.turn_seconds.labels(transport).observe(elapsed_s)
        self.tokens.labels("input").inc(usage.input_tokens)
        self.tokens.labels("cached").inc(usage.cached_tokens)
        self.tokens.labels("output").inc(usage.output_tokens)
        self.tokens.labels("reasoning").inc(usage.reasoning_tokens)
        for kind, source in (sources or {}).items():
            self.usage_sources.labels(kind, source).inc()

    def turn_abandoned(self, transport: str) -> None:
        """A turn cut short because its client went away (see errors.CLIENT_GONE)."""
        self.turns.labels(transport, CLIENT_GONE).inc()
        self.errors.labels(CLIENT_GONE).inc()

    def post_inference(self, seconds: float) -> None:
        self.stage_seconds.labels("post_inference").observe(seconds)

    def post_inference_failure(self, reason: str) -> None:
        self.post_failures.labels(reason).inc()

    def cache_lookup(self, *, hit: bool) -> None:
        (self.cache_hits if hit else self.cache_misses).inc()

    def cache_eviction(self, reason: str) -> None:
        self.cache_evictions.labels(reason).inc()

    def hydration(self, found: bool) -> None:
        self.hydrations.labels("found" if found else "missing").inc()

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def compaction(self, input_tokens: int, output_tokens: int) -> None:
        self.compactions.inc()
        self.tokens.labels("input").inc(input_tokens)
        self.tokens.labels("output").inc(output_tokens)
        self.compaction_tokens.labels("input").inc(input_tokens)
        self.compaction_tokens.labels("output").inc(output_tokens)

    def retry_hook(self, backend: str):
        """A zero-argument callback counting one upstream retry of `backend`."""
        counter = self.backend_retries.labels(backend)
        return lambda *_: counter.inc()

    def replica_declared(self, backend: str, replica: str) -> None:
        """A pool replica exists: its label sets show zeros (and `up` 1) before any call."""
        self.replica_in_flight.labels(backend, replica)
        for outcome in ("ok", "failover", "error", "cancelled"):
            self.replica_calls.labels(backend, replica, outcome)
        for kind in ("prompt", "cached"):
            self.replica_tokens.labels(backend, replica, kind)
        self.replica_up.labels(backend, replica).set(1)

    def replica_started(self, backend: str, replica: str) -> None:
        self.replica_in_flight.labels(backend, replica).inc()

    def replica_ended(self, backend: str, replica: str, outcome: str) -> None:
        self.replica_in_flight.labels(backend, replica).dec()
        self.replica_calls.labels(backend, replica, outcome).inc()

    def replica_health(self, backend: str, replica: str, *, up: bool) -> None:
        self.replica_up.labels(backend, replica).set(1 if up else 0)

    def replica_usage(self, backend: str, replica: str, usage) -> None:
        self.replica_tokens.labels(backend, replica, "prompt").inc(usage.input_tokens or 0)
        self.replica_tokens.labels(backend, replica, "cached").inc(usage.cached_tokens or 0)

    def safety_finding(self, kind: str) -> None:
        self.safety_findings.labels(kind).inc()

    def mcp_call(self, server_label: str, outcome: str, seconds: float) -> None:
        self.mcp_calls.labels(server_label, outcome).inc()
        self.mcp_call_seconds.labels(server_label).observe(seconds)

    def mcp_listing(self, server_label: str, outcome: str, seconds: float) -> None:
        self.mcp_listings.labels(server_label, outcome).inc()

    def mcp_sessions(self, delta: int) -> None:
        self.mcp_sessions_open.inc(delta)

    def mcp_approval(self, event: str) -> None:
        self.mcp_approvals.labels(event).inc()


class BridgeMetrics:
    """The metrics of a bridge in a process of its own (`tether bridge --upstream`), which has no
    engine: the errors the bridge answers itself (`tether_errors_total{code}`; the upstream's core
    counts its in-band errors in its own registry), its event loop and the process. Served at the
    bridge's `/metrics`."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.errors = _errors_counter(r)
        _event_loop_info(r)

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()
