"""The processes the lab runs against: `tether serve` and `tether bridge --upstream`, as real
subprocesses (`ServerProcess`, the one helper that starts them), so their CPU time and memory can
be read from /proc and the client's own work never shares their event loop.

    python -m tether_lab.prototype serve --config bench.toml   (tether serve + the prototype turns)
    python -m tether bridge --upstream HOST:PORT --port 0

`write_config` renders the server configuration for a set of (workload, speed) pairs: one
simulated backend per pair, driven by the script generated from the workload, and one model name
routed to it (`model_name(workload, speed)`), so every transport asks for the same model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tether.workloads import SpeedProfile, Workload
from tether_lab.metrics import ProcStat

# `tether serve`'s banner (tether/server.py `banner`), written in one piece: its gRPC and HTTP
# lines, and its last line, which says it is complete.
_SERVE_GRPC = re.compile(r"^  gRPC +(\S+):(\d+) ", re.M)
_SERVE_HTTP = re.compile(r"^  HTTP +(https?://\S+:(\d+)/v1) ", re.M)
_SERVE_END = re.compile(r"^Ctrl-C \(or SIGTERM\) stops it", re.M)
_BRIDGE_BANNER = re.compile(r"tether bridge: HTTP/WebSocket on (https?://\S+:(\d+)/v1)")
_WORKER_LINE = re.compile(r"tether: worker (\d+) started \(pid (\d+)\)")


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
    lines = [f"store = {toml_value(store)}", f"log_level = {toml_value(log_level)}", ""]
    srv = {"grpc_port": 0, "bridge_port": 0, "shutdown_grace_s": 2.0, "log_format": "text", **(server or {})}
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


# -- ports and /proc ---------------------------------------------------------------------------------


async def announce_and_wait(ready: dict[str, Any]) -> None:
    """A helper process's life once it listens (the paced upstream, the relay, the forwarders,
    the delay proxy): `READY <json>` on stdout, which its launcher reads, then until SIGTERM or
    SIGINT."""
    print("READY " + json.dumps(ready), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free right now (all held until all are picked)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


TCP_ESTABLISHED = "01"
TCP_LISTEN = "0A"


def tcp_sockets(pid: int) -> list[tuple[int, int, str]]:
    """(local port, remote port, state) of every TCP socket process `pid` holds (Linux /proc)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if int(f[9]) in inodes:
                out.append((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), f[3]))
    return out


def established(pid: int, port: int) -> int:
    """How many accepted connections process `pid` holds on its local `port`."""
    return sum(1 for local, _, state in tcp_sockets(pid) if local == port and state == TCP_ESTABLISHED)


def listens(pid: int, port: int) -> bool:
    return any(local == port and state == TCP_LISTEN for local, _, state in tcp_sockets(pid))


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (children inherit it); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 16)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def worker_starts(log_text: str) -> dict[int, int]:
    """Worker index -> pid of its latest start, from a `tether serve --workers N` supervisor's
    start lines."""
    return {int(index): int(pid) for index, pid in _WORKER_LINE.findall(log_text)}


def worker_pids(log_text: str) -> list[int]:
    """The workers' latest pids, in worker order."""
    starts = worker_starts(log_text)
    return [starts[i] for i in sorted(starts)]


# -- a Tether subprocess ------------------------------------------------------------------------------


