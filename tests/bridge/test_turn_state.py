"""`x-codex-turn-state` (tether/bridge/turn_state.py): which responses carry it and what it is.

The routing on it goes through a real nginx in tests/scaleout/test_replicas.py; here, in process:
a replica with `server.replica_id` names itself on every HTTP response (errors too) and on an
accepted WebSocket upgrade, not on a refused upgrade nor while it drains; one without names
nothing; the settings are checked at load.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from tests.support.configs import instant_config
from tests.support.stacks import running_stack
from tether.bridge import turn_state
from tether.config import from_dict

from .helpers import KEY_A

AUTH = {"Authorization": f"Bearer {KEY_A}"}


def _config(replica_id: str = "") -> Any:
    cfg = instant_config()
    cfg.server.replica_id, cfg.server.turn_state_key = replica_id, "k" if replica_id else None
    return cfg


async def test_a_replica_names_itself_on_every_answer(authenticator: Any) -> None:
    token = turn_state.token("replica-a", "k")
    async with running_stack(authenticator, config=_config("replica-a")) as stack:
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
            answers = [
                await http.post("/responses", headers=AUTH, json={"model": "sim-model", "input": "hi", "stream": True}),
                await http.post("/responses", headers=AUTH, json={"model": "sim-model", "input": "hi"}),
                await http.get("/models", headers=AUTH),
                await http.get("/responses/resp_missing", headers=AUTH),  # 404
                await http.get("/models"),  # 401
            ]
            assert [r.status_code for r in answers] == [200, 200, 200, 404, 401]
            assert all(r.headers.get("x-codex-turn-state") == token for r in answers)
        async with stack.ws() as conn:
            assert conn.response.headers["x-codex-turn-state"] == token
        with pytest.raises(InvalidStatus) as refused:  # a refused upgrade names no replica
            async with stack.ws(key="sk-wrong"):
                pass
        assert refused.value.response.status_code == 401
        assert "x-codex-turn-state" not in refused.value.response.headers
        stack.bridge.app.draining = True  # going away: it must not pull a turn back to itself
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
            assert "x-codex-turn-state" not in (await http.get("/models", headers=AUTH)).headers


async def test_without_a_replica_id_there_is_no_header(stack: Any) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        assert "x-codex-turn-state" not in (await http.get("/models", headers=AUTH)).headers
    async with stack.ws() as conn:
        assert "x-codex-turn-state" not in conn.response.headers


def test_the_token_names_the_replica_and_depends_on_the_key() -> None:
    a = turn_state.token("replica-a", "k")
    assert a.startswith("replica-a.") and a == turn_state.token("replica-a", "k")
    assert a != turn_state.token("replica-a", "other-key")
    assert turn_state.token("replica-b", "k").split(".")[1] != a.split(".")[1]


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"replica_id": "replica-a"}, "turn_state_key must be set"),
        ({"replica_id": "a b", "turn_state_key": "k"}, "replica_id must be"),
        ({"replica_id": "x" * 65, "turn_state_key": "k"}, "replica_id must be"),
    ],
)
def test_replica_settings_are_checked(server: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_dict({"server": server})
