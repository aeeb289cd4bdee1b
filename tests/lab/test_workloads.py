"""Workload files: parsing, determinism, and the simulated script they drive."""

from __future__ import annotations

import json

import pytest

from tether import workloads
from tether.backends.simulated import parse_script


@pytest.mark.parametrize("name", ["bugfix20", "chat3", "long100"])
def test_shipped_workloads_load(name):
    wl = workloads.load(name)
    assert wl.turns == len(wl.steps) + 1
    assert parse_script(wl.simulated_script(workloads.SpeedProfile.parse("1000"))).steps
    for s in wl.steps:
        for j, c in enumerate(s.calls):
            out = wl.tool_output(s.index, j)
            assert len(out) == c.output_bytes and out.isascii()
            json.loads(c.arguments)


def test_sizes_match_the_issue():
    bug = workloads.load("bugfix20").summary()
    assert bug["tool_calls"] >= 20 and bug["tools"] >= 10
    assert 4000 <= bug["instructions_bytes"] <= 8000
    assert bug["tool_output_bytes_max"] >= 4096
    assert workloads.load("chat3").tool_calls == 3
    assert workloads.load("long100").tool_calls == 100


def test_generation_is_deterministic():
    a = workloads.generate("test_log", 3000, "x", 1, failures=2)
    assert a == workloads.generate("test_log", 3000, "x", 1, failures=2)
    assert a != workloads.generate("test_log", 3000, "x", 2, failures=2)
    assert "FAILED" in a


def test_repeat_groups_and_generators():
    wl = workloads.parse({
        "name": "t",
        "tools": [{"type": "function", "name": "read_file"}, {"type": "function", "name": "edit_file"}],
        "steps": [
            {"repeat": 3, "steps": [
                {"tool": "read_file", "args": {"path": "m_{i}.py"}, "output": {"kind": "file", "bytes": 100}},
                {"tool": "edit_file", "args": {"new": "@gen code 50"}, "output": {"kind": "edit", "bytes": 40}},
            ]},
        ],
    })  # fmt: skip
    assert [s.calls[0].name for s in wl.steps] == ["read_file", "edit_file"] * 3
    assert json.loads(wl.steps[4].calls[0].arguments) == {"path": "m_3.py"}
    assert len(json.loads(wl.steps[1].calls[0].arguments)["new"]) == 50
    with pytest.raises(ValueError, match="not among the tools"):
        workloads.parse({"tools": [{"type": "function", "name": "a"}], "steps": [{"tool": "b"}]})


def test_ttft_grows_with_context():
    sp = workloads.SpeedProfile.parse("1000@100:300", ttft_ctx_tokens=1000)
    assert sp.ttft_ms(0) == 100 and sp.ttft_ms(500) == 200 and sp.ttft_ms(5000) == 300
    ttfts = [s["ttft_ms"] for s in workloads.load("bugfix20").simulated_script(workloads.SpeedProfile.parse("1000"))["steps"]]
    assert ttfts == sorted(ttfts) and 200 <= ttfts[0] < ttfts[-1] <= 500
