"""`tether bench` quick profile, end to end: a real server subprocess, the separate-process bridge,
the delay proxy, every transport. Asserts completeness and consistency only, never a speed."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from tether import workloads
from tether_lab import bench
from tether_lab.transports import VARIANTS


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    code = bench.main(["quick", "--out", str(out), "--no-progress", "--plot"])
    data = json.loads((out / "results.json").read_text())
    return code, data, out


def test_every_transport_completed_every_rollout(quick_run):
    code, data, _ = quick_run
    assert data["consistency"] == [], data["consistency"]
    assert code == 0
    phases = {p["name"]: p for p in data["phases"]}
    assert set(phases) == {"quick", "quick-net", "quick-raw"}
    assert set(phases["quick"]["variants"]) == set(VARIANTS)  # every transport, the remote bridge included
    ran = defaultdict(set)
    for r in data["rollouts"]:
        assert r["ok"], (r["phase"], r["variant"], r["error"])
        ran[r["phase"]].add(r["variant"])
    for name, phase in phases.items():
        assert ran[name] == set(phase["variants"]), name


def test_results_are_consistent_across_transports(quick_run):
    _, data, _ = quick_run
    turns = workloads.load("chat3").turns
    by_phase = defaultdict(list)
    for r in data["rollouts"]:
        by_phase[r["phase"]].append(r)
        assert len(r["turns"]) == turns, (r["variant"], len(r["turns"]))
    reference = None
    for rs in by_phase.values():
        for r in rs:
            calls = [tuple(c) for t in r["turns"] for c in t["calls"]]
            assert len(calls) == workloads.load("chat3").tool_calls
            # Same tool calls (name, call id, arguments) and the same answer, whatever the transport.
            if reference is None:
                reference = (calls, r["final_text"])
            assert (calls, r["final_text"]) == reference, r["variant"]
            assert r["final_text"]


def test_server_timing_present(quick_run):
    _, data, _ = quick_run
    for r in data["rollouts"]:
        if r["variant"] == "ws-proto":  # one response per rollout: its timing covers all of it
            assert r["whole_rollout_timing"] and r["whole_rollout_timing"]["overhead_ms"] >= 0
            assert "append_wait" in r["whole_rollout_timing"]["stages_ms"]
            continue
        for t in r["turns"]:
            assert t["overhead_ms"] is not None and t["overhead_ms"] >= 0, (r["variant"], t["index"])
            assert {"resolve", "validate", "render", "backend"} <= set(t["stages_ms"]), (r["variant"], t["stages_ms"])


def test_measurements_and_outputs_exist(quick_run):
    _, data, out = quick_run
    for r in data["rollouts"]:
        assert r["bytes_sent"] > 0 and r["e2e_s"] > 0
        assert r["server_cpu_s"] is not None
        if r["phase"] == "quick-net":  # through the delay proxy: wire counters and connections
            assert r["wire_c2s"] > 0 and r["wire_s2c"] > 0 and r["connections"] >= 1
        if r["variant"] == "ws-remote":
            assert r["bridge_cpu_s"] is not None
    newconn = [r for r in data["rollouts"] if r["variant"] == "http-full-newconn" and r["phase"] == "quick-net"]
    assert newconn and newconn[0]["connections"] == len(newconn[0]["turns"])
    for name in ("results.json", "summary.csv", "rollouts.csv", "turns.csv", "report.md"):
        assert (out / name).stat().st_size > 0
    assert list((out / "plots").glob("overhead-vs-turn-*.png"))
