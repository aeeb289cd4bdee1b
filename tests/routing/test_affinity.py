"""Cache-affine routing end to end: a Tether (engine + bridge) in front of a pool, driven by the
official openai SDK over WebSocket mode and HTTP. The serving replica is recorded with each stored
response, so a conversation keeps its replica (and that replica's KV prefix) across turns,
reconnects and Tether replicas sharing a store; a replica that dies mid-conversation is replaced
before the first byte with the history intact."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from openai import AsyncOpenAI

from tests.fakes import FakeChatServer, unavailable
from tether.auth import Authenticator
from tether.config import TetherConfig, from_dict
from tether.core.engine import Engine
from tether.server import start as start_server

KEY = "sk-a"
INSTRUCTIONS = "You are a careful coding agent. " * 40  # a header worth caching
REPLICA = {"ttft_ms": 0, "tokens_per_s": 0, "output_tokens": 8, "tick_ms": 1, "prefill_tokens_per_s": 1e9}


def config(store: str, backend: dict[str, Any]) -> TetherConfig:
    return from_dict(
        {
            "store": store,
            "backends": {"llm": backend},
            "models": {"*": {"backend": "llm"}},
            "server": {"grpc_port": 0, "bridge_port": 0, "shutdown_grace_s": 1},
            "limits": {"coalesce_ms": 0},
        }
    )


def sim_pool(policy: str, replicas: int = 3) -> dict[str, Any]:
    return {"kind": "simulated", **REPLICA, "pool": {"replicas": replicas, "policy": policy}}


@contextlib.asynccontextmanager
async def tether(cfg: TetherConfig) -> AsyncIterator[tuple[Engine, AsyncOpenAI]]:
    running = await start_server(cfg, authenticator=Authenticator({KEY: "t"}))
    try:
        async with AsyncOpenAI(base_url=f"http://127.0.0.1:{running.bridge_port}/v1", api_key=KEY, max_retries=0) as c:
            yield running.engine, c
    finally:
        await running.stop(0.5)


async def ws_turn(conn: Any, **body: Any) -> Any:
    await conn.response.create(model="agent", instructions=INSTRUCTIONS, store=True, **body)
    async for ev in conn:
        if ev.type in ("response.completed", "response.failed", "error"):
            assert ev.type == "response.completed", ev
            return ev.response
    raise AssertionError("no terminal event")


async def served_by(engine: Engine, response_id: str) -> str:
    await engine.post.flush()
    hydrated = await engine.store.load_context("t", response_id)
    assert hydrated is not None
    return hydrated.replica


def prompt_tokens_per_replica(engine: Engine) -> list[int]:
    return [r.backend.physics.prompt_tokens for r in engine.backends["llm"].replicas]


async def test_websocket_continuations_keep_their_replica_across_reconnects_and_tether_replicas(tmp_path):
    store = f"sqlite:///{tmp_path}/t.db"
    async with tether(config(store, sim_pool("chain-affine"))) as (engine, client):
        async with client.responses.connect() as conn:
            first = await ws_turn(conn, input="fix the failing test in parser.py")
            chain = [first]
            for n in range(3):
                chain.append(await ws_turn(conn, previous_response_id=chain[-1].id, input=f"tool output {n}"))
        replicas = {await served_by(engine, r.id) for r in chain}
        assert len(replicas) == 1 and replicas != {""}
        (replica,) = replicas
        # The replica's own prefix cache answered the continuations (the usage reports its hits).
        assert first.usage.input_tokens_details.cached_tokens == 0
        assert all(r.usage.input_tokens_details.cached_tokens > 0.5 * r.usage.input_tokens for r in chain[1:])
        assert sorted(t > 0 for t in prompt_tokens_per_replica(engine)) == [False, False, True]

        # A new connection (nothing cached in Tether): hydrated from the store, same replica.
        async with client.responses.connect() as conn:
            resumed = await ws_turn(conn, previous_response_id=chain[-1].id, input="after a reconnect")
        assert await served_by(engine, resumed.id) == replica
        assert resumed.usage.input_tokens_details.cached_tokens > 0.5 * resumed.usage.input_tokens

    # Another Tether replica sharing the store (its pool has the same replica names).
    async with tether(config(store, sim_pool("chain-affine"))) as (other, client):
        async with client.responses.connect() as conn:
            moved = await ws_turn(conn, previous_response_id=resumed.id, input="on another Tether")
        assert await served_by(other, moved.id) == replica


async def test_http_full_resend_round_robin_spreads_a_conversation_and_prefix_aware_keeps_it(tmp_path):
    results = {}
    for policy in ("round-robin", "prefix-aware"):
        async with tether(config("memory://", sim_pool(policy))) as (engine, client):
            history: list[Any] = [{"role": "user", "content": "fix the failing test in parser.py"}]
            cached = []
            for n in range(6):
                r = await client.responses.create(model="agent", instructions=INSTRUCTIONS, input=history, store=False)
                cached.append(r.usage.input_tokens_details.cached_tokens)
                history += [*(item.model_dump(exclude_none=True) for item in r.output)]
                history.append({"role": "user", "content": f"tool output {n}"})
            results[policy] = (prompt_tokens_per_replica(engine), cached)
    rr_load, rr_cached = results["round-robin"]
    pa_load, pa_cached = results["prefix-aware"]
    assert sum(t > 0 for t in rr_load) == 3  # every replica prefilled part of the conversation
    assert sum(t > 0 for t in pa_load) == 1  # one replica saw all of it
    assert all(c > 0 for c in pa_cached[1:])  # and hit its own cache on every later turn
    assert sum(pa_cached) > sum(rr_cached)


async def test_a_replica_going_down_mid_conversation_fails_over_with_the_history_intact(tmp_path):
    upstreams = [FakeChatServer(api_key=None, strict=False).start() for _ in range(2)]
    urls = [u.base_url for u in upstreams]
    backend = {
        "kind": "openai",
        "max_retries": 0,
        "pool": {"replicas": urls, "policy": "chain-affine", "eject_after_failures": 1, "eject_s": 3600},
    }
    try:
        async with tether(config(f"sqlite:///{tmp_path}/t.db", backend)) as (engine, client):
            async with client.responses.connect() as conn:
                first = await ws_turn(conn, input="remember the number 42")
                second = await ws_turn(conn, previous_response_id=first.id, input="and the word tether")
                replica = await served_by(engine, second.id)
                assert replica == await served_by(engine, first.id)
                dead = upstreams[urls.index(replica)]
                alive = upstreams[1 - urls.index(replica)]
                assert len(alive.chat_requests) == 0
                dead.default = unavailable()  # every call now gets a 503 (its listener may keep kept-alive sockets)
                third = await ws_turn(conn, previous_response_id=second.id, input="what did I ask you to remember?")
            assert third.status == "completed" and await served_by(engine, third.id) == alive.base_url
            assert len(dead.chat_requests) == 3  # two answers, then the 503 that moved the turn
            (sent,) = alive.chat_requests
            texts = [m.get("content") for m in sent.messages]
            assert texts[0].startswith("You are a careful coding agent.")
            user = [m["content"] for m in sent.messages if m["role"] == "user"]
            assert user == ["remember the number 42", "and the word tether", "what did I ask you to remember?"]
            assert sum(m["role"] == "assistant" for m in sent.messages) == 2  # both earlier answers
    finally:
        for u in upstreams:
            u.close()
