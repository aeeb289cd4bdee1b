"""PostgreSQL store (`store = "postgresql://user@host:5432/db"`), on an asyncpg pool.

Schema (`migrations/postgres/0001_init.sql`): the same layout as the SQLite engine, with BYTEA
for proto bytes:

* `items(tenant, key, item_id, item)`: each item once per tenant.
* `responses(tenant, id, response, created_at, conversation_tokens, stored_at, replica)`
  (`replica`, from 0002: the backend-pool replica that served the response).
* `response_items(tenant, response_id, kind, position, item_key)`: the ordered key lists (kind 0
  input, 1 output), indexed by (tenant, item_key) for deletion. A table rather than a text[]
  column: hydration is one ordered index range scan joined to `items`, paging happens in SQL,
  and "is this item still referenced?" is an index probe instead of an array search.
* `usage(seq, tenant, response_id, ...)`, PRIMARY KEY (tenant, response_id) with
  `ON CONFLICT DO NOTHING`: one ledger line per response; `seq` keeps insertion order.
* `schema_version(version, name, applied_at)`.

Migrations are forward-only SQL files `migrations/postgres/NNNN_name.sql`, applied by `open()`
(and by `migrate(url)`, for a `tether migrate` command) on a dedicated connection that holds a
session advisory lock keyed by the target schema, so replicas starting at once apply each file
exactly once. Each file runs in its own transaction with its schema_version row.

Option `schema` (URL `?schema=name`) puts the tables in that schema (created when missing) by
setting the pool's `search_path`; the default is the server's search_path (normally `public`).
Options `min_size` / `max_size` size the pool (defaults 1 / 10).

Consistency: `load_context` and `list_input_items` are each one SELECT, so one snapshot. Writes
for a tenant take a transaction-level advisory lock on (7331, hashtext(tenant)): shared for
`put_response` (writers run in parallel), exclusive for deletion and garbage collection. Inside
the shared lock `put_response` checks that every key it references exists, so a concurrent
delete can never collect an item a new response is about to reference: either the delete
commits first and the put fails with MissingItemError, or the put commits first and the delete
sees its references.

Connections are returned to the pool without asyncpg's default RESET ALL round trip: the store
leaves no session state behind (only transaction-scoped locks and settings).

Query plans: asyncpg prepares each statement once per connection and PostgreSQL switches to a
cached generic plan after five executions. A plan made while the tables were still tiny (a
fresh database) can scan `response_items` sequentially; PostgreSQL re-plans as soon as
autovacuum's ANALYZE updates the statistics (by default after 10% of a table changed, checked
every minute), so a running deployment heals by itself. Something that fills fresh tables within
seconds and measures right away (the hydration benchmark) should call `analyze()` first.

Tests count statements with `set_trace()` (asyncpg query loggers; the callback runs on the next
event-loop iteration, as asyncpg schedules it with `call_soon`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from tether.logging_setup import redact_url
from tether.responses.v1 import items_pb2, response_pb2, service_pb2

from ._common import (
    FencedWrite,
    MissingItemError,
    check_page_args,
    item_api_id,
    parse_items,
    split_query_options,
    usage_to_row,
)
from .base import Hydrated, ItemPage, KeyedItem, ResponseRecord, UsageRecord

MIGRATIONS_DIR = Path(__file__).parent / "migrations" / "postgres"
URL_OPTIONS = ("schema", "min_size", "max_size")

_LOCK_CLASS = 7331  # advisory lock namespace (two-int form) for per-tenant write locks
_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

_HYDRATE = """
SELECT -1::smallint AS kind, 0 AS position, NULL::text AS key, response AS data,
       conversation_tokens AS tokens, replica
  FROM responses WHERE tenant = $1 AND id = $2
UNION ALL
SELECT ri.kind, ri.position, ri.item_key, i.item, NULL, NULL
  FROM response_items ri
  LEFT JOIN items i ON i.tenant = ri.tenant AND i.key = ri.item_key
 WHERE ri.tenant = $1 AND ri.response_id = $2
