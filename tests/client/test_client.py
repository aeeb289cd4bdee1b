"""tether.client against a real server: streams, typed helpers, tool loops, warm-up, lanes, unary
RPCs, API keys."""

from __future__ import annotations

import asyncio
import json

import pytest

import tether.client as tc
from tests.support.configs import FAST, server_config
from tests.support.stacks import Server
from tether import errors
from tether.auth import Authenticator
from tether.backends.simulated import CUSTOM_INPUT
from tether.responses.v1 import items_pb2

SCRIPTED = {"sim": {**FAST, "script": "coding_agent.json"}}


async def test_create_streams_typed_events(server):
    async with tc.connect(server.target) as s:
        stream = await s.create(model="tether-sim", input="hello", store=False)
        events = [ev async for ev in stream]
        arms = [ev.WhichOneof("event") for ev in events]
        assert arms[:2] == ["created", "in_progress"] and arms[-1] == "completed"
        assert "output_text_delta" in arms
        assert {ev.response_id for ev in events} == {stream.id}
        assert [ev.sequence_number for ev in events] == list(range(len(events)))
        response = await stream.final_response()  # after iterating: the terminal Response
        assert response.status == "completed" and not response.store
        deltas = "".join(ev.output_text_delta.delta for ev in events if ev.HasField("output_text_delta"))
        assert deltas == tc.output_text(response) == await stream.text()

        again = await s.create("tether-sim", "once more", previous_response_id=response.id, store=False)
        assert "".join([d async for d in again.text_deltas()]) == tc.output_text(await again.final_response())
        assert (await again.final_response()).usage.cached_tokens > 0  # continued on the connection


async def test_dict_inputs_and_tools(server):
    async with tc.connect(server.target) as s:
        stream = await s.create(
            "tether-sim",
            [{"type": "message", "role": "developer", "content": "be brief"}, tc.user_message("list the files")],
            tools=[{"type": "function", "name": "ls", "parameters": {"type": "object", "properties": {}}}],
            instructions="You are terse.",
            metadata={"job": "42"},
        )
        response = await stream.final_response()
        assert response.metadata["job"] == "42"
        assert [c.name for c in tc.function_calls(response)] == ["ls"]
        items = [i async for i in s.iter_input_items(response.id)]
        assert [i.message.role for i in items] == ["developer", "user"]
        with pytest.raises(tc.TetherError) as bad:
            await s.create("tether-sim", [{"type": "message", "role": 7}])
        assert bad.value.code == errors.INVALID_TYPE


async def test_in_band_error_answers_its_create(server):
    async with tc.connect(server.target) as s:
        stream = await s.create("tether-sim", "hi", previous_response_id="resp_missing")
        events = [ev async for ev in stream]  # the error event is delivered, then iteration ends
        assert [ev.WhichOneof("event") for ev in events] == ["error"]
        with pytest.raises(tc.TetherError) as exc:
            await stream.final_response()
        assert (exc.value.code, exc.value.param) == (errors.PREVIOUS_RESPONSE_NOT_FOUND, "previous_response_id")
        with pytest.raises(tc.TetherError):
            await stream.wait_created()
        ok = await s.create("tether-sim", "still usable")  # per-turn errors leave the session open
        assert (await ok.final_response()).status == "completed"


