"""WebSocket mode with a raw `websockets` client: the cases the SDK cannot express (bad frames,
binary frames, oversize frames, lane limits, queued creates, close codes, disconnects)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.configs import instant_config
from tests.support.stacks import running_stack
from tether.server import start as start_server

from .helpers import (
    WEATHER_TOOL,
    check_ws_events,
    is_terminal,
    recv_json,
    recv_response,
    recv_until,
    send_json,
    wait_for,
)

CREATE: dict[str, Any] = {"type": "response.create", "model": "sim-model", "input": "hi"}


def assert_ws_error(ev: dict[str, Any], code: str, status: int = 400, param: str | None = None) -> None:
    assert ev["type"] == "error", ev
    assert ev["status"] == status
    assert ev["error"]["code"] == code
    assert isinstance(ev["error"]["message"], str) and ev["error"]["message"]
    assert ev["error"]["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param is not None:
        assert ev["error"]["param"] == param


async def test_bad_frames_get_errors_and_the_session_survives(stack: Any) -> None:
    async with stack.ws() as conn:
        await send_json(conn, {**CREATE, "store": False})
        first = (await recv_response(conn))[-1]
        assert first["type"] == "response.completed"

        bad: list[tuple[Any, str, str | None]] = [
            ('{"type": "response.create", ', "invalid_json", None),  # not JSON
            (b'{"type": "response.create"}', "invalid_request", None),  # binary frame
            ("[1, 2, 3]", "invalid_type", None),  # not an object
            ('{"type": "response.explode"}', "unknown_event_type", "type"),
            ('{"model": "sim-model"}', "invalid_request", "type"),  # no type
            (
                '{"type": "response.create", "model": "m", "input": "x", "temperature": "hot"}',
                "invalid_type",
                "temperature",
            ),
            ('{"type": "response.create", "model": 7, "input": "x"}', "invalid_type", "model"),
            (
                '{"type": "response.create", "model": "m", "input": "x", "metadata": [1]}',
                "invalid_type",
                "metadata",
            ),
            ("[" * 200 + "]" * 200, "invalid_json", None),  # deeper than Limits.max_json_depth
        ]
        for frame, code, param in bad:
            await conn.send(frame)
            ev = await recv_json(conn)
            assert_ws_error(ev, code, param=param)
            assert "stream_id" not in ev

        # Same socket, same session: the store=false chain is still in the connection cache.
        await send_json(
            conn,
            {**CREATE, "input": "again", "previous_response_id": first["response"]["id"], "store": False},
        )
        again = (await recv_response(conn))[-1]
        assert again["type"] == "response.completed"
        assert again["response"]["previous_response_id"] == first["response"]["id"]


async def test_oversize_frame_is_an_in_band_error(make_stack: Any) -> None:
    async with make_stack(max_request_bytes=64 * 1024) as stack, stack.ws() as conn:
        big = {**CREATE, "input": "x" * (100 * 1024)}  # over the app limit, under the 4x transport cap
        await send_json(conn, big)
        assert_ws_error(await recv_json(conn), "request_too_large", status=413)
        # Multi-byte text: the limit counts UTF-8 bytes, not characters.
        await send_json(conn, {**CREATE, "input": "é" * (40 * 1024)})
        assert_ws_error(await recv_json(conn), "request_too_large", status=413)
        # A named lane still gets its error, though the frame was never decoded.
        await send_json(conn, {**big, "stream_id": "big-lane"})
        ev = await recv_json(conn)
        assert_ws_error(ev, "request_too_large", status=413)
        assert ev["stream_id"] == "big-lane"
        await send_json(conn, CREATE)
        assert (await recv_response(conn))[-1]["type"] == "response.completed"


async def test_errors_echo_the_lane_of_the_frame(stack: Any) -> None:
    async with stack.ws() as conn:
        await conn.send('{"type": "response.create", "stream_id": "lane-a", "model": ')  # broken JSON
        ev = await recv_json(conn)
        assert_ws_error(ev, "invalid_json")
        assert ev["stream_id"] == "lane-a"
        await send_json(conn, {**CREATE, "stream_id": "lane-b", "tools": "not-a-list"})
        ev = await recv_json(conn)
        assert_ws_error(ev, "invalid_type", param="tools")
        assert ev["stream_id"] == "lane-b"


async def test_frames_beyond_the_transport_cap_fail_the_socket(make_stack: Any) -> None:
    async with make_stack(max_request_bytes=1024) as stack, stack.ws() as conn:
        await conn.send("x" * (8 * 1024))  # > 4x the app limit: the protocol layer refuses (1009)
        with pytest.raises(ConnectionClosed):
            await recv_json(conn)
        assert conn.close_code == 1009


async def test_33rd_lane_is_refused(stack: Any) -> None:
    async with stack.ws() as conn:
        for i in range(32):
            await send_json(conn, {**CREATE, "generate": False, "stream_id": f"lane-{i}"})
            assert (await recv_response(conn))[-1]["type"] == "response.completed"
        await send_json(conn, {**CREATE, "stream_id": "lane-32"})
        ev = await recv_json(conn)
        assert_ws_error(ev, "websocket_stream_limit_reached", param="stream_id")
        assert ev["stream_id"] == "lane-32"
        # Reusing a known lane and the default lane still work.
        await send_json(conn, {**CREATE, "stream_id": "lane-3"})
        done = (await recv_response(conn))[-1]
        assert done["type"] == "response.completed" and done["stream_id"] == "lane-3"
        await send_json(conn, CREATE)
        done = (await recv_response(conn))[-1]
        assert done["type"] == "response.completed" and "stream_id" not in done


async def test_invalid_stream_id(stack: Any) -> None:
    async with stack.ws() as conn:
        for bad in ("has space", "x" * 257, "slash/y"):
            await send_json(conn, {**CREATE, "stream_id": bad})
            ev = await recv_json(conn)
            assert_ws_error(ev, "invalid_stream_id", param="stream_id")
            assert "stream_id" not in ev  # no valid lane to echo


async def test_steer_for_an_unknown_response(stack: Any) -> None:
    async with stack.ws() as conn:
        await send_json(
            conn, {"type": "response.steer", "previous_response_id": "resp_nope", "input": "go left"}
        )
        ev = await recv_json(conn)
        assert ev["type"] == "response.steer.failed"
        assert ev["error"]["code"] == "response_not_found"
        assert ev["steer"]["previous_response_id"] == "resp_nope"


async def test_second_create_on_a_busy_lane_is_queued_fifo(make_stack: Any) -> None:
    # A slow-ish backend so that the second create arrives while the first is generating.
    async with make_stack(backend={"tokens_per_s": 2000, "output_tokens": 40}) as stack, stack.ws() as conn:
        for lane in ("", "busy"):
            extra = {"stream_id": lane} if lane else {}
            await send_json(conn, {**CREATE, "input": "first", **extra})
            await send_json(conn, {**CREATE, "input": "second", **extra})
            events = await recv_until(conn, is_terminal)
            events += await recv_until(conn, is_terminal)
            check_ws_events(events)
            created = [e["response"]["id"] for e in events if e["type"] == "response.created"]
            finished = [e["response"]["id"] for e in events if is_terminal(e)]
            assert len(created) == 2 and finished == created
            # No overlap: every event of the first response precedes the second's created.
            first_done = next(i for i, e in enumerate(events) if is_terminal(e))
            second_created = [i for i, e in enumerate(events) if e["type"] == "response.created"][1]
            assert first_done < second_created
            assert all(e["response"]["status"] == "completed" for e in events if is_terminal(e))
            assert all(e.get("stream_id", "") == lane for e in events)


async def test_background_is_rejected(stack: Any) -> None:
    async with stack.ws() as conn:
        await send_json(conn, {**CREATE, "background": True})
        ev = await recv_json(conn)
        assert ev["type"] == "error" and ev["status"] == 400
        assert ev["error"]["param"] == "background"


async def test_codex_style_fields_are_accepted(stack: Any) -> None:
    """`stream: true`, `client_metadata`, unknown tool types and `response.processed` (ignored)."""
    async with stack.ws() as conn:
        await send_json(
            conn,
            {
                **CREATE,
                "stream": True,
                "store": False,
                "tools": [WEATHER_TOOL, {"type": "web_search", "external_web_access": False}],
                "client_metadata": {"x-codex-turn-metadata": "{}", "session_id": "abc"},
                "include": ["reasoning.encrypted_content"],
                "prompt_cache_key": "session-uuid",
            },
        )
        done = (await recv_response(conn))[-1]
        assert done["type"] == "response.completed"
        await send_json(conn, {"type": "response.processed", "response_id": done["response"]["id"]})
        await send_json(conn, CREATE)
        # Nothing answers `response.processed`: the next frame belongs to the next create.
        assert (await recv_json(conn))["type"] == "response.created"


async def test_lifetime_limit_closes_with_1000(make_stack: Any) -> None:
    async with make_stack(connection_lifetime_s=0.3, lifetime_grace_s=0.0) as stack, stack.ws() as conn:
        ev = await recv_json(conn)
        assert_ws_error(ev, "websocket_connection_limit_reached")
        with pytest.raises(ConnectionClosed):
            await recv_json(conn)
        assert conn.close_code == 1000


async def test_idle_timeout_closes_with_1000(make_stack: Any) -> None:
    async with make_stack(idle_timeout_s=0.2) as stack, stack.ws() as conn:
        ev = await recv_json(conn)
        assert ev["type"] == "error" and ev["error"]["code"] == "idle_timeout"
        with pytest.raises(ConnectionClosed):
            await recv_json(conn)
        assert conn.close_code == 1000


async def test_engine_shutdown_closes_with_1001(stack: Any) -> None:
    async with stack.ws() as conn:
        await send_json(conn, CREATE)
        await recv_response(conn)
        await stack.engine.shutdown(grace=1.0)
        ev = await recv_json(conn)
        assert_ws_error(ev, "server_shutting_down", status=503)
        with pytest.raises(ConnectionClosed):
            await recv_json(conn)
        assert conn.close_code == 1001


async def test_bridge_stop_drains_then_closes_with_1001(authenticator: Any) -> None:
    async with running_stack(authenticator, backend={"tokens_per_s": 2000, "output_tokens": 60}) as stack:
        async with stack.ws() as idle, stack.ws() as busy:
            await send_json(busy, CREATE)
            assert (await recv_json(busy))["type"] == "response.created"
            stopping = asyncio.create_task(stack.bridge.stop(5.0))
            # The idle socket closes at once; the busy one finishes its response first.
            assert_ws_error(await recv_json(idle), "server_shutting_down", status=503)
            with pytest.raises(ConnectionClosed):
                await recv_json(idle)
            assert idle.close_code == 1001
            rest = await recv_until(busy, is_terminal)
            assert rest[-1]["type"] == "response.completed"
            assert_ws_error(await recv_json(busy), "server_shutting_down", status=503)
            with pytest.raises(ConnectionClosed):
                await recv_json(busy)
            assert busy.close_code == 1001
            await stopping


async def test_client_disconnect_frees_the_session(make_stack: Any) -> None:
    # A response that is not stored is cancelled with its client (a stored one runs on:
    # tests/bridge/test_background.py).
    async with make_stack(backend={"tokens_per_s": 200, "output_tokens": 5000}) as stack:
        async with stack.ws() as conn:
            await send_json(conn, {**CREATE, "store": False})
            assert (await recv_json(conn))["type"] == "response.created"
            await wait_for(lambda: len(stack.engine.sessions) == 1)
        # Gone mid-generation: the session is closed (its generation cancelled, its state freed).
        await wait_for(lambda: not stack.engine.sessions)
        await wait_for(lambda: not stack.bridge.app.connections)


async def test_permessage_deflate_is_negotiated_when_offered(stack: Any) -> None:
    async with stack.ws(compression="deflate") as conn:
        extensions = conn.response.headers.get("Sec-WebSocket-Extensions", "")
        assert "permessage-deflate" in extensions
        await send_json(conn, CREATE)
        assert (await recv_response(conn))[-1]["type"] == "response.completed"
    async with stack.ws(compression=None) as conn:
        assert "Sec-WebSocket-Extensions" not in conn.response.headers


def _recording_deflate(seen: list[tuple[bool, int]]) -> Any:
    """A client permessage-deflate offer that records (RSV1, wire length) of every data frame."""
    from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
    from websockets.frames import OP_TEXT

    class Recording(ClientPerMessageDeflateFactory):
        def process_response_params(self, params: Any, accepted: Any) -> Any:
            ext = super().process_response_params(params, accepted)
            decode = ext.decode

            def record(frame: Any, *, max_size: int | None = None) -> Any:
                if frame.opcode is OP_TEXT:
                    seen.append((frame.rsv1, len(frame.data)))
                return decode(frame, max_size=max_size)

            ext.decode = record
            return ext

    return Recording(client_max_window_bits=True)


@pytest.mark.parametrize("min_bytes", [512, 0])
async def test_small_messages_go_out_uncompressed(authenticator: Any, min_bytes: int) -> None:
    """Below `ws_compress_min_bytes` a message is sent as it is (RSV1 unset), at and above it
    deflated; 0 deflates everything. The client reads both kinds alike."""
    config = instant_config()
    config.server.ws_compress_min_bytes = min_bytes
    running = await start_server(config, authenticator=authenticator)
    seen: list[tuple[bool, int]] = []
    try:
        url = f"ws://127.0.0.1:{running.bridge_port}/v1/responses"
        async with connect(url, additional_headers={"Authorization": "Bearer sk-a"}, compression=None,
                           extensions=[_recording_deflate(seen)]) as conn:
            assert "permessage-deflate" in conn.response.headers.get("Sec-WebSocket-Extensions", "")
            await send_json(conn, CREATE)
            events = await recv_response(conn)
            assert events[-1]["type"] == "response.completed"
    finally:
        await running.stop(0.5)
    assert len(seen) == len(events)
    raw = [n for compressed, n in seen if not compressed]
    if min_bytes:
        assert raw and all(n < min_bytes for n in raw)  # the deltas and other small events
        assert any(compressed for compressed, _ in seen)  # response.created and the other large ones
    else:
        assert not raw


async def test_compression_can_be_turned_off(authenticator: Any) -> None:
    config = instant_config()
    config.server.ws_compression = False
    running = await start_server(config, authenticator=authenticator)
    try:
        url = f"ws://127.0.0.1:{running.bridge_port}/v1/responses"
        async with connect(
            url, additional_headers={"Authorization": "Bearer sk-a"}, compression="deflate"
        ) as conn:
            assert "Sec-WebSocket-Extensions" not in conn.response.headers
    finally:
        await running.stop(0.5)


async def test_openai_beta_and_unknown_headers_are_ignored(stack: Any) -> None:
    headers = {
        "Authorization": "Bearer sk-a",
        "OpenAI-Beta": "responses_websockets=2026-02-06",
        "originator": "codex_exec",
        "x-codex-turn-metadata": '{"turn": 1}',
    }
    async with connect(stack.ws_url, additional_headers=headers, compression="deflate") as conn:
        await send_json(conn, CREATE)
        assert (await recv_response(conn))[-1]["type"] == "response.completed"


async def test_ws_upgrade_on_an_unknown_path_is_404(stack: Any) -> None:
    with pytest.raises(InvalidStatus) as info:
        async with connect(
            f"ws://127.0.0.1:{stack.port}/v1/elsewhere", additional_headers={"Authorization": "Bearer sk-a"}
        ):
            pass
    assert info.value.response.status_code == 404
    assert b'"code":"not_found"' in info.value.response.body


def test_compress_min_bytes_must_not_be_negative() -> None:
    from tether.config import from_dict

    assert from_dict({"server": {"ws_compress_min_bytes": 0}}).server.ws_compress_min_bytes == 0
    with pytest.raises(ValueError, match="ws_compress_min_bytes"):
        from_dict({"server": {"ws_compress_min_bytes": -1}})


async def test_a_paced_streams_deltas_are_not_held_by_the_widened_window(make_stack: Any) -> None:
    """A follower that keeps up is written in its producer's step (`tether.core.outbox`: one pass
    per token): a paced stream's deltas leave as they are generated, each its own frame, however
    wide the process's coalescing window has grown, with one sequence of numbers."""
    # One token every 40 ms; the window (what a queued delta waits out) 1 s wide while one stream
    # generates: a delta that waited for it would leave merged with the next 24.
    backend = {"ttft_ms": 0, "tokens_per_s": 25, "tick_ms": 40, "output_tokens": 8}
    async with make_stack(backend=backend, coalesce_ms=1, coalesce_max_ms=1000,
                          coalesce_batches_per_s=1) as stack, stack.ws() as conn:  # fmt: skip
        await send_json(conn, CREATE)
        events = await recv_until(conn, is_terminal)
        check_ws_events(events)
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        assert len(deltas) >= 6, [d["delta"] for d in deltas]  # merged into 1-2 frames when held
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "response.completed"
