"""How an SSE stream ends: `data: [DONE]` right after the event that ended it, and nothing after
(`tether.protocol.wire.SSE_DONE`, the Open Responses specification's framing).

Checked on the wire for every way a stream ends with an event (completed, failed, a followed run, a
background stream), then with the clients that read it: openai-python and openai-node (tests/node,
installed by .ci/run) stop at it. Codex is not installed here; its Responses SSE reader skips data
lines that are not JSON and stops reading right after `response.completed` (the shared reference
notes on the wire contract, [CODEX] codex-rs/codex-api/src/sse/responses.rs), so what it needs is
what the wire test checks: [DONE] never before the terminal event.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from tether.protocol.wire import SSE_DONE

from .helpers import KEY_A, WEATHER_TOOL, sse_frames

AUTH = {"Authorization": f"Bearer {KEY_A}"}
NODE_DIR = Path(__file__).resolve().parents[1] / "node"
REQUIRE = os.environ.get("TETHER_TEST_REQUIRE_SERVERS") == "1"


def _ends_with_done(body: bytes, last_type: str) -> list[tuple[str, dict[str, Any]]]:
    """The body's frames; its last two frames are the `last_type` event and [DONE], the only one."""
    assert body.endswith(b"\n\n" + SSE_DONE), body[-200:]
    assert body.count(b"[DONE]") == 1
    frames = sse_frames(body.decode())  # also: [DONE] once, last, right after the terminal event
    assert frames[-1][0] == last_type, [name for name, _ in frames[-3:]]
    return frames


async def test_done_follows_the_terminal_event_of_every_stream(make_stack: Any, tmp_path: Path) -> None:
    script = tmp_path / "fail.json"
    script.write_text(json.dumps({"steps": [{"error": {"code": "server_error", "message": "boom", "status": 500}}]}))
    async with make_stack() as stack, httpx.AsyncClient(base_url=stack.base_url, headers=AUTH, timeout=10) as h:
        for body in (
            {"model": "sim-model", "input": "hi", "stream": True},
            {"model": "sim-model", "input": "Weather?", "tools": [WEATHER_TOOL], "stream": True},
        ):
            r = await h.post("/responses", json=body)
            frames = _ends_with_done(r.content, "response.completed")
        # A stored response's events again (GET ?stream=true), and a background create streamed.
        done_id = frames[-1][1]["response"]["id"]
        r = await h.get(f"/responses/{done_id}", params={"stream": "true", "starting_after": "2"})
        _ends_with_done(r.content, "response.completed")
        r = await h.post("/responses", json={"model": "sim-model", "input": "hi", "stream": True, "background": True})
        _ends_with_done(r.content, "response.completed")
    async with make_stack(backend={"script": str(script)}) as stack, httpx.AsyncClient(timeout=10) as h:
        r = await h.post(f"{stack.base_url}/responses", headers=AUTH,
                         json={"model": "sim-model", "input": "hi", "stream": True})  # fmt: skip
        _ends_with_done(r.content, "response.failed")


async def test_openai_python_stops_at_done(client: AsyncOpenAI) -> None:
    stream = await client.responses.create(model="sim-model", input="hi", stream=True)
    events = [ev async for ev in stream]  # the SDK ends the iteration at [DONE], without error
    assert events[-1].type == "response.completed"
    assert [ev.sequence_number for ev in events] == list(range(len(events)))
    async with client.responses.stream(model="sim-model", input="hi") as helper:  # the strict accumulator
        final = await helper.get_final_response()
    assert final.status == "completed" and final.output_text


async def test_openai_node_stops_at_done(stack: Any) -> None:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "openai").is_dir():
        reason = "openai-node is not installed: npm ci --prefix tests/node (needs node >= 20)"
        if REQUIRE:
            pytest.fail(reason + " (TETHER_TEST_REQUIRE_SERVERS=1)")
        pytest.skip(reason)
    proc = await asyncio.create_subprocess_exec(
        node, str(NODE_DIR / "responses_sse.mjs"), stack.base_url, KEY_A, "sim-model", "hi",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()[-2000:]
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen["types"][0] == "response.created" and seen["types"][-1] == "response.completed", seen
    assert "response.output_text.delta" in seen["types"]
    assert seen["final"]["status"] == "completed"
