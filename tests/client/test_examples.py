"""Each example in examples/ runs as its own process against a real server, so the examples stay
true: the gRPC scripts (an internal service, tool loop, lanes, the blocking client), the openai
SDK agent over WebSocket mode, Codex's provider table, the transport comparison one-liner and the
two-replica deployment with a shared store."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from tests.support.configs import server_config
from tests.support.served import loopback, served
from tests.support.stacks import Server
from tether.config import ServerConfig, TetherConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# The keys Codex reads in a `[model_providers.<id>]` table (its config reference).
CODEX_PROVIDER_KEYS = {
    "name", "base_url", "env_key", "env_key_instructions", "wire_api", "query_params", "http_headers",
    "env_http_headers", "request_max_retries", "stream_max_retries", "stream_idle_timeout_ms",
    "websocket_connect_timeout_ms", "requires_openai_auth", "supports_websockets", "experimental_bearer_token",
}  # fmt: skip


async def run(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60) -> str:
    """Run a command to its end; its stdout (it must exit 0)."""
    proc = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode()


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("grpc_service.py", ['"ticket": "T-1"', '"status": "completed"', '"priority": ', "3 tickets over 1 connection(s)"]),
        ("tool_loop.py", ["[tool call] read_file(", "final response resp_", ": completed"]),
        ("lanes.py", ["lane planner:", "lane coder:", "lane reviewer:", "3 lanes over 1 connection(s)"]),
        ("sync_hello.py", ["models: tether-sim", "input tokens reused from the connection"]),
    ],
)
async def test_grpc_example(script: str, expect: list[str], tmp_path: Path) -> None:
    srv = await Server(server_config(tmp_path)).start()
    try:
        text = await run(sys.executable, str(EXAMPLES / script), cwd=tmp_path, env={"TETHER_TARGET": srv.target})
    finally:
        await srv.stop()
    for needle in expect:
        assert needle in text, text


async def test_openai_sdk_agent_over_websocket(tmp_path: Path) -> None:
    config = loopback(TetherConfig())
    config.store = "memory://"
    async with served(config, {}) as s:
        text = await run(sys.executable, str(EXAMPLES / "openai_ws_agent.py"), s.base_url, cwd=tmp_path)
    assert "[tool call] list_dir(" in text
    assert "2 turns over one WebSocket: completed" in text, text


async def test_codex_provider_table_points_codex_at_websocket_mode() -> None:
    codex = tomllib.loads((EXAMPLES / "codex" / "config.toml").read_text())
    provider = codex["model_providers"][codex["model_provider"]]
    assert set(provider) <= CODEX_PROVIDER_KEYS, set(provider) - CODEX_PROVIDER_KEYS
    assert provider["wire_api"] == "responses" and provider["supports_websockets"] is True
    assert provider["base_url"] == f"http://127.0.0.1:{ServerConfig().bridge_port}/v1"  # `tether serve`'s default
    # A default server (its port moved to a free one) with the key Codex reads from env_key.
    key = "sk-codex-example"
    config = loopback(TetherConfig())
    config.store = "memory://"
    async with served(config, {key: "codex"}) as s:
        base_url = provider["base_url"].replace(f":{ServerConfig().bridge_port}/", f":{s.port}/")
        client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
        listed = [m.id async for m in client.models.list()]
        async with client.responses.connect() as conn:  # where Codex opens WebSocket mode
            await conn.send({  # a create as Codex words it
                "type": "response.create", "model": codex["model"], "instructions": "You are Codex.",
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]}],
                "tools": [{"type": "custom", "name": "apply_patch", "description": "Apply a patch."}],
                "tool_choice": "auto", "parallel_tool_calls": False, "store": False, "stream": True,
                "include": ["reasoning.encrypted_content"], "prompt_cache_key": "session-1",
                "client_metadata": {"x-codex-turn-metadata": "{}"},
            })  # fmt: skip
            async for event in conn:
                if event.type in ("response.completed", "response.failed", "error"):
                    break
        await client.close()
    assert codex["model"] in listed
    assert event.type == "response.completed", event


async def test_transport_comparison_one_liner(tmp_path: Path) -> None:
    bin_dir = str(Path(sys.executable).parent)  # where `tether` is installed
    env = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    out = tmp_path / "bench"
    text = await run("sh", str(EXAMPLES / "compare_transports.sh"), str(out), cwd=tmp_path, env=env, timeout=180)
    rollouts = json.loads((out / "results.json").read_text())["rollouts"]
    assert sorted(r["variant"] for r in rollouts) == ["grpc", "http-full-keepalive", "ws-inproc"]
    assert all(r["ok"] for r in rollouts), rollouts
    assert "| ws-inproc | 1/1 |" in text, text


async def test_two_replicas_share_a_store(tmp_path: Path) -> None:
    text = await run(sys.executable, str(EXAMPLES / "two_replicas.py"), f"sqlite:///{tmp_path}/shared.db",
                     cwd=tmp_path, timeout=120)  # fmt: skip
    assert "replica A: http://127.0.0.1:" in text and "replica B: http://127.0.0.1:" in text
    assert "(completed) with 3 input items from the shared store" in text, text
