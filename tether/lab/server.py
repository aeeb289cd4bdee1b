"""The processes a bench runs against: `tether serve` and `tether bridge --upstream`, as real
subprocesses, so their CPU time and memory can be read from /proc and the client's own work never
shares their event loop.

    python -m tether serve --config bench.toml --set server.prototype_append=true
    python -m tether bridge --upstream HOST:PORT --port 0

`write_config` renders the server configuration for a set of (workload, speed) pairs: one
simulated backend per pair, driven by the script generated from the workload, and one model name
routed to it (`model_name(workload, speed)`), so every transport asks for the same model.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tether.lab.metrics import ProcStat
from tether.lab.workloads import SpeedProfile, Workload

_SERVE_BANNER = re.compile(r"tether: gRPC on (\S+):(\d+)(?:, HTTP/WebSocket on (\S+))?")
_BRIDGE_BANNER = re.compile(r"tether bridge: HTTP/WebSocket on (\S+)")


def die_with_parent() -> None:
    """preexec_fn for lab subprocesses: SIGTERM them when the bench process dies (Linux), so a
    killed bench never leaves servers, bridges or proxies behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def model_name(workload: Workload | str, speed: SpeedProfile | str) -> str:
    w = workload if isinstance(workload, str) else workload.name
    s = speed if isinstance(speed, str) else speed.name
    return f"bench-{w}-{s}".replace("@", "-").replace(":", "-")


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def write_config(
    path: Path,
    pairs: list[tuple[Workload, SpeedProfile]],
    *,
    store: str,
    script_dir: Path,
    log_level: str = "warning",
    server: dict | None = None,
    limits: dict | None = None,
    backend_options: dict | None = None,
) -> dict[tuple[str, str], str]:
    """Write the server TOML; returns {(workload, speed name): model name}."""
    script_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"store = {toml_value(store)}", f"log_level = {toml_value(log_level)}", 'log_format = "text"', ""]
    srv = {"grpc_port": 0, "bridge_port": 0, "shutdown_grace_s": 2.0, **(server or {})}
    lines.append("[server]")
    lines += [f"{k} = {toml_value(v)}" for k, v in srv.items()]
    if limits:
        lines += ["", "[limits]"] + [f"{k} = {toml_value(v)}" for k, v in limits.items()]
    models: dict[tuple[str, str], str] = {}
    lines += ["", '[backends."default"]', 'kind = "simulated"', "ttft_ms = 1", "tokens_per_s = 0"]
    for wl, speed in pairs:
        name = model_name(wl, speed)
        if (wl.name, speed.name) in models:
            continue
        script = script_dir / f"{name}.json"
        script.write_text(json.dumps(wl.simulated_script(speed), indent=1))
        opts = {"kind": "simulated", "ttft_ms": speed.ttft_min_ms, "tokens_per_s": speed.tokens_per_s,
                "script": str(script.resolve()), **(backend_options or {})}
        lines += ["", f"[backends.{toml_value(name)}]"] + [f"{k} = {toml_value(v)}" for k, v in opts.items()]
        lines += ["", f"[models.{toml_value(name)}]", f"backend = {toml_value(name)}"]
        models[(wl.name, speed.name)] = name
    lines += ["", '[models."*"]', 'backend = "default"', ""]
    path.write_text("\n".join(lines))
    return models


@dataclass
class TetherProcess:
    """A Tether subprocess (`python -m tether serve` or `python -m tether bridge`)."""

    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    grpc_port: int | None = None
    bridge_url: str | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def stat(self) -> ProcStat:
        return ProcStat(self.pid)

    def start(self, timeout: float = 60.0) -> TetherProcess:
        """Start and wait for the banner (blocking: called between measurements)."""
        env = {**os.environ, **self.env}
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child for its lifetime
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=die_with_parent)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if self._parse(text):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[3:5]} exited with {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"no banner from {' '.join(self.argv)} within {timeout:g} s; see {self.log_path}")

    def _parse(self, text: str) -> bool:
        m = _SERVE_BANNER.search(text)
        if m:
            self.grpc_port = int(m.group(2))
            self.bridge_url = m.group(3)
            return True
        m = _BRIDGE_BANNER.search(text)
        if m:
            self.bridge_url = m.group(1)
            return True
        return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def serve_process(config: Path, log_path: Path, *, extra: list[str] | None = None) -> TetherProcess:
    args = ["--config", str(config), "--set", "server.prototype_append=true"]
    return TetherProcess([sys.executable, "-m", "tether", "serve", *args, *(extra or [])], log_path)


def bridge_process(upstream: str, log_path: Path) -> TetherProcess:
    return TetherProcess(
        [sys.executable, "-m", "tether", "bridge", "--upstream", upstream, "--port", "0", "--log-level", "warning"],
        log_path,
    )
