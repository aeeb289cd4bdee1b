"""`tether.store.factory`: URL forms, options, errors; and the hydration benchmark script."""

from __future__ import annotations

import pytest

from tether.store.factory import create_store, migrate, open_store
from tether.store.memory import MemoryStore
from tether.store.postgres import PostgresStore
from tether.store.redis import DEFAULT_TTL_S, RedisStore
from tether.store.sqlite import SCHEMA_VERSION, SqliteStore
from tether_lab import bench_hydrate


async def test_memory_url_opens():
    store = await open_store("memory://")
    assert isinstance(store, MemoryStore) and await store.ping()
    await store.close()


def test_sqlite_urls():
    absolute = create_store("sqlite:///var/lib/tether/t.db")
    assert isinstance(absolute, SqliteStore) and absolute.path == "/var/lib/tether/t.db"
    relative = create_store("sqlite://tether-data/tether.db?busy_timeout_ms=750")
    assert relative.path == "tether-data/tether.db" and relative.busy_timeout_ms == 750
    assert create_store("sqlite://x.db", busy_timeout_ms=9).busy_timeout_ms == 9  # keyword wins
    with pytest.raises(ValueError):
        create_store("sqlite://")


async def test_sqlite_relative_url_creates_parent_dirs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = await open_store("sqlite://a/b/tether.db")
    try:
        assert await store.ping()
    finally:
        await store.close()
    assert (tmp_path / "a" / "b" / "tether.db").is_file()
    assert await migrate("sqlite://a/b/tether.db") == SCHEMA_VERSION


def test_postgres_urls():
    for scheme in ("postgresql", "postgres"):
        store = create_store(
            f"{scheme}://u:pw@db.example:5433/tether?schema=tenant_x&max_size=4&sslmode=disable"
        )
        assert isinstance(store, PostgresStore)
        assert store.schema == "tenant_x" and store.max_size == 4
        assert "schema" not in store.dsn and "sslmode=disable" in store.dsn  # driver options stay
    with pytest.raises(ValueError):
        create_store("postgresql://h/db?schema=bad;name")


def test_redis_urls():
    store = create_store("redis://127.0.0.1:6379/2?ttl_s=3600&prefix=tx")
    assert isinstance(store, RedisStore)
    assert store.ttl_s == 3600 and store.prefix == "tx" and store.url == "redis://127.0.0.1:6379/2"
    assert create_store("redis://localhost").ttl_s == DEFAULT_TTL_S
    assert create_store("rediss://localhost:6380/0", ttl_s=5).ttl_s == 5
    with pytest.raises(ValueError):
        create_store("redis://localhost?ttl_s=-1")


def test_bad_urls():
    with pytest.raises(ValueError, match="unsupported store URL 'mysql://u:\\*\\*\\*@h/db'"):
        create_store("mysql://u:secret@h/db")
    with pytest.raises(ValueError, match="unsupported store URL"):
        create_store("tether.db")
    with pytest.raises(ValueError, match="unknown option"):
        create_store("redis://localhost", ttl=5)  # (unknown URL query params go to the driver)
    with pytest.raises(ValueError, match="unknown option"):
        create_store("memory://", ttl_s=3)


async def test_bench_hydrate_runs(tmp_path):
    import io

    out = io.StringIO()
    rows = await bench_hydrate.run(f"sqlite:///{tmp_path}/bench.db", [3, 6], repeat=5, chars=20, out=out)
    assert [(r["turns"], r["items"]) for r in rows] == [(3, 6), (6, 12)]
    assert "mean_us" in out.getvalue()


def test_bench_hydrate_cli(capsys):
    bench_hydrate.main(["--url", "memory://", "--turns", "2", "--repeat", "3"])
    assert "mean_us" in capsys.readouterr().out
