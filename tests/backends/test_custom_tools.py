"""Custom (freeform) tools through the Chat Completions adapter, both ways, against a local fake
upstream speaking Chat Completions SSE (and one JSON reply): natively on the `openai` dialect
(`{"type": "custom"}` tools, choice, history and streamed calls), emulated on every other dialect
(a function taking `{"input": string}` whose calls come back as custom tool calls); then the
whole loop behind the server, driven by the openai SDK."""

from __future__ import annotations

import json

import orjson
import pytest
from openai import AsyncOpenAI

from tests.fakes import chat_server as fk
from tests.fakes.items import other_tool, user
from tests.support.dialects import call, dialect_server  # noqa: F401  (the `server` fixture)
from tests.support.served import loopback, served
from tether.backends.base import Finish, ToolCallDelta
from tether.backends.chat.dialects import DIALECTS
from tether.backends.chat.stream import EmulatedInput
from tether.config import BackendSpec, Route, TetherConfig
from tether.protocol.json_codec import item_from_json
from tether.responses.v1 import request_pb2

GRAMMAR = {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'}
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch.", "format": GRAMMAR}
PATCH = '*** Begin Patch\n*** Add File: a.py\n+print("hi")\n*** End Patch'
EMULATING = sorted(name for name, d in DIALECTS.items() if not d.custom_tools)
HISTORY = (
    user("fix it"),
    item_from_json(
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"}
    ),
    item_from_json({"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"}),
)


def _choice(obj: dict) -> request_pb2.ToolChoice:
    return request_pb2.ToolChoice(other_json=orjson.dumps(obj).decode())




def _calls(chunks) -> list[tuple[str, str, bool]]:
    """(name, joined input or arguments, custom) per call, from the adapter's chunks."""
    out: dict[int, list] = {}
    for c in chunks:
        if isinstance(c, ToolCallDelta):
            entry = out.setdefault(c.index, [c.name, "", c.custom])
            entry[1] += c.arguments
    return [tuple(v) for _, v in sorted(out.items())]


def test_only_openai_takes_custom_tools_natively():
    assert [name for name, d in DIALECTS.items() if d.custom_tools] == ["openai"]
    assert set(EMULATING) >= {
        "vllm",
        "sglang",
        "llamacpp",
        "llama-cpp-python",
        "ollama",
        "lmstudio",
        "cerebras",
    }


@pytest.mark.parametrize("stream", [True, False])
async def test_native_dialect_sends_custom_tools_and_reads_custom_calls(server, stream):
    server.push(fk.tool_calls(fk.Call("apply_patch", PATCH, "call_p", custom=True)))
    chunks = await call(server, "openai", *HISTORY, tools=[other_tool(APPLY_PATCH)],
                        tool_choice=_choice({"type": "custom", "name": "apply_patch"}),
                        options={"stream_upstream": stream})  # fmt: skip
    body = server.last_body
    assert body["tools"] == [
        {"type": "custom", "custom": {"name": "apply_patch", "description": "Apply a patch.",
                                      "format": {"type": "grammar", "grammar": {"syntax": "lark",
                                                                                 "definition": GRAMMAR["definition"]}}}}
    ]  # fmt: skip
    assert body["tool_choice"] == {"type": "custom", "custom": {"name": "apply_patch"}}
    assert body["messages"][1]["tool_calls"] == [
        {"id": "c1", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin Patch"}}
    ]
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "Done!"}
    assert _calls(chunks) == [("apply_patch", PATCH, True)]
    assert chunks[-1] == Finish("tool_calls", chunks[-1].usage, chunks[-1].timing)


async def test_native_text_format_and_allowed_tools_name_custom_tools(server):
    text_tool = other_tool({"type": "custom", "name": "note", "format": {"type": "text"}})
    server.push(fk.tool_calls(fk.Call("note", "remember this", custom=True)))
    chunks = await call(server, "openai", "x", tools=[text_tool, other_tool(APPLY_PATCH)],
               tool_choice=_choice({"type": "allowed_tools", "mode": "required",
                                    "tools": [{"type": "custom", "name": "note"}]}))  # fmt: skip
    body = server.last_body
    assert body["tools"][0] == {"type": "custom", "custom": {"name": "note", "format": {"type": "text"}}}
    assert body["tool_choice"] == {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [{"type": "custom", "custom": {"name": "note"}}]},
    }
    assert _calls(chunks) == [("note", "remember this", True)]


@pytest.mark.parametrize("dialect", EMULATING)
async def test_emulating_dialect_sends_a_function_and_reads_its_input_back(server, dialect):
    server.push(fk.tool_calls(fk.Call("apply_patch", orjson.dumps({"input": PATCH}).decode(), "call_p")))
    chunks = await call(server, dialect, *HISTORY, tools=[other_tool(APPLY_PATCH)],
                        tool_choice=_choice({"type": "custom", "name": "apply_patch"}))  # fmt: skip
    body = server.last_body
    (tool,) = body["tools"]
    assert tool["type"] == "function" and tool["function"]["name"] == "apply_patch"
    assert tool["function"]["description"] == "Apply a patch."
    params = tool["function"]["parameters"]
    assert params["required"] == ["input"] and params["properties"]["input"]["type"] == "string"
    assert GRAMMAR["definition"] in params["properties"]["input"]["description"]  # the grammar, described
    assert "lark" in params["properties"]["input"]["description"]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    (prior,) = body["messages"][1]["tool_calls"]
    assert prior["type"] == "function" and orjson.loads(prior["function"]["arguments"]) == {
        "input": "*** Begin Patch"
    }
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "Done!"}
    assert _calls(chunks) == [("apply_patch", PATCH, True)]  # the input, not the JSON around it


