"""How long the event loop was blocked.

Every turn of every tenant runs on one event loop per process, so anything that holds it (a big
JSON document, tokenising a long text, a regex over megabytes) delays every other connection by
as much. Two ways to see it, one per kind of loop:

- **the watched selector** (`WatchedSelector`, the loop `tether.eventloop.run` makes on asyncio):
  the loop's own poll is timed. A pass of the loop (the callbacks and I/O handlers it runs between
  two polls) that takes `held` seconds held every ready socket that long, so `held` is the stall,
  measured for every pass, exactly, at the cost of two clock reads per pass (and a thread-CPU
  read at most once a millisecond), and no wake-up of its own. (A periodic timer probe costs wake-ups: at the old 50 ms it
  was 4.4 ms of CPU per second of an idle server on a 2-core VM, more than half of its idle CPU,
  and ~100 µs per token of a single paced stream.)
- **the timer probe** (`LoopLagProbe._run`), for a loop without that selector (uvloop, or a loop
  Tether did not make, as the test suite's): a timer every `interval_s` whose lateness is the
  stall; a stall shorter than the interval is seen only when the timer falls due inside it.

Reported as `tether_event_loop_lag_seconds` (a histogram: each pass that held the loop for at
least `MIN_STALL_S`, or each timer's lateness), `tether_event_loop_lag_max_seconds` (the longest
since the previous scrape), docs/operating.md; `server.loop_lag_interval_s` = 0 turns both off.

Lateness also counts time the process did not run at all (a busy machine) and time the loop
waited for the interpreter lock. `tether_event_loop_busy_max_seconds` separates the loop's own
work: the most CPU time the loop's thread used in one pass (between two wake-ups of the timer
probe), so a callback that computes for 200 ms shows as 0.2 there and a process descheduled for
200 ms does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import time
from collections.abc import Callable
from typing import Any

# The shortest pass the watched selector reports (the histogram's first bucket): shorter ones are
# the loop working as it should, and reporting each would cost more than the pass itself.
MIN_STALL_S = 0.001


class WatchedSelector(selectors.DefaultSelector):
    """The loop's selector, timing each pass between two polls for its `probe` (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.probe: LoopLagProbe | None = None
        self._back = time.perf_counter()  # when the last poll returned
        self._cpu = time.thread_time()  # the thread's CPU, read at the start of a poll ...
        self._cpu_at = self._back  # ... at this time

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        probe = self.probe
        if probe is not None:
            now = time.perf_counter()
            held = now - self._back
            # The thread's CPU is a system call (~2-4 µs on a VM, more than a short pass): read
            # at most once per MIN_STALL_S and for every long pass, so a long pass's CPU counts
            # from a reading at most MIN_STALL_S before it began (capped at its length).
            if held >= MIN_STALL_S or now - self._cpu_at >= MIN_STALL_S:
                cpu = time.thread_time()
                if held >= MIN_STALL_S:
                    probe.record(held, min(held, cpu - self._cpu))
                self._cpu, self._cpu_at = cpu, now
        ready = super().select(timeout)
        self._back = time.perf_counter()
        return ready

    def watch(self, probe: LoopLagProbe | None) -> None:
        """Report each long pass to `probe` from now on (None: to nobody)."""
        self.probe = probe
        self._cpu, self._cpu_at = time.thread_time(), time.perf_counter()


class LoopLagProbe:
    """Measures how long the loop was blocked (module docstring); `on_lag(lag, busy)` gets each
    measurement. `peak()` is the longest lag since it was last read (then reset), `worst` the
    longest ever. `interval_s` 0: no measuring."""

    def __init__(self, interval_s: float, on_lag: Callable[[float, float], None] | None = None) -> None:
        self.interval_s = interval_s
        self.on_lag = on_lag
        self.worst = 0.0
        self._peak = 0.0
        self._busy_peak = 0.0
        self._task: asyncio.Task[None] | None = None
        self._selector: WatchedSelector | None = None

    def start(self) -> LoopLagProbe:
        if self.interval_s <= 0 or self._task is not None or self._selector is not None:
            return self
        loop = asyncio.get_running_loop()
        selector = getattr(loop, "_selector", None)  # asyncio's selector loops keep it there
        if isinstance(selector, WatchedSelector):
            self._selector = selector
            selector.watch(self)
        else:
            self._task = loop.create_task(self._run(), name="tether-loop-lag")
        return self

    @property
    def watching(self) -> str:
        """How it measures: "selector", "timer" or "off"."""
        return "selector" if self._selector is not None else "timer" if self._task is not None else "off"

    async def stop(self) -> None:
        if self._selector is not None:
            self._selector.watch(None)
            self._selector = None
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
        """The most CPU time the loop's thread used in one pass since the previous call (then reset)."""
        peak, self._busy_peak = self._busy_peak, 0.0
        return peak

    def record(self, lag: float, busy: float = 0.0) -> None:
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
