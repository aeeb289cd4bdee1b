"""The shared side of response runs, for replicas that share a Redis or PostgreSQL store.

A run (`tether.core.run`) lives in the process that runs it; with a shared store its events,
its state and a cancel signal also go through that store's engine, so any replica answers
retrieve, resume and cancel for any run (docs/background.md, "Many replicas"). This module is
the contract; one file per engine implements it on the engine's own primitives:

* `redis_runs.py`: a Stream per run (XADD with MAXLEN, XREAD BLOCK), a hash for its state,
  pub/sub for cancels, a key with a TTL per replica for its heartbeat.
* `postgres_runs.py`: tables `runs`, `run_events` and `run_replicas`, LISTEN/NOTIFY for new
  events and cancels.

SQLite and memory stores have no bus: their runs stay in one process (`tether.core.run.Runs`).

Ownership carries a fencing token, the run's **epoch**: its creator publishes with epoch 1; a
replica that takes a queued run over (`claim`) or ends an orphan (`fail_orphan`) raises it, in
the same atomic write. A `publish` whose epoch is not the run's, or to a run already final, is
refused in that write and changes nothing; the response's store write carries the same token
(`ResponseRecord.epoch`, `tether.store.base`), so an owner that was paused past
`run_orphan_after_s` and wakes up can neither append events, nor change the state, nor store a
response that another replica already ended.

Everything here is bytes and plain values (serialized `ServerEvent`s and `Response`s); the core
(`tether.core.shared_runs`) decides what they mean. Sequence numbers are the run's own
(`sequence_number`), so a reader asks for "the events above N" on every engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

FINAL_STATES = frozenset({"completed", "incomplete", "failed", "cancelled"})


@dataclass(frozen=True)
class RunInfo:
    """A run as the shared store has it."""

    owner: str  # the replica running it
    state: str  # a `RunState` value
    response: bytes  # the serialized Response as it stands
    next_seq: int  # the number its next event would get
    owner_alive: bool  # the owner heartbeated within `run_orphan_after_s`


@dataclass(frozen=True)
class Claimed:
    """A queued run taken over from a dead replica (`RunBus.claim`)."""

    tenant: str
    run_id: str
    params: bytes  # serialized ResponseCreateParams
    response: bytes  # serialized Response (queued)
    epoch: int  # the run's fencing token, raised by the claim: the new owner's


class RunBus(Protocol):
    """A run's shared side on one store engine (see the module docstring)."""

    replica: str  # this process's replica id (owner of the runs it runs)

    async def start(self, on_cancel: Callable[[str, str], None]) -> None:
        """Heartbeat this replica and call `on_cancel(tenant, run_id)` for every cancel any
        replica asks (the owner acts on those of its runs)."""
        ...

    async def close(self) -> None: ...

    async def publish(self, tenant: str, run_id: str, events: Sequence[tuple[int, bytes]], *, state: str,
                      response: bytes | None, next_seq: int, epoch: int, params: bytes | None = None) -> bool:  # fmt: skip
        """Append `events` ((sequence number, serialized ServerEvent), in order) to the run's log
        and set its state (and Response, when given), in one write; create the run when new (with
        `epoch`). A final state starts the log's retention. Returns False, having changed
        nothing, when the run is already final or its epoch is not `epoch` (fenced). `params`
        (a queued background run's serialized ResponseCreateParams) lets another replica take
        the run over (`claim`) when this one dies before running it."""
        ...

    async def claim(self, limit: int) -> list[Claimed]:
        """Take over at most `limit` queued runs whose owner stopped heartbeating: each becomes
        this replica's, atomically (one replica gets it, its epoch raised), with what it needs to
        run."""
        ...

    async def info(self, tenant: str, run_id: str) -> RunInfo | None:
        """The run's state, or None when the store has no such run (never, or expired)."""
        ...

    async def read(self, tenant: str, run_id: str, after: int, block_s: float) -> list[tuple[int, bytes]]:
        """The events numbered above `after`, in order; waits at most `block_s` for one when there
        is none yet. The log is bounded: a first event numbered past `after + 1` means the ones
        between were dropped."""
        ...

    async def cancel(self, tenant: str, run_id: str) -> None:
        """Ask the run's owner to cancel it."""
        ...

    async def fail_orphan(self, tenant: str, run_id: str, next_seq: int, event: bytes, response: bytes) -> bool:
        """End a run whose owner died: atomically, when it is not final and its next number is
        still `next_seq`, append `event` as number `next_seq`, mark it failed with `response` and
        raise its epoch (the old owner is fenced off). Returns whether it did."""
        ...
