"""CPU work too large for the event loop runs in one worker thread instead.

Every connection of a process shares its event loop, so a request whose preparation takes the
loop for a second (rendering and tokenising megabytes of input, a stored conversation, a long
template expansion) delays every other tenant's turn by as much. Work on at least
`OFF_LOOP_BYTES` of input goes to `run`'s thread; smaller work stays inline (a thread hop costs
more than it saves).

One thread, not a pool: the loop keeps at most one competitor for the interpreter lock, so it
gets at least about half of it whatever the number of large requests in flight (they queue for
the thread instead). The tokenizer holds the lock for one piece at a time (`render.encode` cuts
long texts into pieces of at most 64,000 bytes, ~3 ms), which bounds how long the loop waits for
it; other large C calls in the thread (copying a multi-megabyte string) hold it for theirs.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Work on at least this many bytes (UTF-8 text, or protobuf size) runs off the loop.
OFF_LOOP_BYTES = 256 * 1024

_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-cpu")
    return _pool


def large(nbytes: int) -> bool:
    return nbytes >= OFF_LOOP_BYTES


async def run(nbytes: int, fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)`: inline when `nbytes` is small, else in the worker thread (the caller waits
    without holding the loop). Exceptions propagate either way."""
    if not large(nbytes):
        return fn(*args)
    return await in_thread(fn, *args)


async def in_thread(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` in the worker thread, whatever its size: for work whose size would itself cost
    a pass over the data to learn (a stored conversation's items), next to a store read anyway."""
    return await asyncio.get_running_loop().run_in_executor(_executor(), functools.partial(fn, *args))