async def test_run_tool_loop_with_sync_and_async_tools(tmp_path):
    srv = await Server(server_config(tmp_path, backends=SCRIPTED)).start()
    calls: list[tuple[str, dict]] = []

    def read_file(path: str) -> str:
        """Read a file."""
        calls.append(("read_file", {"path": path}))
        return "def handler(body):\n    return None\n"

    async def run_tests(target: str) -> dict:
        calls.append(("run_tests", {"target": target}))
        await asyncio.sleep(0)
        return {"passed": len(calls) > 2, "target": target}

    def edit_file(path: str, old: str, new: str) -> str:
        calls.append(("edit_file", {"path": path}))
        return "ok"

    seen: list[str] = []
    try:
        async with tc.connect(srv.target) as s:
            final = await s.run_tool_loop(
                "tether-sim", "Fix the empty-body bug.",
                tools={"read_file": read_file, "run_tests": run_tests, "edit_file": edit_file},
                on_event=lambda ev: seen.append(ev.WhichOneof("event")),
            )
            assert final.status == "completed" and not tc.function_calls(final)
            assert tc.output_text(final).startswith("Fixed: the handler now answers 400")
            assert [name for name, _ in calls] == ["read_file", "run_tests", "edit_file", "run_tests"]
            assert calls[0][1] == {"path": "src/app/handlers.py"}
            assert seen.count("completed") == 5
            # The whole chain is stored: the last turn's input holds the four tool outputs.
            items = [i async for i in s.iter_input_items(final.id)]
            outputs = [i.function_call_output.output_text for i in items if i.HasField("function_call_output")]
            assert len(outputs) == 4 and outputs[1] == '{"passed":false,"target":"tests/test_handlers.py"}'
            assert final.usage.cached_tokens > 0
    finally:
        await srv.stop()


async def test_tool_loop_limits_and_tool_errors(tmp_path):
    srv = await Server(server_config(tmp_path, backends=SCRIPTED)).start()

    def read_file(path: str) -> str:
        raise FileNotFoundError(path)

    try:
        async with tc.connect(srv.target) as s:
            with pytest.raises(tc.ToolLoopError) as limit:
                await s.run_tool_loop("tether-sim", "go", tools={"read_file": read_file}, max_turns=2)
            assert limit.value.code == tc.MAX_TURNS_EXCEEDED
            last = limit.value.response
            # Turn 2 sent the tool's exception (and "no such tool") back to the model as text.
            items = [i async for i in s.iter_input_items(last.id)]
            outputs = [i.function_call_output.output_text for i in items if i.HasField("function_call_output")]
            assert outputs == ["Error: FileNotFoundError: src/app/handlers.py"]
            with pytest.raises(FileNotFoundError):
                await s.run_tool_loop("tether-sim", "go", tools={"read_file": read_file}, raise_tool_errors=True)
    finally:
        await srv.stop()


def _outputs_by_kind(items: list[items_pb2.Item]) -> dict[str, list[tuple[str, str]]]:
    """(call_id, output) of the function and custom tool call outputs among `items`."""
    out: dict[str, list[tuple[str, str]]] = {"function": [], "custom": []}
    for item in items:
        if item.HasField("function_call_output"):
            out["function"].append((item.function_call_output.call_id, item.function_call_output.output_text))
        elif item.HasField("other") and item.other.type == "custom_tool_call_output":
            obj = json.loads(item.other.json)
            out["custom"].append((obj["call_id"], obj["output"]))
    return out


async def test_tool_loop_runs_a_custom_tool(server):
    """A response whose only call is a custom tool call is not the final answer: the loop runs
    the tool on the call's input text and answers with a custom_tool_call_output."""
    inputs: list[str] = []

    async def apply_patch(patch: str) -> str:
        """Apply a patch to the workspace."""
        inputs.append(patch)
        return "Done: 1 file changed."

    async with tc.connect(server.target) as s:
        first = await (await s.create("tether-sim", "fix it", tools=[tc.custom_tool(apply_patch)])).final_response()
        [call] = tc.tool_calls(first)
        assert (call.name, call.output_type, call.text) == ("apply_patch", "custom_tool_call_output", CUSTOM_INPUT)
        assert not tc.function_calls(first)

        final = await s.run_tool_loop(
            "tether-sim", "fix it", tools={"apply_patch": apply_patch},
            tool_specs=[tc.custom_tool(apply_patch, format={"type": "text"})],
        )
        assert inputs == [CUSTOM_INPUT]
        assert final.status == "completed" and not tc.tool_calls(final) and tc.output_text(final)
        items = [i async for i in s.iter_input_items(final.id)]
        calls = [i for i in items if i.HasField("other") and i.other.type == "custom_tool_call"]
        assert len(calls) == 1
        call_id = json.loads(calls[0].other.json)["call_id"]
        assert _outputs_by_kind(items) == {"function": [], "custom": [(call_id, "Done: 1 file changed.")]}


