"""Process memory: which allocator the server runs on, and giving freed memory back to the OS.

Why this exists: a server holding 1,000 agent connections peaks at ~500 MiB, and after those
connections close its live objects return to the baseline, but its resident memory need not.
Measured with the load campaign (docs/reliability.md, "Load"; RSS above the baseline after every
connection closed, and the server's CPU per turn under load):

- CPython's small-object allocator (pymalloc) takes memory in 1 MiB arenas and returns an arena
  only when every block in it is free. The few hundred objects that legitimately outlive a peak
  (metric values, asyncio's task weakrefs, ABC caches) land in arenas all over the heap and pin
  them: +108 MiB stays. It is the fastest for small objects (1.21 ms CPU per turn).
- glibc malloc works per 4 KiB page and `malloc_trim(0)` hands every free page back: +19 MiB,
  but 1.56 ms CPU per turn (every small object now goes through it).
- jemalloc (Debian's libjemalloc2, preloaded) returns memory too and is as fast as pymalloc:
  +25 MiB, 1.16 ms per turn.

So `tether serve` / `tether bridge` re-execute themselves once with `PYTHONMALLOC=malloc` and, when
the system has it, jemalloc preloaded (`server.allocator = "auto"`); and `MemoryReclaimer` runs a
full collection and a purge (`malloc_trim(0)`, or jemalloc's `arena.<all>.purge`) after a wave
of closes: glibc only trims the top of its heap by itself, jemalloc purges on a delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("tether.process_memory")

ALLOCATORS = ("auto", "jemalloc", "malloc", "pymalloc")
_JEMALLOC = "jemalloc"


def _jemalloc_library() -> str | None:
    """The name the dynamic loader knows jemalloc by (libjemalloc.so.2), or None."""
    return ctypes.util.find_library(_JEMALLOC)


def exec_with_allocator(allocator: str) -> None:
    """Replace this process by the same command line run on `allocator` (see the module text).

    "auto" is jemalloc where the system has it, else glibc malloc. Does nothing for pymalloc
    (CPython's default), when PYTHONMALLOC is already set (an explicit choice, or this is the
    re-executed process), or off Linux (the choice was measured there). Call it before anything
    else starts: no thread, socket or buffered output survives the exec."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"server.allocator must be one of {', '.join(ALLOCATORS)}, got {allocator!r}")
    if allocator == "pymalloc" or "PYTHONMALLOC" in os.environ or not sys.platform.startswith("linux"):
        return
    env = {**os.environ, "PYTHONMALLOC": "malloc"}
    if allocator in ("auto", _JEMALLOC):
        library = _jemalloc_library()
        if library is None and allocator == _JEMALLOC:
            raise SystemExit("tether: server.allocator = jemalloc, but libjemalloc is not installed (libjemalloc2)")
        if library is not None:
            env["LD_PRELOAD"] = " ".join(filter(None, [library, os.environ.get("LD_PRELOAD")]))
            # Purge freed pages from a background thread, also while no allocation drives it.
            env.setdefault("MALLOC_CONF", "background_thread:true")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def allocator_in_use() -> str:
    """The allocator this interpreter runs on: jemalloc, malloc, pymalloc (or PYTHONMALLOC's value)."""
    name = os.environ.get("PYTHONMALLOC") or "pymalloc"
    if name == "malloc" and _JEMALLOC in os.environ.get("LD_PRELOAD", ""):
        return _JEMALLOC
    return name


def resident_bytes() -> int:
    """This process's resident set size (0 where /proc is not available)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _load_purge() -> Callable[[], Any] | None:
    symbols = ctypes.CDLL(None)  # the process's global symbols: a preloaded jemalloc comes first
    mallctl = getattr(symbols, "mallctl", None)
    if mallctl is not None:  # jemalloc: purge the unused dirty pages of every arena (4096 = all)
        return lambda: mallctl(b"arena.4096.purge", None, None, None, 0)
    malloc_trim = getattr(symbols, "malloc_trim", None)
    if malloc_trim is not None:  # glibc
        return lambda: malloc_trim(0)
    return None  # musl, macOS: nothing to purge with


_purge = _load_purge()


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS (jemalloc's purge, else glibc's `malloc_trim(0)`).
    Releases the GIL while it walks the heap, so it may run in a worker thread. False where
    neither is there."""
    if _purge is None:
        return False
    _purge()
    return True


class MemoryReclaimer:
    """Every `interval_s`, if at least as many sessions closed since the last reclaim as are open
    now (and at least one did), and no turn is reading a backend, collect garbage and trim the heap.

    The rule follows the load: under steady churn the memory of closed sessions is reused by new
    ones and nothing runs; after a wave of closes (an agent fleet finishing, a deploy draining
    clients) the memory goes back. Not while a response streams: the full collection runs on the
    loop (measured: ~150 ms with 100 sessions open, and the purge beside it stalls allocations),
    which while a new wave of 100 WebSocket creates streamed put their TTFT p50 at 868 ms instead
    of ~100 ms. `counts` returns (open sessions, sessions closed so far); `streaming` the turns
    reading a backend now; `on_reclaim(seconds, released_bytes)` reports each run (metrics)."""

    def __init__(
        self,
        counts: Callable[[], tuple[int, int]],
        interval_s: float,
        on_reclaim: Callable[[float, int], Any] | None = None,
        streaming: Callable[[], int] = lambda: 0,
    ) -> None:
        self.counts = counts
        self.interval_s = interval_s
        self.on_reclaim = on_reclaim
        self.streaming = streaming
        self.runs = 0
        self._closed_at_last = counts()[1]
        self._task: asyncio.Task[None] | None = None

    def due(self) -> bool:
        open_now, closed = self.counts()
        closed_since = closed - self._closed_at_last
        return closed_since > 0 and closed_since >= open_now and not self.streaming()

    async def reclaim(self) -> int:
        """One run (whether or not it is due): the resident bytes it gave back."""
        self._closed_at_last = self.counts()[1]
        started, before = time.perf_counter(), resident_bytes()
        gc.collect()
        await asyncio.to_thread(trim_heap)
        released = max(0, before - resident_bytes())
        seconds = time.perf_counter() - started
        self.runs += 1
        if self.on_reclaim is not None:
            self.on_reclaim(seconds, released)
        log.info(
            "memory reclaimed",
            extra={"released_mib": round(released / 2**20, 1), "seconds": round(seconds, 3)},
        )
        return released

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if self.due():
                await self.reclaim()

    def start(self) -> MemoryReclaimer:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="tether-memory-reclaimer")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
