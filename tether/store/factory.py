"""Pick a store engine from a URL.

    store = await open_store("sqlite://tether-data/tether.db")   # opened, schema migrated
    ...
    await store.close()

`open_store(url, **options)` returns an *opened* store (connected, schema created or migrated);
`create_store(url, **options)` returns one not yet opened, for callers that manage the lifetime
themselves (`await store.open()` / `await store.close()`). Options come from the URL query and
from keyword arguments (keyword arguments win); unknown ones are a ValueError.

URL forms:

| URL                                         | engine        | options                         |
|---------------------------------------------|---------------|---------------------------------|
| `memory://`                                 | MemoryStore   | -                               |
| `sqlite:///abs/path.db`                     | SqliteStore   | `busy_timeout_ms` (5000)        |
| `sqlite://relative/path.db` (from the cwd)  | SqliteStore   | parent folders are created      |
| `postgresql://user:pw@host:5432/db`         | PostgresStore | `schema`, `min_size`, `max_size`|
| `postgres://...` (same)                     |               | other query params go to asyncpg|
| `redis://host:6379/0`, `rediss://...`       | RedisStore    | `ttl_s` (30 days; 0 = none), `prefix` ("tether") |

Unknown scheme: ValueError naming the supported ones.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tether.extras import require
from tether.logging_setup import redact_url

from ._common import split_query_options
from .base import Store
from .runbus import RunBus

SCHEMES = ("memory", "sqlite", "postgresql", "postgres", "redis", "rediss")

_OPTIONS: dict[str, tuple[str, ...]] = {
    "memory": (),
    "sqlite": ("busy_timeout_ms",),
    "postgresql": ("schema", "min_size", "max_size"),
    "redis": ("ttl_s", "prefix"),
}


def _engine(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise ValueError(
            f"unsupported store URL {redact_url(url)!r}: expected memory://, sqlite:///abs/path.db, "
            "sqlite://relative/path.db, postgresql://user@host:port/db (or postgres://) or "
            "redis://host:port/db"
        )
    return {"postgres": "postgresql", "rediss": "redis"}.get(scheme, scheme)


def _check_options(engine: str, url: str, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(_OPTIONS[engine]))
    if unknown:
        allowed = ", ".join(_OPTIONS[engine]) or "none"
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for store {redact_url(url)!r} (allowed: {allowed})"
        )


def sqlite_path(url: str) -> tuple[str, dict[str, str]]:
    """`sqlite:///abs/x.db` -> "/abs/x.db"; `sqlite://rel/x.db` -> "rel/x.db"; plus query options."""
    rest = url.partition("://")[2]
    path, _, query = rest.partition("?")
    if not path or path == "/":
        raise ValueError(
            f"sqlite store URL {url!r} names no file: use sqlite:///abs/path.db or sqlite://rel/path.db"
        )
    return path, dict(parse_qsl(query, keep_blank_values=True))


def create_store(url: str, **options: Any) -> Store:
    """A store for `url`, not yet opened."""
    engine = _engine(url)
    if engine == "memory":
        _check_options(engine, url, {**dict(parse_qsl(urlsplit(url).query)), **options})
        from .memory import MemoryStore

        return MemoryStore()
    if engine == "sqlite":
        path, url_options = sqlite_path(url)
        merged = {**url_options, **options}
        _check_options(engine, url, merged)
        from .sqlite import SqliteStore

        return SqliteStore(path, **merged)
    if engine == "postgresql":
        dsn, url_options = split_query_options(url, _OPTIONS["postgresql"])
        merged = {**url_options, **options}
        _check_options(engine, url, merged)
        return require("tether.store.postgres", "postgres").PostgresStore(dsn, **merged)
    clean, url_options = split_query_options(url, _OPTIONS["redis"])
    merged = {**url_options, **options}
    _check_options(engine, url, merged)
    return require("tether.store.redis", "redis").RedisStore(clean, **merged)


def run_bus_for(store: Store, *, orphan_after_s: float, max_events: int, retention_s: float,
                live_ttl_s: float, max_bytes: int = 1 << 62) -> RunBus | None:  # fmt: skip
    """The shared side of runs on `store`'s engine (opened): Redis and PostgreSQL have one
    (`tether.store.runbus`); memory and SQLite None (their runs stay in one process)."""
    options: dict[str, Any] = {"orphan_after_s": orphan_after_s, "max_events": max_events, "retention_s": retention_s,
               "live_ttl_s": live_ttl_s, "max_bytes": max_bytes}  # fmt: skip
    module = type(store).__module__
    if module == "tether.store.redis":
        from .redis_runs import RedisRunBus

        return RedisRunBus(store, **options)
    if module == "tether.store.postgres":
        from .postgres_runs import PostgresRunBus

        return PostgresRunBus(store, **options)
    return None


async def open_store(url: str, **options: Any) -> Store:
    """A store for `url`, opened: connected and its schema created or migrated."""
    store = create_store(url, **options)
    await store.open()
    return store


async def migrate(url: str, **options: Any) -> int | None:
    """Create or migrate the schema of the store at `url` (for `tether migrate`); returns the
    schema version, or None for engines without one (memory, redis)."""
    engine = _engine(url)
    if engine == "postgresql":
        pg_migrate = require("tether.store.postgres", "postgres").migrate
        dsn, url_options = split_query_options(url, _OPTIONS["postgresql"])
        merged = {**url_options, **options}
        _check_options(engine, url, merged)
        return await pg_migrate(dsn, **{k: v for k, v in merged.items() if k == "schema"})
    store = create_store(url, **options)
    await store.open()
    try:
        if engine == "sqlite":
            return await store.schema_version()  # type: ignore[attr-defined]  # not in `Store`: only SQLite versions its schema
        return None
    finally:
        await store.close()
