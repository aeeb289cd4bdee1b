"""The run bus on PostgreSQL (`tether.store.runbus`), on the store's pool and schema.

Tables (`migrations/postgres/0004_runs.sql`):

* `runs(tenant, id, owner, epoch, state, response, next_seq, expires_at, params)`: a run's state
  and its Response as it stands; `epoch` is the owner's fencing token (raised by a takeover and by
  an orphan's ending; a write with another epoch changes nothing, and the store's
  `put_response` refuses a response write with a lower one); `params`, for a queued background
  run, lets a replica with capacity take it over when its owner's heartbeat is gone (`claim`:
  `FOR UPDATE SKIP LOCKED`, so one replica gets it).
* `run_events(tenant, run_id, seq, event)`: its serialized events by sequence number; at most
  `replay_max_events` of them (older ones are deleted as it passes multiples of 256 beyond) and
  about `replay_max_bytes` of them (the owner counts what it published since the last trim; past
  a quarter of the bound, the oldest events go until the rest, this batch included, fit it).
* `run_replicas(id, seen_at)`: each replica's heartbeat, written every third of
  `run_orphan_after_s`; a replica not seen for that long is gone.

LISTEN/NOTIFY, on one channel per schema (`tether_runs:<schema>`): `e<tenant>\\x1f<id>` when a
run has new events (followers waiting in `read` wake at once) and `c<tenant>\\x1f<id>` for a
cancel (the owner acts). Every replica holds one listening connection besides the pool.

A published batch is one statement (the run's row upserted unless already final, its events
inserted, old ones trimmed, the notification sent, in one round trip and one transaction). A run
expires `replay_retention_s` after it ends and at the latest `live_ttl_s` after its last write
while it runs; the heartbeat deletes expired runs and their events now and then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from .runbus import Claimed, RunInfo

log = logging.getLogger("tether.store.postgres_runs")

_FINAL = "('completed', 'incomplete', 'failed', 'cancelled')"
_TRIM_EVERY = 256

_PUBLISH = f"""
WITH up AS (
  INSERT INTO runs AS r (tenant, id, owner, state, response, next_seq, expires_at, params, epoch)
  VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7), $14, $18)
  ON CONFLICT (tenant, id) DO UPDATE SET
    owner = excluded.owner, state = excluded.state, response = coalesce(excluded.response, r.response),
    next_seq = excluded.next_seq, expires_at = excluded.expires_at, params = CASE WHEN excluded.state = 'queued' THEN coalesce(excluded.params, r.params) END
  WHERE r.state NOT IN {_FINAL} AND r.epoch = excluded.epoch
  RETURNING 1),
ev AS (
  INSERT INTO run_events (tenant, run_id, seq, event)
  SELECT $1, $2, s, e FROM unnest($8::bigint[], $9::bytea[]) AS t(s, e) WHERE EXISTS (SELECT 1 FROM up)
  ON CONFLICT DO NOTHING
  RETURNING 1),
trimmed AS (
  DELETE FROM run_events d WHERE d.tenant = $1 AND d.run_id = $2 AND (
    ($10 AND d.seq < $6 - $11)
    OR ($16 AND d.seq <= (SELECT coalesce(max(t.seq), -1) FROM (
          SELECT seq, sum(length(event)) OVER (ORDER BY seq DESC) AS tail
            FROM run_events WHERE tenant = $1 AND run_id = $2) AS t
         WHERE t.tail > $15::bigint - $17::bigint)))
  RETURNING 1)
SELECT pg_notify($12, $13) FROM up
"""

_INFO = """
SELECT r.owner, r.state, r.response, r.next_seq,
       coalesce((SELECT p.seen_at > now() - make_interval(secs => $3) FROM run_replicas p WHERE p.id = r.owner), false)
  FROM runs r WHERE r.tenant = $1 AND r.id = $2 AND r.expires_at > now()