ORDER BY 1, 2
"""

_PAGE = """
SELECT 0 AS marker, 0 AS pos, NULL::bytea AS data, NULL::text AS key
  FROM responses WHERE tenant = $1 AND id = $2
UNION ALL
(SELECT 1, ri.position, i.item, ri.item_key
   FROM response_items ri
   LEFT JOIN items i ON i.tenant = ri.tenant AND i.key = ri.item_key
  WHERE ri.tenant = $1 AND ri.response_id = $2 AND ri.kind = 0
    AND ($3::text IS NULL OR ri.position {cmp} (
          SELECT {agg}(ri2.position)
            FROM response_items ri2
            JOIN items i2 ON i2.tenant = ri2.tenant AND i2.key = ri2.item_key
           WHERE ri2.tenant = $1 AND ri2.response_id = $2 AND ri2.kind = 0
             AND i2.item_id = $3))
  ORDER BY ri.position {dir}
  LIMIT $4)
ORDER BY 1, 2 {dir}
"""
_PAGE_SQL = {
    "asc": _PAGE.format(cmp=">", agg="min", dir="ASC"),
    "desc": _PAGE.format(cmp="<", agg="max", dir="DESC"),
}

_GC_ITEMS = """
DELETE FROM items i
 WHERE i.tenant = $1 AND i.key = ANY($2::text[])
   AND NOT EXISTS (SELECT 1 FROM response_items r WHERE r.tenant = $1 AND r.item_key = i.key)
"""

_USAGE_COLUMNS = (
    "tenant, response_id, model, backend, input_tokens, cached_tokens, output_tokens,"
    " reasoning_tokens, status, created_at"
)


def migration_files() -> list[tuple[int, str, Path]]:
    """The shipped migrations, in order: (version, name, path)."""
    if not MIGRATIONS_DIR.is_dir():
        raise RuntimeError(f"PostgreSQL migrations not found at {MIGRATIONS_DIR} (broken install?)")
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql")):
        found.append((int(path.name[:4]), path.stem, path))
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"PostgreSQL migrations are not numbered 1..n: {versions}")
    return found


def _check_schema(schema: str | None) -> str | None:
    if schema is None or schema == "":
        return None
    if not _SCHEMA_RE.match(schema):
        raise ValueError(f"invalid PostgreSQL schema name {schema!r} (letters, digits, underscore)")
    return schema


def _server_settings(schema: str | None) -> dict[str, str]:
    return {"search_path": f'"{schema}"'} if schema else {}


async def _apply_migrations(conn: asyncpg.Connection, schema: str | None) -> int:
    """Create the schema if needed and apply pending migrations under a session advisory lock.
    Returns the schema version afterwards."""
    files = migration_files()
    latest = files[-1][0] if files else 0
    lock_name = f"tether-migrate:{schema or ''}"
    await conn.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", lock_name)
    try:
        if schema:
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_version (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")
        if current > latest:
            raise RuntimeError(
                f"PostgreSQL store schema version {current} is newer than this Tether supports "
                f"({latest}); upgrade Tether"
            )
        for version, name, path in files:
            if version <= current:
                continue
            sql = path.read_text(encoding="utf-8")
            async with conn.transaction():
                await conn.execute(sql)  # no arguments: simple protocol, several statements allowed
                await conn.execute(
                    "INSERT INTO schema_version (version, name) VALUES ($1, $2)", version, name
                )
            current = version
        return current
    finally:
        await conn.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", lock_name)


async def migrate(url: str, **options: Any) -> int:
    """Apply pending migrations to the database at `url` (`?schema=` honoured) and return the
    schema version. For a `tether migrate` command; `open()` does the same on start."""
    dsn, url_options = split_query_options(url, URL_OPTIONS)
    schema = _check_schema(options.get("schema", url_options.get("schema")))
    try:
        conn = await asyncpg.connect(dsn, server_settings=_server_settings(schema))
    except (OSError, asyncpg.PostgresError) as exc:
        raise ConnectionError(f"cannot connect to PostgreSQL at {redact_url(dsn)}: {exc}") from exc
    try:
        return await _apply_migrations(conn, schema)
    finally:
        await conn.close()


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Pool reset hook: nothing to reset (the store keeps no session state), so releasing a
    connection costs no round trip."""


