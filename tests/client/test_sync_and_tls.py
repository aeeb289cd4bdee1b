"""The blocking facade (run in a worker thread: the server lives on the test's loop) and TLS."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tether.client as tc
from tests.support.configs import server_config
from tests.support.stacks import Server
from tests.support.tls import self_signed as make_self_signed
from tether import errors
from tether.backends.simulated import CUSTOM_INPUT


def _sync_session_work(target: str) -> dict:
    out: dict = {}
    with tc.connect_sync(target) as s:
        stream = s.create("tether-sim", "hello")
        out["arms"] = [ev.WhichOneof("event") for ev in stream]
        out["text"] = tc.output_text(stream.final_response())
        out["deltas"] = "".join(s.create("tether-sim", "hello again").text_deltas())
        final = s.run_tool_loop("tether-sim", "use the tool", tools={"lookup": lambda key: f"value of {key}"},
                                tool_specs=[tc.function_tool(name="lookup", parameters={
                                    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]})])
        out["loop"] = (final.status, len(list(s.iter_input_items(final.id))))
        lane = s.lane("side")
        out["lane"] = lane.create("tether-sim", "on a lane").final_response().id == lane.last_response_id
        out["warm"] = s.warmup("tether-sim", instructions="hi").startswith("resp_")
        out["models"] = [m.id for m in s.list_models()]
        try:
            s.get("resp_nope")
        except tc.TetherError as exc:
            out["missing"] = exc.code
    return out


async def test_sync_facade(server):
    out = await asyncio.to_thread(_sync_session_work, server.target)
    assert out["arms"][0] == "created" and out["arms"][-1] == "completed"
    assert out["text"] and out["deltas"]
    assert out["loop"] == ("completed", 3)  # user message, function_call, function_call_output
    assert out["lane"] and out["warm"] and "tether-sim" in out["models"]
    assert out["missing"] == errors.RESPONSE_NOT_FOUND


def _sync_custom_loop(target: str) -> tuple[list[str], str, list[str]]:
    inputs: list[str] = []

    def apply_patch(patch: str) -> str:
        """Apply a patch."""
        inputs.append(patch)
        return "applied"

    with tc.connect_sync(target) as s:
        final = s.run_tool_loop("tether-sim", "patch it", tools={"apply_patch": apply_patch},
                                tool_specs=[tc.custom_tool(apply_patch)])
        kinds = [i.other.type if i.HasField("other") else i.WhichOneof("item") for i in s.iter_input_items(final.id)]
        return inputs, final.status, kinds


async def test_sync_tool_loop_runs_a_custom_tool(server):
    inputs, status, kinds = await asyncio.to_thread(_sync_custom_loop, server.target)
    assert inputs == [CUSTOM_INPUT] and status == "completed"
    assert kinds == ["message", "custom_tool_call", "custom_tool_call_output"]


def _sync_refused(target: str) -> str:
    try:
        tc.connect_sync(target, retry=tc.RetryPolicy(max_attempts=2, initial_backoff_s=0.01))
    except tc.TetherError as exc:
        return exc.code
    return "connected"


async def test_sync_connect_failure_is_raised(tmp_path):
    srv = await Server(server_config(tmp_path)).start()
    target = srv.target
    await srv.stop()
    assert await asyncio.to_thread(_sync_refused, target) != "connected"


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    return make_self_signed(tmp_path)


async def test_tls(tmp_path: Path, self_signed):
    cert, key = self_signed
    config = server_config(tmp_path)
    config.server.tls_cert, config.server.tls_key = str(cert), str(key)
    srv = await Server(config).start()
    try:
        async with tc.connect(srv.target, tls_ca=str(cert)) as s:
            assert (await (await s.create("tether-sim", "over TLS")).final_response()).status == "completed"
        with pytest.raises(tc.TetherError):  # plaintext against the TLS port
            await tc.connect(srv.target, retry=tc.RetryPolicy(max_attempts=1))
    finally:
        await srv.stop()
