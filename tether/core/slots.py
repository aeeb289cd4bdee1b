"""Background slots shared fairly between API keys.

`max_background_running` background responses run at once per process; the rest wait
`queued`. One key alone may hold at most `per_key` of those slots (`Limits.background_key_share`
of them, at least one), so a tenant with many long runs leaves slots free for the others; and
when a slot frees, it goes to the waiting run of the key that holds the fewest slots (the
earliest of those first), so a queued run of another key starts at the next slot turnover at
the latest, however many runs the first key has waiting.

`FairSlots` is the sans-I/O part (who gets the next slot: `take`, `release`, `next_grant`),
tested without a loop; `BackgroundSlots` wraps it with one future per waiter.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


def per_key_cap(running: int, share: float) -> int:
    """How many of `running` slots one key may hold: `share` of them, at least one."""
    return max(1, min(running, int(running * share)))


class FairSlots:
    """Slot accounting and the order waiters are served in (no I/O: the caller parks waiters)."""

    def __init__(self, total: int, per_key: int) -> None:
        self.total = max(1, total)
        self.per_key = max(1, min(per_key, self.total))
        self.running: Counter[str] = Counter()
        self.in_use = 0
        self._waiting: dict[str, deque[int]] = {}  # key -> its waiters' tickets, oldest first
        self._tickets = itertools.count()

    @property
    def has_waiters(self) -> bool:
        return bool(self._waiting)

    def can_take(self, key: str) -> bool:
        return self.in_use < self.total and self.running[key] < self.per_key

    def take(self, key: str) -> None:
        self.in_use += 1
        self.running[key] += 1

    def release(self, key: str) -> None:
        self.in_use -= 1
        left = self.running[key] - 1
        if left > 0:
            self.running[key] = left
        else:
            del self.running[key]

    def wait(self, key: str) -> int:
        """Queue a waiter of `key`; its ticket."""
        ticket = next(self._tickets)
        self._waiting.setdefault(key, deque()).append(ticket)
        return ticket

    def leave(self, key: str, ticket: int) -> None:
        """A waiter gave up (cancelled) before it was granted."""
        queue = self._waiting.get(key)
        if queue is not None and ticket in queue:
            queue.remove(ticket)
            if not queue:
                del self._waiting[key]

    def next_grant(self) -> tuple[str, int] | None:
        """The waiter that gets a free slot now (taken for it), or None: among the keys below
        their cap, the one holding the fewest slots, then the one waiting longest."""
        if self.in_use >= self.total:
            return None
        best: tuple[int, int, str] | None = None
        for key, queue in self._waiting.items():
            held = self.running[key]
            if held < self.per_key and (best is None or (held, queue[0]) < best[:2]):
                best = (held, queue[0], key)
        if best is None:
            return None
        _, ticket, key = best
        queue = self._waiting[key]
        queue.popleft()
        if not queue:
            del self._waiting[key]
        self.take(key)
        return key, ticket


class BackgroundSlots:
    """`FairSlots` for tasks: `async with slots.hold(key):` runs once a slot is granted."""

    def __init__(self, total: int, per_key: int) -> None:
        self.fair = FairSlots(total, per_key)
        self._futures: dict[int, asyncio.Future[None]] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        fair = self.fair
        if not fair.has_waiters and fair.can_take(key):
            fair.take(key)
        else:
            ticket = fair.wait(key)
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._futures[ticket] = future
            self._grant()  # a slot may be free for this key although others wait at their cap
            try:
                await future
            except asyncio.CancelledError:
                if self._futures.pop(ticket, None) is not None:
                    fair.leave(key, ticket)
                elif not future.cancelled():  # granted, then cancelled before it ran
                    self._release(key)
                raise
        try:
            yield
        finally:
            self._release(key)

    def _release(self, key: str) -> None:
        self.fair.release(key)
        self._grant()

    def _grant(self) -> None:
        while (granted := self.fair.next_grant()) is not None:
            key, ticket = granted
            future = self._futures.pop(ticket)
            if future.cancelled():  # its task was cancelled and has not run its handler yet
                self.fair.release(key)
                continue
            future.set_result(None)
