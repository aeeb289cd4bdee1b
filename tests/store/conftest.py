"""Fixtures for the store conformance suite: one `store` fixture parametrized over every engine.

PostgreSQL and Redis are real servers (CI starts them):

* TETHER_TEST_PG_URL     default postgresql://postgres@127.0.0.1:5432/test
* TETHER_TEST_REDIS_URL  default redis://127.0.0.1:6379/0

Isolation: each test gets its own PostgreSQL schema `tether_test_<run>_<n>` (created and
migrated by the store's own `open()`), and its own Redis key prefix `tether_test:<run>:<n>`;
the session drops those schemas and deletes those keys at the end. A server that does not
answer skips its tests with a message saying how to start it; set
TETHER_TEST_REQUIRE_SERVERS=1 (CI) to make that a failure instead.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tether.store.memory import MemoryStore
from tether.store.postgres import PostgresStore
from tether.store.redis import RedisStore
from tether.store.sqlite import SqliteStore

PG_URL = os.environ.get("TETHER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("TETHER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE_SERVERS = os.environ.get("TETHER_TEST_REQUIRE_SERVERS", "") not in ("", "0")
RUN_ID = secrets.token_hex(4)
ENGINES = ("memory", "sqlite", "postgres", "redis")

_counter = itertools.count()


def _unavailable(message: str) -> None:
    if REQUIRE_SERVERS:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The PostgreSQL URL, checked reachable once; drops this run's schemas at the end."""
    import asyncpg

    async def probe() -> None:
        conn = await asyncpg.connect(PG_URL, timeout=3)
        await conn.close()

    try:
        asyncio.run(probe())
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable here"
        _unavailable(
            f"PostgreSQL not reachable at {PG_URL} ({type(exc).__name__}: {exc}): start it "
            "(e.g. `docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust -e POSTGRES_DB=test "
            "postgres:16`) or point TETHER_TEST_PG_URL at one"
        )
    yield PG_URL

    async def drop() -> None:
        conn = await asyncpg.connect(PG_URL, timeout=10)
        try:
            names = await conn.fetch(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE $1", f"tether_test_{RUN_ID}_%"
            )
            for (name,) in names:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis URL, checked reachable once; deletes this run's keys at the end."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=10)
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001
        client.close()
        _unavailable(
            f"Redis not reachable at {REDIS_URL} ({type(exc).__name__}: {exc}): start it "
            "(e.g. `docker run -d -p 6379:6379 redis:7`) or point TETHER_TEST_REDIS_URL at one"
        )
    yield REDIS_URL
    try:
        batch = []
        for key in client.scan_iter(match=f"tether_test:{RUN_ID}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    finally:
        client.close()


@dataclass
class EngineSpec:
    """One engine at one isolated location; `new()` makes another (unopened) store on the same
    data (same file / schema / key prefix), like a second process or a restart."""

    name: str
    new: Callable[..., object]


def _spec(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> EngineSpec:
    n = next(_counter)
    if name == "memory":
        shared = MemoryStore()
        return EngineSpec(name, lambda: shared)
    if name == "sqlite":
        path = str(tmp_path / "db" / "store.db")
        return EngineSpec(name, lambda **kw: SqliteStore(path, **kw))
    if name == "postgres":
        url = request.getfixturevalue("pg_url")
        schema = f"tether_test_{RUN_ID}_{n}"
        return EngineSpec(name, lambda **kw: PostgresStore(url, schema=schema, **kw))
    url = request.getfixturevalue("redis_url")
    prefix = f"tether_test:{RUN_ID}:{n}"
    return EngineSpec(name, lambda **kw: RedisStore(url, prefix=prefix, **kw))


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> EngineSpec:
    # A plain (sync) fixture, so server probes run outside the test's event loop.
    return _spec(request.param, request, tmp_path)


@pytest.fixture
async def store(engine: EngineSpec):
    s = engine.new()
    await s.open()
    try:
        yield s
    finally:
        await s.close()
