"""Backend pools: one configured backend served by several replicas of the same model.

A backend whose config has a `pool` table is built as a `BackendPool`: one adapter instance per
replica (the backend's options, with each replica's own overrides), behind one name, so model
routing (`[models]`) is unchanged. For each model call the pool asks its `Balancer`
(`tether.backends.balancer`, the policies and health rules) for candidates, streams from the first,
and fails over to the next when a replica fails before its first chunk (connection refused, 5xx,
429, timeout); once a chunk has arrived, errors go to the client as before. The `Finish` chunk
carries the serving replica's name; the turn records it with the response (connection cache and
store), which is how `chain-affine` routing finds a parent's replica after a reconnect or on
another Tether replica.

    [backends.llama]
    kind = "openai"
    max_retries = 0                      # let the pool fail over instead of retrying one replica
    [backends.llama.pool]
    replicas = ["http://10.0.0.1:8080/v1", "http://10.0.0.2:8080/v1"]  # base_url each, or tables
    policy = "chain-affine"              # round-robin | least-loaded | chain-affine | prefix-aware
    health_path = "/health"              # active probe, resolved against each base_url
    cache_hint = "id_slot"               # llama.cpp slot pinning; or "prompt_cache_key"

`replicas` is a count (that many copies of the backend's options: simulated replicas), or a list
whose entries are a base URL (string) or a table of option overrides (with an optional `name`).
A replica's name is its `name`, else its base URL with any credentials in it masked
(`redact_url`: userinfo, `?token=` and other secret query values), else `<backend>/<index>`. The
name is what metric labels, logs and stored responses carry, so a secret never gets there.

Health: passive (consecutive failures before the first byte eject a replica for `eject_s`, after
which it is on probation) and, with `health_path`, active (a GET every `health_interval_s`; a
failure ejects, a success readmits). Metrics: per-replica in-flight calls, calls by outcome,
routability, and prompt / cached tokens (`tether.observability.metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from tether.backends.balancer import (
    Balancer,
    BalancerSettings,
    Block,
    Policy,
    ReplicaState,
    conversation_key,
    prefix_chain,
)
from tether.backends.base import Backend, BackendError, BackendRequest, Chunk, Finish, chunks_of
from tether.backends.registry import build_backend, parse_dataclass
from tether.logging_setup import redact_url

log = logging.getLogger("tether.pool")

CACHE_HINTS = ("", "prompt_cache_key", "id_slot")


@dataclass(frozen=True, kw_only=True)
class PoolConfig(BalancerSettings):
    """The `pool` table: the balancer's settings (policy, ejection, balance thresholds) and these."""

    replicas: Any  # int, or a list of base URLs / option tables
    failover_attempts: int = 1  # further replicas tried when one fails before its first chunk
    health_path: str = ""  # "" = passive health only
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    cache_hint: str = ""  # "" | "prompt_cache_key" | "id_slot"
    slots_per_replica: int = 1  # with cache_hint = "id_slot": the upstream's --parallel


@dataclass(frozen=True)
class Replica:
    name: str
    backend: Backend
    base_url: str | None


def replica_options(name: str, options: Mapping[str, Any], replicas: Any) -> list[tuple[str, dict[str, Any]]]:
    """(replica name, adapter options) per replica, from the pool's `replicas` value."""
    label = f"backend {name!r}: pool.replicas"
    if isinstance(replicas, int) and not isinstance(replicas, bool):
        if replicas < 1:
            raise ValueError(f"{label} must be at least 1, got {replicas}")
        return [(f"{name}/{i}", dict(options)) for i in range(replicas)]
    if not isinstance(replicas, list) or not replicas:
        raise ValueError(f"{label} must be a count or a non-empty list of base URLs / option tables")
    out = []
    for i, entry in enumerate(replicas):
        if isinstance(entry, str):
            out.append((redact_url(entry), {**options, "base_url": entry}))
        elif isinstance(entry, Mapping):
            entry = dict(entry)
            url = entry.get("base_url")
            rname = entry.pop("name", None) or (redact_url(url) if url else f"{name}/{i}")
            out.append((str(rname), {**options, **entry}))
        else:
            raise ValueError(f"{label}[{i}] must be a base URL or a table, got {entry!r}")
    return out


