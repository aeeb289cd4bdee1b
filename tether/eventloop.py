"""The event loop a Tether process runs on: `server.event_loop` = "auto" (uvloop where it is
installed, else asyncio's own), "uvloop" or "asyncio".

Why uvloop by default: a streaming server's hot path is largely the loop itself (a wake-up per
backend chunk, a socket write per batch of events). On uvloop the server's CPU per streamed token
fell from 1.35 to 1.15 µs in one process, the 100-stream gRPC run's server CPU from 1.3 to 1.1 s
and the benchmark client's from 0.7 to 0.43 s (issue 16, 2-core VM); grpc.aio, websockets and
uvicorn's h11 protocol run on it unchanged. uvloop is a dependency on CPython outside Windows
(pyproject.toml); "asyncio" is the fallback and the switch to compare or rule it out.

`run` is the one way a Tether process runs its top-level coroutine (`tether serve`, `tether
bridge`, each `--workers` worker, the lab's measuring programs): an `asyncio.Runner` with the
chosen loop factory, not `uvloop.install()` or `uvloop.EventLoopPolicy` (deprecated from Python
3.12, gone in 3.16) nor any process-wide event-loop policy. The typed client library
(`tether.client`) runs on whatever loop its caller runs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("auto", "uvloop", "asyncio")
# The config's environment override of `server.event_loop`; a program without a config (the lab's
# benchmarks and their clients) follows it too, so one variable switches a whole measurement.
ENV = "TETHER_SERVER__EVENT_LOOP"


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


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if resolve(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None  # asyncio.Runner's default: a new loop of asyncio's own, exactly as asyncio.run


def environment_choice() -> str:
    """The choice of a program without a config: `TETHER_SERVER__EVENT_LOOP`, else "auto"."""
    return os.environ.get(ENV, "auto")


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
