"""Separate-process mode: the bridge over `RemoteResponsesAPI` in front of a real Tether gRPC
server (both in this test process), plus `tether bridge --upstream` as a real subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import openai
import pytest
from openai import AsyncOpenAI
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.configs import instant_config
from tests.support.stacks import Stack
from tether import server
from tether.auth import Authenticator
from tether.core.engine import Engine
from tether.protocol.wire import error_from_rpc
from tether.service.remote import RemoteResponsesAPI

from .helpers import KEY_A, KEY_B, WEATHER_TOOL, recv_json, recv_response, send_json


class RemoteStack(Stack):
    def __init__(
        self, engine: Engine, bridge: Any, config: Any, grpc_server: Any, api: RemoteResponsesAPI
    ) -> None:
        super().__init__(engine, bridge, config)
        self.grpc = grpc_server
        self.api = api


@contextlib.asynccontextmanager
async def remote_stack(forward: bool) -> AsyncIterator[RemoteStack]:
    """Engine + gRPC server (keys sk-a/sk-b) <- RemoteResponsesAPI <- bridge.

    forward=True: callers' keys are forwarded upstream. forward=False: the bridge checks keys itself
    and calls upstream as sk-a."""
    config = instant_config()
    config.server.bridge = False  # the upstream: gRPC only
    upstream = await server.start(config, authenticator=Authenticator({KEY_A: "a", KEY_B: "b"}))
    engine, grpc_server = upstream.engine, upstream.grpc
    target = f"127.0.0.1:{grpc_server.port}"
    if forward:  # the callers' keys go upstream (ForwardingAuthenticator)
        remote = await server.start_remote_bridge(config, upstream=target)
    else:
        remote = await server.start_remote_bridge(
            config, upstream=target, api_key=KEY_A, authenticator=Authenticator({"sk-bridge": "x"})
        )
    try:
        yield RemoteStack(engine, remote.bridge, config, grpc_server, remote.api)
    finally:
        await remote.stop(0.5)
        await upstream.stop(0)


@pytest.fixture(params=[True, False], ids=["forward-keys", "bridge-key"])
async def remote(request: pytest.FixtureRequest) -> AsyncIterator[RemoteStack]:
    async with remote_stack(request.param) as s:
        s.key = KEY_A if request.param else "sk-bridge"  # type: ignore[attr-defined]
        yield s


async def test_ws_tool_loop_and_warmup_over_grpc(remote: Any) -> None:
    async with remote.client(remote.key) as client, client.responses.connect() as conn:
        await conn.send(
            {"type": "response.create", "model": "sim-model", "input": "setup", "generate": False}
        )
        warm = None
        async for ev in conn:
            if ev.type == "response.completed":
                warm = ev.response
                break
        assert warm is not None and warm.output == []
        await conn.response.create(
            model="sim-model",
            input="weather?",
            tools=[WEATHER_TOOL],
            previous_response_id=warm.id,
            store=False,
        )
        async for ev in conn:
            if ev.type == "response.completed":
                call = ev.response.output[0]
                first = ev.response
                break
        assert call.type == "function_call"
        await conn.response.create(
            model="sim-model",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
            tools=[WEATHER_TOOL],
            store=False,
        )
        async for ev in conn:
            if ev.type in ("response.completed", "error"):
                break
        assert ev.type == "response.completed" and ev.response.output_text


async def test_inject_over_grpc(remote: Any) -> None:
    """`response.inject` crosses the gRPC hop both ways (docs/fields.md "Injecting items")."""
    async with remote.client(remote.key) as client, client.beta.responses.connect() as conn:
        await conn.response.create(model="sim-model", input="hi", store=False)
        async for ev in conn:
            if ev.type == "response.completed":
                break
        items = [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
        await conn.response.inject(response_id=ev.response.id, input=items)
        async for ev in conn:
            if ev.type in ("response.inject.failed", "response.inject.created", "error"):
                break
        assert ev.type == "response.inject.failed" and ev.error.code == "response_already_completed"
        assert [i.model_dump(exclude_none=True) for i in ev.input] == items


async def test_http_endpoints_over_grpc(remote: Any) -> None:
    async with remote.client(remote.key) as client:
        assert (await client.responses.create(model="sim-model", input="hi")).status == "completed"
        stream = await client.responses.create(model="sim-model", input="hi", stream=True)
        assert [ev.type async for ev in stream][-1] == "response.completed"
        async with client.responses.connect() as conn:
            await conn.response.create(model="sim-model", input=[{"role": "user", "content": "keep me"}])
            async for ev in conn:
                if ev.type == "response.completed":
                    stored = ev.response
                    break
        assert (await client.responses.retrieve(stored.id)).id == stored.id
        items = await client.responses.input_items.list(stored.id)
        assert len(items.data) == 1
        count = await client.responses.input_tokens.count(model="sim-model", input="count me")
        assert count.input_tokens > 0
        compacted = await client.responses.compact(
            model="sim-model",
            input=[
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ],
        )
        assert compacted.output[-1].type == "compaction"
        listed = [m.id for m in (await client.models.list()).data]
        assert listed[:2] == ["sim-model", "tether-sim"]  # the route, then the catch-all's default name
        await client.responses.delete(stored.id)
        with pytest.raises(openai.NotFoundError) as info:
            await client.responses.retrieve(stored.id)
        assert info.value.code == "response_not_found" and info.value.param == "response_id"
        with pytest.raises(openai.BadRequestError) as bad:
            await client.responses.create(model="sim-model", input="x", previous_response_id="resp_nope")
        assert bad.value.code == "previous_response_not_found"


async def test_forwarded_keys_are_checked_and_scoped_upstream() -> None:
    async with remote_stack(forward=True) as stack:
        async with stack.client("sk-wrong") as bad:
            with pytest.raises(openai.AuthenticationError):
                await bad.responses.create(model="sim-model", input="x")
            with pytest.raises(openai.AuthenticationError):
                await bad.models.list()
        with pytest.raises(InvalidStatus) as info:
            async with stack.ws("sk-wrong"):
                pass
        assert info.value.response.status_code == 401
        with pytest.raises(InvalidStatus) as info:
            async with stack.ws(None):
                pass
        assert info.value.response.status_code == 401

        async with stack.ws(KEY_A) as conn:
            await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "mine"})
            mine = (await recv_response(conn))[-1]["response"]["id"]
        async with stack.client(KEY_B) as b:
            with pytest.raises(openai.NotFoundError):
                await b.responses.retrieve(mine)


async def test_upstream_shutdown_closes_with_1001() -> None:
    async with remote_stack(forward=True) as stack, stack.ws(KEY_A) as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "hi"})
        await recv_response(conn)
        await stack.engine.shutdown(grace=1.0)
        ev = await recv_json(conn)
        assert ev["type"] == "error" and ev["error"]["code"] == "server_shutting_down"
        with pytest.raises(ConnectionClosed):
            await recv_json(conn)  # exactly one error: the UNAVAILABLE status adds none
        assert conn.close_code == 1001


async def test_upstream_gone() -> None:
    async with remote_stack(forward=False) as stack:
        async with stack.ws("sk-bridge") as conn:
            await stack.grpc.stop(0)
            ev = await recv_json(conn)
            assert ev["type"] == "error" and ev["status"] == 503
            with pytest.raises(ConnectionClosed):
                await recv_json(conn)
        with pytest.raises(InvalidStatus) as info:
            async with stack.ws("sk-bridge"):
                pass
        assert info.value.response.status_code == 503
        async with stack.client("sk-bridge") as client:
            with pytest.raises(openai.InternalServerError) as err:
                await client.responses.create(model="sim-model", input="x")
            assert err.value.status_code == 503
        assert await stack.api.ready() is False


def test_error_mapping_from_status() -> None:
    def rpc(code: grpc.StatusCode, trailing: tuple[tuple[str, str], ...] = ()) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), "details here")

    err = error_from_rpc(
        rpc(
            grpc.StatusCode.INVALID_ARGUMENT,
            (
                ("tether-error-code", "invalid_type"),
                ("tether-error-param", "input[0]"),
                ("tether-error-status", "413"),
            ),
        )
    )
    assert (err.code, err.param, err.status, err.message) == ("invalid_type", "input[0]", 413, "details here")
    expected = {
        grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request"),
        grpc.StatusCode.NOT_FOUND: (404, "response_not_found"),
        grpc.StatusCode.UNAUTHENTICATED: (401, "invalid_api_key"),
        grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_exceeded"),
        grpc.StatusCode.UNAVAILABLE: (503, "upstream_unavailable"),
        grpc.StatusCode.INTERNAL: (500, "server_error"),
        grpc.StatusCode.DEADLINE_EXCEEDED: (500, "server_error"),
    }
    for code, (status, name) in expected.items():
        err = error_from_rpc(rpc(code))
        assert (err.status, err.code, err.param) == (status, name, None)
    assert error_from_rpc(rpc(grpc.StatusCode.UNAUTHENTICATED)).type == "authentication_error"


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGTERM")
async def test_tether_bridge_cli_subprocess() -> None:
    config = instant_config()
    config.server.bridge = False
    upstream = await server.start(config, authenticator=Authenticator({KEY_A: "a"}))
    grpc_server = upstream.grpc
    env = {**os.environ, "TETHER_API_KEYS": ""}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tether", "bridge", "--upstream", f"127.0.0.1:{grpc_server.port}",
        "--port", "0", "--host", "127.0.0.1", "--log-level", "info", "--set", "server.memory_reclaim_interval_s=0.2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("tether bridge: HTTP/WebSocket on http://127.0.0.1:"), line
        base_url = line.split(" on ", 1)[1].split(" -> ", 1)[0]
        async with AsyncOpenAI(base_url=base_url, api_key=KEY_A, max_retries=0) as client:
            assert (await client.responses.create(model="sim-model", input="via CLI")).status == "completed"
            async with client.responses.connect() as conn:
                await conn.response.create(model="sim-model", input="ws via CLI")
                async for ev in conn:
                    if ev.type == "response.completed":
                        break
        # Its one WebSocket closed, so the bridge's memory reclaimer runs (tether/process_memory.py).
        assert proc.stderr is not None
        while b'"memory reclaimed"' not in (log_line := await asyncio.wait_for(proc.stderr.readline(), 30)):
            assert log_line, "the bridge exited"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await upstream.stop(0)


async def test_conversations_over_grpc(remote: Any) -> None:
    """The bridge in front of a remote engine answers /v1/conversations through the gRPC RPCs."""
    async with remote.client(remote.key) as client:
        conv = await client.conversations.create(metadata={"k": "v"})
        r = await client.responses.create(model="sim-model", input="hello", conversation=conv.id)
        assert r.conversation is not None and r.conversation.id == conv.id
        items = [i async for i in client.conversations.items.list(conv.id, order="asc")]
        assert [i.role for i in items] == ["user", "assistant"]
        assert (await client.conversations.update(conv.id, metadata={"k": "w"})).metadata == {"k": "w"}
        assert (await client.conversations.delete(conv.id)).deleted
        with pytest.raises(openai.NotFoundError):
            await client.conversations.retrieve(conv.id)


async def test_one_upstream_key_refuses_several_local_tenants_unless_told(caplog, monkeypatch, capsys) -> None:
    """`--upstream-api-key` makes every local caller one tenant upstream: with local keys of two
    tenants the bridge refuses to start (b would read a's stored responses), unless told to merge."""
    from tether import cli

    config = instant_config()
    config.server.bridge = False
    upstream = await server.start(config, authenticator=Authenticator({KEY_A: "a"}))
    target = f"127.0.0.1:{upstream.grpc.port}"
    two_tenants = Authenticator({"sk-local-a": "a", "sk-local-b": "b"})
    try:
        with pytest.raises(ValueError, match="--merge-local-tenants"):
            await server.start_remote_bridge(config, upstream=target, api_key=KEY_A, authenticator=two_tenants)
        # Two keys of one tenant merge nothing: it starts.
        one_tenant = Authenticator({"sk-local-a": "a", "sk-local-a2": "a"})
        remote = await server.start_remote_bridge(config, upstream=target, api_key=KEY_A, authenticator=one_tenant)
        await remote.stop(0.5)
        with caplog.at_level("WARNING", logger="tether"):
            remote = await server.start_remote_bridge(
                config, upstream=target, api_key=KEY_A, authenticator=two_tenants, merge_tenants=True
            )
            await remote.stop(0.5)
        assert any("share ONE upstream tenant" in r.getMessage() for r in caplog.records)
        # Forwarding the callers' own keys has no such question: each is its own tenant upstream.
        remote = await server.start_remote_bridge(config, upstream=target)
        await remote.stop(0.5)
    finally:
        await upstream.stop(0)
    # The command line refuses before it listens, exit status 2 with the reason.
    monkeypatch.setenv("TETHER_API_KEYS", "sk-local-a:a,sk-local-b:b")
    argv = ["bridge", "--upstream", target, "--upstream-api-key", KEY_A, "--port", "0", "--host", "127.0.0.1"]
    assert cli.main(argv) == 2
    assert "2 local tenants" in capsys.readouterr().err
    assert cli.main(["bridge", "--upstream", target, "--merge-local-tenants"]) == 2
    assert "only means something with --upstream-api-key" in capsys.readouterr().err


async def test_background_resume_and_cancel_over_grpc(remote: Any) -> None:
    """The forwarding bridge passes background creates, stream retrieves and cancels on over gRPC
    (`CreateBackgroundResponse`, `StreamResponse`, `CancelResponse`); refusals keep their codes."""
    async with remote.client(remote.key) as client:
        created = await client.responses.create(model="sim-model", input="hello", background=True)
        assert created.status in ("queued", "in_progress") and created.background
        events = [ev async for ev in await client.responses.retrieve(created.id, stream=True)]
        assert events[-1].type == "response.completed"
        assert [ev.sequence_number for ev in events] == list(range(len(events)))
        tail = [ev async for ev in await client.responses.retrieve(created.id, stream=True, starting_after=1)]
        assert [ev.sequence_number for ev in tail] == list(range(2, len(events)))
        with pytest.raises(openai.BadRequestError) as ended:
            await client.responses.cancel(created.id)
        assert "already ended" in ended.value.message
        with pytest.raises(openai.BadRequestError) as unknown:
            await client.responses.retrieve("resp_unknown", stream=True)
        assert unknown.value.code == "replay_unavailable"
        with pytest.raises(openai.BadRequestError) as no_store:
            await client.responses.create(model="sim-model", input="x", background=True, store=False)
        assert no_store.value.body["param"] == "store"
