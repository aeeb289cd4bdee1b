"""How long the event loop was blocked: a probe that sleeps a fixed interval and measures how late
it wakes up.

Every turn of every tenant runs on one event loop per process, so anything that holds it (a big
JSON document, tokenising a long text, a regex over megabytes) delays every other connection by
as much. The lateness of a timer is that delay as the other connections see it: a probe that
asks to wake every `interval_s` and wakes `lag` seconds late saw the loop blocked for about
`lag` (a stall shorter than the time the probe sleeps is seen only when the wake-up falls inside
it, so the figure is a lower bound of the longest stall, exact for stalls longer than the
interval).

Reported as `tether_event_loop_lag_seconds` (a histogram of every wake-up's lateness) and
`tether_event_loop_lag_max_seconds` (the longest since the previous scrape), see
docs/operating.md; `server.loop_lag_interval_s` sets the interval (0 = no probe).

Lateness also counts time the process did not run at all (a busy machine) and time the loop
waited for the interpreter lock. `tether_event_loop_busy_max_seconds` separates the loop's own
work: the most CPU time the loop's thread used between two wake-ups of the probe (a callback
that computes for 200 ms shows as 0.2 there; a process descheduled for 200 ms does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class LoopLagProbe:
    """Measures the loop's lateness every `interval_s`; `on_lag(lag, busy)` gets each measurement.
    `peak()` is the longest lag since it was last read (then reset), `worst` the longest ever."""

    def __init__(self, interval_s: float, on_lag: Callable[[float, float], None] | None = None) -> None:
        self.interval_s = interval_s
        self.on_lag = on_lag
        self.worst = 0.0
        self.samples = 0
        self._peak = 0.0
        self._busy_peak = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> LoopLagProbe:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tether-loop-lag")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def peak(self) -> float:
        """The longest lag since the previous call (the scrape's gauge), then reset."""
        peak, self._peak = self._peak, 0.0
        return peak

    def busy_peak(self) -> float:
        """The most CPU time the loop's thread used between two wake-ups since the previous
        call (then reset)."""
        peak, self._busy_peak = self._busy_peak, 0.0
        return peak

    def record(self, lag: float, busy: float = 0.0) -> None:
        self.samples += 1
        if busy > self._busy_peak:
            self._busy_peak = busy
        if lag > self._peak:
            self._peak = lag
        if lag > self.worst:
            self.worst = lag
        if self.on_lag is not None:
            self.on_lag(lag, busy)

    async def _run(self) -> None:
        interval = self.interval_s
        clock, cpu = time.perf_counter, time.thread_time
        while True:
            due, used = clock() + interval, cpu()
            await asyncio.sleep(interval)
            self.record(max(0.0, clock() - due), cpu() - used)
