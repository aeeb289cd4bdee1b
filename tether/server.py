"""The composition root: the one place that builds a server from its configuration.

`build_engine` opens the store, builds the backends (with model discovery, retry hooks and pool
health checks) and the engine over them, with the telemetry and the kind of turn the sessions
run. `start` adds the transports: the gRPC server, readiness, the metrics listener, the
in-process bridge (by default) and the memory reclaimer; `Running.stop` stops them in order on
SIGTERM/SIGINT: stop accepting, let in-flight turns finish within the grace period, close
WebSockets with 1001 and gRPC streams with UNAVAILABLE, flush post-inference work, exit 0.
`serve_remote_forever` is `tether bridge --upstream`: the bridge alone, in front of a remote
Tether over `RemoteResponsesAPI`. `stop_signal` is the one wait for SIGTERM/SIGINT of both;
both freeze their startup heap once they listen (`freeze_startup_heap`)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tether import __version__, eventloop, render
from tether.auth import Authenticator
from tether.backends.pool import build_configured_backend
from tether.backends.simulated import LAB_MODEL_PREFIX
from tether.config import STOP_EXTRA_S, TetherConfig
from tether.core.clock import SYSTEM_CLOCK, Clock
from tether.core.engine import Engine
from tether.core.stages.route import Listed
from tether.core.turn import STANDARD_TURNS, TurnStrategy
from tether.observability.health import ReadinessChecker
from tether.observability.loop_lag import LoopLagProbe
from tether.observability.metrics import BridgeMetrics
from tether.observability.metrics_http import MetricsServer, start_metrics_server
from tether.observability.telemetry import Observability
from tether.process_memory import MemoryReclaimer
from tether.service.grpc_server import GrpcServer, start_grpc_server
from tether.startup import StartupError, check_tls, open_configured_store
from tether.store.factory import run_bus_for

if TYPE_CHECKING:
    from tether.bridge.listener import BridgeServer
    from tether.service.remote import RemoteResponsesAPI

log = logging.getLogger("tether.server")


async def build_engine(config: TetherConfig, *, strategy: TurnStrategy = STANDARD_TURNS,
                       clock: Clock = SYSTEM_CLOCK) -> Engine:  # fmt: skip
    """The engine of `config`: its store opened, its backends built, started and discovered.
    `clock`: the time the sessions and turns read (a test sets its own)."""
    telemetry = Observability()
    try:  # a backend's kind or options wrong: one line naming it (ValueError says which)
        backends = {
            name: build_configured_backend(name, spec.kind, dict(spec.options), spec.pool)
            for name, spec in config.backends.items()
        }
    except ValueError as exc:
        raise StartupError(f"configuration: [backends] {exc}") from None
    if config.mcp.enabled:  # its import would otherwise stall the loop on the first MCP create
        from tether.mcp.client import preload

        preload()
    store = await open_configured_store(config.store)
    limits = config.limits
    bus = run_bus_for(store, orphan_after_s=limits.run_orphan_after_s, max_events=limits.replay_max_events,
                      max_bytes=limits.replay_max_bytes, retention_s=limits.replay_retention_s,
                      live_ttl_s=2 * limits.max_turn_s + limits.replay_retention_s)  # fmt: skip
    engine = Engine(config, store, backends, telemetry=telemetry, strategy=strategy, clock=clock, bus=bus)
    await engine.start()
    telemetry.watch_background(engine.runs.background_counts)
    render.encode("warm up the tokenizer")  # load the vocabulary now, not on the first turn
    for name, backend in backends.items():
        added = engine.router.add_discovered(name, list(await backend.discover()))
        if added:
            log.info("backend %s lists %d model(s), routed to it", name, added)
    for backend in backends.values():
        if hasattr(backend, "on_retry"):
            backend.on_retry = telemetry.retry_hook(backend.name)
        if hasattr(backend, "bind_metrics"):  # a pool: per-replica metrics and health checks
            backend.bind_metrics(telemetry)
            await backend.start()  # type: ignore[attr-defined]  # not in `Backend`: a pool's health checks (it has bind_metrics)
    return engine


@dataclass
class Running:
    engine: Engine
    grpc: GrpcServer | None
    bridge: BridgeServer | None
    readiness: ReadinessChecker | None = None
    metrics: MetricsServer | None = None
    reclaimer: MemoryReclaimer | None = None
    loop_lag: LoopLagProbe | None = None

    @property
    def grpc_port(self) -> int:
        assert self.grpc is not None
        return self.grpc.port

    @property
    def bridge_port(self) -> int | None:
        return getattr(self.bridge, "port", None)

    async def stop(self, grace: float) -> None:
        if self.reclaimer is not None:
            await self.reclaimer.stop()
        if self.loop_lag is not None:
            await self.loop_lag.stop()
        if self.readiness is not None:
            await self.readiness.stop()
        if self.grpc is not None:
            await self.grpc.health.enter_graceful_shutdown()
        await self.engine.shutdown(grace)  # sessions end: WS close 1001, gRPC UNAVAILABLE
        if self.bridge is not None:
            await self.bridge.stop(grace)
        if self.grpc is not None:
            await self.grpc.stop(grace)
        await self.engine.aclose()
        if self.metrics is not None:
            await self.metrics.stop()


def make_authenticator(config: TetherConfig) -> Authenticator:
    """The configured API keys (`server.api_keys_file`, TETHER_API_KEYS); open when there are none."""
    return Authenticator.from_sources(file=config.server.api_keys_file)


async def start(config: TetherConfig, *, authenticator: Authenticator | None = None,
                strategy: TurnStrategy = STANDARD_TURNS) -> Running:  # fmt: skip
    """The whole server of `config` (the bridge when `server.bridge`), listening. `authenticator`
    defaults to the configured API keys.

    A failure to start (`tether.startup.StartupError`: a port in use, a TLS file that does not
    load, a store that cannot be opened) stops whatever had started before it is raised, so
    the caller can report it in one line and nothing is left running."""
    check_tls(config.server)  # before the store is opened or anything listens
    engine = await build_engine(config, strategy=strategy)
    telemetry = engine.telemetry
    assert isinstance(telemetry, Observability)  # build_engine's: the metrics the bridge and probes report to
    running = Running(engine, None, None)  # filled in below
    try:
        auth = authenticator if authenticator is not None else make_authenticator(config)
        running.grpc = await start_grpc_server(engine, config, auth, count_error=engine.telemetry.error)
        running.readiness = ReadinessChecker(engine, running.grpc.health).start()
        if config.server.metrics_port:
            from tether.bridge.origin import OriginPolicy

            running.metrics = await start_metrics_server(
                engine, host=config.server.bridge_host, port=config.server.metrics_port, readiness=running.readiness,
                guard=OriginPolicy.from_config(config.server).check,  # DNS rebinding reads no metrics either
            )
        if config.server.bridge:
            from tether.bridge.listener import start_bridge

            running.bridge = await start_bridge(engine, auth, config, metrics=telemetry)
    except BaseException:
        await running.stop(0)
        raise
    # Said once everything listens, so that a failed start prints its reason alone.
    if auth.open:
        log.warning("no API keys configured: the server is OPEN, every caller is the same tenant")
    for name, backend in engine.backends.items():
        sharing = getattr(backend, "tenants_sharing_cache", None)  # upstreams whose prompt cache is per key
        shared = sharing(auth.tenants()) if sharing is not None else []
        if shared:
            log.warning(
                "backend %r: tenants %s share one upstream key, and the upstream's prompt cache is shared by "
                "every call made with a key: one tenant can time another's cached prefixes (give each tenant "
                "a key of its own: tenant_api_key_envs, isolate_tenants; docs/cerebras.md)",
                name, ", ".join(shared),
            )  # fmt: skip
    catch_all = engine.router.catch_all
    if catch_all is not None:
        log.warning(
            "model names not routed elsewhere are answered by backend %r (%s) through the '*' route",
            catch_all,
            config.backends[catch_all].kind,
        )
    running.reclaimer = MemoryReclaimer(
        lambda: (len(engine.sessions), engine.sessions_closed),
        config.server.memory_reclaim_interval_s,
        telemetry.memory_reclaimed,
        lambda: engine.services.coalesce.streaming,  # turns reading a backend now
    ).start()
    probe = LoopLagProbe(config.server.loop_lag_interval_s)
    probe.on_lag = telemetry.watch_loop(probe)
    running.loop_lag = probe.start()
    return running


def banner(config: TetherConfig, running: Running) -> list[str]:
    """What `tether serve` prints on stdout once it listens: where to point each kind of client
    (the bridge's URLs with their real scheme, https:// and wss:// when TLS is on) and which model
    names route to which backend (`Router.listing`, as GET /v1/models lists them). The lab reads
    the HTTP and gRPC lines (tether_lab/processes.py); the last line ends it."""
    rows: list[tuple[str, str, str]] = []
    base_url = getattr(running.bridge, "base_url", None)
    if base_url:
        root = base_url.removesuffix("/v1")
        ws = "wss" + base_url.removeprefix("https") if base_url.startswith("https") else "ws" + base_url.removeprefix("http")
        rows.append(("HTTP", base_url, "base URL for the openai SDK, Codex, curl"))
        rows.append(("WebSocket", f"{ws}/responses", "WebSocket mode: client.responses.connect()"))
    target = f"{config.server.grpc_host}:{running.grpc_port}"
    rows.append(("gRPC", target, f'tether.client.connect("{target}")'))
    if base_url and config.server.console:
        rows.append(("console", f"{root}/console", "open it in a browser"))
    lines = [f"Tether {__version__} is serving. Point a client at:"]
    width = max(len(url) for _, url, _ in rows)
    lines += [f"  {name:<10} {url:<{width}}   {use}" for name, url, use in rows]
    lines.append("Model names (GET /v1/models lists them):")
    routes = model_routes(config, running.engine.router.listing(), running.engine.router.catch_all)
    width = max((len(names) for names, _ in routes), default=0)
    lines += [f"  {names:<{width}} -> {where}" for names, where in routes]
    if not routes:
        lines.append("  none: configure [models] or a backend that lists its models")
    lines.append("Ctrl-C (or SIGTERM) stops it gracefully.")
    return lines


def model_routes(config: TetherConfig, listing: list[Listed], catch_all: str | None) -> list[tuple[str, str]]:
    """(names, backend) rows for the banner: configured names one by one, each backend's
    discovered names together (a long list shortened), the lab's workload models on one row, and
    "any other name" for the "*" route."""

    def where(backend: str) -> str:
        return f"backend {backend} ({config.backends[backend].kind})"

    rows: list[tuple[str, str]] = []
    groups: dict[tuple[str, str], list[str]] = {}
    for entry in listing:
        if entry.source == "config":
            rows.append((entry.model, where(entry.backend)))
        else:
            groups.setdefault((entry.source, entry.backend), []).append(entry.model)
    for (source, backend), names in groups.items():
        lab = [n.removeprefix(LAB_MODEL_PREFIX) for n in names if n.startswith(LAB_MODEL_PREFIX)]
        plain = [n for n in names if not n.startswith(LAB_MODEL_PREFIX)]
        if plain:
            shown = ", ".join(plain[:4]) + (f" and {len(plain) - 4} more" if len(plain) > 4 else "")
            rows.append((shown, where(backend) + (", listed by the server" if source == "discovered" else "")))
        if lab:
            rows.append((f"{LAB_MODEL_PREFIX}<workload>: {', '.join(lab)}", where(backend) + ", lab rollouts"))
    if catch_all is not None:
        rows.append(("any other name", where(catch_all) + ', the "*" route'))
    return rows


def stop_signal() -> asyncio.Event:
    """An event set by the first SIGTERM or SIGINT from now on. Taken before the server says it
    is up, so that a signal sent as soon as the banner or the supervisor's line appears drains
    the server instead of killing it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def freeze_startup_heap(young_threshold: int = 0) -> int:
    """Move every object alive now out of the garbage collector's generations (`gc.freeze`), once
    the server is built and listening: the tokenizer's rank tables (loaded by `build_engine`), the
    compiled codecs and protobuf descriptors, the configuration, the modules. A full (gen-2)
    collection then no longer walks them, so its pauses of the event loop are shorter: one took
    19 ms during a 100-stream run before. Collected first, so that startup garbage is
    freed, not frozen for good. Then the youngest generation's threshold becomes
    `young_threshold` (`server.gc_young_threshold`; 0: Python's own). Returns how many objects
    are frozen (the "tether serving" log line's `frozen_objects`).

    Only in a served process (`serve_forever`, `serve_remote_forever`), never in `start`: tests
    start many servers inside one process, where each freeze would also make every earlier test's
    garbage cycles permanent."""
    gc.collect()
    gc.freeze()
    if young_threshold:
        gc.set_threshold(young_threshold, *gc.get_threshold()[1:])
    return gc.get_freeze_count()


async def serve_forever(config: TetherConfig, *, strategy: TurnStrategy = STANDARD_TURNS,
                        announce: bool = True) -> None:  # fmt: skip
    """Serve `config` until SIGTERM/SIGINT; `announce`: print the `banner` once listening (one
    worker of several announces for all)."""
    stopping = stop_signal()
    running = await start(config, strategy=strategy)
    frozen = freeze_startup_heap(config.server.gc_young_threshold)
    log.info(
        "tether serving",
        extra={
            "grpc": f"{config.server.grpc_host}:{running.grpc_port}",
            "bridge_port": running.bridge_port,
            "event_loop": eventloop.running_loop(),
            "frozen_objects": frozen,
            "gc_threshold": list(gc.get_threshold()),
        },
    )
    if announce:
        print("\n".join(banner(config, running)), flush=True)  # one write: the lab reads it whole
    await stopping.wait()
    await stop_within_deadline(running, config.server.shutdown_grace_s)


async def stop_within_deadline(running: Running, grace: float) -> None:
    """`running.stop(grace)`, bounded: past `grace` + `STOP_EXTRA_S` the stop is abandoned, what
    was still running is logged, and the process exits with status 1 (a supervisor restarting
    replicas one by one must not wait on a stuck one)."""
    log.info("shutting down", extra={"grace_s": grace})
    stopping = asyncio.create_task(running.stop(grace), name="tether-stop")
    done, _ = await asyncio.wait({stopping}, timeout=grace + STOP_EXTRA_S)
    if done:
        stopping.result()  # its error, if it raised
        return
    stuck = sorted(t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task())
    log.error("shutdown passed its deadline (%g s): exiting with what is still running", grace + STOP_EXTRA_S,
              extra={"tasks": stuck[:50]})  # fmt: skip
    stopping.cancel()
    raise SystemExit(1)


@dataclass
class RemoteBridge:
    """`tether bridge --upstream`: the bridge alone, in front of a remote Tether."""

    bridge: BridgeServer
    api: RemoteResponsesAPI
    reclaimer: MemoryReclaimer

    async def stop(self, grace: float) -> None:
        await self.bridge.stop(grace)
        await self.reclaimer.stop()
        await self.api.aclose()


async def start_remote_bridge(config: TetherConfig, *, upstream: str, api_key: str | None = None,
                              tls_ca: str | None = None, authenticator: Authenticator | None = None,
                              merge_tenants: bool = False) -> RemoteBridge:  # fmt: skip
    """The bridge in front of the Tether gRPC server at `upstream`, listening.

    With `api_key`, the bridge authenticates callers itself (`server.api_keys_file` /
    TETHER_API_KEYS, or `authenticator`) and calls upstream as that one key. Without it, each
    caller's own key is forwarded and the upstream authenticates and scopes it
    (`ForwardingAuthenticator`).

    With `api_key`, every local caller is one tenant upstream: each can read, continue and delete
    the others' stored responses and conversations. So local keys naming more than one tenant are
    refused (ValueError) unless `merge_tenants` says that is meant (`--merge-local-tenants`).
    """
    from tether.bridge.listener import start_bridge
    from tether.service.remote import ForwardingAuthenticator, RemoteResponsesAPI

    if authenticator is None:
        if api_key:
            authenticator = Authenticator.from_sources(file=config.server.api_keys_file)
            if authenticator.open:
                log.warning(
                    "no API keys configured for the bridge: it is OPEN, and every caller uses the upstream key"
                )
        else:
            authenticator = ForwardingAuthenticator()
    if api_key and check_merged_tenants(authenticator, merge_tenants) > 1:
        log.warning(
            "--merge-local-tenants: the local tenants share ONE upstream tenant; each can read, continue "
            "and delete the others' stored responses and conversations"
        )
    api = RemoteResponsesAPI(upstream, api_key=api_key, tls_ca=tls_ca)
    try:
        bridge = await start_bridge(api, authenticator, config, metrics=BridgeMetrics())
    except BaseException:
        await api.aclose()
        raise
    app = bridge.app
    reclaimer = MemoryReclaimer(
        lambda: (len(app.connections), app.connections_closed), config.server.memory_reclaim_interval_s
    ).start()
    return RemoteBridge(bridge, api, reclaimer)


def check_merged_tenants(authenticator: Authenticator, merge_tenants: bool) -> int:
    """A bridge calling upstream as one key merges its local tenants into one: more than one local
    tenant is refused (ValueError) unless `merge_tenants`. Returns the number of local tenants."""
    tenants = len(authenticator.tenants())
    if tenants > 1 and not merge_tenants:
        raise ValueError(
            f"--upstream-api-key with {tenants} local tenants would make them one tenant upstream: "
            "each could read, continue and delete the others' stored responses and conversations. "
            "Forward the callers' own keys instead (leave --upstream-api-key out), or pass "
            "--merge-local-tenants if every local key may see every other's data"
        )
    return tenants


async def serve_remote_forever(
    config: TetherConfig, *, upstream: str, api_key: str | None = None, tls_ca: str | None = None,
    merge_tenants: bool = False,
) -> None:
    """Serve the bridge in front of the Tether gRPC server at `upstream` until SIGTERM/SIGINT."""
    stopping = stop_signal()
    remote = await start_remote_bridge(
        config, upstream=upstream, api_key=api_key, tls_ca=tls_ca, merge_tenants=merge_tenants
    )
    freeze_startup_heap(config.server.gc_young_threshold)
    try:
        print(f"tether bridge: HTTP/WebSocket on {remote.bridge.base_url} -> gRPC {upstream}", flush=True)
        await stopping.wait()
        log.info("bridge shutting down", extra={"grace_s": config.server.shutdown_grace_s})
    finally:
        await remote.stop(config.server.shutdown_grace_s)
