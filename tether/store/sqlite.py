"""The embedded default store: one SQLite file (`store = "sqlite://tether-data/tether.db"`).

Runtime model
-------------
stdlib `sqlite3`, one connection, used only by one dedicated worker thread (a single-worker
executor). Every call, read or write, runs on that thread in arrival order, so the event loop
never blocks on disk and the connection is never shared across threads. Protos are serialized
and parsed on the worker too.

The file is opened in WAL mode (`journal_mode=WAL`, `synchronous=NORMAL`, `busy_timeout`), so
several processes on one machine can share it: readers never block the writer, and writers take
the lock up front (`BEGIN IMMEDIATE`) and wait up to `busy_timeout_ms` for one another instead of
failing on a lock upgrade. (WAL needs a local file system: not NFS.)

Schema
------
* `items(tenant, key, item_id, item)`: each item once; `item` is the serialized Item proto,
  `item_id` its API-visible id (for `list_input_items` paging).
* `responses(tenant, id, response, created_at, conversation_tokens, stored_at, replica)`: the
  final Response proto, and the backend-pool replica that served it (migration 2).
* `response_items(tenant, response_id, kind, position, item_key)`: the ordered key lists, kind
  0 = effective input, 1 = output. A table rather than a JSON array column because:
  hydration is then one indexed range scan joined to `items` (ordered by kind, position) in a
  single SELECT; `list_input_items` pages by position in SQL instead of decoding a whole array;
  and deletion can ask "does any other response still reference this key?" through the
  `(tenant, item_key)` index, where a JSON column would need a scan of every response of the
  tenant. The cost is one small row per (response, key), the same O(n) per response a JSON
  array would take in bytes.
* `usage(tenant, response_id, ...)`, PRIMARY KEY (tenant, response_id): `INSERT OR IGNORE`
  makes a duplicate record a no-op; rowid order is insertion order.
* `schema_version(version, applied_at)`: forward-only migrations (`MIGRATIONS` below, SQL kept in
  this module so the default engine needs no package data), applied by `open()` inside one
  `BEGIN IMMEDIATE` transaction, so processes opening the file at once do not race.

`put_response` is one `BEGIN IMMEDIATE` transaction: insert the new items (`INSERT OR IGNORE`:
existing keys win), replace the response's key rows, check every referenced key exists (else
MissingItemError and a rollback), upsert the response row, and collect items that a replaced
version referenced and nothing references any more. `delete_response` deletes the row and its
key rows, then the items no remaining response of the tenant references (index probes).

`load_context` is exactly one SELECT (a UNION ALL of the response row and the joined item rows),
whatever the chain length. Tests count statements with `set_trace()` (sqlite3's trace callback).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tether.responses.v1 import items_pb2, response_pb2, service_pb2

from ._common import FencedWrite, MissingItemError, check_page_args, item_api_id, usage_to_row
from .base import Hydrated, ItemPage, KeyedItem, ResponseRecord, UsageRecord

R = TypeVar("R")

INPUT, OUTPUT = 0, 1

# Forward-only migrations: (version, statements). Never edit a shipped entry; append a new one.
MIGRATIONS: list[tuple[int, tuple[str, ...]]] = [
    (
        1,
        (
            """CREATE TABLE items (
                tenant  TEXT NOT NULL,
                key     TEXT NOT NULL,
                item_id TEXT NOT NULL DEFAULT '',
                item    BLOB NOT NULL,
                PRIMARY KEY (tenant, key)
            )""",
            """CREATE TABLE responses (
                tenant              TEXT NOT NULL,
                id                  TEXT NOT NULL,
                response            BLOB NOT NULL,
                created_at          INTEGER NOT NULL DEFAULT 0,
                conversation_tokens INTEGER NOT NULL DEFAULT 0,
                stored_at           REAL NOT NULL,
                PRIMARY KEY (tenant, id)
            )""",
            """CREATE TABLE response_items (
                tenant      TEXT NOT NULL,
                response_id TEXT NOT NULL,
                kind        INTEGER NOT NULL,
                position    INTEGER NOT NULL,
                item_key    TEXT NOT NULL,
                PRIMARY KEY (tenant, response_id, kind, position)
            ) WITHOUT ROWID""",
            "CREATE INDEX response_items_by_key ON response_items (tenant, item_key)",
            """CREATE TABLE usage (
                tenant           TEXT NOT NULL,
                response_id      TEXT NOT NULL,
                model            TEXT NOT NULL,
                backend          TEXT NOT NULL,
                input_tokens     INTEGER NOT NULL,
                cached_tokens    INTEGER NOT NULL,
                output_tokens    INTEGER NOT NULL,
                reasoning_tokens INTEGER NOT NULL,
                status           TEXT NOT NULL,
                created_at       REAL NOT NULL,
                PRIMARY KEY (tenant, response_id)
            )""",
        ),
    ),
    (2, ("ALTER TABLE responses ADD COLUMN replica TEXT NOT NULL DEFAULT ''",)),
    (
        3,
        (
            """CREATE TABLE conversations (
                tenant       TEXT NOT NULL,
                id           TEXT NOT NULL,
                conversation BLOB NOT NULL,
                PRIMARY KEY (tenant, id)
            )""",
            """CREATE TABLE conversation_items (
                tenant          TEXT NOT NULL,
                conversation_id TEXT NOT NULL,
                position        INTEGER NOT NULL,
                item_id         TEXT NOT NULL,
                item            BLOB NOT NULL,
                PRIMARY KEY (tenant, conversation_id, position)
            ) WITHOUT ROWID""",
        ),
    ),
    # The writer's fencing token (ResponseRecord.epoch): a write with a lower one is refused.
    (4, ("ALTER TABLE responses ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0",)),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]

_HYDRATE = """
SELECT -1 AS kind, 0 AS position, NULL AS key, response AS data, conversation_tokens AS tokens,
       replica
  FROM responses WHERE tenant = :tenant AND id = :rid
