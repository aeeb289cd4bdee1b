"""Per-turn stage timers: named stages, wall time each, reported in `server_timing` and metrics."""

from __future__ import annotations

import time
from typing import Literal

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

    def stage(self, name: str) -> _Stage:
        """`with clock.stage(name):` adds the block's wall time to `name` (also when it raises)."""
        return _Stage(self.stages, name)

    def add(self, name: str, seconds: float) -> None:
        self.stages[name] = self.stages.get(name, 0.0) + seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self._started

    def overhead(self) -> float:
        """Elapsed time not spent waiting on the backend."""
        return self.elapsed() - self.stages.get("backend_wait", 0.0)


class _Stage:
    """One timed block of a `StageClock`. A plain slotted context manager, not a
    `contextlib.contextmanager` generator: a turn enters about ten stages, and the generator
    protocol cost ~1 us each on the hot path (`python -m tether_lab.hotpath turns --profile`)."""

    __slots__ = ("_stages", "_name", "_t0")

    def __init__(self, stages: dict[str, float], name: str) -> None:
        self._stages = stages
        self._name = name
        self._t0 = time.perf_counter()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> Literal[False]:
        stages, name = self._stages, self._name
        stages[name] = stages.get(name, 0.0) + time.perf_counter() - self._t0
        return False
