"""Errors the bridge answers, in-process and standalone (`tether bridge --upstream`):

- a create refused at admission (too many connections for the key, requests per minute, a bad
  key, the server shutting down) gets the catalogue's HTTP status and OpenAI error body through
  the standalone bridge exactly as through the in-process one, streaming or not (the standalone
  bridge answered 500 `server_error` to the refusals the Engine raises at admission);
- every error the bridge answers is counted once in `tether_errors_total{code}`: its own
  (bad JSON, 413, unknown route, 405, 426, bad key, a refused WebSocket handshake) and refusals the
  API raised, while an error the core sent in-band (and counted) is not counted again. A
  standalone bridge counts what it answers in its own `/metrics` (it has no engine)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.configs import instant_config
from tests.support.metrics import http_get, samples, value
from tether import errors, server
from tether.auth import Authenticator
from tether.errors import CATALOGUE

from .helpers import KEY_A, KEY_B


@contextlib.asynccontextmanager
async def two_bridges(**limits: Any) -> AsyncIterator[tuple[server.Running, server.RemoteBridge]]:
    """One upstream Tether (engine, gRPC, its in-process bridge; keys sk-a/sk-b) and a standalone
    bridge in front of its gRPC port, forwarding the callers' keys."""
    config = instant_config(**limits)
    config.server.bridge = True
    upstream = await server.start(config, authenticator=Authenticator({KEY_A: "a", KEY_B: "b"}))
    remote = await server.start_remote_bridge(config, upstream=f"127.0.0.1:{upstream.grpc_port}")
    try:
        yield upstream, remote
    finally:
        await remote.stop(0.5)
        await upstream.stop(0)


def _base_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/v1"


