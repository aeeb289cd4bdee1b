"""The lab's MCP overhead figure runs end to end (a short run: 3 turns, 1 repetition): a WebSocket
keeps its MCP session, so its later turns spend less time on the MCP server than HTTP turns,
which each open and initialise one."""

from __future__ import annotations

from tether_lab import mcp_overhead


async def test_mcp_overhead_measures_both_transports() -> None:
    results = await mcp_overhead.measure(turns=3, reps=1)
    figures = mcp_overhead.summary(results)
    assert set(figures) == {"ws", "http"} and all(len(run) == 3 for runs in results.values() for run in runs)
    assert all(ms > 0 for runs in results.values() for run in runs for ms in run)
    assert figures["ws"]["turns_2_to_n_median_ms"] < figures["http"]["turns_2_to_n_median_ms"]
