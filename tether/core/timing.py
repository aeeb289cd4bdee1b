"""Per-turn stage timers: named stages, wall time each, reported in `server_timing` and metrics."""

from __future__ import annotations

import time
from contextlib import contextmanager

# The stages of a turn, in order. `backend` is the model's time (TTFT + streaming); everything
# else is server overhead, the cost a transport with cached state is meant to shrink.
# `render_overlapped` is tokenising the new input while the backend computes its first token
# (when only `usage` needs the count): it is inside the backend's wait, not overhead, unless the
# backend was ready before it ended.
# `mcp` is the time spent on remote MCP servers (opening a session, listing, calling: tether.core.mcp).
STAGES = ("resolve", "validate", "classify", "render", "route", "backend", "render_overlapped", "mcp", "emit",
          "finalize")  # fmt: skip


class StageClock:
    __slots__ = ("stages", "_started")

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self._started = time.perf_counter()

    @contextmanager
    def stage(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stages[name] = self.stages.get(name, 0.0) + time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        self.stages[name] = self.stages.get(name, 0.0) + seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self._started

    def overhead(self) -> float:
        """Elapsed time not spent waiting on the backend."""
        return self.elapsed() - self.stages.get("backend_wait", 0.0)
