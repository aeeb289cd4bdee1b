"""Authentication, tenant isolation and the per-key connection limit, on HTTP and WebSocket."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tether.auth import Authenticator

from .conftest import running_stack
from .helpers import KEY_A, KEY_B, recv_json, recv_response, send_json, wait_for


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic sk-a"}]
)
async def test_http_requires_a_valid_key(stack: Any, headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}") as h:
        for method, path in (
            ("POST", "/v1/responses"),
            ("GET", "/v1/models"),
            ("GET", "/v1/responses/resp_x"),
        ):
            r = await h.request(method, path, headers=headers, json={"model": "m", "input": "x"})
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert r.json()["error"]["type"] == "authentication_error"
        # Health endpoints need no key.
        assert (await h.get("/healthz")).status_code == 200


async def test_sdk_with_a_wrong_key(stack: Any) -> None:
    async with stack.client("sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.responses.create(model="sim-model", input="x")


@pytest.mark.parametrize("key", [None, "sk-wrong"])
async def test_ws_upgrade_requires_a_valid_key(stack: Any, key: str | None) -> None:
    with pytest.raises(InvalidStatus) as info:
        async with stack.ws(key):
            pass
    response = info.value.response
    assert response.status_code == 401
    assert b'"code":"invalid_api_key"' in response.body
    assert response.headers["Content-Type"] == "application/json"


async def test_tenant_isolation(stack: Any) -> None:
    async with stack.ws(KEY_A) as conn:
        await send_json(
            conn, {"type": "response.create", "model": "sim-model", "input": "mine", "store": True}
        )
        mine = (await recv_response(conn))[-1]["response"]["id"]
        # Same tenant, new connection: continues from the store.
        async with stack.ws(KEY_A) as again:
            await send_json(
                again,
                {
                    "type": "response.create",
                    "model": "sim-model",
                    "input": "go",
                    "previous_response_id": mine,
                },
            )
            assert (await recv_response(again))[-1]["type"] == "response.completed"

    async with stack.client(KEY_A) as a:
        assert (await a.responses.retrieve(mine)).id == mine
    async with stack.client(KEY_B) as b:
        with pytest.raises(openai.NotFoundError):
            await b.responses.retrieve(mine)
        with pytest.raises(openai.NotFoundError):
            await b.responses.input_items.list(mine)
        with pytest.raises(openai.NotFoundError):
            await b.responses.delete(mine)
        with pytest.raises(openai.BadRequestError) as info:
            await b.responses.create(model="sim-model", input="steal", previous_response_id=mine)
        assert info.value.code == "previous_response_not_found"

    async with stack.ws(KEY_B) as conn:
        await send_json(
            conn,
            {"type": "response.create", "model": "sim-model", "input": "steal", "previous_response_id": mine},
        )
        ev = await recv_json(conn)
        assert ev["type"] == "error" and ev["error"]["code"] == "previous_response_not_found"


async def test_per_key_connection_limit(make_stack: Any) -> None:
    async with make_stack(max_connections_per_key=2) as stack:
        async with stack.ws(KEY_A), stack.ws(KEY_A) as second:
            with pytest.raises(InvalidStatus) as info:
                async with stack.ws(KEY_A):
                    pass
            assert info.value.response.status_code == 429
            assert b'"code":"rate_limit_exceeded"' in info.value.response.body
            # Other keys are not affected, and the open sockets still work.
            async with stack.ws(KEY_B) as other:
                await send_json(other, {"type": "response.create", "model": "sim-model", "input": "x"})
                assert (await recv_response(other))[-1]["type"] == "response.completed"
            await send_json(second, {"type": "response.create", "model": "sim-model", "input": "x"})
            assert (await recv_response(second))[-1]["type"] == "response.completed"
        await wait_for(lambda: not stack.engine.sessions)
        async with stack.ws(KEY_A), stack.ws(KEY_A):
            pass


async def test_open_server_needs_no_key() -> None:
    async with running_stack(Authenticator({})) as stack:
        async with stack.client("anything") as client:
            assert (await client.responses.create(model="sim-model", input="x")).status == "completed"
        async with connect(stack.ws_url) as conn:
            await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "x"})
            assert (await recv_response(conn))[-1]["type"] == "response.completed"