def build_configured_backend(name: str, kind: str, options: Mapping[str, Any], pool: Mapping[str, Any] | None) -> Backend:
    """A backend from its config: one adapter, or (with a `pool` table) a pool of them."""
    if pool is None:
        return build_backend(name, kind, options)
    config = parse_dataclass(PoolConfig, pool, f"backend {name!r}: pool")
    members = [
        Replica(rname, build_backend(name, kind, opts), opts.get("base_url"))
        for rname, opts in replica_options(name, options, config.replicas)
    ]
    return BackendPool(name, members, config)


def _failover_worthy(exc: BackendError) -> bool:
    """Failures that say "this replica, not this request": 5xx, 429, timeouts, unreachable."""
    return exc.retryable or exc.status >= 500 or exc.status == 429


class BackendPool:
    """Several replicas of one backend behind one name (the `Backend` protocol)."""

    def __init__(self, name: str, replicas: list[Replica], config: PoolConfig) -> None:
        if config.policy not in {p.value for p in Policy}:
            raise ValueError(
                f"backend {name!r}: pool.policy must be one of {', '.join(p.value for p in Policy)}, got {config.policy!r}"
            )
        if config.cache_hint not in CACHE_HINTS:
            raise ValueError(f"backend {name!r}: pool.cache_hint must be one of {CACHE_HINTS}, got {config.cache_hint!r}")
        if config.failover_attempts < 0 or config.eject_after_failures < 1 or config.slots_per_replica < 1:
            raise ValueError(
                f"backend {name!r}: pool.failover_attempts must be >= 0, eject_after_failures and slots_per_replica >= 1"
            )
        if config.health_path and not all(r.base_url for r in replicas):
            raise ValueError(f"backend {name!r}: pool.health_path needs a base_url on every replica")
        self.name = name
        self.kind = replicas[0].backend.kind
        self.config = config
        self.replicas = replicas
        self.balancer = Balancer([r.name for r in replicas], config)
        self.metrics: Any = None  # tether.observability.metrics.Metrics, bound by the engine
        self._health_task: asyncio.Task | None = None
        self._http: httpx.AsyncClient | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    def bind_metrics(self, metrics: Any) -> None:
        self.metrics = metrics
        for state in self.balancer.replicas:
            metrics.replica_declared(self.name, state.name)

    async def start(self) -> None:
        """Start the active health checks (when `health_path` is set)."""
        if self.config.health_path and self._health_task is None:
            self._http = httpx.AsyncClient(timeout=self.config.health_timeout_s)
            self._health_task = asyncio.create_task(self._health_loop(), name=f"tether-health-{self.name}")

    async def aclose(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self._http is not None:
            await self._http.aclose()
        for replica in self.replicas:
            await replica.backend.aclose()

    async def check_health(self) -> None:
        """One round of active probes (the health loop calls it every `health_interval_s`)."""
        assert self._http is not None
        states = self.balancer.replicas
        results = await asyncio.gather(*(self._probe(r) for r in self.replicas), return_exceptions=True)
        now = time.monotonic()
        for state, ok in zip(states, results, strict=True):
            self.balancer.probed(state, ok is True, now)
            self._report_health(state, now)

    async def _probe(self, replica: Replica) -> bool:
        assert self._http is not None and replica.base_url
        url = httpx.URL(replica.base_url.rstrip("/") + "/").join(self.config.health_path)
        try:
            response = await self._http.get(url)
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 300

    async def _health_loop(self) -> None:
        while True:
            try:
                await self.check_health()
            except Exception:  # noqa: BLE001 - a probe round must never end the loop
                log.exception("health check of pool %s failed", self.name)
            await asyncio.sleep(self.config.health_interval_s)

    # -- the Backend contract ---------------------------------------------------------------------

    async def prepare(self, request: BackendRequest) -> None:
        """Checked (and its upstream body built) by one replica: they all run the same model and
        server, so what one refuses every one would."""
        await self.replicas[0].backend.prepare(request)

    def reads_input_tokens(self, request: BackendRequest) -> bool:
        """As its replicas do (they all run the same server)."""
        return any(r.backend.reads_input_tokens(request) for r in self.replicas)

    async def discover(self) -> Sequence[str]:
        """Every model id any replica lists (a replica that cannot say lists nothing)."""
        listed = await asyncio.gather(*(r.backend.discover() for r in self.replicas))
        return list(dict.fromkeys(m for models in listed for m in models))

    def owned_by(self, model: str) -> str:
        return self.replicas[0].backend.owned_by(model)

    def catch_all_models(self) -> Sequence[str]:
        return self.replicas[0].backend.catch_all_models()

    # -- serving ----------------------------------------------------------------------------------

    def _chain(self, request: BackendRequest) -> list[Block]:
        needs = self.config.cache_hint or (
            self.balancer.policy is Policy.PREFIX_AWARE and not request.prompt_cache_key
        )
        if not needs:
            return []
        return prefix_chain(request.instructions, request.tools, request.items, scope=request.tenant)

    def _hints(self, chain: list[Block], request: BackendRequest) -> dict[str, object]:
        """The cache hint for the upstream, from the tenant's own keys: the client's
        `prompt_cache_key` scoped to the tenant, else the conversation key of the tenant's chain."""
        hint = self.config.cache_hint
        if not hint:
            return {}
        key = request.scoped_cache_key(request.prompt_cache_key) if request.prompt_cache_key else conversation_key(chain)
        if hint == "prompt_cache_key":
            return {"prompt_cache_key": key}
        return {"id_slot": int(key[:8] or "0", 16) % self.config.slots_per_replica}

    def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        return chunks_of(self.stream_runs(request))

    async def stream_runs(self, request: BackendRequest) -> AsyncGenerator[list[Chunk], None]:
        chain = self._chain(request)
        now = time.monotonic()
        cache_key = request.scoped_cache_key(request.prompt_cache_key) if request.prompt_cache_key else None
        order = self.balancer.order(now, affinity=request.affinity, chain=chain, cache_key=cache_key)
        candidates = order[: 1 + self.config.failover_attempts]
        fields = self._hints(chain, request)
        failure: BackendError | None = None
        for state in candidates:
            replica = self.replicas[state.index]
            upstream = request
            if fields or state.index != 0:  # hints, or another replica than `prepare` asked: it builds its own body
                upstream = replace(request, upstream_fields={**request.upstream_fields, **fields}, prepared=None)
            self.balancer.started(state, chain, affinity=request.affinity)
            if self.metrics is not None:
                self.metrics.replica_started(self.name, state.name)
            stream = replica.backend.stream_runs(upstream)
            outcome = "cancelled"  # until the replica answers or fails
            try:
                try:
                    first = await anext(stream)
                except BackendError as exc:
                    if not _failover_worthy(exc):
                        outcome = "error"
                        raise
                    outcome = "failover"
                    failure = exc
                    self.balancer.failed(state, time.monotonic())
                    self._report_health(state, time.monotonic())
                    log.warning("replica %s of %s failed before its first chunk: %s", state.name, self.name, exc.message)
                    continue
                self.balancer.succeeded(state)
                self._report_health(state, time.monotonic())
                outcome = "ok"  # served; an error after this point goes to the client, not elsewhere
                try:
                    yield self._tagged(first, state)
                    async for run in stream:
                        yield self._tagged(run, state)
                except BackendError:
                    outcome = "error"
                    raise
                return
            finally:
                await stream.aclose()
                self.balancer.ended(state)
                if self.metrics is not None:
                    self.metrics.replica_ended(self.name, state.name, outcome)
        assert failure is not None
        raise failure

    def _tagged(self, run: list[Chunk], state: ReplicaState) -> list[Chunk]:
        """The run with its `Finish` (the stream's last chunk) naming the replica."""
        last = run[-1] if run else None
        if isinstance(last, Finish):
            if last.usage is not None and self.metrics is not None:
                self.metrics.replica_usage(self.name, state.name, last.usage)
            return [*run[:-1], replace(last, replica=state.name)]
        return run

    def _report_health(self, state: ReplicaState, now: float) -> None:
        if self.metrics is not None:
            self.metrics.replica_health(self.name, state.name, up=state.routable(now))
