"""Readiness: a periodic check that keeps the gRPC health service (and `/readyz`) truthful.

`grpc_server.start_grpc_server` sets SERVING once at start. `ReadinessChecker` re-checks every
`interval_s`: the engine is ready when it is not shutting down, its store answers a ping
(`engine.ready()`) within `timeout_s`, and it has backends and model routes configured. On a
change it sets the gRPC health status of `""` (the server) and of the ResponsesService to
SERVING / NOT_SERVING, so load balancers and `grpc_health_probe` stop routing to a replica that
lost its store. After `HealthServicer.enter_graceful_shutdown()` the servicer ignores updates,
so shutdown stays NOT_SERVING.

Start it next to the gRPC server (see docs/operating.md) and stop it before shutting down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from grpc_health.v1 import health_pb2

log = logging.getLogger("tether.health")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def engine_ready(engine: Any) -> bool:
    """The readiness of an in-process engine (or anything with an async `ready()`)."""
    ready = getattr(engine, "ready", None)
    if ready is not None and not await ready():
        return False
    backends = getattr(engine, "backends", None)
    config = getattr(engine, "config", None)
    if backends is not None and not backends:
        return False
    return not (config is not None and not getattr(config, "models", True))


class ReadinessChecker:
    def __init__(
        self,
        engine: Any = None,
        health_servicer: Any = None,
        *,
        check: Callable[[], Awaitable[bool]] | None = None,
        services: Sequence[str] | None = None,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
    ) -> None:
        """`engine`: checked with `engine_ready(engine)` unless `check` is given.
        `health_servicer`: a `grpc_health.v1.health.aio.HealthServicer` to update (optional).
        `services`: the health service names to set (default: "" and the ResponsesService)."""
        if check is None:
            if engine is None:
                raise ValueError("ReadinessChecker needs an engine or a check")
            check = lambda: engine_ready(engine)  # noqa: E731
        self._check = check
        self._servicer = health_servicer
        if services is None:
            from tether.service.grpc_server import SERVICE_NAME

            services = ("", SERVICE_NAME)
        self._services = tuple(services)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.ready: bool | None = None  # the last result (None before the first check)
        self.checks = 0
        self.transitions = 0
        self._task: asyncio.Task[None] | None = None

    def is_ready(self) -> bool:
        """The last result (for `/readyz`); False before the first check."""
        return bool(self.ready)

    async def check_once(self) -> bool:
        try:
            ok = bool(await asyncio.wait_for(self._check(), self.timeout_s))
        except Exception as exc:  # noqa: BLE001 - an unreachable store is "not ready", never a crash
            log.warning("readiness check failed: %s", type(exc).__name__)
            ok = False
        self.checks += 1
        if ok != self.ready:
            if self.ready is not None:
                self.transitions += 1
                log.warning("readiness changed", extra={"ready": ok})
            self.ready = ok
            await self._publish(ok)
        return ok

    async def _publish(self, ok: bool) -> None:
        if self._servicer is None:
            return
        status = SERVING if ok else NOT_SERVING
        for service in self._services:
            await self._servicer.set(service, status)

    def start(self) -> ReadinessChecker:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tether-readiness")
        return self

    async def _run(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        # Cancel until it ends: Python 3.11's `asyncio.wait_for` (in `check_once`) swallows a
        # cancel that lands as the check completes, and the loop would go on (a server stopped
        # right after it started then hung in `stop`).
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.1)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
