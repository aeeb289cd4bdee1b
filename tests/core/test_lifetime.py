"""A connection's lifetime and idle timeout as a pure rule (`tether.core.lifetime.check`), and the
session's watchdog driven by a clock the test sets (no sleeping out the limits)."""

from __future__ import annotations

import asyncio

import pytest

from tests.core.clocks import SetClock
from tests.support.configs import make_config
from tether.core.lifetime import MAX_SLEEP_S, MIN_SLEEP_S, Check, Ending, check
from tether.server import build_engine

LIMITS = {"lifetime_s": 3600.0, "idle_timeout_s": 900.0}


def at(now: float, *, last_activity: float = 0.0, idle: bool = True) -> Check:
    return check(now, opened_at=0.0, last_activity=last_activity, idle=idle, **LIMITS)


def test_the_lifetime_ends_a_connection_at_its_edge_whatever_it_does() -> None:
    assert at(3600.0, last_activity=3599.0, idle=False) == Check(Ending.LIFETIME, 0.0)
    assert at(3599.999, last_activity=3599.0, idle=False).ending is None


def test_idle_ends_only_a_connection_with_nothing_running() -> None:
    assert at(900.0) == Check(Ending.IDLE, 0.0)
    assert at(899.0).ending is None
    assert at(2000.0, idle=False).ending is None  # a long turn is not idleness


def test_the_watchdog_sleeps_until_the_next_edge_within_its_bounds() -> None:
    assert at(899.0) == Check(None, 1.0)  # one second to the idle edge
    assert at(10.0) == Check(None, MAX_SLEEP_S)  # far from both edges: look again later
    assert at(899.999) == Check(None, MIN_SLEEP_S)
    assert check(3598.0, opened_at=0.0, last_activity=3597.0, idle=True, **LIMITS) == Check(None, 2.0)


@pytest.mark.parametrize(("limit", "code"), [("connection_lifetime_s", "websocket_connection_limit_reached"),
                                             ("idle_timeout_s", "idle_timeout")])  # fmt: skip
async def test_a_session_ends_when_its_clock_passes_a_limit(limit: str, code: str) -> None:
    clock = SetClock()
    limits = {"connection_lifetime_s": 60.0, "idle_timeout_s": 30.0, "lifetime_grace_s": 0.0}
    engine = await build_engine(make_config(limits=limits), clock=clock)
    try:
        session = await engine.open_session("t", transport="test")
        await asyncio.sleep(0)  # the watchdog looked once: nothing due
        assert session.state.value == "open"
        clock.advance(limits[limit])
        events = [ev async for batch in session.events() for ev in batch]
        assert [ev.error.error.code for ev in events] == [code]
        assert session.state.value == "closed" and session not in engine.sessions
    finally:
        await engine.aclose()
