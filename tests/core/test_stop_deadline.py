"""`tether serve` stops within one deadline: `server.shutdown_grace_s` + `STOP_EXTRA_S`. A stop
that passes it is abandoned, what was still running is logged by name, and the process exits 1
(a supervisor restarting replicas one by one must not wait on a stuck one)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from tether import server


class _StuckStop:
    async def stop(self, grace: float) -> None:
        await asyncio.create_task(asyncio.Event().wait(), name="tether-stuck-on-purpose")


class _QuickStop:
    def __init__(self) -> None:
        self.graces: list[float] = []

    async def stop(self, grace: float) -> None:
        self.graces.append(grace)


async def test_a_stop_past_its_deadline_exits_1_naming_what_was_stuck(monkeypatch, caplog) -> None:
    monkeypatch.setattr(server, "STOP_EXTRA_S", 0.2)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="tether.server"), pytest.raises(SystemExit) as exited:
        await server.stop_within_deadline(_StuckStop(), 0.1)  # type: ignore[arg-type]
    assert exited.value.code == 1
    assert 0.3 <= time.monotonic() - started < 2.0
    record = next(r for r in caplog.records if "deadline" in r.getMessage())
    assert "tether-stuck-on-purpose" in record.tasks  # type: ignore[attr-defined]


async def test_a_stop_within_its_deadline_returns_with_the_grace_passed_on() -> None:
    quick = _QuickStop()
    await server.stop_within_deadline(quick, 3.0)  # type: ignore[arg-type]
    assert quick.graces == [3.0]
