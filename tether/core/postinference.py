"""Post-inference work (usage ledger, store write), off the turn's critical path.

A finished turn hands its record to this worker and answers the client at once; the write
overlaps with the client's next turn. Guarantees:
- never lost while the process lives: failed writes are retried with backoff, and `flush()`
  (called on shutdown) waits for everything queued;
- read-your-writes: a store read for a response whose write is still queued (for example a
  continuation of it from another connection) first waits for that write (`wait_durable`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from tether.store.base import ResponseRecord, Store, UsageRecord

log = logging.getLogger("tether.post")


@dataclass
class PostJob:
    usage: UsageRecord | None
    record: ResponseRecord | None  # None for store=false: nothing reaches the store


class PostInference:
    def __init__(self, store: Store, *, workers: int = 2, max_attempts: int = 8, on_done=None) -> None:
        self._store = store
        self._queue: asyncio.Queue[tuple[PostJob, asyncio.Future]] = asyncio.Queue()
        self._pending: dict[tuple[str, str], asyncio.Future] = {}
        self._tasks = [asyncio.create_task(self._run(), name=f"tether-post-{i}") for i in range(workers)]
        self._max_attempts = max_attempts
        self._on_done = on_done  # callback(seconds) for the post-inference stage timer
        self.completed = 0
        self.failed = 0

    def submit(self, job: PostJob) -> None:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        if job.record is not None:
            key = (job.record.tenant, job.record.response.id)
            self._pending[key] = fut
            fut.add_done_callback(lambda _f, key=key: self._pending.pop(key, None))
        self._queue.put_nowait((job, fut))

    async def write_now(self, job: PostJob) -> None:
        """Write on the caller's path (store_durability = "before_terminal"); same retries."""
        started = time.perf_counter()
        try:
            await self._write(job)
            self.completed += 1
        finally:
            if self._on_done is not None:
                self._on_done(time.perf_counter() - started)

    async def wait_durable(self, tenant: str, response_id: str) -> None:
        fut = self._pending.get((tenant, response_id))
        if fut is not None:
            await asyncio.shield(fut)

    async def flush(self) -> None:
        await self._queue.join()

    async def aclose(self) -> None:
        await self.flush()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            job, fut = await self._queue.get()
            started = time.perf_counter()
            try:
                await self._write(job)
                self.completed += 1
            except Exception:  # noqa: BLE001 - logged; the job is counted as failed, never silently
                self.failed += 1
                log.exception("post-inference write failed permanently")
            finally:
                if not fut.done():
                    fut.set_result(None)
                self._queue.task_done()
                if self._on_done is not None:
                    self._on_done(time.perf_counter() - started)

    async def _write(self, job: PostJob) -> None:
        delay = 0.05
        for attempt in range(1, self._max_attempts + 1):
            try:
                if job.record is not None:
                    await self._store.put_response(job.record)
                if job.usage is not None:
                    await self._store.record_usage(job.usage)
                return
            except Exception:  # noqa: BLE001 - transient store errors are retried
                if attempt == self._max_attempts:
                    raise
                log.warning("post-inference write failed (attempt %d), retrying", attempt)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