@dataclass
class ServerProcess:
    """`tether serve` (or `tether bridge`: `program="bridge"`) as a real subprocess on loopback.

    The one way the lab, the fuzzer, the load and scale-out campaigns and the tests start a
    Tether process. Its stdout and stderr go to `{workdir}/{name}.{start}.out` / `.err` (a
    temporary folder when `workdir` is None), so a crash can be read after the fact.

    Ports: 0 (the default) lets the server pick; `start` then waits for its banner and reads
    them from it. Fixed ports (the scale-out campaigns: workers share them through SO_REUSEPORT,
    nginx needs them up front) make `start` return at once; `wait_ready` waits until every
    serving process listens and /readyz answers. `prelude` is Python code run in the server
    process before the CLI (tests use it to slow a store down); `env` is added to the
    environment (e.g. TETHER_API_KEYS); `args` are extra command-line arguments.
    """

    config: Path | None = None
    workdir: Path | None = None
    grpc_port: int = 0
    bridge_port: int = 0
    workers: int = 1
    name: str = "tether"
    args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    prelude: str = ""
    program: str = "serve"
    module: str = "tether"  # the program's module: `tether_lab.prototype` serves with the prototype turns
    log_level: str | None = "warning"
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    announced_url: str | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def stat(self) -> ProcStat:
        return ProcStat(self.pid)

    def rss(self) -> int:
        return ProcStat(self.pid).rss_bytes()

    @property
    def base_url(self) -> str:
        """The HTTP listener's root (`/readyz`, `/metrics`; the API is under `api_url`)."""
        return f"http://{self.host}:{self.bridge_port}"

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def bridge_url(self) -> str:
        """The API URL as the server announced it (https with TLS)."""
        return self.announced_url or self.api_url

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.bridge_port}/v1/responses"

    @property
    def grpc_target(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def stdout_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / f"{self.name}.{self.starts}.out"

    @property
    def stderr_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / f"{self.name}.{self.starts}.err"

    def command(self) -> list[str]:
        cli = [self.program]
        if self.config is not None:
            cli += ["--config", str(self.config)]
        cli += ["--host", self.host, "--port", str(self.bridge_port)]
        if self.program == "serve":
            cli += ["--grpc-port", str(self.grpc_port)]
            if self.workers != 1:
                cli += ["--workers", str(self.workers)]
        if self.log_level:
            cli += ["--log-level", self.log_level]
        cli += list(self.args)
        if self.prelude:
            launcher = f"import runpy\nrunpy.run_module({self.module!r}, run_name='__main__', alter_sys=True)\n"
            return [sys.executable, "-c", self.prelude + "\n" + launcher, *cli]
        return [sys.executable, "-m", self.module, *cli]

    def start(self, timeout: float = 60.0) -> ServerProcess:
        raise_fd_limit()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"tether-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=err, env=env,
                                         start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip
        if self.grpc_port and self.bridge_port or (self.program == "bridge" and self.bridge_port):
            return self  # fixed ports: `wait_ready` when needed
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._parse_banner(self.stdout_path.read_text(errors="replace")):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"tether {self.program} exited with {self.proc.returncode}:\n{self.logs()}")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"tether {self.program} did not start within {timeout:g} s:\n{self.logs()}")

    def _parse_banner(self, text: str) -> bool:
        if self.program != "serve":
            m = _BRIDGE_BANNER.search(text)
            if m is None:
                return False
            self.announced_url, self.bridge_port = m.group(1), int(m.group(2))
            return True
        grpc = _SERVE_GRPC.search(text)
        if grpc is None or _SERVE_END.search(text) is None:
            return False
        http = _SERVE_HTTP.search(text)
        self.grpc_port = int(grpc.group(2))
        self.bridge_port = int(http.group(2)) if http else 0
        self.announced_url = http.group(1) if http else None
        return True

    def log_text(self) -> str:
        """The server's log (its stderr) of the latest start."""
        try:
            return self.stderr_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return ""

    def logs(self, tail: int = 4000) -> str:
        text = ""
        for path in (self.stdout_path, self.stderr_path):
            with contextlib.suppress(OSError):
                text += f"--- {path.name}\n" + path.read_text(errors="replace")[-tail:]
        return text

    def worker_pids(self) -> dict[int, int]:
        """Worker index -> pid of its latest start (from the supervisor's stdout)."""
        with contextlib.suppress(OSError):
            return worker_starts(self.stdout_path.read_text(errors="replace"))
        return {}

    def serving_pids(self) -> list[int]:
        return list(self.worker_pids().values()) if self.workers > 1 else [self.pid]

    def wait_ready(self, timeout: float = 30.0) -> ServerProcess:
        """Until every serving process listens on both ports and /readyz answers 200."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc and self.proc.returncode}\n{self.logs()}"
                )
            pids = self.serving_pids()
            if len(pids) == self.workers and all(
                listens(p, self.grpc_port) and listens(p, self.bridge_port) for p in pids
            ):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                        return self
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout} s\n{self.logs()}")
            time.sleep(0.05)

    def send_signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Signal and wait; SIGKILL after `timeout`. Returns the exit status."""
        if self.proc is None:
            return None
        self.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait: the exit code (the graceful path; raises when it does not end)."""
        assert self.proc is not None
        self.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> int | None:
        """SIGKILL (`kill -9`): no cleanup of any kind in the server."""
        return self.stop(signal.SIGKILL)

    def metrics(self) -> dict[str, float]:
        """This process's Prometheus samples, `name{label="v",...}` -> value (straight to its port)."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=5).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, val = line.rpartition(" ")
                out[key] = float(val)
        return out

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.terminate(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def serve_process(config: Path, workdir: Path, *, name: str = "server", extra: Sequence[str] = ()) -> ServerProcess:
    """`tether serve` as the bench runs it: ephemeral ports, the prototype turns on."""
    return ServerProcess(config, workdir, name=name, module="tether_lab.prototype", args=list(extra))


def bridge_process(upstream: str, workdir: Path, *, name: str = "bridge") -> ServerProcess:
    return ServerProcess(workdir=workdir, name=name, program="bridge", args=["--upstream", upstream])
