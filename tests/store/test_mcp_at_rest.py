"""No MCP credential at rest: a background create whose `mcp` tool carries `headers` and
`authorization`, on a Redis and a PostgreSQL store shared by two replicas and on SQLite, leaves
neither in any Redis key, any PostgreSQL table or the SQLite file, while it is queued, while it
runs, after it completed, and after another replica took it over (which still sends them to the
MCP server: the replicas share `server.reasoning_key`, under which a takeable run's params are
sealed)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.fakes.mcp_server import McpTestServer
from tests.store.conftest import RUN_ID
from tests.support.configs import instant_config
from tests.support.stacks import running_stack
from tether import server
from tether.auth import Authenticator
from tether.config import TetherConfig

SLOW = {"ttft_ms": 0, "tokens_per_s": 60, "output_tokens": 40, "tick_ms": 1}  # ~0.7 s a response


def replica_config(store: str) -> TetherConfig:
    cfg = instant_config(SLOW, max_background_running=1, run_orphan_after_s=1.0)
    cfg.store = store
    cfg.server.reasoning_key = "shared-by-the-replicas"
    cfg.mcp.allowed_servers = ["127.0.0.1"]
    cfg.mcp.allow_private_networks = ["127.0.0.0/8"]
    return cfg


async def redis_values(url: str, prefix: str) -> list[bytes]:
    import redis.asyncio as aioredis

    client = aioredis.from_url(url)
    out: list[bytes] = []
    try:
        async for key in client.scan_iter(match=prefix + "*", count=1000):
            kind = (await client.type(key)).decode()
            out.append(key)
            if kind == "string":
                out.append(await client.get(key) or b"")
            elif kind == "hash":
                out.extend(b for kv in (await client.hgetall(key)).items() for b in kv)
            elif kind == "stream":
                out.extend(v for _, fields in await client.xrange(key) for v in fields.values())
            elif kind == "zset":
                out.extend(await client.zrange(key, 0, -1))
            elif kind == "list":
                out.extend(await client.lrange(key, 0, -1))
            elif kind == "set":
                out.extend(await client.smembers(key))
            else:
                raise AssertionError(f"a {kind} key this scan cannot read: {key!r}")
    finally:
        await client.aclose()
    return out


async def pg_values(url: str, schema: str) -> list[bytes]:
    import asyncpg

    conn = await asyncpg.connect(url)
    out: list[bytes] = []
    try:
        tables = [r[0] for r in await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema)]  # fmt: skip
        assert "runs" in tables and "responses" in tables, tables
        for table in tables:
            for row in await conn.fetch(f'SELECT * FROM "{schema}"."{table}"'):
                out.extend(v if isinstance(v, bytes) else str(v).encode() for v in row.values())
    finally:
        await conn.close()
    return out


def sqlite_values(path: Path) -> list[bytes]:
    return [p.read_bytes() for p in path.parent.glob(path.name + "*")]  # the file, its WAL and shm


@pytest.fixture(params=["redis", "postgres", "sqlite"])
def located(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, Callable[[], Awaitable[list[bytes]]]]:
    """(engine, store URL private to the test, a scan of everything that store holds). A plain
    (sync) fixture, so the server probes run outside the test's event loop."""
    tag = f"mcp{secrets.token_hex(3)}"
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = f"tether_test:{RUN_ID}:{tag}"
        return "redis", f"{url}?prefix={prefix}", lambda: redis_values(url, prefix)
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        schema = f"tether_test_{RUN_ID}_{tag}"
        return "postgres", f"{url}?schema={schema}", lambda: pg_values(url, schema)
    path = tmp_path / "tether.db"

    async def scan() -> list[bytes]:
        return sqlite_values(path)

    return "sqlite", f"sqlite:///{path}", scan


