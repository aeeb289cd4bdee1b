"""One code, one status on every transport: representative errors raised over HTTP (the official
SDK and plain httpx) and over gRPC (a raw stub for unary RPCs, the typed client for an in-band
refusal) carry the same code with the catalogue's HTTP status, and a gRPC call ends with the
catalogue's gRPC status."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import openai
import pytest

import tether.client
from tests.support.stacks import Stack
from tether import errors
from tether.errors import CATALOGUE
from tether.protocol import wire
from tether.responses.v1 import service_pb2, service_pb2_grpc
from tether.service.grpc_server import start_grpc_server

from .helpers import KEY_A

UNARY_CASES = [
    # (code, HTTP method and path, gRPC method, request, API key)
    (errors.RESPONSE_NOT_FOUND, "GET", "/responses/resp_missing", "GetResponse",
     service_pb2.GetResponseRequest(response_id="resp_missing"), KEY_A),
    (errors.CONVERSATION_NOT_FOUND, "GET", "/conversations/conv_missing", "GetConversation",
     service_pb2.GetConversationRequest(conversation_id="conv_missing"), KEY_A),
    (errors.INVALID_API_KEY, "GET", "/models", "ListModels", service_pb2.ListModelsRequest(), "sk-not-a-key"),
]


async def http_error(stack: Stack, method: str, path: str, key: str, body: Any = None) -> tuple[int, str]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as http:
        r = await http.request(method, stack.base_url + path, json=body, headers={"authorization": f"Bearer {key}"})
    return r.status_code, r.json()["error"]["code"]


@pytest.mark.parametrize(("code", "method", "path", "rpc", "request_", "key"), UNARY_CASES,
                         ids=[c[0] for c in UNARY_CASES])
async def test_unary_errors_have_the_catalogue_statuses_on_http_and_grpc(
    stack: Stack, grpc_port: int, code: str, method: str, path: str, rpc: str, request_: Any, key: str
) -> None:
    kind = CATALOGUE[code]
    assert await http_error(stack, method, path, key) == (kind.http, code)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = service_pb2_grpc.ResponsesServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await getattr(stub, rpc)(request_, metadata=wire.bearer(key))
    assert failed.value.code() == grpc.StatusCode[kind.grpc]
    trailing = dict(failed.value.trailing_metadata() or ())
    assert (trailing[wire.ERROR_CODE_KEY], trailing[wire.ERROR_STATUS_KEY]) == (code, str(kind.http))


async def test_an_in_band_refusal_has_the_same_status_over_http_and_the_typed_client(
    stack: Stack, grpc_port: int
) -> None:
    kind = CATALOGUE[errors.PREVIOUS_RESPONSE_NOT_FOUND]
    async with stack.client() as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model="sim-model", input="hi", previous_response_id="resp_missing")
    assert refused.value.status_code == kind.http
    assert refused.value.body["code"] == errors.PREVIOUS_RESPONSE_NOT_FOUND  # type: ignore[index]
    async with tether.client.connect(f"127.0.0.1:{grpc_port}", api_key=KEY_A) as session:
        stream = await session.create("sim-model", "hi", previous_response_id="resp_missing")
        with pytest.raises(tether.client.TetherError) as failed:
            await stream.final_response()
    assert (failed.value.code, failed.value.status) == (errors.PREVIOUS_RESPONSE_NOT_FOUND, kind.http)


async def test_an_oversized_item_is_400_item_too_large_on_both(make_stack: Any, authenticator: Any) -> None:
    """The per-item limit is a 400 of its own (`item_too_large`), not the 413 of a whole body."""
    big = {"type": "message", "role": "user", "content": "x" * 3000}
    async with make_stack(max_item_bytes=2000) as stack:
        status, code = await http_error(stack, "POST", "/responses", KEY_A, {"model": "sim-model", "input": [big]})
        assert (status, code) == (400, errors.ITEM_TOO_LARGE)
        server = await start_grpc_server(stack.engine, stack.config, authenticator)
        try:
            async with tether.client.connect(f"127.0.0.1:{server.port}", api_key=KEY_A) as session:
                stream = await session.create("sim-model", [big])
                with pytest.raises(tether.client.TetherError) as failed:
                    await stream.final_response()
        finally:
            await server.stop(0)
    assert (failed.value.code, failed.value.status, failed.value.param) == (errors.ITEM_TOO_LARGE, 400, "input[0]")

