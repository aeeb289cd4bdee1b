"""Every limit in `Limits` (and the bridge's own request-head limits), each tested at its edge
(accepted) and one step past it (the documented error), on the transport where it is enforced.

docs/reliability.md has the table this file proves. Time-based limits (lifetime, idle) use short
values but assert only the order of events and the close codes, never elapsed time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.bridge.helpers import check_ws_events, is_terminal, recv_until, wait_for
from tether.config import Limits, TetherConfig, apply_env
from tether.protocol import json_codec
from tether.responses.v1 import service_pb2, service_pb2_grpc

from .support import (
    CREATE,
    KEY_A,
    KEY_B,
    dumps,
    full_stack,
    instant_config,
    metric,
    recv_json,
    recv_response,
    send_json,
    with_models,
    ws_error,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def body_of_size(size: int, **extra: Any) -> str:
    """A create body (JSON text, ASCII) of exactly `size` bytes: the input text is the padding."""
    obj = {**CREATE, **extra, "input": ""}
    base = len(dumps(obj))
    assert size >= base
    obj["input"] = "x" * (size - base)
    text = dumps(obj)
    assert len(text.encode()) == size
    return text


def session_request_of_size(size: int) -> bytes:
    """A serialized SessionRequest (a create) of exactly `size` bytes."""
    req = service_pb2.SessionRequest()
    req.create.model, req.create.store = "sim-model", False
    n = size - 16
    for _ in range(64):
        req.create.input_text = "x" * n
        got = req.ByteSize()
        if got == size:
            return req.SerializeToString()
        n += size - got
    raise AssertionError("no exact size found")


def nested(depth: int) -> Any:
    """A JSON value nested `depth` levels deep (`depth` arrays)."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# -- configuration ------------------------------------------------------------------------------


def test_every_limit_is_configurable_and_documented() -> None:
    docs = DOCS.read_text()
    table = docs[docs.index("## Limits") :]
    for f in dataclasses.fields(Limits):
        default = getattr(Limits(), f.name)
        raw = "7" if isinstance(default, int) else "0.5"
        cfg = TetherConfig()
        apply_env(cfg, {f"TETHER_LIMITS__{f.name.upper()}": raw})
        assert getattr(cfg.limits, f.name) == type(default)(raw), f.name
        assert f"`{f.name}`" in table, f"{f.name} is missing from the limits table in {DOCS}"
    for name in ("http_max_header_bytes", "http_header_timeout_s", "http_body_timeout_s"):
        assert f"`{name}`" in table, name


# -- request size ---------------------------------------------------------------------------------


async def test_request_bytes_over_http() -> None:
    limit = 4096
    async with full_stack(instant_config(max_request_bytes=limit)) as stack, stack.http() as h:
        ok = await h.post(
            "/v1/responses", content=body_of_size(limit), headers={"content-type": "application/json"}
        )
        assert ok.status_code == 200 and ok.json()["status"] == "completed"
        past = await h.post("/v1/responses", content=body_of_size(limit + 1))
        assert past.status_code == 413 and past.json()["error"]["code"] == "request_too_large"

        # Chunked (no Content-Length): counted while it streams in.
        async def chunks(text: str):
            for i in range(0, len(text), 1000):
                yield text[i : i + 1000].encode()

        ok = await h.post("/v1/responses", content=chunks(body_of_size(limit)))
        assert ok.status_code == 200
        past = await h.post("/v1/responses", content=chunks(body_of_size(limit + 1)))
        assert past.status_code == 413 and past.json()["error"]["code"] == "request_too_large"


