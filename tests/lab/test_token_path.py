"""The token-path measurement (tether_lab/token_path.py): every stage carries every token, and in
the one-pass stage each delta reaches the connection's writer in the upstream read's own step."""

from __future__ import annotations

from tether_lab import token_path


async def test_every_stage_carries_every_token_and_one_pass_writes_each_inline() -> None:
    result = await token_path.measure(tokens=30, turns=2, reps=1)
    rows = {r["stage"]: r for r in result["rows"]}
    assert list(rows) == list(token_path.STAGES)
    for name, row in rows.items():
        assert row["tokens_out"] == 60, name  # each read made one chunk, one delta, one write
        assert row["us_per_token"] > 0, name
    table = token_path.render(result)
    assert "| one pass (ws) |" in table and "100%" in table