UNION ALL
SELECT ri.kind, ri.position, ri.item_key, i.item, NULL, NULL
  FROM response_items ri
  LEFT JOIN items i ON i.tenant = ri.tenant AND i.key = ri.item_key
 WHERE ri.tenant = :tenant AND ri.response_id = :rid
ORDER BY 1, 2
"""

# One statement per order: a marker row (does the response exist?) and the page (limit + 1 rows
# to tell has_more). The cursor is the first position, in listing order, whose item has the
# `after` id; an unknown cursor yields an empty page.
_PAGE = """
SELECT 0 AS marker, 0 AS pos, NULL AS data, NULL AS key
  FROM responses WHERE tenant = :tenant AND id = :rid
UNION ALL
SELECT * FROM (
  SELECT 1, ri.position, i.item, ri.item_key
    FROM response_items ri
    LEFT JOIN items i ON i.tenant = ri.tenant AND i.key = ri.item_key
   WHERE ri.tenant = :tenant AND ri.response_id = :rid AND ri.kind = 0
     AND (:after IS NULL OR ri.position {cmp} (
           SELECT {agg}(ri2.position)
             FROM response_items ri2
             JOIN items i2 ON i2.tenant = ri2.tenant AND i2.key = ri2.item_key
            WHERE ri2.tenant = :tenant AND ri2.response_id = :rid AND ri2.kind = 0
              AND i2.item_id = :after))
   ORDER BY ri.position {dir}
   LIMIT :limit)
ORDER BY 1, 2 {dir}
"""
_PAGE_SQL = {
    "asc": _PAGE.format(cmp=">", agg="min", dir="ASC"),
    "desc": _PAGE.format(cmp="<", agg="max", dir="DESC"),
}

# After a put wrote its response_items: a referenced key that names no stored item (the put then
# rolls back), so a response can never be stored with a dangling reference.
_MISSING = """
SELECT ri.item_key FROM response_items ri
 WHERE ri.tenant = ? AND ri.response_id = ?
   AND NOT EXISTS (SELECT 1 FROM items i WHERE i.tenant = ri.tenant AND i.key = ri.item_key)
 LIMIT 1
