"""Readiness: the periodic checker flips the gRPC health status with the store's reachability."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tether.observability.health import NOT_SERVING, SERVING, ReadinessChecker, engine_ready
from tether.service.grpc_server import SERVICE_NAME


async def _status(target: str, service: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service))
        return reply.status


async def test_checker_follows_the_store(server, monkeypatch):
    engine = server.engine
    checker = ReadinessChecker(engine, server.grpc.health, timeout_s=0.2)
    assert await checker.check_once() is True
    assert await _status(server.target, "") == SERVING
    assert await _status(server.target, SERVICE_NAME) == SERVING

    async def unreachable() -> bool:
        raise ConnectionError("store down")

    monkeypatch.setattr(engine.store, "ping", unreachable)
    assert await checker.check_once() is False
    assert await _status(server.target, "") == NOT_SERVING
    assert await _status(server.target, SERVICE_NAME) == NOT_SERVING
    assert not checker.is_ready() and checker.transitions == 1

    async def hangs() -> bool:
        await asyncio.sleep(30)
        return True

    monkeypatch.setattr(engine.store, "ping", hangs)
    assert await checker.check_once() is False  # a store that does not answer in time is not ready

    monkeypatch.undo()
    assert await checker.check_once() is True
    assert await _status(server.target, SERVICE_NAME) == SERVING and checker.transitions == 2

    await server.grpc.health.enter_graceful_shutdown()  # shutdown wins over later checks
    await checker.check_once()
    assert await _status(server.target, "") == NOT_SERVING


async def test_periodic_checks_and_backends(server):
    checker = ReadinessChecker(server.engine, None, interval_s=0.01).start()
    try:
        for _ in range(500):
            if checker.checks >= 3:
                break
            await asyncio.sleep(0.01)
        assert checker.checks >= 3 and checker.is_ready()
    finally:
        await checker.stop()
    backends, server.engine.backends = server.engine.backends, {}
    try:
        assert await engine_ready(server.engine) is False  # no backend configured: not ready
    finally:
        server.engine.backends = backends
