"""Engine-specific guarantees: SQLite persistence, migrations and multi-process sharing;
PostgreSQL migrations under concurrency; Redis TTLs."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import textwrap

import pytest

from tether.store.postgres import PostgresStore, migrate, migration_files
from tether.store.redis import RedisStore
from tether.store.sqlite import SCHEMA_VERSION, SqliteStore

from .conftest import RUN_ID
from .test_conformance import T1, Chain, assert_hydrated, usage

# -- SQLite ----------------------------------------------------------------------------------


async def test_sqlite_persists_across_reopen(tmp_path):
    path = str(tmp_path / "nested" / "dir" / "tether.db")  # parent folders get created
    chain = Chain()
    first, _, _ = chain.next(n_inputs=2, n_outputs=2)
    second, inputs, outs = chain.next()
    store = SqliteStore(path)
    await store.open()
    await store.put_response(first)
    await store.put_response(second)
    await store.record_usage(usage(T1, second.response.id))
    await store.close()
    assert await store.ping() is False

    reopened = SqliteStore(path)
    await reopened.open()
    try:
        assert await reopened.schema_version() == SCHEMA_VERSION
        assert_hydrated(await reopened.load_context(T1, second.response.id), second, inputs, outs)
        assert await reopened.usage_records() == [usage(T1, second.response.id)]
    finally:
        await reopened.close()

    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


async def test_sqlite_refuses_newer_schema(tmp_path):
    path = str(tmp_path / "t.db")
    store = SqliteStore(path)
    await store.open()
    await store.close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (999, 0)")
    conn.commit()
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        await SqliteStore(path).open()


async def test_sqlite_several_processes_share_the_file(tmp_path):
    path = str(tmp_path / "shared.db")
    script = textwrap.dedent(
        """
        import asyncio, sys
        from tests.store.test_conformance import Chain
        from tether.store.sqlite import SqliteStore

        async def main(path, name):
            store = SqliteStore(path, busy_timeout_ms=20000)
            await store.open()
            chain = Chain(prefix=name)
            for _ in range(25):
                record, _, _ = chain.next()
                await store.put_response(record)
                assert await store.load_context("tenant-a", record.response.id) is not None
            await store.close()

        asyncio.run(main(sys.argv[1], sys.argv[2]))
        """
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, path, f"proc{j}", cwd=str(_repo_root())
        )
        for j in range(3)
    ]
    for proc in procs:
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    store = SqliteStore(path)
    await store.open()
    try:
        assert await store.item_count(T1) == 3 * 25 * 2
        for j in range(3):
            h = await store.load_context(T1, f"resp_proc{j}_24")
            assert h is not None and len(h.inputs) == 49
    finally:
        await store.close()


def _repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[2]


# -- PostgreSQL ------------------------------------------------------------------------------


async def test_postgres_migrate_is_idempotent_and_race_free(pg_url):
    schema = f"tether_test_{RUN_ID}_migrate"
    url = f"{pg_url}?schema={schema}"
    versions = await asyncio.gather(*[migrate(url) for _ in range(5)])
    latest = migration_files()[-1][0]
    assert versions == [latest] * 5
    assert await migrate(url) == latest
    store = PostgresStore(pg_url, schema=schema)
    await store.open()
    try:
        assert await store.schema_version() == latest
        count = await store.pool.fetchval("SELECT count(*) FROM schema_version")
        assert count == len(migration_files())
    finally:
        await store.close()


async def test_postgres_concurrent_open(pg_url):
    schema = f"tether_test_{RUN_ID}_open"
    stores = [PostgresStore(pg_url, schema=schema, max_size=2) for _ in range(4)]
    await asyncio.gather(*[s.open() for s in stores])
    try:
        record, inputs, outs = Chain().next()
        await stores[0].put_response(record)
        assert_hydrated(await stores[3].load_context(T1, record.response.id), record, inputs, outs)
    finally:
        await asyncio.gather(*[s.close() for s in stores])


async def test_postgres_unreachable_is_a_clear_error():
    store = PostgresStore("postgresql://nobody:secret@127.0.0.1:1/none")
    with pytest.raises(ConnectionError) as info:
        await store.open()
    assert "127.0.0.1:1" in str(info.value) and "secret" not in str(info.value)


# -- Redis -----------------------------------------------------------------------------------


async def _redis_store(redis_url: str, name: str, **kw) -> RedisStore:
    store = RedisStore(redis_url, prefix=f"tether_test:{RUN_ID}:{name}", **kw)
    await store.open()
    return store


async def test_redis_ttl_is_set_and_refreshed(redis_url):
    store = await _redis_store(redis_url, "ttl", ttl_s=3600)
    try:
        chain = Chain()
        parent, p_in, p_out = chain.next(n_inputs=1, n_outputs=1)
        await store.put_response(parent)
        r = store.client
        ttl = await r.ttl(store.response_key(T1, parent.response.id))
        assert 3590 <= ttl <= 3600
        for key in parent.input_keys + parent.output_keys:
            assert 3590 <= await r.ttl(store.item_key(T1, key)) <= 3600

        # Age one of the parent's items, then continue the chain: the newer response refreshes it.
        aged = store.item_key(T1, parent.input_keys[0])
        await r.expire(aged, 100)
        assert await r.ttl(aged) <= 100
        child, _, _ = chain.next()
        await store.put_response(child)
        assert 3590 <= await r.ttl(aged) <= 3600

        # A refresh never shortens: a store configured with a shorter TTL leaves it alone.
        short = RedisStore(store.url, prefix=store.prefix, ttl_s=60)
        await short.open()
        try:
            grandchild, _, _ = chain.next()
            await short.put_response(grandchild)
            assert await r.ttl(aged) > 60
            assert await r.ttl(short.response_key(T1, grandchild.response.id)) <= 60
        finally:
            await short.close()
    finally:
        await store.close()


async def test_redis_ttl_zero_means_no_expiry(redis_url):
    store = await _redis_store(redis_url, "nottl", ttl_s=0)
    try:
        record, _, _ = Chain().next()
        await store.put_response(record)
        assert await store.client.ttl(store.response_key(T1, record.response.id)) == -1
        assert await store.client.ttl(store.item_key(T1, record.input_keys[0])) == -1
    finally:
        await store.close()


async def test_redis_hydration_is_one_round_trip(redis_url):
    store = await _redis_store(redis_url, "rtt")
    try:
        chain = Chain()
        for _ in range(50):
            record, inputs, outs = chain.next()
            await store.put_response(record)
        sent: list[tuple] = []
        client = store.client
        original = client.execute_command

        async def counting(*args, **kwargs):
            sent.append(args)
            return await original(*args, **kwargs)

        client.execute_command = counting
        try:
            h = await store.load_context(T1, record.response.id)
        finally:
            client.execute_command = original
        assert [a[0] for a in sent] == ["EVALSHA"]
        assert_hydrated(h, record, inputs, outs)
    finally:
        await store.close()


async def test_redis_usage_ledger_is_a_stream(redis_url):
    store = await _redis_store(redis_url, "ledger")
    try:
        await store.record_usage(usage(T1, "resp_1"))
        await store.record_usage(usage(T1, "resp_1"))
        assert await store.client.xlen(store.usage_stream_key) == 1
        assert await store.client.sismember(store.usage_seen_key, '["tenant-a", "resp_1"]')
    finally:
        await store.close()
