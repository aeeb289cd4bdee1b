"""The bytes of pending creates (`max_queued_bytes_per_connection`, `_per_key`, `_per_process`,
tether/core/queued.py), each at its edge (accepted) and one create past it (429
`too_many_queued_bytes`); a create larger than a whole budget is 413 `request_too_large`; the
bytes go back when turns end or their connection closes.

The simulated model waits a minute for its first token, so the turns these tests start stay
pending until they are cancelled or their connection closes.
"""

from __future__ import annotations

from typing import Any

from tests.bridge.helpers import recv_until, wait_for

from .support import CREATE, KEY_A, KEY_B, dumps, full_stack, instant_config, recv_json, send_json, ws_error

HANGING = {"ttft_ms": 60_000}
PADDED = {**CREATE, "input": "x" * 10_000}


def size_of(event: dict[str, Any]) -> int:
    """The bytes the server charges for a create event sent on a WebSocket (its JSON text)."""
    return len(dumps(event))


async def next_error(conn: Any) -> dict[str, Any]:
    """The next `error` event on `conn` (events of turns already running may come first)."""
    return (await recv_until(conn, lambda e: e["type"] == "error"))[-1]


async def created(conn: Any) -> str:
    """The id of the next `response.created` on `conn`."""
    ev = await recv_until(conn, lambda e: e["type"] == "response.created")
    return ev[-1]["response"]["id"]


async def test_per_connection_edge_then_429_and_bytes_come_back() -> None:
    s = size_of(PADDED)
    async with full_stack(instant_config(HANGING, max_queued_bytes_per_connection=2 * s)) as stack:
        queued = stack.engine.services.queued
        async with stack.ws() as conn, stack.ws() as other:
            await send_json(conn, PADDED)
            first = await created(conn)  # generating: still held
            await send_json(conn, PADDED)  # queued behind it: 2 x s, the edge
            await wait_for(lambda: queued.total == 2 * s)
            await send_json(conn, PADDED)
            err = ws_error(await next_error(conn), "too_many_queued_bytes", 429)
            assert "connection" in err["message"] and str(2 * s) in err["message"]
            # Another connection of the same key has its own budget.
            await send_json(other, PADDED)
            await created(other)
            # A turn that ends gives its bytes back: the refused create now fits.
            await send_json(conn, {"type": "response.cancel", "response_id": first})
            await recv_until(conn, lambda e: e["type"] == "response.incomplete")
            await wait_for(lambda: queued.total == 2 * s)
            await send_json(conn, PADDED)
            await wait_for(lambda: queued.total == 3 * s)
        # Closed connections hold nothing.
        await wait_for(lambda: queued.total == 0 and queued.of_key("a") == 0)


async def test_per_key_edge_then_429_on_every_transport_and_other_keys_unaffected() -> None:
    s = size_of(PADDED)
    config = instant_config(HANGING, max_queued_bytes_per_connection=0, max_queued_bytes_per_key=2 * s)
    async with full_stack(config) as stack:
        queued = stack.engine.services.queued
        async with stack.ws() as one, stack.ws() as two, stack.ws(KEY_B) as b:
            await send_json(one, PADDED)
            await created(one)
            await send_json(two, PADDED)  # the key's edge, over two connections
            await created(two)
            assert queued.of_key("a") == 2 * s
            await send_json(two, PADDED)
            err = ws_error(await next_error(two), "too_many_queued_bytes", 429)
            assert "API key" in err["message"]
            async with stack.http(KEY_A) as h:  # a stateless create of the same key (its body's size)
                r = await h.post("/v1/responses", content=dumps({k: v for k, v in PADDED.items() if k != "type"}))
                assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_queued_bytes"
            await send_json(b, PADDED)  # another key: its own budget
            await created(b)
            assert queued.of_key("b") == s


async def test_per_process_edge_then_429() -> None:
    s = size_of(PADDED)
    config = instant_config(HANGING, max_queued_bytes_per_connection=0, max_queued_bytes_per_key=0,
                            max_queued_bytes_per_process=2 * s)  # fmt: skip
    async with full_stack(config) as stack, stack.ws() as a, stack.ws(KEY_B) as b:
        await send_json(a, PADDED)
        await created(a)
        await send_json(b, PADDED)  # the process's edge
        await created(b)
        await send_json(b, PADDED)
        err = ws_error(await next_error(b), "too_many_queued_bytes", 429)
        assert "server" in err["message"]


async def test_a_create_larger_than_a_whole_budget_is_413() -> None:
    s = size_of(PADDED)
    async with full_stack(instant_config(max_queued_bytes_per_connection=s)) as stack, stack.ws() as conn:
        await send_json(conn, PADDED)  # exactly the budget: accepted, and it completes
        done = await recv_until(conn, lambda e: e["type"] in ("response.completed", "error"))
        assert done[-1]["type"] == "response.completed"
        await send_json(conn, {**PADDED, "input": PADDED["input"] + "x"})
        ws_error(await next_error(conn), "request_too_large", 413)
        await wait_for(lambda: stack.engine.services.queued.total == 0)


async def test_many_large_creates_on_one_socket_are_bounded() -> None:
    """The red-team case scaled down: 64 creates of 256 KiB queued on one WebSocket under a 1 MiB
    connection budget: four are held, the other 60 refused, and memory held stays at the bound."""
    big = {**CREATE, "input": "x" * (256 * 1024 - 64)}
    s = size_of(big)
    async with full_stack(instant_config(HANGING, max_queued_bytes_per_connection=4 * s)) as stack, stack.ws() as conn:
        for _ in range(64):
            await send_json(conn, big)
        refused = 0
        while refused < 60:
            ev = await recv_json(conn)
            if ev["type"] == "error":
                ws_error(ev, "too_many_queued_bytes", 429)
                refused += 1
        assert stack.engine.services.queued.total == 4 * s


async def test_a_steers_successor_is_charged_and_released() -> None:
    """The server's own create (a steer's successor) counts while it runs and goes back after."""
    slow = {"ttft_ms": 0, "tokens_per_s": 40, "output_tokens": 400}
    async with full_stack(instant_config(slow)) as stack, stack.ws() as conn:
        queued = stack.engine.services.queued
        await send_json(conn, {**CREATE, "input": "write a lot"})
        first = await recv_until(conn, lambda e: e["type"] == "response.output_text.delta")
        held = queued.total
        assert held == size_of({**CREATE, "input": "write a lot"})
        await send_json(conn, {"type": "response.steer", "previous_response_id": first[0]["response"]["id"],
                               "input": "stop, go left"})  # fmt: skip
        successor = await recv_until(conn, lambda e: e["type"] == "response.created")
        assert successor[-1]["response"]["previous_response_id"] == first[0]["response"]["id"]
        assert queued.total > 0  # the successor, while it runs
        await send_json(conn, {"type": "response.cancel", "response_id": successor[-1]["response"]["id"]})
        await recv_until(conn, lambda e: e["type"] == "response.incomplete")
        await wait_for(lambda: queued.total == 0 and queued.of_key("a") == 0)