async def _refusal(port: int, key: str, *, stream: bool) -> tuple[int, str | None, dict[str, Any]]:
    """(HTTP status, error code, error body) of a refused create, read by the official SDK."""
    async with AsyncOpenAI(base_url=_base_url(port), api_key=key, max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            if stream:
                async for _ in await client.responses.create(model="sim-model", input="x", stream=True):
                    pass
            else:
                await client.responses.create(model="sim-model", input="x")
    body = refused.value.body
    assert isinstance(body, dict)
    return refused.value.status_code, refused.value.code, body


# (case id, limits, key, code)
REFUSALS = [
    ("connections-per-key", {"max_connections_per_key": 0}, KEY_A, errors.RATE_LIMIT_EXCEEDED),
    ("requests-per-minute", {"requests_per_minute": 1}, KEY_A, errors.RATE_LIMIT_EXCEEDED),
    ("bad-key", {}, "sk-wrong", errors.INVALID_API_KEY),
    ("shutting-down", {}, KEY_A, errors.SERVER_SHUTTING_DOWN),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("limits", "key", "code"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
async def test_a_refused_create_has_the_same_status_through_the_standalone_bridge(
    limits: dict[str, Any], key: str, code: str, stream: bool
) -> None:
    async with two_bridges(**limits) as (upstream, remote):
        if limits.get("requests_per_minute"):
            async with AsyncOpenAI(base_url=_base_url(upstream.bridge_port), api_key=key, max_retries=0) as c:
                assert (await c.responses.create(model="sim-model", input="x")).status == "completed"
        if code == errors.SERVER_SHUTTING_DOWN:
            await upstream.engine.shutdown(grace=0)
        in_process = await _refusal(upstream.bridge_port, key, stream=stream)  # type: ignore[arg-type]
        standalone = await _refusal(remote.bridge.port, key, stream=stream)
    assert in_process[:2] == (CATALOGUE[code].http, code)
    assert standalone[:2] == in_process[:2]
    assert standalone[2]["type"] == in_process[2]["type"] == CATALOGUE[code].type
    assert "Unexpected" not in standalone[2]["message"]


async def _scrape(port: int) -> dict:
    status, _, body = await http_get(port, "/metrics")
    assert status == 200
    return samples(body.decode())


async def _bridge_level_errors(port: int, key: str) -> list[str]:
    """Errors the bridge answers before (or instead of) the core, over HTTP and the WebSocket
    handshake; the codes it answered."""
    codes: list[str] = []
    auth = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=_base_url(port), timeout=30) as http:
        requests = [
            ("POST", "/responses", {"content": b"{not json", "headers": auth}),
            ("POST", "/responses", {"content": b'{"input": "' + b"x" * 5000 + b'"}', "headers": auth}),
            ("POST", "/responses", {"json": {"model": "sim-model", "input": 5}, "headers": auth}),
            ("GET", "/nowhere", {"headers": auth}),
            ("DELETE", "/models", {"headers": auth}),
            ("GET", "/responses", {"headers": auth}),
            ("GET", "/models", {"headers": {"authorization": "Bearer sk-wrong"}}),
            ("GET", "/models", {}),
        ]
        for method, path, kwargs in requests:
            r = await http.request(method, _base_url(port) + path, **kwargs)
            assert r.status_code >= 400, (method, path)
            codes.append(r.json()["error"]["code"])
    for path, headers in (("/v1/responses", {"authorization": "Bearer sk-wrong"}), ("/v1/elsewhere", auth)):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"ws://127.0.0.1:{port}{path}", additional_headers=headers):
                pass
        codes.append(json.loads(refused.value.response.body or b"{}")["error"]["code"])
    return codes


def _counted(before: dict, after: dict, codes: set[str]) -> dict[str, float]:
    return {c: value(after, "tether_errors_total", code=c) - value(before, "tether_errors_total", code=c) for c in codes}


async def test_bridge_level_errors_are_counted_once_and_core_errors_still_once() -> None:
    async with two_bridges(max_request_bytes=4096) as (upstream, _):
        port = upstream.bridge_port
        assert port is not None
        before = await _scrape(port)
        codes = await _bridge_level_errors(port, KEY_A)
        after = await _scrape(port)
        assert set(codes) >= {
            errors.INVALID_JSON, errors.REQUEST_TOO_LARGE, errors.NOT_FOUND, errors.METHOD_NOT_ALLOWED,
            errors.UPGRADE_REQUIRED, errors.INVALID_API_KEY,
        }
        assert _counted(before, after, set(codes)) == {c: codes.count(c) for c in set(codes)}

        # An error the core sends in-band (and counts) is counted once, not again by the bridge.
        async with AsyncOpenAI(base_url=_base_url(port), api_key=KEY_A, max_retries=0) as client:
            for stream in (False, True):
                with pytest.raises(openai.BadRequestError):
                    await client.responses.create(
                        model="sim-model", input="x", previous_response_id="resp_missing", stream=stream
                    )
        final = await _scrape(port)
        assert _counted(after, final, {errors.PREVIOUS_RESPONSE_NOT_FOUND}) == {errors.PREVIOUS_RESPONSE_NOT_FOUND: 2}


async def test_a_refusal_the_engine_raises_is_counted_once() -> None:
    """Too many connections for the key: the Engine raises at admission (it counts nothing), and
    each process counts the refusal it answers, once: the in-process bridge its 429; through the
    standalone bridge, the upstream's gRPC service the call it ended (it cannot tell a bridge from
    any other gRPC client) and the standalone bridge its 429, in its own metrics."""
    async with two_bridges(max_connections_per_key=0) as (upstream, remote):
        port = upstream.bridge_port
        assert port is not None
        code = errors.RATE_LIMIT_EXCEEDED
        before, remote_before = await _scrape(port), await _scrape(remote.bridge.port)
        assert (await _refusal(port, KEY_A, stream=True))[1] == code
        assert _counted(before, await _scrape(port), {code}) == {code: 1}
        assert (await _refusal(remote.bridge.port, KEY_A, stream=False))[1] == code
        assert _counted(before, await _scrape(port), {code}) == {code: 2}
        assert _counted(remote_before, await _scrape(remote.bridge.port), {code}) == {code: 1}


async def test_the_standalone_bridge_counts_what_it_answers_in_its_own_metrics() -> None:
    async with two_bridges(max_request_bytes=4096) as (upstream, remote):
        port, upstream_port = remote.bridge.port, upstream.bridge_port
        assert upstream_port is not None
        before, upstream_before = await _scrape(port), await _scrape(upstream_port)
        codes = await _bridge_level_errors(port, KEY_A)
        after = await _scrape(port)
        assert {errors.INVALID_JSON, errors.REQUEST_TOO_LARGE, errors.NOT_FOUND, errors.INVALID_API_KEY} <= set(codes)
        assert _counted(before, after, set(codes)) == {c: codes.count(c) for c in set(codes)}
        assert value(after, "process_cpu_seconds_total") > 0
        # No turns are served here: the engine's metrics are the upstream's.
        assert not [k for k in after if k[0].startswith("tether_turns")]

        # An in-band error of the upstream's core: counted there once, not by this bridge.
        async with AsyncOpenAI(base_url=_base_url(port), api_key=KEY_A, max_retries=0) as client:
            with pytest.raises(openai.BadRequestError):
                await client.responses.create(model="sim-model", input="x", previous_response_id="resp_missing")
        code = errors.PREVIOUS_RESPONSE_NOT_FOUND
        assert _counted(after, await _scrape(port), {code}) == {code: 0}
        assert _counted(upstream_before, await _scrape(upstream_port), {code}) == {code: 1}


async def test_errors_the_grpc_service_ends_calls_with_are_counted_once() -> None:
    """A call the gRPC service ends with an error status (a bad key, an unknown id, an undecodable
    request, a session refused at admission) is counted once in `tether_errors_total{code}`; an
    error a session sends in-band (counted by the core) is not counted again."""
    import grpc

    from tether.protocol import json_codec, wire
    from tether.responses.v1 import service_pb2, service_pb2_grpc

    async with two_bridges(max_connections_per_key=1) as (upstream, _):
        before = await _scrape(upstream.bridge_port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{upstream.grpc_port}") as channel:
            stub = service_pb2_grpc.ResponsesServiceStub(channel)
            ended: list[str] = []
            for key, rpc, request in (
                ("sk-wrong", "ListModels", service_pb2.ListModelsRequest()),
                (KEY_A, "GetResponse", service_pb2.GetResponseRequest(response_id="resp_nope")),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await getattr(stub, rpc)(request, metadata=wire.bearer(key))
                ended.append(dict(failed.value.trailing_metadata() or ())[wire.ERROR_CODE_KEY])
            raw = channel.unary_unary("/tether.responses.v1.ResponsesService/GetResponse")
            with pytest.raises(grpc.aio.AioRpcError):
                await raw(b"\xff\xff\xff", metadata=wire.bearer(KEY_A))
            # One session holds the key's only slot; a second is refused at admission. The first
            # gets an in-band error (an unknown previous response), which the core counts.
            first = stub.Session(metadata=wire.bearer(KEY_A))
            await first.write(json_codec.client_event_from_json(
                {"type": "response.create", "model": "sim-model", "input": "x", "previous_response_id": "resp_gone"}
            ))  # fmt: skip
            reply = await first.read()
            assert any(ev.WhichOneof("event") == "error" for ev in reply.events), reply
            second = stub.Session(metadata=wire.bearer(KEY_A))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await second.read()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            await first.done_writing()
            while await first.read() != grpc.aio.EOF:
                pass
        after = await _scrape(upstream.bridge_port)
    assert ended == [errors.INVALID_API_KEY, errors.RESPONSE_NOT_FOUND]
    counted = _counted(before, after, {errors.INVALID_API_KEY, errors.RESPONSE_NOT_FOUND, errors.INVALID_REQUEST,
                                        errors.RATE_LIMIT_EXCEEDED, errors.PREVIOUS_RESPONSE_NOT_FOUND})  # fmt: skip
    assert counted == {
        errors.INVALID_API_KEY: 1,
        errors.RESPONSE_NOT_FOUND: 1,
        errors.INVALID_REQUEST: 1,  # the undecodable request
        errors.RATE_LIMIT_EXCEEDED: 1,
        errors.PREVIOUS_RESPONSE_NOT_FOUND: 1,
    }
