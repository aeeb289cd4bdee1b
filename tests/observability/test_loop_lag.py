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