async def test_tool_loop_answers_function_and_custom_calls_of_one_response(tmp_path):
    script = tmp_path / "mixed.json"
    script.write_text(json.dumps({"steps": [
        {"tool_calls": [{"name": "apply_patch", "input": "*** Begin Patch\n*** End Patch", "call_id": "call_p"},
                        {"name": "read_file", "arguments": {"path": "a.py"}, "call_id": "call_r"}]},
        {"text": "Both done."},
    ]}))  # fmt: skip
    srv = await Server(server_config(tmp_path, backends={"sim": {**FAST, "script": str(script)}})).start()
    ran: list[tuple[str, object]] = []

    def apply_patch(patch: str) -> dict:
        ran.append(("apply_patch", patch))
        return {"applied": True}

    def read_file(path: str) -> str:
        ran.append(("read_file", path))
        return "x = 1\n"

    grammar = {"type": "grammar", "syntax": "regex", "definition": r"\*\*\* Begin Patch[\s\S]*"}
    try:
        async with tc.connect(srv.target) as s:
            final = await s.run_tool_loop(
                "tether-sim", "go", tools={"apply_patch": apply_patch, "read_file": read_file},
                tool_specs=[read_file, {"type": "custom", "name": "apply_patch", "format": grammar}],
            )
            assert tc.output_text(final) == "Both done."
            assert sorted(ran) == [("apply_patch", "*** Begin Patch\n*** End Patch"), ("read_file", "a.py")]
            items = [i async for i in s.iter_input_items(final.id)]
            assert _outputs_by_kind(items) == {
                "function": [("call_r", "x = 1\n")],
                "custom": [("call_p", '{"applied":true}')],
            }
    finally:
        await srv.stop()


async def test_warmup_then_continue(server):
    def grep(pattern: str, path: str = ".") -> str:
        """Search files."""
        return ""

    async with tc.connect(server.target) as s:
        warm = await s.warmup("tether-sim", tools={"grep": grep}, instructions="You are a coding agent.")
        assert warm.startswith("resp_")
        stream = await s.create("tether-sim", "find TODOs", previous_response_id=warm, tools={"grep": grep},
                                instructions="You are a coding agent.")
        response = await stream.final_response()
        assert response.previous_response_id == warm
        assert response.usage.cached_tokens > 0  # the warmed header and prefix were reused
        spec = tc.function_tool(grep)
        assert spec.function.description == "Search files."
        assert '"required":["pattern"]' in spec.function.parameters_json


async def test_lanes_are_demultiplexed(tmp_path):
    backends = {"sim": {**FAST, "ttft_ms": 5, "tokens_per_s": 2000, "output_tokens": 40}}
    srv = await Server(server_config(tmp_path, backends=backends)).start()
    try:
        async with tc.connect(srv.target) as s:
            lanes = [s.lane(f"agent-{i}") for i in range(4)]
            streams = [await lane.create("tether-sim", f"task {i}") for i, lane in enumerate(lanes)]
            default = await s.create("tether-sim", "on the default lane")
            results = await asyncio.gather(*(st.final_response() for st in [*streams, default]))
            assert all(r.status == "completed" for r in results)
            assert len({r.id for r in results}) == 5
            for lane, stream, result in zip(lanes, streams, results[:4], strict=True):
                assert stream.stream_id == lane.name and stream.id == result.id
                assert lane.last_response_id == result.id
            # Several creates on one lane, sent back to back, run in order, each its own stream.
            lane = s.lane("queue")
            queued = [await lane.create("tether-sim", f"step {i}") for i in range(3)]
            done = [await q.final_response() for q in queued]
            assert [d.id for d in done] == [q.id for q in queued] and len({d.id for d in done}) == 3
            assert all(d.created_at <= e.created_at for d, e in zip(done, done[1:], strict=False))
            # One cancelled response does not disturb its lane.
            slow = await lane.create("tether-sim", "long", max_output_tokens=100000)
            await slow.wait_created()
            await slow.cancel()
            assert (await slow.final_response()).status == "cancelled"
            assert (await (await lane.create("tether-sim", "after")).final_response()).status == "completed"
    finally:
        await srv.stop()