async def test_request_bytes_over_websocket_plain_and_deflated() -> None:
    limit = 64 * 1024
    async with full_stack(instant_config(max_request_bytes=limit)) as stack:
        for compression in (None, "deflate"):
            async with stack.ws(compression=compression) as conn:
                negotiated = conn.response.headers.get("Sec-WebSocket-Extensions", "")
                assert ("permessage-deflate" in negotiated) == (compression is not None)
                await conn.send(body_of_size(limit))
                assert (await recv_response(conn))[-1]["type"] == "response.completed"
                # One byte past: in-band error, the socket stays usable. Deflated, this frame is a
                # few hundred bytes on the wire and inflates past the limit.
                await conn.send(body_of_size(limit + 1))
                ws_error(await recv_json(conn), "request_too_large", 413)
                # Multi-byte text counts UTF-8 bytes.
                await send_json(conn, {**CREATE, "input": "é" * (limit // 2)})
                ws_error(await recv_json(conn), "request_too_large", 413)
                await send_json(conn, CREATE)
                assert (await recv_response(conn))[-1]["type"] == "response.completed"
        # A frame that inflates past the transport cap (4x the limit) is refused by the protocol
        # layer (1009) without being inflated further: a ~1 KB deflate bomb.
        async with stack.ws(compression="deflate") as conn:
            await conn.send("x" * (4 * limit + 1))
            with pytest.raises(ConnectionClosed):
                await recv_json(conn)
            assert conn.close_code == 1009
        async with stack.ws() as conn:  # the server is fine
            await send_json(conn, CREATE)
            assert (await recv_response(conn))[-1]["type"] == "response.completed"


async def test_request_bytes_over_grpc() -> None:
    limit = 4096
    async with full_stack(instant_config(max_request_bytes=limit)) as stack, stack.channel() as channel:
        ident = lambda b: b  # noqa: E731
        method = "/tether.responses.v1.ResponsesService/Session"
        call = channel.stream_stream(method, request_serializer=ident, response_deserializer=ident)(
            metadata=(("authorization", f"Bearer {KEY_A}"),)
        )
        await call.write(session_request_of_size(limit))
        while True:  # accepted: the response streams to its terminal event
            batch = service_pb2.SessionResponse.FromString(await asyncio.wait_for(call.read(), 10))
            if any(ev.WhichOneof("event") == "completed" for ev in batch.events):
                break
        await call.write(session_request_of_size(limit + 1))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            while True:
                await asyncio.wait_for(call.read(), 10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- JSON shape -----------------------------------------------------------------------------------


async def test_json_depth() -> None:
    depth = Limits().max_json_depth  # the default, 64: the create object is level 1
    at_edge = {**CREATE, "client_metadata": nested(depth - 1)}  # a declared field taking any JSON
    past = {**CREATE, "client_metadata": nested(depth)}
    async with full_stack() as stack:
        async with stack.ws() as conn:
            await send_json(conn, at_edge)
            assert (await recv_response(conn))[-1]["type"] == "response.completed"
            await send_json(conn, past)
            ws_error(await recv_json(conn), "invalid_json", 400)
        async with stack.http() as h:
            ok = await h.post("/v1/responses", content=dumps(at_edge))
            assert ok.status_code == 200
            bad = await h.post("/v1/responses", content=dumps(past))
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"


async def test_input_items() -> None:
    items = [{"type": "message", "role": "user", "content": f"m{i}"} for i in range(5)]
    async with full_stack(instant_config(max_input_items=4)) as stack:
        async with stack.ws() as conn:
            await send_json(conn, {**CREATE, "input": items[:4]})
            assert (await recv_response(conn))[-1]["type"] == "response.completed"
            await send_json(conn, {**CREATE, "input": items})
            assert ws_error(await recv_json(conn), "too_many_items", 400)["param"] == "input"
        async with stack.http() as h:
            r = await h.post("/v1/responses", content=dumps({**CREATE, "input": items}))
            assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_items"


async def test_item_bytes() -> None:
    limit = 1000

    def item_of_size(size: int) -> dict[str, Any]:
        item = {"type": "message", "id": "msg_" + "0" * 32, "role": "user", "content": ""}
        base = json_codec.params_from_json({"model": "m", "input": [item]}).input[0].ByteSize()
        item["content"] = "y" * (size - base)
        # One byte string length prefix may grow past 127: adjust until exact.
        while (
            got := json_codec.params_from_json({"model": "m", "input": [item]}).input[0].ByteSize()
        ) != size:
            item["content"] = "y" * (len(item["content"]) + size - got)
        return item

    async with full_stack(instant_config(max_item_bytes=limit)) as stack, stack.ws() as conn:
        await send_json(conn, {**CREATE, "input": [item_of_size(limit)]})
        assert (await recv_response(conn))[-1]["type"] == "response.completed"
        await send_json(conn, {**CREATE, "input": [item_of_size(limit + 1)]})
        assert ws_error(await recv_json(conn), "item_too_large", 400)["param"] == "input[0]"


async def test_tools() -> None:
    def tools(n: int) -> list[dict[str, Any]]:
        return [{"type": "function", "name": f"f{i}", "parameters": {"type": "object"}} for i in range(n)]

    async with full_stack(instant_config(max_tools=3)) as stack, stack.ws() as conn:
        await send_json(conn, {**CREATE, "tools": tools(3)})
        assert (await recv_response(conn))[-1]["type"] == "response.completed"
        await send_json(conn, {**CREATE, "tools": tools(4)})
        assert ws_error(await recv_json(conn), "invalid_request", 400)["param"] == "tools"


async def test_metadata_pairs_and_sizes() -> None:
    limit = Limits().max_metadata_pairs
    async with full_stack() as stack, stack.ws() as conn:
        for metadata, ok in (
            ({f"k{i}": "v" for i in range(limit)}, True),
            ({f"k{i}": "v" for i in range(limit + 1)}, False),
            ({"k" * 64: "v" * 512}, True),
            ({"k" * 65: "v"}, False),
            ({"k": "v" * 513}, False),
        ):
            await send_json(conn, {**CREATE, "metadata": metadata})
            if ok:
                assert (await recv_response(conn))[-1]["type"] == "response.completed"
            else:
                assert ws_error(await recv_json(conn), "invalid_request", 400)["param"] == "metadata"


# -- tokens -----------------------------------------------------------------------------------------


async def test_input_tokens_per_model_context_window() -> None:
    body = {"model": "any", "input": [{"type": "message", "id": "msg_" + "1" * 32, "role": "user",
                                       "content": "count these words please, exactly once"}],
            "instructions": "be brief", "store": False}  # fmt: skip
    async with full_stack() as probe, probe.http() as h:
        counted = (await h.post("/v1/responses/input_tokens", content=dumps(body))).json()["input_tokens"]
    assert counted > 5
    config = with_models(
        instant_config(max_input_tokens=counted),
        {
            "edge": {"backend": "sim", "context_window": counted},
            "past": {"backend": "sim", "context_window": counted - 1},
            "*": {"backend": "sim"},  # Limits.max_input_tokens
        },
    )
    async with full_stack(config) as stack:
        async with stack.ws() as conn:
            for model in ("edge", "other"):
                await send_json(conn, {"type": "response.create", **body, "model": model})
                done = (await recv_response(conn))[-1]
                assert done["type"] == "response.completed"
                assert done["response"]["usage"]["input_tokens"] == counted
            await send_json(conn, {"type": "response.create", **body, "model": "past"})
            assert ws_error(await recv_json(conn), "context_length_exceeded", 400)["param"] == "input"
        async with stack.http() as h:
            r = await h.post("/v1/responses", content=dumps({**body, "model": "past"}))
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


async def test_output_tokens() -> None:
    async with full_stack(instant_config(max_output_tokens=50)) as stack, stack.ws() as conn:
        await send_json(conn, {**CREATE, "max_output_tokens": 50})
        done = (await recv_response(conn))[-1]
        assert done["type"] in ("response.completed", "response.incomplete")
        assert done["response"]["max_output_tokens"] == 50
        for bad in (51, 0):
            await send_json(conn, {**CREATE, "max_output_tokens": bad})
            assert ws_error(await recv_json(conn), "invalid_request", 400)["param"] == "max_output_tokens"


# -- connection scope ---------------------------------------------------------------------------


async def test_lanes_per_connection() -> None:
    async with full_stack(instant_config(max_lanes=2)) as stack:
        async with stack.ws() as conn:
            for lane in ("a", "b"):
                await send_json(conn, {**CREATE, "stream_id": lane})
                assert (await recv_response(conn))[-1]["type"] == "response.completed"
            await send_json(conn, {**CREATE, "stream_id": "c"})
            err = ws_error(await recv_json(conn), "websocket_stream_limit_reached", 400)
            assert err["param"] == "stream_id"
        async with stack.channel() as channel:
            session = stack.session(channel)
            for lane in ("a", "b", "c"):
                await session.create(model="sim-model", input="x", store=False, stream_id=lane)
                last = await session.until_terminal()
                if lane == "c":
                    assert last.error.error.code == "websocket_stream_limit_reached"
                else:
                    assert last.WhichOneof("event") == "completed"
            session.call.cancel()


async def test_active_responses_per_connection_17th_waits() -> None:
    """16 responses generate at once; the 17th (on its own lane) starts only after one of them
    ends. Proven by the event order: no backend ever answers (60 s to the first token), so the
    only way a response ends is the cancel the test sends."""
    limit = Limits().max_active_responses
    async with full_stack(instant_config({"ttft_ms": 60_000})) as stack, stack.ws() as conn:
        log: list[dict[str, Any]] = []

        async def read_until(pred) -> dict[str, Any]:
            while True:
                ev = await recv_json(conn)
                log.append(ev)
                if pred(ev):
                    return ev

        ids: dict[str, str] = {}
        for i in range(limit):
            await send_json(conn, {**CREATE, "stream_id": f"l{i}"})
        while len(ids) < limit:
            ev = await read_until(lambda e: e["type"] == "response.created")
            ids[ev["stream_id"]] = ev["response"]["id"]
        assert metric(stack.engine, "tether_active_responses") == limit
        await send_json(conn, {**CREATE, "stream_id": "l16"})
        await send_json(conn, {"type": "response.cancel", "response_id": "resp_sentinel"})
        ws_error(await read_until(lambda e: e["type"] == "error"), "response_not_found")
        assert not any(e.get("stream_id") == "l16" for e in log)  # queued behind the semaphore
        await send_json(conn, {"type": "response.cancel", "response_id": ids["l0"]})
        created17 = await read_until(lambda e: e["type"] == "response.created")
        assert created17["stream_id"] == "l16"
        order = [(e["type"], e.get("stream_id")) for e in log]
        assert order.index(("response.incomplete", "l0")) < order.index(("response.created", "l16"))
        # Never more than `limit` in flight, at any point of the event stream.
        live, peak = set(), 0
        for e in log:
            if e["type"] == "response.created":
                live.add(e["response"]["id"])
            elif is_terminal(e):
                live.discard(e["response"]["id"])
            peak = max(peak, len(live))
        assert peak == limit


async def test_queued_responses_per_lane() -> None:
    async with (
        full_stack(instant_config({"ttft_ms": 60_000}, max_queued_responses=2)) as stack,
        stack.ws() as conn,
    ):
        await send_json(conn, CREATE)
        assert (await recv_json(conn))["type"] == "response.created"  # running, no longer queued
        for _ in range(2):  # the queue's edge: accepted silently
            await send_json(conn, CREATE)
        await send_json(conn, CREATE)
        err = await recv_until(conn, lambda e: e["type"] == "error")
        ws_error(err[-1], "too_many_queued_responses", 429)


async def test_connections_per_key_across_transports() -> None:
    async with full_stack(instant_config(max_connections_per_key=2)) as stack, stack.channel() as channel:
        async with stack.ws(KEY_A) as first:
            session = stack.session(channel, KEY_A)  # WS + gRPC = 2: the edge
            await session.create(model="sim-model", input="x", store=False)
            assert (await session.until_terminal()).WhichOneof("event") == "completed"
            with pytest.raises(InvalidStatus) as info:
                async with stack.ws(KEY_A):
                    pass
            assert info.value.response.status_code == 429
            assert orjson.loads(info.value.response.body)["error"]["code"] == "rate_limit_exceeded"
            refused = service_pb2_grpc.ResponsesServiceStub(channel).Session(
                metadata=(("authorization", f"Bearer {KEY_A}"),)
            )
            with pytest.raises(grpc.aio.AioRpcError) as rpc:
                await refused.read()
            assert rpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert dict(rpc.value.trailing_metadata() or ())["tether-error-code"] == "rate_limit_exceeded"
            # A stateless HTTP create is a one-turn session of the same key: refused too.
            async with stack.http(KEY_A) as h:
                r = await h.post("/v1/responses", content=dumps(CREATE))
                assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
            # Another key is not affected; the open connections still work.
            async with stack.ws(KEY_B) as other:
                await send_json(other, CREATE)
                assert (await recv_response(other))[-1]["type"] == "response.completed"
            await send_json(first, CREATE)
            assert (await recv_response(first))[-1]["type"] == "response.completed"
            session.call.cancel()
        await wait_for(lambda: not stack.engine.sessions)
        async with stack.ws(KEY_A), stack.ws(KEY_A):  # freed: the edge again
            pass


async def test_connection_lifetime_lets_the_turn_in_flight_finish() -> None:
    # The response takes ~2 s and the connection lives 0.5 s: it is in flight at the deadline and
    # finishes within the grace; then the lifetime error and a normal close.
    cfg = instant_config(
        {"tokens_per_s": 20, "output_tokens": 40}, connection_lifetime_s=0.5, lifetime_grace_s=30
    )
    async with full_stack(cfg) as stack, stack.ws() as conn:
        await send_json(conn, CREATE)
        events = await recv_until(conn, is_terminal, within=30)
        assert events[-1]["type"] == "response.completed"
        ws_error(await recv_json(conn), "websocket_connection_limit_reached", 400)
        with pytest.raises(ConnectionClosed):
            await recv_json(conn)
        assert conn.close_code == 1000


async def test_connection_lifetime_past_the_grace_ends_the_response() -> None:
    cfg = instant_config(
        {"tokens_per_s": 20, "output_tokens": 60}, connection_lifetime_s=0.3, lifetime_grace_s=0.2
    )
    async with full_stack(cfg) as stack, stack.ws() as conn:
        await send_json(conn, CREATE)
        events = []
        with pytest.raises(ConnectionClosed):
            while True:
                events.append(await recv_json(conn, within=30))
        assert events[-1]["error"]["code"] == "websocket_connection_limit_reached"
        terminal = [e for e in events if is_terminal(e)]
        assert [e["type"] for e in terminal] == ["response.failed"], [e["type"] for e in events]
        error = terminal[0]["response"]["error"]
        assert (error["code"], error["tether_code"]) == ("server_error", "websocket_connection_limit_reached")
        check_ws_events(events)  # strict SDK parse, the failed response included


async def test_idle_timeout_spares_an_active_connection() -> None:
    # The response streams for ~1.5 s, three idle timeouts: an active connection is not idle.
    cfg = instant_config({"tokens_per_s": 20, "output_tokens": 30}, idle_timeout_s=0.5)
    async with full_stack(cfg) as stack, stack.ws() as conn:
        await send_json(conn, CREATE)
        events = await recv_until(conn, is_terminal, within=30)
        assert events[-1]["type"] == "response.completed"
        ws_error(await recv_json(conn, within=30), "idle_timeout", 408)
        with pytest.raises(ConnectionClosed):
            await recv_json(conn)
        assert conn.close_code == 1000


# -- per API key rates ------------------------------------------------------------------------------


def _check_retry_headers(headers: Any) -> float:
    seconds = int(headers["retry-after"])
    ms = int(headers["retry-after-ms"])
    assert seconds >= 1 and ms > 0 and seconds * 1000 >= ms  # rounded up, never early
    return ms / 1000


async def test_requests_per_minute_per_key() -> None:
    async with full_stack(instant_config(requests_per_minute=2)) as stack, stack.channel() as channel:
        async with stack.ws(KEY_A) as conn, stack.http(KEY_A) as h:
            await send_json(conn, CREATE)  # 1
            assert (await recv_response(conn))[-1]["type"] == "response.completed"
            r = await h.post("/v1/responses", content=dumps(CREATE))  # 2: the edge (all transports share it)
            assert r.status_code == 200
            await send_json(conn, CREATE)  # 3
            err = ws_error(await recv_json(conn), "rate_limit_exceeded", 429)
            assert 0 < _check_retry_headers(err["headers"]) <= 30
            r = await h.post("/v1/responses", content=dumps(CREATE))
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
            assert 0 < _check_retry_headers(r.headers) <= 30
            session = stack.session(channel, KEY_A)
            await session.create(model="sim-model", input="x", store=False)
            e = (await session.until_terminal()).error.error
            assert (e.code, e.status) == ("rate_limit_exceeded", 429) and 0 < e.retry_after_s <= 30
            session.call.cancel()
        async with stack.ws(KEY_B) as other:  # per key
            await send_json(other, CREATE)
            assert (await recv_response(other))[-1]["type"] == "response.completed"


async def _count_tokens(body: dict[str, Any]) -> int:
    async with full_stack() as probe, probe.http() as h:
        return (await h.post("/v1/responses/input_tokens", content=dumps(body))).json()["input_tokens"]


async def test_tokens_per_minute_per_key() -> None:
    body = {**CREATE, "input": "some input tokens to count"}
    tokens = await _count_tokens(body)
    async with full_stack(instant_config(tokens_per_minute=tokens + 1)) as stack, stack.ws() as conn:
        await send_json(conn, body)  # within the budget: admitted
        done = (await recv_response(conn))[-1]
        assert done["type"] == "response.completed" and done["response"]["usage"]["input_tokens"] == tokens
        await send_json(conn, body)  # the bucket paid input + output tokens: refused with a hint
        err = ws_error(await recv_json(conn), "rate_limit_exceeded", 429)
        assert "tokens per minute" in err["message"]
        _check_retry_headers(err["headers"])
        async with stack.http() as h:
            r = await h.post("/v1/responses", content=dumps(body))
            assert r.status_code == 429
            _check_retry_headers(r.headers)
        async with stack.ws(KEY_B) as other:  # per key
            await send_json(other, body)
            assert (await recv_response(other))[-1]["type"] == "response.completed"


async def test_tokens_per_minute_exact_budget_is_admitted() -> None:
    body = {**CREATE, "input": "some input tokens to count"}
    tokens = await _count_tokens(body)
    async with full_stack(instant_config(tokens_per_minute=tokens)) as stack, stack.ws() as conn:
        await send_json(conn, body)
        assert (await recv_response(conn))[-1]["type"] == "response.completed"


COMPACTING = {"context_management": [{"type": "compaction", "compact_threshold": 1000}]}  # the least allowed


async def test_compaction_calls_pay_the_rate_limits_and_are_counted() -> None:
    """`POST /v1/responses/compact` is admitted like a create (429 past `requests_per_minute`,
    and no model call then); a compaction inside a turn is one more request on the key's
    budget. Both calls' tokens are in `tether_tokens_total`, `tether_compaction_tokens_total`
    and one usage-ledger line each (status "compaction")."""
    history = [{"role": "user", "content": "tell me a story " * 300}, {"role": "assistant", "content": "once " * 40},
               {"role": "user", "content": "go on"}]  # fmt: skip
    async with full_stack(instant_config(requests_per_minute=3)) as stack, stack.http(KEY_A) as h:
        engine = stack.engine
        r = await h.post("/v1/responses/compact", content=dumps({"model": "sim-model", "input": history}))
        assert r.status_code == 200, r.text  # 1 request of 3
        compacted = r.json()
        assert compacted["usage"]["input_tokens"] > 0 and compacted["usage"]["output_tokens"] > 0
        assert metric(engine, "tether_compactions_total") == 1
        assert metric(engine, "tether_compaction_tokens_total", kind="input") == compacted["usage"]["input_tokens"]
        assert metric(engine, "tether_compaction_tokens_total", kind="output") == compacted["usage"]["output_tokens"]
        assert metric(engine, "tether_tokens_total", kind="output") == compacted["usage"]["output_tokens"]

        body = {**CREATE, "input": history, "store": True, **COMPACTING}
        r = await h.post("/v1/responses", content=dumps(body))  # 2 and 3: the turn and its compaction
        assert r.status_code == 200, r.text
        done = r.json()
        assert done["output"][-1]["type"] == "compaction"
        assert metric(engine, "tether_compactions_total") == 2
        r = await h.post("/v1/responses/compact", content=dumps({"model": "sim-model", "input": history}))
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert metric(engine, "tether_compactions_total") == 2  # refused before its model call
        async with stack.http(KEY_B) as other:  # per key
            assert (await other.post("/v1/responses", content=dumps(CREATE))).status_code == 200

        await engine.post.flush()
        ledger = {u.response_id: u for u in await engine.store.usage_records("a")}
        assert ledger[compacted["id"]].status == "compaction"
        assert ledger[compacted["id"]].output_tokens == compacted["usage"]["output_tokens"]
        in_turn = ledger[done["output"][-1]["id"]]
        assert in_turn.status == "compaction" and in_turn.input_tokens > 0 and in_turn.output_tokens > 0
        assert ledger[done["id"]].status == "completed"


async def test_compaction_in_a_turn_pays_the_tokens_per_minute_budget() -> None:
    body = {**CREATE, "input": "some input tokens to count " * 250}  # past the compaction threshold
    tokens = await _count_tokens(body)
    async with full_stack() as probe, probe.http() as h:
        output = (await h.post("/v1/responses", content=dumps(body))).json()["usage"]["output_tokens"]
    # Room for three turns' input and two turns' output, with 50 tokens to spare: not for the
    # compaction's call as well (its input alone is about `tokens`).
    budget = 3 * tokens + 2 * output + 50
    async with full_stack(instant_config(tokens_per_minute=budget)) as stack, stack.http(KEY_A) as h:
        r = await h.post("/v1/responses", content=dumps(body))
        assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == output
        r = await h.post("/v1/responses", content=dumps({**body, **COMPACTING}))
        assert r.status_code == 200 and r.json()["output"][-1]["type"] == "compaction"
        assert r.json()["usage"]["output_tokens"] == output
        # The compaction's input and output tokens were charged too: the budget is spent.
        r = await h.post("/v1/responses", content=dumps(body))
        assert r.status_code == 429 and "tokens per minute" in r.json()["error"]["message"]


# -- caches -----------------------------------------------------------------------------------------


async def test_cache_responses_per_connection_lru() -> None:
    async with full_stack(instant_config(cache_responses_per_connection=2)) as stack, stack.ws() as conn:
        engine = stack.engine

        async def create(**extra: Any) -> dict[str, Any]:
            await send_json(conn, {**CREATE, **extra})
            return (await recv_response(conn))[-1]

        r1 = (await create())["response"]["id"]
        r2 = (await create())["response"]["id"]
        assert metric(engine, "tether_cache_evictions_total", reason="connection_capacity") == 0  # edge
        r3 = (await create(store=True))["response"]["id"]  # 3 > 2: evicts r1, the least recently used
        assert metric(engine, "tether_cache_evictions_total", reason="connection_capacity") == 1
        err = await create(previous_response_id=r1)
        assert err["type"] == "error" and err["error"]["code"] == "previous_response_not_found"
        hits = metric(engine, "tether_cache_hits_total")
        assert (await create(previous_response_id=r2))["type"] == "response.completed"
        assert metric(engine, "tether_cache_hits_total") == hits + 1
        # A stored response evicted from the cache is hydrated from the store instead.
        for _ in range(2):
            await create()
        found = metric(engine, "tether_hydrations_total", result="found")
        assert (await create(previous_response_id=r3))["type"] == "response.completed"
        assert metric(engine, "tether_hydrations_total", result="found") == found + 1
        for session in engine.sessions:
            assert len(session.cache) <= 2


async def test_cache_bytes_per_process_lru_across_connections() -> None:
    create = {**CREATE, "generate": False, "input": "a deterministic input of a few tokens"}

    async def two_entries(stack) -> int:
        async with stack.ws() as conn:
            for _ in range(2):
                await send_json(conn, create)
                await recv_response(conn)
            return stack.engine.cache_budget.used

    async with full_stack() as probe:
        used = await two_entries(probe)  # bytes of two cached responses
    assert used > 0
    async with full_stack(instant_config(cache_bytes_per_process=used)) as stack:
        engine = stack.engine
        async with stack.ws() as a:
            for _ in range(2):
                await send_json(a, create)
                await recv_response(a)
            assert engine.cache_budget.used == used  # the edge: nothing evicted
            assert metric(engine, "tether_cache_evictions_total", reason="process_budget") == 0
            async with stack.ws() as b:  # one more entry, on another connection
                await send_json(b, create)
                await recv_response(b)
                assert metric(engine, "tether_cache_evictions_total", reason="process_budget") == 1
                assert engine.cache_budget.used <= used
                sizes = sorted(len(s.cache) for s in engine.sessions)
                assert sizes == [1, 1]  # a's least recently used entry went
        await wait_for(lambda: engine.cache_budget.used == 0)  # closed connections free their share


async def test_cache_bytes_per_process_fair_share_per_tenant() -> None:
    """Tenant a's generate:false warm-ups fill the process budget many times over; tenant b's
    store=false state, within its fair share, stays, and b continues from it."""
    warm = {**CREATE, "generate": False, "input": "a deterministic input of a few tokens"}
    async with full_stack() as probe, probe.ws() as conn:
        await send_json(conn, warm)
        await recv_response(conn)
        one = probe.engine.cache_budget.used  # bytes of one cached response
    async with full_stack(instant_config(cache_bytes_per_process=4 * one)) as stack:
        engine = stack.engine
        async with stack.ws(KEY_B) as b, stack.ws(KEY_A) as a:
            await send_json(b, warm)
            kept = (await recv_response(b))[-1]["response"]["id"]
            for _ in range(12):
                await send_json(a, warm)
                await recv_response(a)
            assert metric(engine, "tether_cache_evictions_total", reason="process_budget") >= 9
            assert engine.cache_budget.used_by("b") == one
            await send_json(b, {**CREATE, "previous_response_id": kept})
            assert (await recv_response(b))[-1]["type"] == "response.completed"


# -- the bridge's request head ---------------------------------------------------------------------


async def test_http_header_bytes() -> None:
    config = instant_config()
    config.server.http_max_header_bytes = 4096
    async with full_stack(config) as stack:

        def head(size: int) -> bytes:
            # uvicorn's scope: path + headers, each header counted as len(name)+len(value)+4.
            fixed = len(b"/healthz") + (4 + 9 + 4) + (5 + 4)  # host: 127.0.0.1, x-pad: ...
            pad = b"p" * (size - fixed)
            return b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-pad: " + pad + b"\r\n\r\n"

        for size, status in ((4096, b" 200 "), (4097, b" 431 ")):
            reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            writer.write(head(size))
            line = await asyncio.wait_for(reader.readline(), 10)
            assert status in line, (size, line)
            writer.close()
        # The WebSocket upgrade goes through the same check.
        with pytest.raises(InvalidStatus) as info:
            async with stack.ws(extra_headers={"x-pad": "p" * 5000}):
                pass
        assert info.value.response.status_code == 431
