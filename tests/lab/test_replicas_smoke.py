"""`tether bench replicas`, end to end at toy size: a real server subprocess with pools of
simulated replicas, every variant, two replica counts. Asserts completeness and what routing must
produce (where the prompt tokens went), never a speed."""

from __future__ import annotations

import json
import time

from tether import workloads
from tether.backends.base import BackendRequest, Finish
from tether.backends.registry import build_backend
from tether.core.items import user_message
from tether_lab import bench, replicas


def test_replicas_phase_runs_every_cell_and_routes_as_configured(tmp_path):
    out = tmp_path / "rep"
    code = bench.main(["replicas", "--agents", "2", "--replica-counts", "1,2", "--time-scale", "50",
                       "--workload", "chat3", "--out", str(out), "--plot"])
    assert code == 0
    data = json.loads((out / "replicas.json").read_text())
    cells = {(c["variant"], c["replicas"]): c for c in data["cells"]}
    assert set(cells) == {(v, n) for v in replicas.VARIANTS for n in (1, 2)}
    for (variant, n), c in cells.items():
        assert c["ok"] == 2 and len(c["e2e_s"]) == 2, (variant, n, c["errors"])
        assert len(c["ttft_by_turn_s"]) == 4  # chat3: 3 tool calls + the answer
        assert set(c["prompt_tokens"]) == {f"rep-{variant}-{n}/{i}" for i in range(n)}
        assert sum(c["calls"].values()) == 2 * 4  # every model call reached exactly one replica
        assert 0 < sum(c["cached_tokens"].values()) < sum(c["prompt_tokens"].values())
    # Round-robin spreads both agents' calls over both replicas; chain-affine keeps each agent's
    # continuations on the replica of its first turn (4 calls each: 8 calls, 4 on each or 8 on one).
    assert all(v > 0 for v in cells[("http-rr", 2)]["calls"].values())
    assert sorted(cells[("ws-affine", 2)]["calls"].values()) in ([4.0, 4.0], [0.0, 8.0])
    assert set(data["ratios"]) == {"1", "2"}
    report = (out / "report.md").read_text()
    assert "ws-affine/http-rr" in report and "balance" in report
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "replicas-e2e.png", "replicas-hit-ratio-2.png", "replicas-ttft-by-turn-2.png"]


async def test_the_replicas_decode_at_their_own_rate(tmp_path):
    """The workload's script sets what the model says, the replica how fast: a step's own
    `tokens_per_s` (the lab's speed profile) would override the replica's decode rate."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(replicas.replica_script(workloads.load("chat3"))))
    rate = 400.0
    backend = build_backend("r", "simulated", {"ttft_ms": 0, "tokens_per_s": rate, "prefill_tokens_per_s": 1e9,
                                               "tick_ms": 2, "script": str(script)})  # fmt: skip
    request = BackendRequest(model="m", instructions="i", items=[user_message("go")], input_tokens=10)
    started = time.monotonic()
    finish = None
    async for chunk in backend.stream(request):
        if isinstance(chunk, Finish):
            finish = chunk
    took = time.monotonic() - started
    assert finish is not None and finish.usage.output_tokens >= 20
    assert took >= 0.8 * finish.usage.output_tokens / rate, (took, finish.usage.output_tokens)
