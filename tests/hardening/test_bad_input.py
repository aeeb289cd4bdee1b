"""Deterministic replays of what the fuzzer found (tether_lab/fuzz/, docs/reliability.md
"Findings"): fixed ones as regression tests, open ones as strict xfails naming the core fix, so
each flips to a failure (remove the marker) the moment its fix lands."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import grpc
import pytest

from tether.backends.base import BackendBase, BackendRequest, TextDelta

from .support import (
    CREATE,
    KEY_A,
    full_stack,
    instant_config,
    local_adapter,
    recv_json,
    recv_turn,
    send_json,
    with_backend,
    with_models,
    ws_error,
)


async def test_http_query_integers_out_of_int32_range_are_400() -> None:
    """Fixed in the bridge: `?limit=99999999999` raised ValueError building the int32 proto field
    (HTTP 500 + a logged traceback)."""
    async with full_stack() as stack, stack.http() as h:
        for value in ("99999999999", "-99999999999", "2147483648"):
            r = await h.get("/v1/responses/resp_x/input_items", params={"limit": value})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text
        r = await h.get("/v1/responses/resp_x/input_items", params={"limit": "abc"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_type"


async def test_grpc_session_undecodable_message_ends_the_stream() -> None:
    async with full_stack() as stack, stack.channel() as channel:
        ident = lambda b: b  # noqa: E731
        call = channel.stream_stream(
            "/tether.responses.v1.ResponsesService/Session",
            request_serializer=ident,
            response_deserializer=ident,
        )(metadata=(("authorization", f"Bearer {KEY_A}"),))
        await call.write(b"\xff\xff\xff\xff\x0f not a SessionRequest")
        try:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(call.read(), 5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        finally:
            call.cancel()


async def test_grpc_unary_undecodable_request_is_invalid_argument() -> None:
    async with full_stack() as stack, stack.channel() as channel:
        ident = lambda b: b  # noqa: E731
        call = channel.unary_unary(
            "/tether.responses.v1.ResponsesService/GetResponse",
            request_serializer=ident,
            response_deserializer=ident,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"\xff\xff\xff", metadata=(("authorization", f"Bearer {KEY_A}"),), timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@dataclasses.dataclass
class BrokenConfig:
    pass


class Broken(BackendBase):
    """A backend with a bug: it raises a plain exception (not a BackendError) mid-stream."""

    kind: ClassVar[str] = "hardening_broken"
    Config: ClassVar[type] = BrokenConfig

    def __init__(self, name: str, config: Any = None) -> None:
        self.name = name

    async def stream(self, request: BackendRequest) -> AsyncIterator[Any]:
        yield TextDelta("partial ")
        raise RuntimeError("adapter bug")



local_adapter(Broken)


async def test_backend_bug_ends_the_turn_with_response_failed() -> None:
    config = instant_config()
    with_backend(config, "broken", "hardening_broken")
    with_models(config, {"broken": {"backend": "broken"}, "*": {"backend": "sim"}})
    async with full_stack(config) as stack, stack.ws() as conn:
        await send_json(conn, {**CREATE, "model": "broken"})
        events = await recv_turn(conn)
        assert events[-1]["type"] == "response.failed", [e["type"] for e in events]
        await send_json(conn, CREATE)  # the session goes on
        assert (await recv_turn(conn))[-1]["type"] == "response.completed"


BAD_PARAMS = [
    ("text.format without type", {"text": {"format": {"name": "x"}}}),
    ("text.format json_schema without schema", {"text": {"format": {"type": "json_schema", "name": "x"}}}),
    ("text.format unknown type", {"text": {"format": {"type": "yaml"}}}),
    ("reasoning.summary not in the enum", {"reasoning": {"summary": "verbose"}}),
    ("reasoning.effort not in the enum", {"reasoning": {"effort": "extreme"}}),
    ("truncation not in the enum", {"truncation": "sometimes"}),
    ("service_tier not in the enum", {"service_tier": "gold"}),
]


@pytest.mark.parametrize("name,extra", BAD_PARAMS, ids=[n for n, _ in BAD_PARAMS])
async def test_invalid_enum_and_shape_fields_are_rejected(name: str, extra: dict[str, Any]) -> None:
    async with full_stack() as stack, stack.ws() as conn:
        await send_json(conn, {**CREATE, **extra})
        ev = await recv_json(conn)
        ws_error(ev, "invalid_request", 400)