"""

_ORPHAN = f"""
WITH up AS (
  UPDATE runs SET state = 'failed', response = $4, next_seq = $3 + 1, expires_at = now() + make_interval(secs => $5),
                  epoch = epoch + 1
   WHERE tenant = $1 AND id = $2 AND next_seq = $3 AND state NOT IN {_FINAL}
  RETURNING 1),
ev AS (
  INSERT INTO run_events (tenant, run_id, seq, event) SELECT $1, $2, $3, $6 FROM up
  ON CONFLICT DO NOTHING
  RETURNING 1)
SELECT pg_notify($7, $8) FROM up
"""

_CLAIM = """
UPDATE runs SET owner = $1, epoch = runs.epoch + 1
 WHERE (tenant, id) IN (
   SELECT r.tenant, r.id FROM runs r
    WHERE r.state = 'queued' AND r.params IS NOT NULL AND r.expires_at > now()
      AND NOT EXISTS (SELECT 1 FROM run_replicas p
                       WHERE p.id = r.owner AND p.seen_at > now() - make_interval(secs => $3))
    ORDER BY r.expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
RETURNING tenant, id, params, response, epoch
"""

_SWEEP = """
WITH gone AS (DELETE FROM runs WHERE expires_at < now() RETURNING tenant, id)
DELETE FROM run_events e USING gone WHERE e.tenant = gone.tenant AND e.run_id = gone.id
"""


class PostgresRunBus:
    def __init__(self, store: Any, *, orphan_after_s: float, max_events: int, retention_s: float,
                 live_ttl_s: float, max_bytes: int = 1 << 62, replica: str | None = None) -> None:  # fmt: skip
        self.store = store  # a PostgresStore, open
        self.replica = replica or secrets.token_hex(8)
        self.orphan_after_s = float(orphan_after_s)
        self.max_events = max(1, max_events)
        self.max_bytes = max(1, max_bytes)
        # Bytes each run of this replica published since its log was last trimmed by size.
        self._untrimmed: dict[tuple[str, str], int] = {}
        self.retention_s = float(max(1.0, retention_s))
        self.live_ttl_s = float(max(self.retention_s, live_ttl_s))
        self.channel = f"tether_runs:{store.schema or ''}"[:63]
        self._listener: asyncpg.Connection | None = None
        self._on_cancel: Callable[[str, str], None] = lambda tenant, run_id: None
        self._waiters: dict[tuple[str, str], set[asyncio.Future]] = {}
        self._task: asyncio.Task | None = None

    @property
    def _pool(self) -> asyncpg.Pool:
        return self.store.pool

    # -- lifetime ----------------------------------------------------------------------------

    async def start(self, on_cancel: Callable[[str, str], None]) -> None:
        self._on_cancel = on_cancel
        await self._beat()
        await self._listen()
        self._task = asyncio.create_task(self._heartbeat(), name="tether-run-heartbeat")

    async def _listen(self) -> None:
        settings = {"search_path": f'"{self.store.schema}"'} if self.store.schema else {}
        conn = await asyncpg.connect(self.store.dsn, server_settings=settings)
        await conn.add_listener(self.channel, self._notified)
        self._listener = conn

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
            self._listener = None
        with contextlib.suppress(Exception):  # a clean stop is no orphan: its runs ended first
            await self._pool.execute("DELETE FROM run_replicas WHERE id = $1", self.replica)

    async def _beat(self) -> None:
        await self._pool.execute(
            "INSERT INTO run_replicas (id, seen_at) VALUES ($1, now()) ON CONFLICT (id) DO UPDATE SET seen_at = now()",
            self.replica,
        )

    async def _heartbeat(self) -> None:
        beats = 0
        while True:
            await asyncio.sleep(self.orphan_after_s / 3)
            beats += 1
            try:
                await self._beat()
                if self._listener is None or self._listener.is_closed():  # the server restarted
                    await self._listen()
                if beats % 64 == 0:
                    await self._pool.execute(_SWEEP)
                    await self._pool.execute("DELETE FROM run_replicas WHERE seen_at < now() - interval '1 day'")
            except Exception as exc:  # noqa: BLE001 - PostgreSQL away: try again next beat
                log.warning("run heartbeat failed: %s", exc)

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        kind, tenant, _, run_id = payload[0], *payload[1:].partition("\x1f")
        if kind == "e":
            for future in self._waiters.pop((tenant, run_id), ()):
                if not future.done():
                    future.set_result(None)
        elif kind == "c":
            self._on_cancel(tenant, run_id)

    # -- the bus -----------------------------------------------------------------------------

    async def publish(self, tenant: str, run_id: str, events: Sequence[tuple[int, bytes]], *, state: str,
                      response: bytes | None, next_seq: int, epoch: int, params: bytes | None = None) -> bool:  # fmt: skip
        final = state in ("completed", "incomplete", "failed", "cancelled")
        start = events[0][0] if events else next_seq
        trim = next_seq > self.max_events and (next_seq // _TRIM_EVERY) != (start // _TRIM_EVERY)
        key = (tenant, run_id)
        added = sum(len(e) for _, e in events)
        untrimmed = self._untrimmed.get(key, 0) + added
        trim_bytes = untrimmed > self.max_bytes // 4
        if final:
            self._untrimmed.pop(key, None)
        else:
            self._untrimmed[key] = 0 if trim_bytes else untrimmed
        rows = await self._pool.fetch(
            _PUBLISH, tenant, run_id, self.replica, state, response, next_seq,
            self.retention_s if final else self.live_ttl_s,
            [s for s, _ in events], [e for _, e in events], trim, self.max_events,
            self.channel, f"e{tenant}\x1f{run_id}", params, self.max_bytes, trim_bytes, added, epoch,
        )  # fmt: skip
        return len(rows) == 1

    async def claim(self, limit: int) -> list[Claimed]:
        if limit <= 0:
            return []
        rows = await self._pool.fetch(_CLAIM, self.replica, limit, self.orphan_after_s)
        return [Claimed(tenant, run_id, bytes(params), bytes(response or b""), epoch)
                for tenant, run_id, params, response, epoch in rows]  # fmt: skip

    async def info(self, tenant: str, run_id: str) -> RunInfo | None:
        row = await self._pool.fetchrow(_INFO, tenant, run_id, self.orphan_after_s)
        if row is None:
            return None
        owner, state, response, next_seq, alive = row
        return RunInfo(owner=owner, state=state, response=bytes(response or b""), next_seq=next_seq,
                       owner_alive=bool(alive))  # fmt: skip

    async def _fetch(self, tenant: str, run_id: str, after: int) -> list[tuple[int, bytes]]:
        rows = await self._pool.fetch(
            "SELECT seq, event FROM run_events WHERE tenant = $1 AND run_id = $2 AND seq > $3 ORDER BY seq LIMIT 1000",
            tenant, run_id, after,
        )  # fmt: skip
        return [(seq, bytes(event)) for seq, event in rows]

    async def read(self, tenant: str, run_id: str, after: int, block_s: float) -> list[tuple[int, bytes]]:
        if block_s <= 0:
            return await self._fetch(tenant, run_id, after)
        key = (tenant, run_id)
        future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, set()).add(future)  # before the read: a NOTIFY in between wakes it
        try:
            rows = await self._fetch(tenant, run_id, after)
            if rows:
                return rows
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, block_s)
            return await self._fetch(tenant, run_id, after)
        finally:
            waiting = self._waiters.get(key)
            if waiting is not None:
                waiting.discard(future)
                if not waiting:
                    del self._waiters[key]

    async def cancel(self, tenant: str, run_id: str) -> None:
        await self._pool.execute("SELECT pg_notify($1, $2)", self.channel, f"c{tenant}\x1f{run_id}")

    async def fail_orphan(self, tenant: str, run_id: str, next_seq: int, event: bytes, response: bytes) -> bool:
        rows = await self._pool.fetch(_ORPHAN, tenant, run_id, next_seq, response, self.retention_s, event,
                                      self.channel, f"e{tenant}\x1f{run_id}")  # fmt: skip
        return len(rows) == 1