async def test_emulated_input_streams_as_its_arguments_arrive(server):
    server.push(fk.tool_calls(fk.Call("apply_patch", orjson.dumps({"input": PATCH}).decode(), "call_p")))
    chunks = await call(server, "vllm", "x", tools=[other_tool(APPLY_PATCH)])
    pieces = [c.arguments for c in chunks if isinstance(c, ToolCallDelta) and c.arguments]
    assert len(pieces) >= 3 and "".join(pieces) == PATCH  # the upstream sent it in 3 fragments


@pytest.mark.parametrize("text", [PATCH, 'quotes " and \\ backslashes', "emoji \U0001f600 and \u00e9", ""])
def test_emulated_input_decodes_whatever_the_fragment_boundaries(text):
    ascii_escaped = json.dumps({"input": text})  # \u escapes, a surrogate pair for the emoji
    for raw in (orjson.dumps({"input": text}).decode(), orjson.dumps({"input": text}, option=orjson.OPT_INDENT_2).decode(),
                ascii_escaped):  # fmt: skip
        for i in range(len(raw) + 1):
            for j in range(i, len(raw) + 1, 3):
                held = EmulatedInput()
                streamed = held.feed(raw[:i]) + held.feed(raw[i:j]) + held.feed(raw[j:])
                assert streamed + held.end() == text, (raw, i, j)


def test_emulated_input_of_another_shape_is_the_arguments_text():
    held = EmulatedInput()
    assert held.feed('{"path": "a.py", ') + held.feed('"input": "x"}') == ""
    assert held.end() == "x"  # an object with the input later: read at the end
    held = EmulatedInput()
    assert held.feed("*** Begin Patch") == "" and held.end() == "*** Begin Patch"
    held = EmulatedInput()
    assert held.feed('{"input": "cut sh') == "cut sh" and held.end() == ""  # cut by the output cap


async def test_emulated_reply_without_a_json_input_passes_its_text_on(server):
    server.push(fk.tool_calls(fk.Call("apply_patch", "*** Begin Patch (not JSON)", "call_p")))
    chunks = await call(server, "vllm", "x", tools=[other_tool(APPLY_PATCH)])
    assert _calls(chunks) == [("apply_patch", "*** Begin Patch (not JSON)", True)]


async def test_emulated_and_function_calls_in_one_reply(server):
    weather = request_pb2.Tool(function=request_pb2.FunctionTool(name="get_weather", parameters_json="{}"))
    server.push(fk.tool_calls(fk.Call("get_weather", '{"city":"Rome"}', "call_w"),
                              fk.Call("apply_patch", '{"input":"p"}', "call_p"), interleave_calls=True))  # fmt: skip
    chunks = await call(server, "llamacpp", "x", tools=[weather, other_tool(APPLY_PATCH)])
    assert _calls(chunks) == [("get_weather", '{"city":"Rome"}', False), ("apply_patch", "p", True)]
    assert isinstance(chunks[-1], Finish) and chunks[-1].reason == "tool_calls"


# -- behind the server -----------------------------------------------------------------------------

KEY = "sk-t"


def _config(upstream: fk.FakeChatServer, dialect: str) -> TetherConfig:
    cfg = TetherConfig()
    cfg.store = "memory://"
    cfg.backends = {
        "up": BackendSpec(kind="openai", options={"base_url": upstream.base_url, "dialect": dialect})
    }
    cfg.models = {"m": Route(backend="up", upstream_model="m")}
    return loopback(cfg)


@pytest.mark.parametrize(
    ("dialect", "arguments"), [("openai", PATCH), ("vllm", orjson.dumps({"input": PATCH}).decode())]
)
async def test_sdk_loop_through_the_server(dialect, arguments):
    with fk.FakeChatServer(api_key=None, strict=False, lifetime_s=60) as upstream:
        upstream.push(fk.tool_calls(fk.Call("apply_patch", arguments, "call_p", custom=dialect == "openai")),
                      fk.text("Patched."))  # fmt: skip
        async with served(_config(upstream, dialect), {KEY: "t"}) as s, \
                AsyncOpenAI(base_url=s.base_url, api_key=KEY, max_retries=0) as client:  # fmt: skip
            events = []
            stream = await client.responses.create(
                model="m", input="fix it", tools=[APPLY_PATCH], stream=True
            )
            async for ev in stream:
                events.append(ev)
            r1 = events[-1].response
            (item,) = r1.output
            assert (item.type, item.name, item.input, item.call_id) == (
                "custom_tool_call",
                "apply_patch",
                PATCH,
                "call_p",
            )
            deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
            assert deltas == PATCH
            r2 = await client.responses.create(
                model="m", previous_response_id=r1.id, tools=[APPLY_PATCH],
                input=[{"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"}],
            )  # fmt: skip
            assert r2.output_text == "Patched."
        sent = upstream.last_body["messages"]
        (back,) = sent[-2]["tool_calls"]
        if dialect == "openai":
            assert back == {
                "id": "call_p",
                "type": "custom",
                "custom": {"name": "apply_patch", "input": PATCH},
            }
        else:
            assert back["type"] == "function" and orjson.loads(back["function"]["arguments"]) == {
                "input": PATCH
            }
        assert sent[-1] == {"role": "tool", "tool_call_id": "call_p", "content": "Done!"}
