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


BACKEND_MISTAKES = {  # a config file -> what its one line must say
    '[backends.slow]\nkind = "simulated"\n[models."*"]\nbackend = "sim"\n':
        "tether: configuration: models.*.backend: 'sim' is not a configured backend (defined: slow)",
    '[backends.x]\nkind = "nope"\n[models."*"]\nbackend = "x"\n':
        "tether: configuration: [backends] unknown backend kind 'nope'",
    '[backends.o]\nkind = "openai"\n[models."*"]\nbackend = "o"\n':
        "tether: configuration: [backends] backend 'o' (openai): base_url is required",
}


def test_a_backend_or_route_mistake_is_one_line(tmp_path: Path) -> None:
    """The mistakes a new user makes first, each the real program (run side by side)."""
    launch = "import runpy\nrunpy.run_module('tether', run_name='__main__', alter_sys=True)\n"
    running = []
    for i, text in enumerate(BACKEND_MISTAKES):
        (tmp_path / f"{i}.toml").write_text(text)
        running.append(subprocess.Popen([sys.executable, "-c", launch, "serve", "--config", f"{i}.toml", "--port", "0",
                                         "--grpc-port", "0", "--store", "memory://"], cwd=tmp_path, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    for proc, expected in zip(running, BACKEND_MISTAKES.values(), strict=True):
        out, err = proc.communicate(timeout=60)
        line = one_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        assert line.startswith(expected), line


LOADER_MISTAKES = {  # every error the configuration loader raises, as a file -> the setting its line names
    "[server\n": "line 1",
    "bogus = 1\n": "bogus",
    "log_format = 'json'\n": "[server]",
    "[server]\nbridge_port = 'x'\n": "server.bridge_port",
    "[server]\nbridge_port = [1]\n": "server.bridge_port",
    "[server]\nws_compression = 1\n": "server.ws_compression",
    "[server]\nallocator = 'tcmalloc'\n": "server.allocator",
    "[server]\nlog_format = 'xml'\n": "server.log_format",
    "[server]\nevent_loop = 'trio'\n": "event_loop",
    "[server]\nws_compress_min_bytes = -1\n": "server.ws_compress_min_bytes",
    "[server]\nloop_lag_interval_s = -1\n": "server.loop_lag_interval_s",
    "[server]\ngc_young_threshold = -1\n": "server.gc_young_threshold",
    "[limits]\nmax_turn_s = 0\n": "limits.max_turn_s",
    "[limits]\ncoalesce_ms = -1\n": "limits.coalesce_ms",
    "[limits]\nrun_orphan_after_s = 0\n": "limits.run_orphan_after_s",
    "[limits]\non_client_gone = 'stay'\n": "limits.on_client_gone",
    "[limits]\nmax_logprobs = 0\n": "limits.max_logprobs",
    "[limits]\nnope = 1\n": "[limits]",
    "store_durability = 'sometimes'\n": "store_durability",
    "store = 5\n": "store",
    "[mcp]\ncall_timeout_s = 0\n": "mcp.call_timeout_s",
    "[mcp]\nmax_list_pages = 0\n": "mcp.max_list_pages",
    "[mcp]\nmax_error_bytes = 0\n": "mcp.max_error_bytes",
    "[mcp]\nallow_private_networks = ['not-a-net']\n": "mcp.allow_private_networks",
    "[backends]\nx = 1\n": "backends.x",
    "backends = 1\n": "[backends]",
    "[models]\n'*' = 'sim'\n": "models.*",
    "[models.m]\nbackend = 'gone'\n": "models.m.backend",
    "[models.m]\nbogus = 1\n": "[models.m]",
    "[models.m]\nbackend = 3\n": "models.m.backend",
}


def test_every_loader_mistake_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    """`tether serve`'s own loader (`build_config`) on each mistake: SystemExit with one line
    (the program prints it and exits 1; the subprocess cases above show that path)."""
    from tether.cli import build_config, make_parser

    for i, (text, setting) in enumerate(LOADER_MISTAKES.items()):
        path = tmp_path / f"{i}.toml"
        path.write_text(text)
        with pytest.raises(SystemExit) as info:
            build_config(make_parser().parse_args(["serve", "--config", str(path)]))
        line = str(info.value.code)
        assert line.startswith("tether: configuration: ") and "\n" not in line, (text, line)
        assert setting in line, (text, line)
    with pytest.raises(SystemExit) as info:
        build_config(make_parser().parse_args(["serve", "--config", str(tmp_path / "missing.toml")]))
    assert "missing.toml" in str(info.value.code) and "\n" not in str(info.value.code)
