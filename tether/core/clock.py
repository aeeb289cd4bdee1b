"""The time the core reads, injected: `Clock` is what the session (lifetime, idle timeout), the
outbox (coalescing window) and the turn (`created_at`, `completed_at`) ask for the time, so
their rules are tested with a clock a test sets, without sleeping.

`SYSTEM_CLOCK` is the real one. Stage timings (`timing.StageClock`) stay on `perf_counter`: they
measure, they decide nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, windows)."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch (timestamps a client reads)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once `monotonic()` has moved on by `seconds` (the watchdog's wait)."""
        ...


class SystemClock:
    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
