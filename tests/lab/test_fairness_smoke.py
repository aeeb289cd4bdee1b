"""`python -m tether_lab.fairness --quick`, end to end at toy size: a real server subprocess, the
quiet tenant in a process of its own, every noisy scenario once. Asserts that every phase ran and
what each heavy request got back (the limits answered as documented), never a latency: the
figures are the campaign's to report (docs/reliability.md, "Fairness")."""

from __future__ import annotations

import json

from tether_lab import fairness


def test_every_scenario_runs_and_the_limits_answer(tmp_path):
    out = tmp_path / "fairness.json"
    fairness.main(["--quick", "--workdir", str(tmp_path / "work"), "--json", str(out)])
    data = json.loads(out.read_text())
    phases = {p["name"]: p for p in data["phases"]}
    assert list(phases) == ["baseline", *fairness.SCENARIOS]
    for p in phases.values():
        assert p["turns"] > 0 and p["failed_quiet"] == 0, p
        assert p["stall_ms"] >= 0
    assert phases["sse_line"]["noisy"] == "failed backend_error"  # a 2 MB line past a 1 MiB cap
    assert phases["logprobs"]["noisy"].startswith("completed")
    assert phases["big_input"]["noisy"] == "completed"
    assert phases["template"]["noisy"] == "completed"
    assert phases["big_conversation"]["noisy"] == "filled; create: completed"
    assert "running" in phases["queued_bytes"]["noisy"]
