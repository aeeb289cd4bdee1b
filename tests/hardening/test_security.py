"""Security properties: unguessable ids, constant-time key checks, tenant isolation on every path
and every transport, nothing secret in the logs, and the HTTP front end's defences against
slow-loris clients and oversized request heads."""

from __future__ import annotations

import asyncio
import collections
import hmac
import io
import logging
import re
from typing import Any

import grpc
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.bridge.helpers import is_terminal, recv_until
from tether import auth, ids
from tether.logging_setup import setup_logging
from tether.responses.v1 import request_pb2, service_pb2, service_pb2_grpc

from .support import (
    CREATE,
    KEY_A,
    KEY_B,
    full_stack,
    instant_config,
    recv_json,
    recv_response,
    send_json,
    with_backend,
    with_models,
    ws_error,
)

ID_RE = re.compile(r"^(?P<prefix>[a-z]+)_(?P<hex>[0-9a-f]{32})$")
TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}


# -- ids ---------------------------------------------------------------------------------------------


def test_ids_carry_128_random_bits() -> None:
    n = 20_000
    samples = [ids.response_id() for _ in range(n)]
    assert len(set(samples)) == n
    hexes = []
    for rid in samples:
        m = ID_RE.match(rid)
        assert m and m["prefix"] == "resp", rid
        hexes.append(m["hex"])
    # Every one of the 32 hex digits is uniform over 16 symbols (chi-square, 15 degrees of
    # freedom; 60 is far beyond p = 1e-6), and the 128 bits are balanced overall.
    for pos in range(32):
        counts = collections.Counter(h[pos] for h in hexes)
        expected = n / 16
        chi2 = sum((counts.get(c, 0) - expected) ** 2 / expected for c in "0123456789abcdef")
        assert chi2 < 60, (pos, chi2)
    ones = sum(bin(int(h, 16)).count("1") for h in hexes)
    total = 128 * n
    assert abs(ones - total / 2) < 6 * (total / 4) ** 0.5
    for make in (ids.message_id, ids.function_call_id, ids.reasoning_id, ids.compaction_id, ids.call_id):
        assert ID_RE.match(make())


