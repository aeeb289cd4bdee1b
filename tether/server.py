"""Process lifecycle: start the engine, the gRPC server and (by default) the in-process bridge;
stop them in order on SIGTERM/SIGINT: stop accepting, let in-flight turns finish within the
grace period, close WebSockets with 1001 and gRPC streams with UNAVAILABLE, flush post-inference
work, exit 0."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from tether.auth import Authenticator
from tether.config import TetherConfig
from tether.core.engine import Engine
from tether.memory import MemoryReclaimer
from tether.observability.health import ReadinessChecker
from tether.observability.metrics_http import MetricsServer, start_metrics_server
from tether.service.grpc_server import GrpcServer, start_grpc_server

log = logging.getLogger("tether.server")


@dataclass
class Running:
    engine: Engine
    grpc: GrpcServer
    bridge: object | None  # tether.bridge.server.BridgeServer
    readiness: ReadinessChecker | None = None
    metrics: MetricsServer | None = None
    reclaimer: MemoryReclaimer | None = None

    @property
    def grpc_port(self) -> int:
        return self.grpc.port

    @property
    def bridge_port(self) -> int | None:
        return getattr(self.bridge, "port", None)

    async def stop(self, grace: float) -> None:
        if self.reclaimer is not None:
            await self.reclaimer.stop()
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


async def start(config: TetherConfig) -> Running:
    engine = await Engine.start(config)
    auth = make_authenticator(config)
    grpc_server = await start_grpc_server(engine, config, auth)
    readiness = ReadinessChecker(engine, grpc_server.health).start()
    metrics = None
    if config.server.metrics_port:
        metrics = await start_metrics_server(
            engine, host=config.server.bridge_host, port=config.server.metrics_port, readiness=readiness
        )
    bridge = None
    if config.server.bridge:
        from tether.bridge.server import start_bridge

        bridge = await start_bridge(engine, auth, config)
    reclaimer = MemoryReclaimer(
        lambda: (len(engine.sessions), engine.sessions_closed),
        config.server.memory_reclaim_interval_s,
        engine.metrics.memory_reclaimed,
    ).start()
    return Running(engine, grpc_server, bridge, readiness, metrics, reclaimer)


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


async def serve_forever(config: TetherConfig) -> None:
    running = await start(config)
    log.info(
        "tether serving",
        extra={"grpc": f"{config.server.grpc_host}:{running.grpc_port}", "bridge_port": running.bridge_port},
    )
    for line in startup_lines(config, running):
        print(line, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down", extra={"grace_s": config.server.shutdown_grace_s})
    await running.stop(config.server.shutdown_grace_s)
