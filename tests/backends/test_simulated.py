"""The simulated backend: deterministic content, scripts, limits, pacing without per-token sleeps."""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest

from tests.fakes.items import (
    assistant,
    function_call,
    function_output,
    function_tool,
    reasoning,
    request,
    user,
)
from tether.backends import simulated as sim
from tether.backends.base import BackendBase, BackendError, Finish, ReasoningDelta, TextDelta, ToolCallDelta
from tether.backends.registry import build_backend
from tether.backends.simulated import SimulatedBackend, SimulatedConfig, model_turns
from tether.errors import TetherError
from tether.responses.v1 import request_pb2

FAST = {"ttft_ms": 0, "tokens_per_s": 0}


async def collect(backend, req):
    return [c async for c in backend.stream(req)]


def text_of(chunks, kind=TextDelta) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))


def calls_of(chunks) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for c in chunks:
        if isinstance(c, ToolCallDelta):
            d = out.setdefault(c.index, {"call_id": None, "name": None, "arguments": ""})
            if c.call_id is not None:
                assert d["call_id"] is None, "call_id only on the first fragment"
                d["call_id"], d["name"] = c.call_id, c.name
            d["arguments"] += c.arguments
    return out


def backend(**options) -> SimulatedBackend:
    return build_backend("sim", "simulated", {**FAST, **options})


async def test_text_answer_is_deterministic_and_counted():
    b = backend(output_tokens=25)
    req = request("hello", input_tokens=7)
    first, second = await collect(b, req), await collect(b, req)
    assert first[:-1] == second[:-1]  # same deltas (Finish differs only in measured timing)
    assert first[-1].usage == second[-1].usage
    deltas = [c for c in first if isinstance(c, TextDelta)]
    assert len(deltas) == 25
    fin = first[-1]
    assert isinstance(fin, Finish) and fin.reason == "stop"
    assert fin.usage.input_tokens == 7 and fin.usage.output_tokens == 25
    assert sum(isinstance(c, Finish) for c in first) == 1
    assert text_of(first).endswith(".")


async def test_unscripted_answer_says_what_it_is():
    b = backend(output_tokens=150, call_tools=False)
    req = request("please fix the failing test in app.py", input_tokens=9, tools=[function_tool("read_file")])
    chunks = await collect(b, req)
    assert chunks[:-1] == (await collect(b, req))[:-1]  # deterministic
    text = text_of(chunks)
    assert text.startswith("This is Tether's simulated model (backend 'sim'), not a language model")
    assert 'It received 1 input item (last user message: "please fix the failing test in app.py"), 1 tool, 9 input tokens.' in text
    assert "add an openai or cerebras backend to tether.toml and route model names to it under [models]" in text
    assert "Filler up to output_tokens:" in text  # what follows is padding, and says so
    assert sum(isinstance(c, TextDelta) for c in chunks) == 150 == chunks[-1].usage.output_tokens
    short = text_of(await collect(backend(output_tokens=5), request("hi")))
    assert short == "This is Tether's simulated model."


async def test_lab_model_plays_the_workload_script():
    from tether import workloads

    wl = workloads.load("chat3")
    b = backend()
    first = calls_of(await collect(b, request("x", model="tether-lab/chat3@4000@1:2")))
    assert [c["name"] for c in first.values()] == [c.name for c in wl.steps[0].calls]
    plan = b.plan(request("x", model="tether-lab/chat3@4000@1:2"))  # the speed comes from the name
    assert plan.tokens_per_s == 4000 and 0.001 <= plan.ttft_s <= 0.002
    with pytest.raises(BackendError) as bad:
        await collect(b, request("x", model="tether-lab/chat3@fast"))
    assert bad.value.code == "invalid_request" and "tether-lab/chat3@fast" in bad.value.message