"""

_GC_ITEM = """
DELETE FROM items
 WHERE tenant = ? AND key = ?
   AND NOT EXISTS (SELECT 1 FROM response_items WHERE tenant = ? AND item_key = ?)
"""


class SqliteStore:
    def __init__(self, path: str, *, busy_timeout_ms: int = 5000) -> None:
        self.path = path
        self.busy_timeout_ms = int(busy_timeout_ms)
        self._conn: sqlite3.Connection | None = None
        self._executor: ThreadPoolExecutor | None = None

    # -- plumbing ------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., R], *args: Any) -> R:
        if self._executor is None:
            raise RuntimeError("SqliteStore is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("SqliteStore is not open")
        return self._conn

    def _write(self, fn: Callable[[sqlite3.Connection], R]) -> R:
        conn = self._db
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-sqlite")
        try:
            await self._run(self._open_sync)
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise

    def _open_sync(self) -> None:
        if self.path != ":memory:" and not self.path.startswith("file:"):
            parent = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(parent, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self.busy_timeout_ms / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._conn = conn
            self._write(self._migrate)
        except BaseException:
            self._conn = None
            conn.close()
            raise

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        current = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        if current > SCHEMA_VERSION:
            raise RuntimeError(
                f"SQLite store schema version {current} is newer than this Tether supports "
                f"({SCHEMA_VERSION}); upgrade Tether"
            )
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            for statement in statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, time.time())
            )

    async def close(self) -> None:
        executor = self._executor
        if executor is None:
            return
        try:
            await self._run(self._close_sync)
        finally:
            self._executor = None
            executor.shutdown(wait=False)

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def ping(self) -> bool:
        if self._executor is None:
            return False
        try:
            return await self._run(lambda: self._db.execute("SELECT 1").fetchone()[0] == 1)
        except Exception:
            return False

    async def set_trace(self, callback: Callable[[str], None] | None) -> None:
        """Call `callback(sql)` for every statement the connection runs (None removes it)."""
        await self._run(self._db.set_trace_callback, callback)

    async def schema_version(self) -> int:
        return await self._run(
            lambda: self._db.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
        )

    # -- responses -----------------------------------------------------------------------

    async def put_response(self, record: ResponseRecord) -> None:
        if not record.response.id:
            raise ValueError("response.id is empty")
        await self._run(self._write, lambda conn: self._put_sync(conn, record))

    @staticmethod
    def _put_sync(conn: sqlite3.Connection, record: ResponseRecord) -> None:
        tenant, rid = record.tenant, record.response.id
        fence = conn.execute("SELECT epoch FROM responses WHERE tenant = ? AND id = ?", (tenant, rid)).fetchone()
        if fence is not None and fence[0] > record.epoch:
            raise FencedWrite(tenant, rid, record.epoch)
        old_keys = {
            key
            for (key,) in conn.execute(
                "SELECT item_key FROM response_items WHERE tenant = ? AND response_id = ?", (tenant, rid)
            )
        }
        if old_keys:
            conn.execute("DELETE FROM response_items WHERE tenant = ? AND response_id = ?", (tenant, rid))
        if record.new_items:
            conn.executemany(
                "INSERT OR IGNORE INTO items (tenant, key, item_id, item) VALUES (?, ?, ?, ?)",
                [(tenant, k.key, item_api_id(k.item), k.item.SerializeToString()) for k in record.new_items],
            )
        rows = [(tenant, rid, INPUT, pos, key) for pos, key in enumerate(record.input_keys)]
        rows += [(tenant, rid, OUTPUT, pos, key) for pos, key in enumerate(record.output_keys)]
        if rows:
            conn.executemany(
                "INSERT INTO response_items (tenant, response_id, kind, position, item_key) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            missing = conn.execute(_MISSING, (tenant, rid)).fetchone()
            if missing is not None:
                raise MissingItemError(tenant, rid, missing[0])
        conn.execute(
            """INSERT INTO responses (tenant, id, response, created_at, conversation_tokens, stored_at, replica, epoch)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (tenant, id) DO UPDATE SET
                 response = excluded.response, created_at = excluded.created_at,
                 conversation_tokens = excluded.conversation_tokens, stored_at = excluded.stored_at,
                 replica = excluded.replica, epoch = excluded.epoch""",
            (
                tenant,
                rid,
                record.response.SerializeToString(),
                record.response.created_at,
                record.conversation_tokens,
                time.time(),
                record.replica,
                record.epoch,
            ),
        )
        dropped = old_keys - set(record.input_keys) - set(record.output_keys)
        if dropped:
            conn.executemany(_GC_ITEM, [(tenant, key, tenant, key) for key in dropped])

    async def get_response(self, tenant: str, response_id: str) -> response_pb2.Response | None:
        def read() -> response_pb2.Response | None:
            row = self._db.execute(
                "SELECT response FROM responses WHERE tenant = ? AND id = ?", (tenant, response_id)
            ).fetchone()
            return None if row is None else response_pb2.Response.FromString(row[0])

        return await self._run(read)

    async def load_context(self, tenant: str, response_id: str) -> Hydrated | None:
        def read() -> Hydrated | None:
            rows = self._db.execute(_HYDRATE, {"tenant": tenant, "rid": response_id}).fetchall()
            return _hydrate(rows, tenant, response_id)

        return await self._run(read)

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM responses WHERE tenant = ? AND id = ?", (tenant, response_id))
            if cur.rowcount == 0:
                return False
            keys = {
                key
                for (key,) in conn.execute(
                    "DELETE FROM response_items WHERE tenant = ? AND response_id = ? RETURNING item_key",
                    (tenant, response_id),
                )
            }
            if keys:
                conn.executemany(_GC_ITEM, [(tenant, key, tenant, key) for key in keys])
            return True

        return await self._run(self._write, delete)

    async def list_input_items(
        self, tenant: str, response_id: str, *, after: str | None, limit: int, order: str
    ) -> ItemPage | None:
        after = check_page_args(after, limit, order)
        params = {"tenant": tenant, "rid": response_id, "after": after, "limit": limit + 1}

        def read() -> ItemPage | None:
            rows = self._db.execute(_PAGE_SQL[order], params).fetchall()
            return _page(rows, tenant, response_id, limit)

        return await self._run(read)

    # -- usage ledger --------------------------------------------------------------------

    async def record_usage(self, record: UsageRecord) -> None:
        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                """INSERT OR IGNORE INTO usage (tenant, response_id, model, backend, input_tokens,
                     cached_tokens, output_tokens, reasoning_tokens, status, created_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                usage_to_row(record),
            )

        await self._run(self._write, insert)

    async def usage_records(self, tenant: str | None = None) -> list[UsageRecord]:
        def read() -> list[UsageRecord]:
            sql = (
                "SELECT tenant, response_id, model, backend, input_tokens, cached_tokens, output_tokens,"
                " reasoning_tokens, status, created_at FROM usage"
            )
            if tenant is None:
                rows = self._db.execute(sql + " ORDER BY rowid").fetchall()
            else:
                rows = self._db.execute(sql + " WHERE tenant = ? ORDER BY rowid", (tenant,)).fetchall()
            return [UsageRecord(*row) for row in rows]

        return await self._run(read)

    # -- conversations -------------------------------------------------------------------

    async def put_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> None:
        def upsert(conn: sqlite3.Connection) -> None:
            conn.execute(
                """INSERT INTO conversations (tenant, id, conversation) VALUES (?, ?, ?)
                   ON CONFLICT (tenant, id) DO UPDATE SET conversation = excluded.conversation""",
                (tenant, conversation.id, conversation.SerializeToString()),
            )

        await self._run(self._write, upsert)

    async def update_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> bool:
        def update(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE conversations SET conversation = ? WHERE tenant = ? AND id = ?",
                (conversation.SerializeToString(), tenant, conversation.id),
            )
            return cur.rowcount > 0

        return await self._run(self._write, update)

    async def get_conversation(self, tenant: str, conversation_id: str) -> service_pb2.Conversation | None:
        def read() -> service_pb2.Conversation | None:
            row = self._db.execute(
                "SELECT conversation FROM conversations WHERE tenant = ? AND id = ?", (tenant, conversation_id)
            ).fetchone()
            return None if row is None else service_pb2.Conversation.FromString(row[0])

        return await self._run(read)

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM conversations WHERE tenant = ? AND id = ?", (tenant, conversation_id))
            conn.execute(
                "DELETE FROM conversation_items WHERE tenant = ? AND conversation_id = ?", (tenant, conversation_id)
            )
            return cur.rowcount > 0

        return await self._run(self._write, delete)

    async def append_conversation_items(
        self, tenant: str, conversation_id: str, items: Sequence[items_pb2.Item]
    ) -> bool:
        def append(conn: sqlite3.Connection) -> bool:
            key = (tenant, conversation_id)
            if conn.execute("SELECT 1 FROM conversations WHERE tenant = ? AND id = ?", key).fetchone() is None:
                return False
            start = conn.execute(
                "SELECT coalesce(max(position), -1) + 1 FROM conversation_items WHERE tenant = ? AND conversation_id = ?",
                key,
            ).fetchone()[0]
            conn.executemany(
                "INSERT INTO conversation_items (tenant, conversation_id, position, item_id, item) VALUES (?, ?, ?, ?, ?)",
                [(*key, start + n, item_api_id(i), i.SerializeToString()) for n, i in enumerate(items)],
            )
            return True

        return await self._run(self._write, append)

    async def conversation_items(self, tenant: str, conversation_id: str) -> list[items_pb2.Item] | None:
        def read() -> list[items_pb2.Item] | None:
            rows = self._db.execute(
                """SELECT 0, NULL FROM conversations WHERE tenant = :t AND id = :c
                   UNION ALL
                   SELECT * FROM (SELECT 1, item FROM conversation_items
                                   WHERE tenant = :t AND conversation_id = :c ORDER BY position)""",
                {"t": tenant, "c": conversation_id},
            ).fetchall()
            if not rows or rows[0][0] != 0:
                return None
            return [items_pb2.Item.FromString(data) for _, data in rows[1:]]

        return await self._run(read)

    async def delete_conversation_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "DELETE FROM conversation_items WHERE tenant = ? AND conversation_id = ? AND item_id = ?",
                (tenant, conversation_id, item_id),
            )
            return cur.rowcount > 0

        return await self._run(self._write, delete)

    # -- test aids -----------------------------------------------------------------------

    async def item_count(self, tenant: str) -> int:
        return await self._run(
            lambda: self._db.execute("SELECT count(*) FROM items WHERE tenant = ?", (tenant,)).fetchone()[0]
        )


