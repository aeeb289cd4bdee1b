"""The adapter registry: options validated against each adapter's config dataclass."""

from __future__ import annotations

import dataclasses

import pytest

from tether.backends.cerebras import CerebrasBackend, CerebrasConfig
from tether.backends.openai_compat import OpenAICompatBackend
from tether.backends.registry import backend_kinds, build_backend, parse_options, register_backend
from tether.backends.simulated import SimulatedBackend


def test_kinds():
    # Other suites may register test adapters in the same process; the built-ins are always there.
    kinds = backend_kinds()
    assert kinds == sorted(kinds) and {"cerebras", "openai", "simulated"} <= set(kinds)


def test_build_each_kind(monkeypatch):
    monkeypatch.setenv("CEREBRAS_API_KEY", "k")
    sim = build_backend("sim", "simulated", {"tokens_per_s": 65, "ttft_ms": 10})
    assert isinstance(sim, SimulatedBackend) and sim.name == "sim" and sim.config.tokens_per_s == 65.0
    assert isinstance(build_backend("c", "cerebras", {"max_retries": 1}), CerebrasBackend)
    assert isinstance(
        build_backend("o", "openai", {"base_url": "http://127.0.0.1:9/v1"}), OpenAICompatBackend
    )


def test_unknown_option_and_kind():
    with pytest.raises(
        ValueError, match=r"backend 'sim' \(kind 'simulated'\): unknown option\(s\) tokens_per_sec"
    ):
        build_backend("sim", "simulated", {"tokens_per_sec": 10})
    with pytest.raises(ValueError, match="unknown backend kind 'nope'"):
        build_backend("x", "nope", {})


def test_types_are_checked_and_coerced():
    cfg = parse_options(
        "simulated", {"ttft_ms": 5, "output_tokens": "12", "call_tools": "false", "script": None}
    )
    assert cfg.ttft_ms == 5.0 and cfg.output_tokens == 12 and cfg.call_tools is False and cfg.script is None
    for bad in ({"output_tokens": 1.5}, {"call_tools": "maybe"}, {"script": 3}, {"ttft_ms": True}):
        with pytest.raises(ValueError, match="must be"):
            parse_options("simulated", bad, "sim")
    cfg = parse_options("cerebras", {"headers": {"a": "b"}, "default_max_output_tokens": None})
    assert isinstance(cfg, CerebrasConfig) and cfg.headers == {"a": "b"}
    with pytest.raises(ValueError, match="table"):
        parse_options("cerebras", {"headers": ["a"]})


def test_register_a_new_adapter():
    @dataclasses.dataclass
    class EchoConfig:
        word: str = "hi"

    class Echo:
        kind = "echo-test"
        Config = EchoConfig

        def __init__(self, name, config):
            self.name, self.config = name, config

    register_backend(Echo)
    try:
        assert build_backend("e", "echo-test", {"word": "yo"}).config.word == "yo"
    finally:
        from tether.backends import registry

        registry._ADAPTERS.pop("echo-test")
