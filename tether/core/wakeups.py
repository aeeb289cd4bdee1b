"""Reading a backend stream one wake-up at a time: every chunk it has ready, without waiting.

A backend streams small chunks, and most upstreams send one token per chunk; a wake-up (a network
read, a timer tick) often makes many of them ready at once. Handling each chunk as it comes costs
an await, an event and a queue operation per token. `WakeupReader.next()` instead returns the
whole run of chunks the stream produces before it next has to wait, so the turn builds and queues
one event per wake-up whatever the upstream's chunk size.

It reads the backend's `stream_runs()`: an adapter that has a wake-up's chunks in hand yields
them as one list (one step of its generator per wake-up, not per token); one that yields chunk by
chunk comes as runs of one, and the reader joins the runs that are ready together.

How it knows what is ready, for any async generator: it steps the generator's `__anext__()`
coroutine by hand (`send(None)`). A step that finishes at once delivered a ready run; a step that
yields is waiting on a future, so the wake-up ends there, and the started step is kept and later
awaited through `_finish` (which hands the future it yielded to the task, exactly what `await`
would have done, so timers started inside it keep their deadlines). When the reader is closed
with a step still pending (the turn was cancelled while writing the run out), the step is
cancelled the way an awaited one would be, then the generator is closed, so the upstream is
released exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import types
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any

from tether.backends.base import Chunk


@types.coroutine
def _finish(step: Any, pending: Any, throw: BaseException | None = None) -> Generator[Any, Any, Any]:
    """Await `step`, an `__anext__()` coroutine already run up to its first suspension, where it
    yielded `pending` (the future it waits on). With `throw`, raise that inside it first."""
    while True:
        try:
            if throw is not None:
                exc, throw = throw, None
                pending = step.throw(exc)
                continue
            try:
                sent = yield pending
            except BaseException as exc:  # noqa: BLE001 - forwarded into the step, as await does
                throw = exc
                continue
            pending = step.send(sent)
        except StopIteration as done:
            return done.value


class WakeupReader:
    """`next()` returns the chunks of the stream's next wake-up, from a stream of runs
    (`Backend.stream_runs`): [] once it has ended (`ended`), or where the stream yielded an empty
    run (its `RunSink` asks for the turn's task, which then finds the chunks in the sink).
    `waited` is the time spent inside the backend (waiting, and producing the chunks).

    `while_waiting` runs once, the first time the stream has to wait before its first chunk (the
    model computing its first token): work that only the end of the turn needs goes there. Its
    time counts as waiting unless the backend was ready before it ended (then it delayed the
    stream, and counts as the caller's)."""

    def __init__(self, stream: AsyncGenerator[list[Chunk], None], while_waiting: Callable[[], None] | None = None) -> None:
        self._stream = stream
        self._while_waiting = while_waiting
        self._step: Any = None  # a started __anext__() that is waiting
        self._pending: Any = None  # what it waits on
        self.ended = False
        self.waited = 0.0

    async def next(self) -> list[Chunk]:
        chunks: list[Chunk] = []
        if self.ended:
            return chunks
        step, pending = self._step, self._pending
        self._step = self._pending = None
        anext = self._stream.__anext__
        t0 = time.perf_counter()
        try:
            if step is not None:  # it was waiting: its chunk is the first of this wake-up
                run = await _finish(step, pending)
                if not run:  # the stream's sink asks for its owner (`RunSink`)
                    return chunks
                chunks += run
            while True:
                step = anext()
                try:
                    pending = step.send(None)
                except StopIteration as ready:
                    if not ready.value:
                        return chunks
                    chunks += ready.value
                    continue
                if chunks:  # the stream has to wait: this wake-up's run is complete
                    self._step, self._pending = step, pending
                    return chunks
                if self._while_waiting is not None:
                    self._run_while_waiting(pending)
                run = await _finish(step, pending)
                if not run:
                    return chunks
                chunks += run
        except StopAsyncIteration:
            self.ended = True
            return chunks
        finally:
            self.waited += time.perf_counter() - t0

    def _run_while_waiting(self, pending: Any) -> None:
        work, self._while_waiting = self._while_waiting, None
        assert work is not None
        t0 = time.perf_counter()
        work()
        if pending is None or pending.done():  # the backend was ready first: the work delayed it
            self.waited -= time.perf_counter() - t0

    async def aclose(self) -> None:
        """Release the stream (and the upstream behind it), also when a step is still pending."""
        step, pending = self._step, self._pending
        self._step = self._pending = None
        if step is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await _finish(step, pending, throw=asyncio.CancelledError())
        await self._stream.aclose()
