"""The composition root: the one place that builds a server from its configuration.

`build_engine` opens the store, builds the backends (with model discovery, retry hooks and pool
health checks) and the engine over them, with the telemetry and the kind of turn the sessions
run. `start` adds the transports: the gRPC server, readiness, the metrics listener, the
in-process bridge (by default) and the memory reclaimer; `Running.stop` stops them in order on
SIGTERM/SIGINT: stop accepting, let in-flight turns finish within the grace period, close
WebSockets with 1001 and gRPC streams with UNAVAILABLE, flush post-inference work, exit 0.
`serve_remote_forever` is `tether bridge --upstream`: the bridge alone, in front of a remote
Tether over `RemoteResponsesAPI`. `wait_for_signal` is the one wait for SIGTERM/SIGINT of both;
both freeze their startup heap once they listen (`freeze_startup_heap`)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tether import eventloop, render
from tether.auth import Authenticator
from tether.backends.pool import build_configured_backend
from tether.config import TetherConfig
from tether.core.clock import SYSTEM_CLOCK, Clock
from tether.core.engine import Engine
from tether.core.turn import STANDARD_TURNS, TurnStrategy
from tether.observability.health import ReadinessChecker
from tether.observability.loop_lag import LoopLagProbe
from tether.observability.metrics import BridgeMetrics
from tether.observability.metrics_http import MetricsServer, start_metrics_server
from tether.observability.telemetry import Observability
from tether.process_memory import MemoryReclaimer
from tether.service.grpc_server import GrpcServer, start_grpc_server
from tether.store.factory import open_store

if TYPE_CHECKING:
    from tether.bridge.listener import BridgeServer
    from tether.service.remote import RemoteResponsesAPI

log = logging.getLogger("tether.server")


async def build_engine(config: TetherConfig, *, strategy: TurnStrategy = STANDARD_TURNS,
                       clock: Clock = SYSTEM_CLOCK) -> Engine:  # fmt: skip
    """The engine of `config`: its store opened, its backends built, started and discovered.
    `clock`: the time the sessions and turns read (a test sets its own)."""
    telemetry = Observability()
    store = await open_store(config.store)
    backends = {
        name: build_configured_backend(name, spec.kind, dict(spec.options), spec.pool)
        for name, spec in config.backends.items()
    }
    engine = Engine(config, store, backends, telemetry=telemetry, strategy=strategy, clock=clock)
    render.encode("warm up the tokenizer")  # load the vocabulary now, not on the first turn
    for name, backend in backends.items():
        added = engine.router.add_discovered(name, list(await backend.discover()))
        if added:
            log.info("backend %s lists %d model(s), routed to it", name, added)
    catch_all = engine.router.catch_all
    if catch_all is not None:
        log.warning(
            "model names not routed elsewhere are answered by backend %r (%s) through the '*' route",
            catch_all,
            config.backends[catch_all].kind,
        )
    for backend in backends.values():
        if hasattr(backend, "on_retry"):
            backend.on_retry = telemetry.retry_hook(backend.name)
        if hasattr(backend, "bind_metrics"):  # a pool: per-replica metrics and health checks
            backend.bind_metrics(telemetry)
            await backend.start()
    return engine


@dataclass
class Running:
    engine: Engine
    grpc: GrpcServer
    bridge: object | None  # tether.bridge.listener.BridgeServer
    readiness: ReadinessChecker | None = None
    metrics: MetricsServer | None = None
    reclaimer: MemoryReclaimer | None = None
    loop_lag: LoopLagProbe | None = None

    @property
    def grpc_port(self) -> int:
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
        await self.grpc.health.enter_graceful_shutdown()
        await self.engine.shutdown(grace)  # sessions end: WS close 1001, gRPC UNAVAILABLE
        if self.bridge is not None:
            await self.bridge.stop(grace)
        await self.grpc.stop(grace)
        await self.engine.aclose()
        if self.metrics is not None:
            await self.metrics.stop()


def make_authenticator(config: TetherConfig) -> Authenticator:
    auth = Authenticator.from_sources(file=config.server.api_keys_file)
    if auth.open:
        log.warning("no API keys configured: the server is OPEN, every caller is the same tenant")
    return auth


async def start(config: TetherConfig, *, authenticator: Authenticator | None = None,
                strategy: TurnStrategy = STANDARD_TURNS) -> Running:  # fmt: skip
    """The whole server of `config` (the bridge when `server.bridge`), listening. `authenticator`
    defaults to the configured API keys."""
    engine = await build_engine(config, strategy=strategy)
    try:
        auth = authenticator if authenticator is not None else make_authenticator(config)
        grpc_server = await start_grpc_server(engine, config, auth, count_error=engine.telemetry.error)
    except BaseException:
        await engine.aclose()
        raise
    readiness = ReadinessChecker(engine, grpc_server.health).start()
    metrics = None
    if config.server.metrics_port:
        metrics = await start_metrics_server(
            engine, host=config.server.bridge_host, port=config.server.metrics_port, readiness=readiness
        )
    bridge = None
    if config.server.bridge:
        from tether.bridge.listener import start_bridge

        bridge = await start_bridge(engine, auth, config, metrics=engine.telemetry)
    reclaimer = MemoryReclaimer(
        lambda: (len(engine.sessions), engine.sessions_closed),
        config.server.memory_reclaim_interval_s,
        engine.telemetry.memory_reclaimed,
    ).start()
    probe = LoopLagProbe(config.server.loop_lag_interval_s)
    probe.on_lag = engine.telemetry.watch_loop(probe)
    return Running(engine, grpc_server, bridge, readiness, metrics, reclaimer, probe.start())


def startup_lines(config: TetherConfig, running: Running) -> list[str]:
    """What `tether serve` prints once it listens (the lab parses the first line): the bridge's
    URL with its real scheme (https:// when TLS is on), and the console's."""
    bridge = running.bridge
    base_url = getattr(bridge, "base_url", None)
    lines = [f"tether: gRPC on {config.server.grpc_host}:{running.grpc_port}"
             + (f", HTTP/WebSocket on {base_url}" if base_url else "")]  # fmt: skip
    if base_url and config.server.console:
        lines.append(f"tether: console at {base_url.removesuffix('/v1')}/console")
    return lines


async def wait_for_signal() -> None:
    """Return on the first SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def freeze_startup_heap() -> int:
    """Move every object alive now out of the garbage collector's generations (`gc.freeze`), once
    the server is built and listening: the tokenizer's rank tables (loaded by `build_engine`), the
    compiled codecs and protobuf descriptors, the configuration, the modules. A full (gen-2)
    collection then no longer walks them, so its pauses of the event loop are shorter: one took
    19 ms during a 100-stream run before (issue 16). Collected first, so that startup garbage is
    freed, not frozen for good. Returns how many objects are frozen (the "tether serving" log
    line's `frozen_objects`).

    Only in a served process (`serve_forever`, `serve_remote_forever`), never in `start`: tests
    start many servers inside one process, where each freeze would also make every earlier test's
    garbage cycles permanent."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def serve_forever(config: TetherConfig, *, strategy: TurnStrategy = STANDARD_TURNS) -> None:
    running = await start(config, strategy=strategy)
    frozen = freeze_startup_heap()
    log.info(
        "tether serving",
        extra={
            "grpc": f"{config.server.grpc_host}:{running.grpc_port}",
            "bridge_port": running.bridge_port,
            "event_loop": eventloop.running_loop(),
            "frozen_objects": frozen,
        },
    )
    for line in startup_lines(config, running):
        print(line, flush=True)
    await wait_for_signal()
    log.info("shutting down", extra={"grace_s": config.server.shutdown_grace_s})
    await running.stop(config.server.shutdown_grace_s)


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
                              ) -> RemoteBridge:  # fmt: skip
    """The bridge in front of the Tether gRPC server at `upstream`, listening.

    With `api_key`, the bridge authenticates callers itself (`server.api_keys_file` /
    TETHER_API_KEYS, or `authenticator`) and calls upstream as that one key. Without it, each
    caller's own key is forwarded and the upstream authenticates and scopes it
    (`ForwardingAuthenticator`).
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


async def serve_remote_forever(
    config: TetherConfig, *, upstream: str, api_key: str | None = None, tls_ca: str | None = None
) -> None:
    """Serve the bridge in front of the Tether gRPC server at `upstream` until SIGTERM/SIGINT."""
    remote = await start_remote_bridge(config, upstream=upstream, api_key=api_key, tls_ca=tls_ca)
    freeze_startup_heap()
    try:
        print(f"tether bridge: HTTP/WebSocket on {remote.bridge.base_url} -> gRPC {upstream}", flush=True)
        await wait_for_signal()
        log.info("bridge shutting down", extra={"grace_s": config.server.shutdown_grace_s})
    finally:
        await remote.stop(config.server.shutdown_grace_s)
