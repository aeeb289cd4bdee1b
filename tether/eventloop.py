"""The event loop a Tether process runs on: `server.event_loop` = "asyncio" (the default: the
standard library's loop), "uvloop", or "auto" (uvloop where it is installed, else asyncio).

Why the choice, and why asyncio by default (measured on a 2-core VM): on uvloop the server's CPU per
streamed token is 10-17% lower (1.16-1.25 -> 1.04 µs in one process; the 100-stream gRPC run's
server CPU 0.87 -> 0.77 s), but the per-turn server overhead of a cached `bugfix20` turn over real
sockets was 3-12% higher in each of six back-to-back A/B pairs (gRPC p50 0.95-1.03 vs 1.00-1.16
ms), while in one process it was not. A server for agents'
tool loops is judged on the turn, so asyncio is the default; "uvloop" is the switch for a
process whose CPU is the limit (many concurrent streams). grpc.aio, websockets and uvicorn's h11
protocol run on both unchanged. uvloop is a dependency on CPython outside Windows (pyproject.toml).

`run` is the one way a Tether process runs its top-level coroutine (`tether serve`, `tether
bridge`, each `--workers` worker, the lab's measuring programs): an `asyncio.Runner` with the
chosen loop factory, not `uvloop.install()` or `uvloop.EventLoopPolicy` (deprecated from Python
3.12, gone in 3.16) nor any process-wide event-loop policy. The typed client library
(`tether.client`) runs on whatever loop its caller runs.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from functools import cache
from typing import Any, TypeVar

from tether.observability.loop_lag import WatchedSelector

T = TypeVar("T")

CHOICES = ("auto", "uvloop", "asyncio")
# The config's environment override of `server.event_loop`; a program without a config (the lab's
# benchmarks and their clients) follows it too, so one variable switches a whole measurement.
ENV = "TETHER_SERVER__EVENT_LOOP"
DEFAULT = "asyncio"  # `server.event_loop`'s default (see the module docstring)


@cache
def uvloop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def resolve(choice: str) -> str:
    """The loop `choice` runs here, "uvloop" or "asyncio"; a ValueError naming `server.event_loop`
    for an unknown choice, or for "uvloop" where it cannot be imported (never a silent fallback)."""
    if choice not in CHOICES:
        raise ValueError(f"server.event_loop must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "auto":
        return "uvloop" if uvloop_available() else "asyncio"
    if choice == "uvloop" and not uvloop_available():
        raise ValueError(
            "server.event_loop = 'uvloop', but uvloop cannot be imported here (pip install uvloop; "
            "Tether installs it on CPython outside Windows); use 'auto' or 'asyncio'"
        )
    return choice


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if resolve(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    if sys.platform == "win32":  # asyncio's loop there is the proactor, which has no selector
        return asyncio.new_event_loop
    # asyncio's own loop, on a selector that times each pass (how long the loop was blocked,
    # tether/observability/loop_lag.py) instead of a timer that wakes the process to find out.
    return lambda: asyncio.SelectorEventLoop(WatchedSelector())


def environment_choice() -> str:
    """The choice of a program without a config: `TETHER_SERVER__EVENT_LOOP`, else the default."""
    return os.environ.get(ENV, DEFAULT)


def run(main: Coroutine[Any, Any, T], choice: str | None = None) -> T:
    """Run `main` to completion on a new loop of `choice` (see `resolve`; None: the
    `environment_choice()`), then close it."""
    choice = environment_choice() if choice is None else choice
    with asyncio.Runner(loop_factory=_loop_factory(choice)) as runner:
        return runner.run(main)


def running_loop() -> str:
    """The loop this coroutine runs on, "uvloop" or "asyncio", read from the loop itself (not from
    the setting), so that what the startup log and `tether_event_loop_info` report is what runs."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.partition(".")[0] == "uvloop" else "asyncio"
