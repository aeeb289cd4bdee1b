"""A `tether serve` that cannot start says why in one line on stderr and exits with status 1: a
port in use (naming the port and the setting or flag that moves it), a bad configuration key or
value, a missing extra, a store that cannot be reached, a TLS file that does not load. No
traceback, no event-loop noise after it. Each case runs the real program in a subprocess."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

# Makes the store's driver unimportable in the child, as when the extra was never installed.
WITHOUT_ASYNCPG = "import sys\nsys.modules['asyncpg'] = None\n"


def serve(tmp_path: Path, *args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """`tether serve ARGS` in `tmp_path` (its default SQLite store lands there), to its exit."""
    launch = prelude + "import runpy\nrunpy.run_module('tether', run_name='__main__', alter_sys=True)\n"
    return subprocess.run(
        [sys.executable, "-c", launch, "serve", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed start printed on stderr (and nothing else)."""
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.fixture
def taken_port():
    with socket.create_server(("127.0.0.1", 0)) as other:
        yield other.getsockname()[1]


def test_a_bridge_port_in_use_names_the_port_and_the_flag(tmp_path: Path, taken_port: int) -> None:
    line = one_line(serve(tmp_path, "--port", str(taken_port), "--grpc-port", "0"))
    assert line == (
        f"tether: the HTTP/WebSocket port 127.0.0.1:{taken_port} is already in use (another tether serve?): "
        "choose another with [server] bridge_port or --port (0 picks a free port)"
    )


def test_a_grpc_port_in_use_names_the_port_and_the_flag(tmp_path: Path, taken_port: int) -> None:
    line = one_line(serve(tmp_path, "--grpc-port", str(taken_port), "--port", "0"))
    assert line == (
        f"tether: the gRPC port 127.0.0.1:{taken_port} is already in use (another tether serve?): "
        "choose another with [server] grpc_port or --grpc-port (0 picks a free port)"
    )


def test_a_metrics_port_in_use_names_the_setting(tmp_path: Path, taken_port: int) -> None:
    line = one_line(serve(tmp_path, "--port", "0", "--grpc-port", "0", "--set", f"server.metrics_port={taken_port}"))
    assert f"the metrics port 127.0.0.1:{taken_port} is already in use" in line
    assert "[server] metrics_port" in line


def test_an_address_that_is_not_this_machines_names_the_host_setting(tmp_path: Path) -> None:
    line = one_line(serve(tmp_path, "--host", "192.0.2.1", "--port", "0", "--grpc-port", "0"))  # TEST-NET-1
    assert line.startswith("tether: cannot listen for gRPC on 192.0.2.1:0: ")
    assert "--host or [server] grpc_host" in line


def test_a_bad_configuration_key_or_value_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[server]\nbridge_prot = 8001\n")
    line = one_line(serve(tmp_path, "--config", "bad.toml"))
    assert line == "tether: configuration: unknown keys in [server]: ['bridge_prot']"
    line = one_line(serve(tmp_path, "--set", "limits.coalesce_ms=soon"))
    assert line == "tether: --set limits.coalesce_ms=soon: limits.coalesce_ms: cannot read 'soon' as float"


def test_a_missing_extra_names_the_pip_install(tmp_path: Path) -> None:
    result = serve(tmp_path, "--store", "postgresql://127.0.0.1:5432/test", "--port", "0", "--grpc-port", "0",
                   prelude=WITHOUT_ASYNCPG)  # fmt: skip
    line = one_line(result)
    assert line.startswith("tether: a PostgreSQL store needs the 'postgres' extra (missing module 'asyncpg')")
    assert "pip install 'tether[postgres]'" in line


def test_an_unreachable_store_is_one_line(tmp_path: Path) -> None:
    # A port that listens but never speaks Redis would hang a client; a closed one refuses at once.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    line = one_line(serve(tmp_path, "--store", f"redis://127.0.0.1:{port}/0", "--port", "0", "--grpc-port", "0"))
    assert line.startswith("tether: the store cannot be opened: ")
    assert f"redis://127.0.0.1:{port}/0" in line and "--store" in line


def test_an_unreachable_postgresql_store_hides_its_password(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"postgresql://tether:hunter2@127.0.0.1:{port}/test"
    line = one_line(serve(tmp_path, "--store", url, "--port", "0", "--grpc-port", "0"))
    assert line.startswith("tether: the store cannot be opened: ")
    assert "hunter2" not in line and f"127.0.0.1:{port}" in line


def test_a_tls_file_that_does_not_load(tmp_path: Path) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("this is not a certificate\n")
    flags = ("--port", "0", "--grpc-port", "0")
    line = one_line(serve(tmp_path, *flags, "--tls-cert", str(not_pem), "--tls-key", str(not_pem)))
    assert line.startswith(f"tether: TLS certificate {not_pem} with key {not_pem} does not load: not a PEM certificate")
    assert "--tls-cert" in line
    missing = tmp_path / "missing.key"
    line = one_line(serve(tmp_path, *flags, "--tls-cert", str(not_pem), "--tls-key", str(missing)))
    assert line.startswith(f"tether: the TLS key file {missing} does not exist")
    line = one_line(serve(tmp_path, *flags, "--tls-cert", str(not_pem)))
    assert line.startswith("tether: TLS needs both a certificate and its key")
    # Several workers: refused once by the supervisor, before any worker starts.
    line = one_line(serve(tmp_path, *flags, "--workers", "2", "--tls-cert", str(missing), "--tls-key", str(missing)))
    assert line.startswith(f"tether: the TLS certificate file {missing} does not exist")
