"""Post-inference work (usage ledger, store write), off the turn's critical path.

A finished turn hands its record to this worker and answers the client at once; the write
overlaps with the client's next turn. Guarantees:
- a completed store=true response is stored and billed, even when a response it continues is
  deleted while it runs: the store then refuses the write (`MissingItemError`: a referenced item
  is gone), and the job is written once more carrying every item it references, from the chain
  the session holds in memory (`PostJob.self_contained`). The deletion removed the parent's
  response row; the items live on under the child, as they do when the child was stored first
  (docs/reliability.md, "Deleting a response that is being continued");
- transient store errors (connection, timeout, a locked database: `is_transient`) are retried
  with backoff; anything else fails the job at once (logged, counted in
  `tether_post_inference_failures_total{reason="permanent"}`), never retried;
- a job waiting for its next attempt holds no worker: it is put back on the queue when its delay
  ends, so one tenant's failing writes cannot delay another tenant's;
- `flush()` (called on shutdown) waits for everything submitted, retries included;
- read-your-writes: a store read for a response whose write is still queued (for example a
  continuation of it from another connection) first waits for that write (`wait_durable`);
- a finished turn's bookkeeping after its terminal event (`after_terminal`: tokenising the output
  for the connection cache, building this job) runs one turn per event-loop iteration, and runs
  even when the connection closes right after the terminal event (see `after_terminal`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tether.core.chain import Node
from tether.store._common import FencedWrite, MissingItemError, is_transient
from tether.store.base import KeyedItem, ResponseRecord, Store, UsageRecord

log = logging.getLogger("tether.post")


@dataclass(frozen=True)
class Failed:
    """An attempt that failed for good (already logged and counted)."""

    error: Exception


@dataclass
class PostJob:
    usage: UsageRecord | None
    record: ResponseRecord | None  # None for store=false: nothing reaches the store
    context: Node | None = None  # the record's whole chain (input + output), held until written

    def self_contained(self) -> PostJob:
        """The same job, its record carrying every item it references (the store skips the ones
        it has): what is written when a referenced item was deleted meanwhile."""
        assert self.record is not None and self.context is not None
        items = [KeyedItem(s.key, s.item) for s in self.context.all_segments()]
        return dataclasses.replace(
            self, record=dataclasses.replace(self.record, new_items=items), context=None
        )


class PostInference:
    """`on_done(seconds)` times each finished job; `on_failure(reason)` counts a failed attempt:
    "retried" (transient, tried again), "repaired" (a referenced item was gone, written again
    self-contained), "fenced" (the response was already ended by another replica, which took
    over from this one: not stored, `tether.store.base.ResponseRecord.epoch`), "permanent" (given
    up: the response is not stored)."""

    def __init__(
        self,
        store: Store,
        *,
        workers: int = 2,
        max_attempts: int = 8,
        on_done: Callable[[float], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._queue: asyncio.Queue[tuple[PostJob, asyncio.Future, int]] = asyncio.Queue()
        self._pending: dict[tuple[str, str], asyncio.Future] = {}
        self._tasks = [asyncio.create_task(self._run(), name=f"tether-post-{i}") for i in range(workers)]
        self._paced: deque[tuple[Callable[[], None], asyncio.Future]] = deque()
        self._paced_ready = asyncio.Event()
        self._tasks.append(asyncio.create_task(self._run_paced(), name="tether-post-paced"))
        self._max_attempts = max_attempts
        self._on_done = on_done
        self._on_failure = on_failure
        self._outstanding = 0  # submitted, not finished (queued, being written or waiting to retry)
        self._idle = asyncio.Event()
        self._idle.set()
        self.completed = 0
        self.failed = 0

    def submit(self, job: PostJob) -> None:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        if job.record is not None:
            key = (job.record.tenant, job.record.response.id)
            self._pending[key] = fut
            fut.add_done_callback(lambda _f, key=key: self._pending.pop(key, None))  # type: ignore[misc]  # mypy infers no lambda with a default
        self._started_one()
        self._queue.put_nowait((job, fut, 1))

    async def after_terminal(self, work: Callable[[], None]) -> None:
        """Run a finished turn's bookkeeping (`work`, synchronous CPU work) after its terminal
        event, paced: one `work` per event-loop iteration, in the order they came.

        Why paced: turns that end together (streams started together end within milliseconds)
        each tokenise their output for the connection cache, ~0.4 ms per 4,000 tokens. Run back
        to back in one iteration, 100 of them stalled the loop for ~70 ms, and every other
        stream's model ticks, writes and terminal events waited behind them. Why here: the work
        must happen even if the caller is cancelled (the client closing its connection right
        after the terminal event would otherwise lose the store write), and `flush()` on
        shutdown waits for it like for the writes it submits. Raises what `work` raised."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._started_one()
        self._paced.append((work, fut))
        self._paced_ready.set()
        await asyncio.shield(fut)

    async def write_now(self, job: PostJob) -> None:
        """Write on the caller's path (store_durability = "before_terminal"); same error policy,
        the retries waited out here (this caller's own turn)."""
        started = time.perf_counter()
        attempt = 1
        try:
            while True:
                outcome = await self._attempt(job, attempt)
                if isinstance(outcome, PostJob):
                    job = outcome
                elif isinstance(outcome, float):
                    attempt += 1
                    await asyncio.sleep(outcome)
                elif isinstance(outcome, Failed):
                    raise outcome.error
                else:
                    self.completed += 1
                    return
        finally:
            if self._on_done is not None:
                self._on_done(time.perf_counter() - started)

    async def wait_durable(self, tenant: str, response_id: str) -> None:
        fut = self._pending.get((tenant, response_id))
        if fut is not None:
            await asyncio.shield(fut)

    async def flush(self) -> None:
        await self._idle.wait()

    async def aclose(self) -> None:
        await self.flush()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            job, fut, attempt = await self._queue.get()
            started = time.perf_counter()
            try:
                outcome = await self._attempt(job, attempt)
                while isinstance(outcome, PostJob):
                    job = outcome
                    outcome = await self._attempt(job, attempt)
            finally:
                self._queue.task_done()
                if self._on_done is not None:
                    self._on_done(time.perf_counter() - started)
            if isinstance(outcome, float):  # back on the queue after the delay; no worker waits
                loop.call_later(outcome, self._queue.put_nowait, (job, fut, attempt + 1))
                continue
            if outcome is None:
                self.completed += 1
            if not fut.done():
                fut.set_result(None)
            self._finished_one()

    async def _run_paced(self) -> None:
        paced = self._paced
        while True:
            if not paced:
                self._paced_ready.clear()
                await self._paced_ready.wait()
            work, fut = paced.popleft()
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - raised where the caller waits (or, if it was
                fut.set_exception(exc)  # cancelled meanwhile, logged by asyncio as never retrieved)
            else:
                fut.set_result(None)
            finally:
                self._finished_one()
            await asyncio.sleep(0)  # the next one in the next iteration: timers and writers first

    def _started_one(self) -> None:
        self._outstanding += 1
        self._idle.clear()

    def _finished_one(self) -> None:
        """A submitted job or paced work is done (written, given up, or run): `flush()` may end."""
        self._outstanding -= 1
        if not self._outstanding:
            self._idle.set()

    async def _attempt(self, job: PostJob, attempt: int) -> PostJob | float | Failed | None:
        """One write. None: written; `Failed`: given up (logged and counted); a float: a
        transient error, try again after that many seconds; a PostJob: write that one now."""
        try:
            if job.record is not None:
                await self._store.put_response(job.record)
            if job.usage is not None:
                await self._store.record_usage(job.usage)
            return None
        except FencedWrite as exc:
            # Another replica ended this run for an owner it took for dead (this one, paused):
            # the response it stored is final. The tokens were spent all the same: the ledger
            # line is still written.
            self._count("fenced")
            log.warning("a response write was refused: another replica ended the response",
                        extra={"response_id": exc.response_id})  # fmt: skip
            return dataclasses.replace(job, record=None, context=None) if job.usage is not None else None
        except MissingItemError as exc:
            if job.context is not None:
                self._count("repaired")
                log.info("a referenced item was deleted meanwhile; writing the response self-contained",
                         extra={"response_id": exc.response_id})  # fmt: skip
                return job.self_contained()
            return self._give_up(job, exc)
        except Exception as exc:  # noqa: BLE001 - classified: transient ones are retried, others fail
            if is_transient(exc) and attempt < self._max_attempts:
                self._count("retried")
                log.warning("post-inference write failed (attempt %d), retrying: %s", attempt, exc)
                return min(0.05 * 2 ** (attempt - 1), 2.0)
            return self._give_up(job, exc)

    def _give_up(self, job: PostJob, exc: Exception) -> Failed:
        self.failed += 1
        self._count("permanent")
        rid = job.record.response.id if job.record is not None else job.usage.response_id if job.usage else ""
        log.error("post-inference write failed permanently: %s: %s", type(exc).__name__, exc,
                  extra={"response_id": rid})  # fmt: skip
        return Failed(exc)

    def _count(self, reason: str) -> None:
        if self._on_failure is not None:
            self._on_failure(reason)
