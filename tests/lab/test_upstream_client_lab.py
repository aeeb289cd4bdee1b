"""`python -m tether_lab.upstream_client` runs end to end: Tether's client, aiohttp's (the lab
extra has it) and the plain exchange each measured, per request and per streamed read."""

from __future__ import annotations

from tether_lab import upstream_client


async def test_the_client_figures_come_for_each_client() -> None:
    rows = await upstream_client.measure(requests=20, tokens=200)
    got = {(client, what) for client, what, _ in rows}
    assert got == {("tether http1", "request (1-token stream)"), ("tether http1", "streamed read"),
                   ("aiohttp", "request (1-token stream)"), ("aiohttp", "streamed read"),
                   ("plain asyncio", "request (1-token stream)")}  # fmt: skip
    assert all(us > 0 for _, _, us in rows)
