"""What `tether serve` says when it starts, as a new user sees it: a banner on stdout naming where to
point each kind of client and which model names route where; logs on stderr as readable lines on
a terminal and JSON lines otherwise (`--log-format`, `[server] log_format` to choose). The real
program in a subprocess, its stderr a pipe or a pseudo-terminal."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tether.config import from_dict
from tether.logging_setup import resolve_format

SERVE = [sys.executable, "-m", "tether", "serve", "--store", "memory://", "--port", "0", "--grpc-port", "0"]


def start(tmp_path: Path, *args: str, tty: bool = False) -> tuple[subprocess.Popen[bytes], int | None]:
    """`tether serve ARGS` with stdout a pipe and stderr a pipe, or (tty) a pseudo-terminal whose
    reading end is returned."""
    master = None
    if tty:
        master, slave = pty.openpty()
        proc = subprocess.Popen([*SERVE, *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
    else:
        proc = subprocess.Popen([*SERVE, *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, master


def read_banner(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        assert line, f"tether serve exited with {proc.wait()} before its banner"
        lines.append(line.rstrip("\n"))
        if line.startswith("Ctrl-C"):
            return lines
    raise AssertionError(f"no banner within {timeout} s: {lines}")


def stop(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    return (err or b"").decode()


def read_pty(master: int, until: float = 2.0) -> str:
    out = b""
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            out += chunk
    return out.decode(errors="replace").replace("\r\n", "\n")


def test_the_banner_says_where_to_point_each_client_and_where_models_route(tmp_path: Path) -> None:
    proc, _ = start(tmp_path)
    try:
        lines = read_banner(proc)
    finally:
        err = stop(proc)
    text = "\n".join(lines)
    grpc = re.search(r"^  gRPC +(127\.0\.0\.1:\d+) ", text, re.M)
    http = re.search(r"^  HTTP +http://127\.0\.0\.1:(\d+)/v1 ", text, re.M)
    assert grpc and http, text
    port = http.group(1)
    assert lines[0] == "Tether 0.1.0 is serving. Point a client at:"
    assert re.search(rf"^  WebSocket +ws://127\.0\.0\.1:{port}/v1/responses ", text, re.M)
    assert re.search(rf"^  console +http://127\.0\.0\.1:{port}/console ", text, re.M)
    assert f'tether.client.connect("{grpc.group(1)}")' in text
    models = lines[lines.index("Model names (GET /v1/models lists them):") + 1 : -1]
    assert [re.split(r" +-> ", row.strip()) for row in models] == [
        ["tether-sim", "backend sim (simulated)"],
        ["tether-lab/<workload>: bugfix20, chat3, long100", "backend sim (simulated), lab rollouts"],
        ["any other name", 'backend sim (simulated), the "*" route'],
    ]
    # The README shows this banner to newcomers (the default ports); it stays what the server prints.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    shown = readme.split("## Your first request", 1)[1].split("```\n", 2)[1].splitlines()
    printed = text.replace(f":{port}/", ":8000/").replace(grpc.group(1), "127.0.0.1:50051").splitlines()
    assert [line.split() for line in shown] == [line.split() for line in printed]
    # stderr is a pipe here: every log line is one JSON object.
    records = [json.loads(line) for line in err.splitlines()]
    assert any(r["msg"].startswith("no API keys configured") and r["level"] == "warning" for r in records)


def test_logs_are_readable_lines_on_a_terminal(tmp_path: Path) -> None:
    proc, master = start(tmp_path, tty=True)
    assert master is not None
    try:
        read_banner(proc)
        logs = read_pty(master, until=1.0)
    finally:
        stop(proc)
        os.close(master)
    assert re.search(r"^\d\d:\d\d:\d\d warning tether\.server: no API keys configured", logs, re.M), logs
    assert "{" not in logs.splitlines()[0], logs


def test_log_format_chooses_json_on_a_terminal(tmp_path: Path) -> None:
    proc, master = start(tmp_path, "--log-format", "json", tty=True)
    assert master is not None
    try:
        read_banner(proc)
        logs = read_pty(master, until=1.0)
    finally:
        stop(proc)
        os.close(master)
    records = [json.loads(line) for line in logs.splitlines() if line.strip()]
    assert any(r["logger"] == "tether.server" for r in records)


def test_log_format_setting_and_its_auto_default() -> None:
    class Stream(io.StringIO):
        def __init__(self, tty: bool) -> None:
            super().__init__()
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    assert from_dict({}).server.log_format == "auto"
    assert resolve_format("auto", Stream(tty=True)) == "text"
    assert resolve_format("auto", Stream(tty=False)) == "json"
    assert resolve_format("json", Stream(tty=True)) == "json"
    assert from_dict({"server": {"log_format": "text"}}).server.log_format == "text"
    with pytest.raises(ValueError, match="server.log_format must be one of auto, json, text"):
        from_dict({"server": {"log_format": "yaml"}})
    with pytest.raises(ValueError, match=r"log_format is a \[server\] setting"):
        from_dict({"log_format": "json"})


def test_the_banner_groups_model_names_by_backend() -> None:
    from tether.core.stages.route import Listed
    from tether.server import model_routes

    config = from_dict({
        "store": "memory://",
        "backends": {"gpu": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}, "sim": {"kind": "simulated"}},
        "models": {"coder": {"backend": "gpu"}, "*": {"backend": "sim"}},
    })  # fmt: skip
    listing = [Listed("coder", "gpu", "vllm", "config")]
    listing += [Listed(f"m{i}", "gpu", "vllm", "discovered") for i in range(6)]
    listing += [Listed("tether-sim", "sim", "tether", "*"), Listed("tether-lab/chat3", "sim", "tether", "*")]
    assert model_routes(config, listing, "sim") == [
        ("coder", "backend gpu (openai)"),
        ("m0, m1, m2, m3 and 2 more", "backend gpu (openai), listed by the server"),
        ("tether-sim", "backend sim (simulated)"),
        ("tether-lab/<workload>: chat3", "backend sim (simulated), lab rollouts"),
        ("any other name", 'backend sim (simulated), the "*" route'),
    ]