async def test_ids_on_the_wire_are_unguessable() -> None:
    async with full_stack() as stack, stack.ws() as conn:
        await send_json(conn, {**CREATE, "store": True, "tools": [TOOL]})
        events = await recv_response(conn)
        first = events[-1]["response"]
        call = first["output"][0]
        await send_json(conn, {**CREATE, "store": True, "previous_response_id": first["id"], "tools": [TOOL],
                               "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "x"}]})  # fmt: skip
        events += await recv_response(conn)
    seen = set()
    for ev in events:
        if "response" in ev:
            seen.add(ev["response"]["id"])
        if "item" in ev:
            seen.add(ev["item"]["id"])
        if "item_id" in ev:
            seen.add(ev["item_id"])
    assert len(seen) >= 4
    for value in seen:
        assert ID_RE.match(value), value


# -- API keys ------------------------------------------------------------------------------------------


def test_api_keys_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configured key is compared, whatever the presented key (no early exit, so the time
    does not say which key or how many matched), always as 32-byte SHA-256 digests (so it does not
    depend on the presented key's length or on a shared prefix), with `hmac.compare_digest`."""
    keys = {f"sk-key-{i:02d}-{'x' * i}": f"tenant-{i}" for i in range(8)}
    authenticator = auth.Authenticator(keys)
    assert all(len(d) == 32 for d, _ in authenticator._entries)
    assert not any(k.encode() in repr(authenticator._entries).encode() for k in keys)  # digests only
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    presented = [*list(keys)[:1], *list(keys)[-1:], "sk-key-00-", "nope", "sk-" + "z" * 500]
    for key in presented:
        calls.clear()
        try:
            tenant = authenticator.tenant_for(f"Bearer {key}")
            assert tenant == keys[key]
        except Exception as exc:  # noqa: BLE001 - a wrong key: 401
            assert getattr(exc, "code", None) == "invalid_api_key"
        assert calls == [(32, 32)] * len(keys), key


# -- tenant isolation ----------------------------------------------------------------------------------


async def test_tenant_isolation_on_every_path_and_transport() -> None:
    """Tenant b holds tenant a's ids (a stored tool loop, a store=false response cached on a's
    connection, a response a is generating right now, a's lane) and tries every path with them
    over HTTP, WebSocket and gRPC. Nothing is found, nothing changes, nothing of a's leaks."""
    secret_text = "tenant-a private text 8c1f"
    config = instant_config()
    with_backend(config, "slow", "simulated", ttft_ms=0, tokens_per_s=300, output_tokens=300, tick_ms=5)
    with_models(config, {"slow": {"backend": "slow"}, "*": {"backend": "sim"}})
    async with full_stack(config) as stack, stack.channel() as channel:
        async with stack.ws(KEY_A) as a:
            await send_json(
                a, {**CREATE, "input": secret_text, "store": True, "tools": [TOOL], "stream_id": "lane1"}
            )
            stored = (await recv_response(a, within=30))[-1]["response"]
            call_id = stored["output"][0]["call_id"]
            await send_json(a, {**CREATE, "input": "cached only", "store": False})
            cached = (await recv_response(a, within=30))[-1]["response"]["id"]
            await send_json(a, {**CREATE, "model": "slow", "input": "long answer", "store": True})
            active = (await recv_json(a))["response"]["id"]  # generating while b tries
            rid = stored["id"]
            others = [rid, cached, active]

            # -- HTTP
            async with stack.http(KEY_B) as h:
                for target in others:
                    for method, path in (("GET", f"/v1/responses/{target}"), ("DELETE", f"/v1/responses/{target}"),
                                         ("GET", f"/v1/responses/{target}/input_items")):  # fmt: skip
                        r = await h.request(method, path)
                        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found", (
                            path
                        )
                    for path in ("/v1/responses", "/v1/responses/input_tokens", "/v1/responses/compact"):
                        r = await h.post(
                            path, json={"model": "m", "input": "x", "previous_response_id": target}
                        )
                        assert r.status_code == 400, (path, r.text)
                        assert r.json()["error"]["code"] == "previous_response_not_found", path
                        assert secret_text not in r.text

            # -- WebSocket (b's own connection, a's lane name, a's call id)
            async with stack.ws(KEY_B) as b:
                for target in others:
                    for extra in ({}, {"stream_id": "lane1"},
                                  {"context_management": [{"type": "compaction", "compact_threshold": 1000}]}):  # fmt: skip
                        await send_json(b, {**CREATE, "previous_response_id": target, **extra})
                        ws_error(await recv_json(b), "previous_response_not_found")
                    await send_json(b, {"type": "response.cancel", "response_id": target})
                    ws_error(await recv_json(b), "response_not_found")
                    await send_json(
                        b, {"type": "response.steer", "previous_response_id": target, "input": "hijack"}
                    )
                    failed = await recv_json(b)
                    assert failed["type"] == "response.steer.failed"
                    assert failed["error"]["code"] == "response_not_found"
                await send_json(
                    b,
                    {
                        "type": "response.append",
                        "input": [{"type": "message", "role": "user", "content": "more"}],
                    },
                )
                ws_error(await recv_json(b), "previous_response_not_found")
                await send_json(b, {**CREATE, "stream_id": "lane1",
                                    "input": [{"type": "function_call_output", "call_id": call_id, "output": "x"}]})  # fmt: skip
                ws_error(await recv_json(b), "unknown_call_id")

            # -- gRPC
            stub = service_pb2_grpc.ResponsesServiceStub(channel)
            md = (("authorization", f"Bearer {KEY_B}"),)
            for target in others:
                for rpc, request in (
                    (stub.GetResponse, service_pb2.GetResponseRequest(response_id=target)),
                    (stub.DeleteResponse, service_pb2.DeleteResponseRequest(response_id=target)),
                    (stub.ListInputItems, service_pb2.ListInputItemsRequest(response_id=target)),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await rpc(request, metadata=md)
                    assert info.value.code() == grpc.StatusCode.NOT_FOUND
                    assert dict(info.value.trailing_metadata())["tether-error-code"] == "response_not_found"
                params = request_pb2.ResponseCreateParams(
                    model="m", input_text="x", previous_response_id=target
                )
                for rpc, request in (
                    (stub.CountInputTokens, service_pb2.CountInputTokensRequest(params=params)),
                    (stub.CompactResponse, service_pb2.CompactResponseRequest(params=params)),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await rpc(request, metadata=md)
                    assert (
                        dict(info.value.trailing_metadata())["tether-error-code"]
                        == "previous_response_not_found"
                    )
                events = [
                    ev
                    async for batch in stub.CreateResponse(
                        service_pb2.CreateResponseRequest(params=params), metadata=md
                    )
                    for ev in batch.events
                ]
                assert [ev.error.error.code for ev in events] == ["previous_response_not_found"]
                session = stack.session(channel, KEY_B)
                await session.create(model="m", input="x", previous_response_id=target)
                assert (await session.until_terminal()).error.error.code == "previous_response_not_found"
                cancel = service_pb2.SessionRequest()
                cancel.cancel.response_id = target
                await session.send(cancel)
                assert (await session.until_terminal()).error.error.code == "response_not_found"
                session.call.cancel()

            # a is untouched: its active response finishes, its stored chain is whole.
            rest = await recv_until(a, is_terminal, within=60)
            assert rest[-1]["type"] == "response.completed" and rest[-1]["response"]["id"] == active
            await send_json(a, {**CREATE, "store": True, "previous_response_id": rid, "tools": [TOOL], "stream_id": "lane1",
                                "input": [{"type": "function_call_output", "call_id": call_id, "output": "x"}]})  # fmt: skip
            assert (await recv_response(a, within=30))[-1]["type"] == "response.completed"
        async with stack.http(KEY_A) as h:
            assert (await h.get(f"/v1/responses/{rid}")).status_code == 200
            items = (await h.get(f"/v1/responses/{rid}/input_items")).json()["data"]
            assert any(secret_text in str(i) for i in items)


# -- logs ------------------------------------------------------------------------------------------------


@pytest.fixture
def captured_logs():
    """Tether's own log setup (JSON lines, redaction on: the defaults of `tether serve`) at DEBUG,
    the most verbose level, written to a buffer; pytest's handlers are put back afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    setup_logging("debug", "json", redact_content=True)
    buf = io.StringIO()
    handler = root.handlers[0]
    handler.setStream(buf)  # type: ignore[attr-defined]
    # This process is also the client: its libraries' own debug logs are not the server's.
    handler.addFilter(lambda r: not r.name.startswith(("websockets.client", "httpx", "httpcore", "openai")))
    try:
        yield buf
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


async def test_secrets_and_contents_are_not_logged(captured_logs: io.StringIO) -> None:
    marker = "PURPLE-ELEPHANT-4471 the user's private words"
    secret = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx0123456789"
    aws = "AKIAABCDEFGHIJKLMNOP"
    wrong = "sk-wrong-key-0123456789abcdef"
    keys = {"sk-tenant-a-SECRETKEY-987654321": "a"}
    key = next(iter(keys))
    async with full_stack(keys=keys) as stack, stack.channel() as channel:
        async with stack.ws(key) as conn:
            for text in (marker, f"my key is {secret} and {aws}"):
                await send_json(conn, {**CREATE, "input": text, "store": True, "tools": [TOOL]})
                assert (await recv_response(conn))[-1]["type"] == "response.completed"
            await conn.send('{"type": "response.create", "input": "' + marker + '", broken')
            ws_error(await recv_json(conn), "invalid_json")
            await send_json(
                conn,
                {**CREATE, "input": [{"type": "function_call_output", "call_id": marker, "output": marker}]},
            )
            ws_error(await recv_json(conn), "unknown_call_id")
        with pytest.raises(InvalidStatus):
            async with stack.ws(wrong):
                pass
        async with stack.http(wrong) as h:
            assert (await h.post("/v1/responses", json={"model": "m", "input": marker})).status_code == 401
        async with stack.http(key) as h:
            r = await h.post(
                "/v1/responses",
                json={"model": "m", "input": marker, "tools": [{"type": "function", "name": "bad name!"}]},
            )
            assert r.status_code == 400
        with pytest.raises(grpc.aio.AioRpcError):
            await service_pb2_grpc.ResponsesServiceStub(channel).ListModels(
                service_pb2.ListModelsRequest(), metadata=(("authorization", f"Bearer {wrong}"),)
            )
    logging.getLogger("tether.test").info("request with Authorization: Bearer %s", wrong)  # redacted too
    text = captured_logs.getvalue()
    assert "safety findings" in text  # the classifier ran and logged only kinds and counts
    for needle in (marker, "PURPLE-ELEPHANT", secret, aws, wrong, key, "private words"):
        assert needle not in text, needle


# -- slow-loris and oversized heads ---------------------------------------------------------------------


def _loris_config() -> Any:
    config = instant_config(idle_timeout_s=0.5)
    config.server.http_header_timeout_s = 0.5  # type: ignore[attr-defined]
    config.server.http_body_timeout_s = 0.5  # type: ignore[attr-defined]
    return config


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes (b"" when it reset the connection instead)."""
    try:
        return await asyncio.wait_for(reader.read(), 30)
    except ConnectionResetError:
        return b""


async def test_slow_loris_heads_and_bodies_are_cut_off() -> None:
    async with full_stack(_loris_config()) as stack:
        port = stack.port
        # 1. Connect and send nothing.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert (await _read_all(reader)).startswith(b"HTTP/1.1 408 ")
        writer.close()

        # 2. Trickle a head, one byte at a time, forever: the server hangs up first.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def trickle() -> None:
            writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            while True:
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.05)

        task = asyncio.create_task(trickle())
        reply = await _read_all(reader)
        assert reply.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in reply
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        writer.close()

        # 3. A kept-alive connection: the first request is served, the trickled second is not.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert b" 200 " in await asyncio.wait_for(reader.readline(), 10)
        await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 10)
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        assert (await _read_all(reader)).startswith(b"HTTP/1.1 408 ")
        writer.close()

        # 4. A body that never completes: 408 request_timeout.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/responses HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer " + KEY_A.encode()
            + b"\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":"
        )  # fmt: skip
        reply = await _read_all(reader)
        assert reply.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in reply
        writer.close()

        # 5. A WebSocket upgrade request trickled: same head deadline.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/responses HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n")
        assert (await _read_all(reader)).startswith(b"HTTP/1.1 408 ")
        writer.close()

        # 6. An upgraded socket that sends half a message and stops: the idle timeout closes it.
        async with stack.ws() as conn:

            async def half() -> Any:
                yield '{"type": "response.create", '
                await asyncio.Event().wait()

            sender = asyncio.create_task(conn.send(half()))
            ws_error(await recv_json(conn, within=30), "idle_timeout", 408)
            with pytest.raises(ConnectionClosed):
                await recv_json(conn)
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

        # The server is fine and holds no leftover connections.
        async with stack.http() as h:
            assert (await h.get("/healthz")).status_code == 200
        server_state = stack.bridge._server.server_state
        for _ in range(200):
            if len(server_state.connections) <= 1:
                break
            await asyncio.sleep(0.05)
        assert len(server_state.connections) <= 1


async def test_oversized_heads_are_refused() -> None:
    async with full_stack() as stack:  # http_max_header_bytes = 16 KiB
        # In one piece: the app's check (431).
        reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 40_000 + b"\r\n\r\n")
        assert b" 431 " in await asyncio.wait_for(reader.readline(), 10)
        writer.close()
        # In pieces, never finishing: h11's incomplete-head bound (400, then the socket closes).
        reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: ")
        for _ in range(40):
            writer.write(b"a" * 1000)
            await writer.drain()
        reply = await _read_all(reader)
        assert reply == b"" or reply.startswith(b"HTTP/1.1 400 "), reply  # 400 + close, or a reset
        writer.close()
        # Many small headers add up the same way.
        many = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 50) for i in range(400))
        reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n")
        line = await asyncio.wait_for(reader.readline(), 10)
        assert b" 431 " in line or b" 400 " in line, line
        writer.close()
