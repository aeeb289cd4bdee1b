"""The outboxes' coalescing window widens while many streams generate at once
(`CoalesceWindow`): the rule at and past its edges, an outbox holding deltas for the widened
window, the turns counting themselves, and the settings refused when negative."""

from __future__ import annotations

import asyncio

import pytest

from tests.core.clocks import SetClock
from tests.core.test_outbox import created, delta
from tests.support.configs import make_config
from tether.config import from_dict
from tether.core.outbox import CoalesceWindow, Outbox
from tether.protocol import json_codec
from tether.server import build_engine


def test_the_window_is_the_minimum_until_the_streams_need_more_then_grows_to_its_cap() -> None:
    w = CoalesceWindow(0.008, 0.032, 4000)  # the defaults: 8 ms, 32 ms, 4,000 batches/s
    assert w.current() == 0.008  # nothing generating
    w.streaming = 32  # 32 / 4,000 = 8 ms: the edge, still the minimum
    assert w.current() == pytest.approx(0.008)
    w.streaming = 100
    assert w.current() == pytest.approx(0.025)  # 100 / 4,000
    w.streaming = 128  # the cap's edge
    assert w.current() == pytest.approx(0.032)
    w.streaming = 10_000  # past it
    assert w.current() == pytest.approx(0.032)


def test_a_fixed_window_a_disabled_one_and_a_minimum_over_the_cap() -> None:
    fixed = CoalesceWindow(0.008, 0.032, 0)  # batches_per_s 0: never widens
    fixed.streaming = 10_000
    assert fixed.current() == 0.008
    off = CoalesceWindow(0.0, 0.032, 4000)  # coalesce_ms 0: every delta as it comes
    off.streaming = 10_000
    assert off.current() == 0.0
    wide = CoalesceWindow(0.050, 0.032, 4000)  # a minimum over the cap is the window
    wide.streaming = 10_000
    assert wide.current() == 0.050


def test_generating_counts_a_stream_for_the_block_even_when_it_raises() -> None:
    w = CoalesceWindow(0.008, 0.032, 4000)
    with w.generating(), w.generating():
        assert w.streaming == 2
    with pytest.raises(RuntimeError), w.generating():
        raise RuntimeError("a backend failed")
    assert w.streaming == 0


async def test_an_outbox_holds_deltas_for_the_widened_window() -> None:
    clock = SetClock()
    window = CoalesceWindow(0.010, 0.040, 1000)
    box = Outbox(max_events=16, window=window, max_coalesced_bytes=1 << 16, clock=clock)
    window.streaming = 30  # 30 / 1,000 = 30 ms
    await box.put(created("r"))
    assert len(await box.get_batch()) == 1  # flushed at t = 0
    clock.advance(0.015)  # past the minimum, inside the widened window
    await box.put(delta("r", "a"))
    waiting = asyncio.create_task(box.get_batch())
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()
    window.streaming = 0  # the same moment with few streams: the 10 ms window is over
    await box.put(delta("r", "b"))
    at_once = asyncio.create_task(box.get_batch())
    await asyncio.sleep(0)
    assert at_once.done() and [ev.output_text_delta.delta for ev in at_once.result()] == ["ab"]


async def test_a_turn_counts_itself_while_it_reads_its_backend() -> None:
    engine = await build_engine(make_config(backends={"sim": {"kind": "simulated", "ttft_ms": 1, "tokens_per_s": 200,
                                                              "output_tokens": 40, "call_tools": False}}))  # fmt: skip
    window = engine.services.coalesce
    try:
        session = await engine.open_session("", transport="websocket")
        events = session.events()
        await session.send(json_codec.client_event_from_json(
            {"type": "response.create", "model": "m", "input": "hi", "store": False}))  # fmt: skip
        seen: list[int] = []
        while True:
            batch = await anext(events)
            seen.append(window.streaming)
            if any(ev.WhichOneof("event") == "completed" for ev in batch):
                break
        assert 1 in seen  # counted while the text streamed
        await session.close()
        assert window.streaming == 0
    finally:
        await engine.aclose()


@pytest.mark.parametrize("name", ["coalesce_ms", "coalesce_max_ms", "coalesce_batches_per_s"])
def test_a_negative_setting_is_refused_naming_it(name: str) -> None:
    with pytest.raises(ValueError, match=f"limits.{name}"):
        from_dict({"limits": {name: -1}})
