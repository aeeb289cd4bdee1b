"""Two real llama.cpp replicas (the suite's llama-cpp-python server with SmolLM2-135M, two ports)
behind one Tether pool with chain-affine routing, driven by the openai SDK over WebSocket mode:

- a conversation's continuations land on one replica and reuse its prompt cache, as that server
  reports it (llama-cpp-python's `Llama.generate: N prefix-match hit` lines in its log);
- killing that replica mid-conversation moves the next turn to the other one, which is sent the
  whole history.

Behaviour only, no timing assertions.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.support.served import loopback, served
from tether.config import from_dict

from .conftest import ALIAS, KEY, LlamaServer, start_llama_server

PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit")
PROMPT_EVAL = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[LlamaServer]]:
    started: list[LlamaServer] = []
    try:
        for i in range(2):
            started.append(start_llama_server(tmp_path / f"llama-{i}.log", threads=1))
        yield started
    finally:
        for server in started:
            server.stop()


async def turn(conn: Any, **body: Any) -> Any:
    """One turn; the instructions go with every turn (they are not inherited), as agents send them."""
    await conn.response.create(
        model=ALIAS, instructions="You are terse.", store=True, max_output_tokens=12, temperature=0, **body
    )
    async for ev in conn:
        if ev.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            assert ev.type in ("response.completed", "response.incomplete"), ev
            return ev.response
    raise AssertionError("no terminal event")


async def test_continuations_stay_on_one_real_replica_and_fail_over_with_the_history(tmp_path, replicas):
    cfg = loopback(from_dict({
        "store": f"sqlite:///{tmp_path}/t.db",
        "backends": {"llama": {
            "kind": "openai", "max_retries": 0,
            "pool": {"replicas": [r.base_url for r in replicas], "policy": "chain-affine",
                     "eject_after_failures": 1, "eject_s": 3600},
        }},
        "models": {ALIAS: {"backend": "llama"}},
    }))  # fmt: skip
    async with served(cfg, {KEY: "t"}) as s:
        client = AsyncOpenAI(base_url=s.base_url, api_key=KEY, max_retries=0, timeout=120)

        async def replica_of(response_id: str) -> str:
            await s.engine.post.flush()
            return (await s.engine.store.load_context("t", response_id)).replica

        async with client.responses.connect() as conn:
            chain = [await turn(conn, input="My name is Ada. Say hi.")]
            for text in ("What is two plus two?", "Name a colour."):
                chain.append(await turn(conn, previous_response_id=chain[-1].id, input=text))
            served_by = {await replica_of(r.id) for r in chain}
            assert len(served_by) == 1
            home = next(r for r in replicas if r.base_url in served_by)
            other = next(r for r in replicas if r is not home)
            # The serving replica's own report: each continuation reused the cached prefix.
            hits = [int(n) for n in PREFIX_HIT.findall(home.log())]
            assert len(hits) >= 2 and all(n > 20 for n in hits[-2:]), home.log()[-3000:]
            assert not PROMPT_EVAL.findall(other.log())  # the other replica computed nothing
            first_turn_prompt = int(PROMPT_EVAL.findall(home.log())[0])

            home.stop()  # the replica dies mid-conversation
            moved = await turn(conn, previous_response_id=chain[-1].id, input="What is my name?")
        assert await replica_of(moved.id) == other.base_url
        # The other replica, with nothing cached, prefilled the whole conversation: far more prompt
        # tokens than the first turn needed.
        evaluated = [int(n) for n in PROMPT_EVAL.findall(other.log())]
        assert evaluated and evaluated[0] > first_turn_prompt + 20, (evaluated, first_turn_prompt)
        items = await client.responses.input_items.list(moved.id, order="asc", limit=20)
        roles = [getattr(i, "role", None) for i in items.data]
        assert roles == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
        await client.close()
