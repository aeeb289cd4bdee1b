"""The loop-lag probe (tether/observability/loop_lag.py): a stall of the event loop shows on
`/metrics` as `tether_event_loop_lag_max_seconds` (the longest since the previous scrape, then
back to a small value) and in `tether_event_loop_lag_seconds`."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.hardening.support import full_stack, instant_config
from tests.support.metrics import samples


def _lag(text: str) -> tuple[float, float, float]:
    scrape = samples(text)
    return (scrape[("tether_event_loop_lag_max_seconds", ())], scrape[("tether_event_loop_lag_seconds_count", ())],
            scrape[("tether_event_loop_busy_max_seconds", ())])  # fmt: skip


async def test_a_blocked_loop_shows_in_the_metrics_then_the_peak_resets() -> None:
    config = instant_config()
    config.server.loop_lag_interval_s = 0.005
    async with full_stack(config) as stack, httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}") as h:
        await asyncio.sleep(0.05)
        await h.get("/metrics")  # the peak so far (startup) is read and reset
        time.sleep(0.2)  # noqa: ASYNC251 - the point: the loop is blocked for 200 ms, using no CPU
        await asyncio.sleep(0.02)
        peak, count, busy = _lag((await h.get("/metrics")).text)
        assert 0.15 <= peak < 1.0, peak
        assert count > 0 and busy < 0.1, busy  # blocked, not computing: lag, not busy
        spin_until = time.perf_counter() + 0.2
        while time.perf_counter() < spin_until:  # 200 ms of CPU on the loop
            pass
        await asyncio.sleep(0.02)
        peak, _, busy = _lag((await h.get("/metrics")).text)
        assert peak >= 0.15 and busy >= 0.1, (peak, busy)
        await asyncio.sleep(0.05)
        peak, _, busy = _lag((await h.get("/metrics")).text)
        assert peak < 0.1 and busy < 0.1, (peak, busy)


def test_the_loop_tether_runs_on_times_each_pass_without_a_timer_of_its_own() -> None:
    """`tether serve`'s loop (tether.eventloop.run on asyncio) measures from its selector: every
    pass that held the loop is seen whole, a blocked pass as lag and a computing one as busy too,
    and nothing wakes the process to measure (no probe task)."""
    from tether import eventloop
    from tether.observability.loop_lag import LoopLagProbe

    async def main() -> tuple[str, list[tuple[float, float]], float]:
        got: list[tuple[float, float]] = []
        probe = LoopLagProbe(0.05, lambda lag, busy: got.append((lag, busy))).start()
        watching = f"{probe.watching}, {len(asyncio.all_tasks())} task(s)"
        await asyncio.sleep(0.01)
        time.sleep(0.03)  # noqa: ASYNC251 - shorter than the interval: a timer would likely miss it
        await asyncio.sleep(0.01)
        spin_until = time.perf_counter() + 0.05
        while time.perf_counter() < spin_until:
            pass
        await asyncio.sleep(0.01)
        await probe.stop()
        return watching, got, probe.worst

    watching, got, worst = eventloop.run(main(), "asyncio")
    assert watching == "selector, 1 task(s)"  # no probe task beside main
    blocked = [(lag, busy) for lag, busy in got if 0.025 <= lag < 0.045]
    spun = [(lag, busy) for lag, busy in got if 0.045 <= lag < 0.2]
    assert len(blocked) == 1 and blocked[0][1] < 0.01, got
    assert len(spun) == 1 and spun[0][1] >= 0.04, got
    assert worst < 0.2