async def test_no_mcp_credential_at_rest(located: tuple[str, str, Callable[[], Awaitable[list[bytes]]]]) -> None:
    kind, store, scan = located
    secrets_sent = [f"hdr-{secrets.token_hex(8)}", f"tok-{secrets.token_hex(8)}"]
    scans: dict[str, int] = {}

    async def check(when: str) -> None:
        values = await scan()
        assert values, when
        for secret in secrets_sent:
            assert not [v for v in values if secret.encode() in v], f"{secret} at rest ({kind}, {when})"
        scans[when] = len(values)

    with McpTestServer() as mcp:
        tool = {"type": "mcp", "server_label": "dice", "server_url": mcp.url, "require_approval": "never",
                "headers": {"X-Api-Key": secrets_sent[0]}, "authorization": secrets_sent[1]}  # fmt: skip
        auth = Authenticator({})
        a_config = replica_config(store)
        a_config.server.bridge = True
        a = await server.start(a_config, authenticator=auth)
        a_running = True
        try:
            on_a = AsyncOpenAI(base_url=f"http://127.0.0.1:{a.bridge_port}/v1", api_key="x", max_retries=0)
            busy = await on_a.responses.create(model="sim-model", input="write", background=True)
            waiting = await on_a.responses.create(model="sim-model", input="please roll", tools=[tool],
                                                  background=True)  # fmt: skip
            assert (await on_a.responses.retrieve(waiting.id)).status == "queued"
            await check("queued")
            if kind == "sqlite":  # one process: nothing to take over
                await until(on_a, waiting.id, "in_progress")
                await check("running")
                await until(on_a, waiting.id, "completed")
                await check("completed")
                assert_sent(mcp, secrets_sent)
                return
            b_config = replica_config(store)
            async with running_stack(auth, config=b_config) as b:
                on_b = AsyncOpenAI(base_url=b.base_url, api_key="x", max_retries=0)
                await until(on_b, busy.id, "in_progress")
                a_running = False
                await a.stop(0.5)  # a rolling restart: B takes the queued run over
                await until(on_b, waiting.id, "in_progress")
                await check("running, taken over")
                done = await until(on_b, waiting.id, "completed")
                assert [o.type for o in done.output][:2] == ["mcp_list_tools", "mcp_call"]
                await check("completed, taken over")
                assert_sent(mcp, secrets_sent)  # B opened the sealed params: the server got them
        finally:
            if a_running:
                await a.stop(0.5)
    assert len(scans) == 3


def assert_sent(mcp: McpTestServer, sent: list[str]) -> None:
    assert any(h.get("x-api-key") == sent[0] and h.get("authorization") == f"Bearer {sent[1]}" for h in mcp.headers)


async def until(client: AsyncOpenAI, response_id: str, status: str) -> Any:
    for _ in range(300):
        r = await client.responses.retrieve(response_id)
        if r.status == status:
            return r
        assert r.status in ("queued", "in_progress", status), r
        await asyncio.sleep(0.02)
    raise AssertionError(f"{response_id} never {status}")


@pytest.fixture
def redis_store(redis_url: str) -> str:
    return f"{redis_url}?prefix=tether_test:{RUN_ID}:mcp{secrets.token_hex(3)}"


async def test_a_replica_without_the_key_fails_the_run_instead_of_running_it_bare(redis_store: str) -> None:
    with McpTestServer() as mcp:
        tool = {"type": "mcp", "server_label": "dice", "server_url": mcp.url, "require_approval": "never",
                "authorization": "tok-never-sent-bare"}  # fmt: skip
        a_config = replica_config(redis_store)
        a_config.server.bridge = True
        a = await server.start(a_config, authenticator=Authenticator({}))
        try:
            on_a = AsyncOpenAI(base_url=f"http://127.0.0.1:{a.bridge_port}/v1", api_key="x", max_retries=0)
            await on_a.responses.create(model="sim-model", input="write", background=True)
            waiting = await on_a.responses.create(model="sim-model", input="please roll", tools=[tool], background=True)
            b_config = replica_config(redis_store)
            b_config.server.reasoning_key = "another key"
            async with running_stack(Authenticator({}), config=b_config) as b:
                on_b = AsyncOpenAI(base_url=b.base_url, api_key="x", max_retries=0)
                await a.stop(0.5)
                a = None
                failed = await until(on_b, waiting.id, "failed")
                assert "reasoning_key" in failed.error.message
                assert not [h for h in mcp.headers if "tok-never-sent-bare" in h.get("authorization", "")]
        finally:
            if a is not None:
                await a.stop(0.5)
