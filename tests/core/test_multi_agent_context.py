"""A multi-agent continuation rebuilds its agents' contexts from the chain without tokenising the
chain's items again: an agent's context carries each item's token count, taken from the chain's
segment (tokenised once, when the item joined the chain); only the multi-agent items, which an
agent reads in another form, are tokenised (exact counts, no timing)."""

from __future__ import annotations

from array import array

import orjson
import pytest

from tether import render
from tether.core import multi_agent
from tether.core.chain import Segment
from tether.core.items import user_message
from tether.responses.v1 import items_pb2


def _tagged(item: items_pb2.Item, agent: str) -> items_pb2.Item:
    item.agent.agent_name = agent
    return item


def _seg(item: items_pb2.Item, tokens: int) -> Segment:
    return Segment("k", item, array("I", range(tokens)))


def test_rebuild_reuses_the_chains_token_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    spawn = items_pb2.Item()
    spawn.multi_agent_call.action, spawn.multi_agent_call.call_id = "spawn_agent", "c1"
    spawn.multi_agent_call.arguments = orjson.dumps({"task_name": "w", "message": "task"}).decode()
    spawned = items_pb2.Item()
    spawned.multi_agent_call_output.action, spawned.multi_agent_call_output.call_id = "spawn_agent", "c1"
    spawned.multi_agent_call_output.output.add().output_text.text = '{"task_name": "/root/w"}'
    call = items_pb2.Item()
    call.function_call.call_id, call.function_call.name, call.function_call.arguments = "c2", "get_weather", "{}"
    chain = [
        _seg(user_message("question " * 50), 1000),  # the root's: counts as its segment says
        _seg(_tagged(spawn, "/root"), 7),
        _seg(_tagged(spawned, "/root"), 7),
        _seg(_tagged(call, "/root/w"), 500),
    ]
    encoded: list[str] = []
    real = render.encode
    monkeypatch.setattr(render, "encode", lambda text: encoded.append(text) or real(text))
    agents = multi_agent._rebuild(chain)
    root, worker = agents["/root"], agents["/root/w"]
    assert root.sizes[0] == 1000 and worker.sizes[-1] == 500
    # Tokenised now: the root's action call and its result (as a function call and its output),
    # and the worker's task (a user message made from the spawn): nothing the chain holds as is.
    assert len(encoded) == 3
    assert root.context_tokens == 1000 + sum(root.sizes[1:]) and len(root.sizes) == len(root.context) == 3
    assert worker.status is multi_agent.Status.WAITING_CLIENT