async def test_auto_tool_call_from_schema_then_text():
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}, "flag": {"type": "boolean"}},
        "required": ["path", "limit"],
    }
    b = backend()
    tools = [function_tool("read_file", schema), function_tool("other")]
    chunks = await collect(b, request("read it", tools=tools))
    calls = calls_of(chunks)
    assert list(calls) == [0]
    assert calls[0]["name"] == "read_file" and calls[0]["call_id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"path": "README.md", "limit": 1}
    assert chunks[-1].reason == "tool_calls"
    assert not any(isinstance(c, TextDelta) for c in chunks)

    # Once a function_call_output is in context it answers with text.
    follow = request(
        "read it", function_call(calls[0]["call_id"], "read_file", {"path": "x"}), function_output(calls[0]["call_id"], "ok"),
        tools=tools,
    )  # fmt: skip
    chunks = await collect(b, follow)
    assert chunks[-1].reason == "stop" and text_of(chunks) and not calls_of(chunks)


async def test_tool_choice_none_and_forced_function():
    b = backend()
    tools = [function_tool("a"), function_tool("b")]
    chunks = await collect(b, request("x", tools=tools, tool_choice=request_pb2.ToolChoice(mode="none")))
    assert not calls_of(chunks) and chunks[-1].reason == "stop"
    chunks = await collect(
        b, request("x", tools=tools, tool_choice=request_pb2.ToolChoice(function_name="b"))
    )
    assert calls_of(chunks)[0]["name"] == "b"


async def test_max_output_tokens_stops_with_length():
    b = backend(output_tokens=50, reasoning_tokens=5)
    chunks = await collect(b, request("x", max_output_tokens=12))
    assert chunks[-1] == Finish("length", chunks[-1].usage, chunks[-1].timing)
    assert chunks[-1].usage.output_tokens == 12 and chunks[-1].usage.reasoning_tokens == 5
    assert sum(isinstance(c, ReasoningDelta) for c in chunks) == 5
    assert sum(isinstance(c, TextDelta) for c in chunks) == 7


async def test_summary_for_compaction_mentions_item_count():
    b = backend(summary_tokens=40)
    items = [user("one"), assistant("two"), user("three")]
    chunks = await collect(b, request(*items, instructions="Summarize the conversation so far."))
    text = text_of(chunks)
    assert text.startswith("Summary of 3 earlier items:")
    assert chunks[-1].usage.output_tokens == 40
    assert text == text_of(
        await collect(b, request(*items, instructions="Summarize the conversation so far."))
    )


def test_model_turns_counts_runs_of_model_items():
    items = [
        user("u"), reasoning("r"), function_call("c1", "f"), function_call("c2", "g"), function_output("c1", "o"),
        function_output("c2", "o"), assistant("a"), user("u2"), assistant("b"),
    ]  # fmt: skip
    assert model_turns(items) == 3
    assert model_turns([user("u")]) == 0


async def test_coding_agent_script_tool_loop():
    b = backend(script="coding_agent.json")
    tools = [function_tool(n) for n in ("read_file", "run_tests", "edit_file")]
    items = [user("fix the handler")]
    names = []
    for _ in range(5):
        chunks = await collect(b, request(*items, tools=tools))
        calls = calls_of(chunks)
        if not calls:
            assert chunks[-1].reason == "stop"
            assert "tests pass" in text_of(chunks)
            break
        assert chunks[-1].reason == "tool_calls"
        assert any(isinstance(c, ReasoningDelta) for c in chunks)
        for c in calls.values():
            json.loads(c["arguments"])
            names.append(c["name"])
            items += [
                function_call(c["call_id"], c["name"], c["arguments"]),
                function_output(c["call_id"], "ok"),
            ]
    assert names == ["read_file", "run_tests", "edit_file", "run_tests"]
    # After the script: plain text answers.
    chunks = await collect(b, request(*items, assistant("done"), user("thanks")))
    assert chunks[-1].reason == "stop" and text_of(chunks)


async def test_script_parallel_calls_toml_and_hint(tmp_path):
    script = tmp_path / "s.toml"
    script.write_text(
        """
[[steps]]
text = "Two at once."
[[steps.tool_calls]]
name = "a"
arguments = { x = 1 }
[[steps.tool_calls]]
name = "b"
call_id = "call_fixed"

[[steps]]
text_tokens = 3
finish = "content_filter"
"""
    )
    b = backend()  # no configured script: selected per request
    chunks = await collect(b, request("go", hints={"script": str(script)}))
    calls = calls_of(chunks)
    assert [calls[0]["name"], calls[1]["name"]] == ["a", "b"]
    assert json.loads(calls[0]["arguments"]) == {"x": 1} and calls[1]["call_id"] == "call_fixed"
    assert text_of(chunks) == "Two at once."
    chunks = await collect(b, request("go", hints={"script": str(script), "turn": "1"}))
    assert chunks[-1].reason == "content_filter" and sum(isinstance(c, TextDelta) for c in chunks) == 3


async def test_script_error_step(tmp_path):
    script = tmp_path / "e.json"
    script.write_text(
        json.dumps(
            {
                "steps": [
                    {
                        "text_tokens": 5,
                        "error": {"code": "backend_error", "message": "boom", "status": 502},
                        "error_after_tokens": 2,
                    }
                ]
            }
        )
    )
    b = backend(script=str(script))
    got = []
    with pytest.raises(BackendError) as ei:
        async for c in b.stream(request("x")):
            got.append(c)
    assert ei.value.code == "backend_error" and ei.value.status == 502
    assert len(got) == 2


def test_bad_scripts_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"steps": [{"txt": "typo"}]}))
    with pytest.raises(ValueError, match="unknown step key"):
        backend(script=str(bad))
    with pytest.raises(ValueError, match="not found"):
        backend(script=str(tmp_path / "missing.json"))