async def test_unary_helpers(server):
    async with tc.connect(server.target) as s:
        models = await s.list_models()
        assert "tether-sim" in [m.id for m in models]
        first = await (await s.create("tether-sim", "remember 42")).final_response()
        second = await (await s.create("tether-sim", "and?", previous_response_id=first.id)).final_response()
        assert (await s.get(second.id)).id == second.id
        page = await s.list_input_items(second.id, limit=1, order="asc")
        assert page.has_more and len(page.data) == 1
        assert await s.count_input_tokens("tether-sim", "more", previous_response_id=second.id) > second.usage.input_tokens - 1
        compacted = await s.compact("tether-sim", previous_response_id=second.id)
        assert compacted.output[-1].HasField("compaction")
        assert await s.delete(second.id)
        with pytest.raises(tc.TetherError) as gone:
            await s.get(second.id)
        assert (gone.value.code, gone.value.status) == (errors.RESPONSE_NOT_FOUND, 404)


async def test_api_keys(tmp_path):
    srv = await Server(server_config(tmp_path), Authenticator({"sk-good-key": "team"})).start()
    try:
        with pytest.raises(tc.TetherError) as bad:
            await tc.connect(srv.target, api_key="sk-wrong-key")
        assert (bad.value.code, bad.value.status) == (errors.INVALID_API_KEY, 401)
        # Without the up-front check, the refusal answers the first create.
        s = await tc.connect(srv.target, verify=False)
        try:
            with pytest.raises(tc.TetherError) as late:
                await (await s.create("tether-sim", "hi")).final_response()
            assert late.value.code == errors.INVALID_API_KEY
        finally:
            await s.aclose()
        async with tc.connect(srv.target, api_key="sk-good-key") as ok:
            response = await (await ok.create("tether-sim", "hi")).final_response()
            assert response.status == "completed"
            assert (await ok.get(response.id)).id == response.id
    finally:
        await srv.stop()


def test_params_helpers():
    params = tc.build_params(
        "m", [{"type": "function_call_output", "call_id": "c1", "output": "x"}],
        tools=[lambda_tool], reasoning={"effort": "low"}, store=False, tool_choice="required",
    )
    assert params.input[0].function_call_output.call_id == "c1"
    assert params.tools[0].function.name == "lambda_tool"
    assert params.reasoning.effort == "low" and params.HasField("store") and not params.store
    assert params.tool_choice.mode == "required"
    assert isinstance(tc.to_items("hi")[0], items_pb2.Item)
    assert tc.function_call_output("c", {"a": 1}).function_call_output.output_text == '{"a":1}'
    custom = tc.custom_tool(lambda_tool, format={"type": "text"})
    assert (custom.other.type, json.loads(custom.other.json)) == (
        "custom", {"type": "custom", "name": "lambda_tool", "description": "Do something.", "format": {"type": "text"}}
    )
    assert json.loads(tc.custom_tool(name="t").other.json) == {"type": "custom", "name": "t"}
    with pytest.raises(ValueError):
        tc.custom_tool()
    assert json.loads(tc.custom_tool_call_output("c", {"a": 1}).other.json) == {
        "type": "custom_tool_call_output", "call_id": "c", "output": '{"a":1}'
    }


def lambda_tool(n: int, names: list[str], flag: bool = False) -> str:
    """Do something."""
    return ""