def _hydrate(rows: list[Any], tenant: str, response_id: str) -> Hydrated | None:
    """Build a Hydrated from the hydration query's rows: (kind, position, key, data, tokens,
    replica), the response row (kind -1) first, then inputs (0) and outputs (1) in position order."""
    if not rows or rows[0][0] != -1:
        return None
    _, _, _, data, tokens, replica = rows[0]
    inputs: list[KeyedItem] = []
    outputs: list[KeyedItem] = []
    parse = items_pb2.Item.FromString
    for kind, _, key, item, _, _ in rows[1:]:
        if item is None:
            raise MissingItemError(tenant, response_id, key)
        (inputs if kind == INPUT else outputs).append(KeyedItem(key, parse(item)))
    return Hydrated(
        response=response_pb2.Response.FromString(data),
        inputs=inputs,
        outputs=outputs,
        conversation_tokens=tokens or 0,
        replica=replica or "",
    )


def _page(rows: list[Any], tenant: str, response_id: str, limit: int) -> ItemPage | None:
    """Build an ItemPage from the paging query's rows: (marker, position, item, key)."""
    if not rows or rows[0][0] != 0:
        return None
    items = []
    for _, _, data, key in rows[1 : limit + 1]:
        if data is None:
            raise MissingItemError(tenant, response_id, key)
        items.append(items_pb2.Item.FromString(data))
    return ItemPage(items, len(rows) - 1 > limit)