class PostgresStore:
    def __init__(self, dsn: str, *, schema: str | None = None, min_size: int = 1, max_size: int = 10) -> None:
        self.dsn = dsn
        self.schema = _check_schema(schema)
        self.min_size = int(min_size)
        self.max_size = int(max_size)
        self._pool: asyncpg.Pool | None = None
        self._trace: Callable[[str], None] | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresStore:
        dsn, url_options = split_query_options(url, URL_OPTIONS)
        merged: dict[str, Any] = {**url_options, **options}
        return cls(dsn, **merged)

    # -- plumbing ------------------------------------------------------------------------

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("PostgresStore is not open")
        return self._pool

    def _log_query(self, record: Any) -> None:
        if self._trace is not None:
            self._trace(record.query)

    async def _init_connection(self, conn: asyncpg.Connection) -> None:
        conn.add_query_logger(self._log_query)

    async def open(self) -> None:
        if self._pool is not None:
            return
        settings = _server_settings(self.schema)
        try:
            conn = await asyncpg.connect(self.dsn, server_settings=settings)
        except (OSError, asyncpg.PostgresError) as exc:
            raise ConnectionError(f"cannot connect to PostgreSQL at {redact_url(self.dsn)}: {exc}") from exc
        try:
            await _apply_migrations(conn, self.schema)
        finally:
            await conn.close()
        self._pool = await asyncpg.create_pool(
            self.dsn,
            min_size=self.min_size,
            max_size=self.max_size,
            server_settings=settings,
            init=self._init_connection,
            reset=_no_reset,
        )

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def ping(self) -> bool:
        if self._pool is None:
            return False
        try:
            return await self._pool.fetchval("SELECT 1", timeout=5) == 1
        except Exception:
            return False

    async def set_trace(self, callback: Callable[[str], None] | None) -> None:
        """Call `callback(sql)` for every statement the pool's connections run (None removes
        it). asyncpg calls it on the next event-loop iteration."""
        self._trace = callback

    async def schema_version(self) -> int:
        return await self.pool.fetchval("SELECT coalesce(max(version), 0) FROM schema_version")

    async def analyze(self) -> None:
        """Refresh the planner statistics of the store's tables (autovacuum does this in a
        running deployment; benchmarks that fill tables in seconds call it, see the module
        docstring)."""
        await self.pool.execute("ANALYZE items; ANALYZE responses; ANALYZE response_items; ANALYZE usage")

    # -- responses -----------------------------------------------------------------------

    async def put_response(self, record: ResponseRecord) -> None:
        tenant, rid = record.tenant, record.response.id
        if not rid:
            raise ValueError("response.id is empty")
        kinds = [0] * len(record.input_keys) + [1] * len(record.output_keys)
        positions = list(range(len(record.input_keys))) + list(range(len(record.output_keys)))
        keys = [*record.input_keys, *record.output_keys]
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock_shared($1, hashtext($2))", _LOCK_CLASS, tenant)
            # Upsert the response row first: its row lock serializes two writes of one id.
            # ... unless a newer owner wrote it or owns its run (a higher epoch: the run's row is
            # read FOR SHARE, so an orphan's ending cannot slip in before this commits); then
            # nothing is written.
            run_epoch = await conn.fetchval(
                "SELECT epoch FROM runs WHERE tenant = $1 AND id = $2 FOR SHARE", tenant, rid
            )
            if run_epoch is not None and run_epoch > record.epoch:
                raise FencedWrite(tenant, rid, record.epoch)
            written = await conn.fetchval(
                """INSERT INTO responses (tenant, id, response, created_at, conversation_tokens, replica, epoch)
                   VALUES ($1, $2, $3, $4, $5, $6, $7)
                   ON CONFLICT (tenant, id) DO UPDATE SET
                     response = excluded.response, created_at = excluded.created_at,
                     conversation_tokens = excluded.conversation_tokens, stored_at = now(),
                     replica = excluded.replica, epoch = excluded.epoch
                   WHERE responses.epoch <= excluded.epoch
                   RETURNING 1""",
                tenant,
                rid,
                record.response.SerializeToString(),
                record.response.created_at,
                record.conversation_tokens,
                record.replica,
                record.epoch,
            )
            if written is None:
                raise FencedWrite(tenant, rid, record.epoch)
            old = await conn.fetch(
                "DELETE FROM response_items WHERE tenant = $1 AND response_id = $2 RETURNING item_key",
                tenant,
                rid,
            )
            if record.new_items:
                await conn.execute(
                    """INSERT INTO items (tenant, key, item_id, item)
                       SELECT $1, k, i, b FROM unnest($2::text[], $3::text[], $4::bytea[]) AS t(k, i, b)
                       ON CONFLICT (tenant, key) DO NOTHING""",
                    tenant,
                    [k.key for k in record.new_items],
                    [item_api_id(k.item) for k in record.new_items],
                    [k.item.SerializeToString() for k in record.new_items],
                )
            if keys:
                missing = await conn.fetchval(
                    """WITH added AS (
                         INSERT INTO response_items (tenant, response_id, kind, position, item_key)
                         SELECT $1, $2, k, p, key
                           FROM unnest($3::smallint[], $4::integer[], $5::text[]) AS t(k, p, key)
                         RETURNING item_key)
                       SELECT a.item_key FROM added a
                        WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.tenant = $1 AND i.key = a.item_key)
                        LIMIT 1""",
                    tenant,
                    rid,
                    kinds,
                    positions,
                    keys,
                )
                if missing is not None:
                    raise MissingItemError(tenant, rid, missing)
        dropped = {r[0] for r in old} - set(keys)
        if dropped:
            async with self.pool.acquire() as conn, conn.transaction():
                await self._gc(conn, tenant, dropped)

    @staticmethod
    async def _gc(conn: asyncpg.Connection, tenant: str, keys: set[str]) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _LOCK_CLASS, tenant)
        await conn.execute(_GC_ITEMS, tenant, sorted(keys))

    async def get_response(self, tenant: str, response_id: str) -> response_pb2.Response | None:
        data = await self.pool.fetchval(
            "SELECT response FROM responses WHERE tenant = $1 AND id = $2", tenant, response_id
        )
        return None if data is None else response_pb2.Response.FromString(data)

    async def load_context(self, tenant: str, response_id: str) -> Hydrated | None:
        rows = await self.pool.fetch(_HYDRATE, tenant, response_id)
        if not rows or rows[0][0] != -1:
            return None
        inputs: list[KeyedItem] = []
        outputs: list[KeyedItem] = []
        parse = items_pb2.Item.FromString
        for kind, _, key, item, _, _ in rows[1:]:
            if item is None:
                raise MissingItemError(tenant, response_id, key)
            (inputs if kind == 0 else outputs).append(KeyedItem(key, parse(item)))
        return Hydrated(
            response=response_pb2.Response.FromString(rows[0][3]),
            inputs=inputs,
            outputs=outputs,
            conversation_tokens=rows[0][4] or 0,
            replica=rows[0][5] or "",
        )

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _LOCK_CLASS, tenant)
            gone = await conn.fetchval(
                "DELETE FROM responses WHERE tenant = $1 AND id = $2 RETURNING 1", tenant, response_id
            )
            if gone is None:
                return False
            rows = await conn.fetch(
                "DELETE FROM response_items WHERE tenant = $1 AND response_id = $2 RETURNING item_key",
                tenant,
                response_id,
            )
            if rows:
                await conn.execute(_GC_ITEMS, tenant, sorted({r[0] for r in rows}))
            return True

    async def list_input_items(
        self, tenant: str, response_id: str, *, after: str | None, limit: int, order: str
    ) -> ItemPage | None:
        after = check_page_args(after, limit, order)
        rows = await self.pool.fetch(_PAGE_SQL[order], tenant, response_id, after, limit + 1)
        if not rows or rows[0][0] != 0:
            return None
        items = []
        for _, _, data, key in rows[1 : limit + 1]:
            if data is None:
                raise MissingItemError(tenant, response_id, key)
            items.append(items_pb2.Item.FromString(data))
        return ItemPage(items, len(rows) - 1 > limit)

    # -- usage ledger --------------------------------------------------------------------

    async def record_usage(self, record: UsageRecord) -> None:
        await self.pool.execute(
            f"""INSERT INTO usage ({_USAGE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                ON CONFLICT (tenant, response_id) DO NOTHING""",
            *usage_to_row(record),
        )

    async def usage_records(self, tenant: str | None = None) -> list[UsageRecord]:
        if tenant is None:
            rows = await self.pool.fetch(f"SELECT {_USAGE_COLUMNS} FROM usage ORDER BY seq")
        else:
            rows = await self.pool.fetch(
                f"SELECT {_USAGE_COLUMNS} FROM usage WHERE tenant = $1 ORDER BY seq", tenant
            )
        return [UsageRecord(*row) for row in rows]

    # -- conversations -------------------------------------------------------------------

    async def put_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> None:
        await self.pool.execute(
            """INSERT INTO conversations (tenant, id, conversation) VALUES ($1, $2, $3)
               ON CONFLICT (tenant, id) DO UPDATE SET conversation = excluded.conversation""",
            tenant,
            conversation.id,
            conversation.SerializeToString(),
        )

    async def update_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> bool:
        found = await self.pool.fetchval(
            "UPDATE conversations SET conversation = $3 WHERE tenant = $1 AND id = $2 RETURNING 1",
            tenant,
            conversation.id,
            conversation.SerializeToString(),
        )
        return found is not None

    async def get_conversation(self, tenant: str, conversation_id: str) -> service_pb2.Conversation | None:
        data = await self.pool.fetchval(
            "SELECT conversation FROM conversations WHERE tenant = $1 AND id = $2", tenant, conversation_id
        )
        return None if data is None else service_pb2.Conversation.FromString(data)

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            gone = await conn.fetchval(
                "DELETE FROM conversations WHERE tenant = $1 AND id = $2 RETURNING 1", tenant, conversation_id
            )
            await conn.execute(
                "DELETE FROM conversation_items WHERE tenant = $1 AND conversation_id = $2", tenant, conversation_id
            )
            return gone is not None

    async def append_conversation_items(
        self, tenant: str, conversation_id: str, items: Sequence[items_pb2.Item]
    ) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            # The row lock serialises appends to one conversation (positions stay unique).
            found = await conn.fetchval(
                "SELECT 1 FROM conversations WHERE tenant = $1 AND id = $2 FOR UPDATE", tenant, conversation_id
            )
            if found is None:
                return False
            start = await conn.fetchval(
                "SELECT coalesce(max(position), -1) + 1 FROM conversation_items WHERE tenant = $1 AND conversation_id = $2",
                tenant,
                conversation_id,
            )
            await conn.executemany(
                "INSERT INTO conversation_items (tenant, conversation_id, position, item_id, item) VALUES ($1, $2, $3, $4, $5)",
                [(tenant, conversation_id, start + n, item_api_id(i), i.SerializeToString()) for n, i in enumerate(items)],
            )
            return True

    async def conversation_items(self, tenant: str, conversation_id: str) -> list[items_pb2.Item] | None:
        rows = await self.pool.fetch(
            """SELECT 0 AS marker, -1::bigint AS position, NULL::bytea AS item
                 FROM conversations WHERE tenant = $1 AND id = $2
               UNION ALL
               SELECT 1, position, item FROM conversation_items WHERE tenant = $1 AND conversation_id = $2
               ORDER BY 1, 2""",
            tenant,
            conversation_id,
        )
        if not rows or rows[0][0] != 0:
            return None
        return await parse_items([row[2] for row in rows[1:]])

    async def delete_conversation_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        gone = await self.pool.fetchval(
            """DELETE FROM conversation_items WHERE tenant = $1 AND conversation_id = $2 AND item_id = $3
               RETURNING 1""",
            tenant,
            conversation_id,
            item_id,
        )
        return gone is not None

    # -- test aids -----------------------------------------------------------------------

    async def item_count(self, tenant: str) -> int:
        return await self.pool.fetchval("SELECT count(*) FROM items WHERE tenant = $1", tenant)