async def test_bad_hint_script_is_invalid_request():
    with pytest.raises(TetherError) as ei:
        await collect(backend(), request("x", hints={"script": "/nonexistent/script.json"}))
    assert ei.value.status == 400


async def test_json_schema_text_format():
    fmt = request_pb2.TextFormat(
        type="json_schema",
        name="r",
        schema_json=orjson.dumps(
            {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}
        ).decode(),
    )
    chunks = await collect(backend(), request("x", text_format=fmt))
    assert json.loads(text_of(chunks)) == {"n": 1}


async def test_tokens_per_chunk_merges_without_changing_text():
    one = await collect(backend(output_tokens=30, reasoning_tokens=4), request("x"))
    merged = await collect(backend(output_tokens=30, reasoning_tokens=4, tokens_per_chunk=8), request("x"))
    assert text_of(one) == text_of(merged) and text_of(one, ReasoningDelta) == text_of(merged, ReasoningDelta)
    assert len(merged) < len(one)
    assert merged[-1].usage.output_tokens == one[-1].usage.output_tokens == 34


async def test_fast_rates_do_not_sleep_per_token(monkeypatch):
    sleeps = []
    real_sleep = asyncio.sleep

    async def counting_sleep(delay, *a, **kw):
        sleeps.append(delay)
        return await real_sleep(delay, *a, **kw)

    monkeypatch.setattr(sim.asyncio, "sleep", counting_sleep)
    b = SimulatedBackend("s", SimulatedConfig(ttft_ms=1, tokens_per_s=4000, output_tokens=400))
    chunks = await collect(b, request("x"))
    assert sum(isinstance(c, TextDelta) for c in chunks) == 400
    # Every sleep lasts at least one tick, so ~100 ms of emission cannot take more than a few dozen.
    assert len(sleeps) < 100


async def test_aclose_mid_stream():
    b = backend(tokens_per_s=1000, output_tokens=1000)
    gen = b.stream(request("x"))
    assert isinstance(await gen.__anext__(), TextDelta)
    await gen.aclose()


async def test_stream_runs_yields_each_wakeups_due_tokens_as_one_run_and_stream_the_same_chunks():
    b = backend(output_tokens=50, reasoning_tokens=3)  # tokens_per_s = 0: every token is due at once
    runs = [run async for run in b.stream_runs(request("x"))]
    assert [len(run) for run in runs] == [53, 1] and isinstance(runs[1][0], Finish)
    flat = [c async for c in b.stream(request("x"))]
    assert [c for run in runs for c in run][:-1] == flat[:-1]  # the Finish differs only in its timing
    assert flat[-1].usage == runs[1][0].usage and flat[-1].reason == runs[1][0].reason
    paced = backend(tokens_per_s=4000, output_tokens=400)
    runs = [run async for run in paced.stream_runs(request("x"))]
    assert sum(len(run) for run in runs) == 401 and len(runs) < 100  # a run per tick, not per token


def test_a_backend_must_implement_stream_or_stream_runs():
    with pytest.raises(TypeError, match="stream"):

        class Neither(BackendBase):
            name = "neither"
