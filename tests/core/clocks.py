"""A clock a test sets (`tether.core.clock.Clock`), so time rules run without sleeping: `sleep`
returns when the test has advanced the clock past its end."""

from __future__ import annotations

import asyncio


class SetClock:
    def __init__(self, monotonic: float = 0.0, wall: float = 1_700_000_000.0) -> None:
        self.now = monotonic
        self.wall_now = wall
        self._sleepers: list[tuple[float, asyncio.Future]] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.wall_now

    async def sleep(self, seconds: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, wake))
        await wake

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_now += seconds
        due = [(at, fut) for at, fut in self._sleepers if at <= self.now]
        self._sleepers = [(at, fut) for at, fut in self._sleepers if at > self.now]
        for _, fut in due:
            if not fut.done():
                fut.set_result(None)
