"""A bounded load campaign against a `tether serve` subprocess on loopback (`python -m tether.lab.load`).

    python -m tether.lab.load --connections 1000 --rolling 200 --grpc 20 --duration 60

What it does, in order:

1. starts `tether serve` (simulated backend, SQLite store in a temporary folder, both ports on
   127.0.0.1:0) unless `--target` names a running one, and reads its RSS from /proc (baseline);
2. opens `--connections` WebSocket connections and keeps them open; `--rolling` of them run
   rollouts back to back for `--duration` seconds: a tool loop (create with a tool -> the model
   calls it -> the client sends the tool output with `previous_response_id` -> a text answer),
   every `--stored-every`-th rollout with `store=true`; `--grpc` gRPC Session streams run the same
   rollouts. Every create asks for `include: ["tether:server_timing"]`;
3. reports throughput (turns/s, events/s), the per-turn server overhead (`server_timing.overhead_ms`:
   p50/p99, which excludes the model's time), errors (anything but a completed turn: must be 0),
   memory per idle connection ((RSS with all connections open - baseline) / connections), peak RSS;
4. retrieves every `store=true` response over HTTP (`GET /v1/responses/{id}`): all must be there;
5. closes every connection and waits for the server's RSS to settle: it must come back near its
   baseline (`--rss-slack-mib`).

The client is one asyncio process; the server another (its CPU and memory are its own). File
descriptors: each connection costs one in each process, so the soft `RLIMIT_NOFILE` is raised to
the hard limit here and in the server (the subprocess inherits it).

`ServerProcess` (a `tether serve` subprocess with its ports parsed from the banner) is shared with
`tether.lab.fuzz` and the hardening tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

_BANNER = re.compile(r"tether: gRPC on (\S+):(\d+)(?:, HTTP/WebSocket on http://(\S+):(\d+)/v1)?")

FAST_SIM = {"ttft_ms": 1, "tokens_per_s": 4000, "output_tokens": 24, "tick_ms": 2}


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 16)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def write_config(path: Path, *, store: str, sim: dict[str, Any] | None = None, extra: str = "") -> Path:
    """A TOML config: one simulated backend answering every model name, the given store."""
    options = "\n".join(f"{k} = {orjson.dumps(v).decode()}" for k, v in {**FAST_SIM, **(sim or {})}.items())
    path.write_text(
        f'store = "{store}"\nlog_level = "warning"\n\n[backends.sim]\nkind = "simulated"\n{options}\n\n'
        f'[models."*"]\nbackend = "sim"\n{extra}\n'
    )
    return path


@dataclass
class ServerProcess:
    """`tether serve` as a subprocess on 127.0.0.1 with ephemeral ports.

    `prelude` is Python code run in the server process before the CLI (tests use it to slow a
    store down, for example); `env` is added to the environment (e.g. TETHER_API_KEYS)."""

    config: Path | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    prelude: str = ""
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    grpc_port: int = 0
    bridge_port: int = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.bridge_port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.bridge_port}/v1/responses"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def rss(self) -> int:
        return rss_bytes(self.pid)

    def command(self) -> list[str]:
        cli = ["serve", "--host", "127.0.0.1", "--grpc-port", "0", "--port", "0"]
        if self.config is not None:
            cli += ["--config", str(self.config)]
        cli += self.args
        launcher = "import sys\nfrom tether.cli import main\nsys.exit(main(sys.argv[1:]))\n"
        if self.prelude:
            return [sys.executable, "-c", self.prelude + "\n" + launcher, *cli]
        return [sys.executable, "-m", "tether.cli", *cli]

    def start(self, timeout: float = 60.0) -> ServerProcess:
        raise_fd_limit()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="tether-serve-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it from here
        try:
            self.proc = subprocess.Popen(
                self.command(), stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True
            )
        finally:
            log.close()
        found: dict[str, str] = {}
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for raw in self.proc.stdout:
                m = _BANNER.search(raw.decode(errors="replace"))
                if m and not ready.is_set():
                    found.update(grpc=m.group(2), bridge=m.group(4) or "0")
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True, name="tether-serve-stdout").start()
        if not ready.wait(timeout) or not found:
            self.kill()
            raise RuntimeError(f"tether serve did not start: {self.log_text()[-2000:]}")
        self.grpc_port, self.bridge_port = int(found["grpc"]), int(found["bridge"])
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait: the exit code (the graceful path)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL (`kill -9`): no cleanup of any kind in the server."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


async def wait_rss_settled(proc: ServerProcess, *, within_s: float = 10.0, step_s: float = 0.25) -> int:
    """The server's RSS once two readings in a row agree within 1 MiB (or after `within_s`)."""
    last = proc.rss()
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        await asyncio.sleep(step_s)
        now = proc.rss()
        if abs(now - last) < 1 << 20:
            return now
        last = now
    return last
