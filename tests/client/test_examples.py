"""Each example in examples/ runs as its own process against a real server started here."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.support.configs import server_config
from tests.support.stacks import Server

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("tool_loop.py", ["[tool call] read_file(", "final response resp_", ": completed"]),
        ("lanes.py", ["lane planner:", "lane coder:", "lane reviewer:", "3 lanes over 1 connection(s)"]),
        ("sync_hello.py", ["models: tether-sim", "input tokens reused from the connection"]),
    ],
)
async def test_example(script: str, expect: list[str], tmp_path):
    srv = await Server(server_config(tmp_path)).start()
    try:
        env = {**os.environ, "TETHER_TARGET": srv.target}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(EXAMPLES / script), cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await srv.stop()
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    for needle in expect:
        assert needle in text, text
