"""The test suite's configurations, in one place.

- `make_config(store, ...)`: the general one (a fast simulated model, ephemeral ports, the given
  store); `server_config(tmp_path, ...)` is it with a SQLite file and the instant model `FAST`.
- `instant_config(backend, **limits)`: memory store and an instant simulated model answering
  every model name (`sim-model` included), for the bridge, console and hardening suites.
"""

from __future__ import annotations

from typing import Any

from tether.config import BackendSpec, Route, TetherConfig, from_dict

# An instant simulated model: no first-token delay, no pacing, 12 tokens.
FAST = {"kind": "simulated", "ttft_ms": 1, "tokens_per_s": 0, "tick_ms": 1, "output_tokens": 12}
FAST_BACKEND = {"ttft_ms": 0, "tokens_per_s": 0, "output_tokens": 12, "tick_ms": 1}


def make_config(store: str = "memory://", *, backends: dict | None = None, models: dict | None = None,
                limits: dict | None = None, **top) -> TetherConfig:
    """A test configuration: fast simulated model, ephemeral ports, given store."""
    data = {
        "store": store,
        "backends": backends or {"sim": {"kind": "simulated", "ttft_ms": 1, "tokens_per_s": 20000}},
        "server": {"grpc_port": 0, "bridge_port": 0, "shutdown_grace_s": 5},
        "limits": {"coalesce_ms": 2, **(limits or {})},
        **top,
    }
    if models is not None:
        data["models"] = models
    return from_dict(data)


def server_config(tmp_path, *, backends: dict[str, Any] | None = None, models: dict[str, Any] | None = None,
                  **limits: Any) -> TetherConfig:
    """SQLite in `tmp_path` (outlives a server restart), the instant model, no coalescing."""
    return make_config(
        f"sqlite:///{tmp_path}/tether.db",
        backends=backends or {"sim": FAST},
        models=models,
        limits={"coalesce_ms": 0, **limits},
    )


def instant_config(backend: dict[str, Any] | None = None, **limits: Any) -> TetherConfig:
    """Memory store, an instant simulated backend (`backend` overrides its options), `limits`."""
    cfg = TetherConfig()
    cfg.store = "memory://"
    cfg.backends = {"sim": BackendSpec(kind="simulated", options={**FAST_BACKEND, **(backend or {})})}
    cfg.models = {"sim-model": Route(backend="sim"), "*": Route(backend="sim")}
    cfg.server.bridge_host = "127.0.0.1"
    cfg.server.bridge_port = 0
    cfg.server.grpc_host = "127.0.0.1"
    cfg.server.grpc_port = 0
    cfg.server.shutdown_grace_s = 2.0
    cfg.server.metrics_port = 0
    cfg.limits.coalesce_ms = 0
    for key, value in limits.items():
        setattr(cfg.limits, key, value)
    return cfg
