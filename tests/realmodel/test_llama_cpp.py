"""Tether in front of a real model (SmolLM2-135M on llama-cpp-python), driven by the openai SDK.

Behaviour and token accounting only, never speed: each test keeps prompts and outputs small.
"""

from __future__ import annotations

import json

import httpx

from tests.bridge.helpers import one_response

from .conftest import ALIAS, RealStack, wait_for

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}
TIMING = ["tether:server_timing"]


async def test_plain_turn_usage_is_the_servers_own(real: RealStack) -> None:
    prompt = "Name one colour."
    async with real.client() as client:
        r = await client.responses.create(
            model="smol-exact", input=prompt, max_output_tokens=12, temperature=0, include=TIMING
        )
    assert r.status in ("completed", "incomplete") and r.output_text
    direct = await real.upstream(
        {"messages": [{"role": "user", "content": prompt}], "max_tokens": 12, "temperature": 0}
    )
    assert r.usage.input_tokens == direct["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == direct["usage"]["completion_tokens"] > 0
    assert r.output_text == direct["choices"][0]["message"]["content"]
    sources = r.model_extra["server_timing"]["usage_sources"]
    assert sources["input"] == sources["output"] == "upstream"


async def test_streamed_turn_counts_what_the_stream_does_not_report(real: RealStack) -> None:
    async with real.client() as client:
        stream = await client.responses.create(
            model=ALIAS, input="Say hello.", max_output_tokens=16, temperature=0, stream=True, include=TIMING
        )
        deltas, final = [], None
        async for ev in stream:
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
            elif ev.type in TERMINAL:
                final = ev.response
    assert final is not None and final.status in ("completed", "incomplete")
    assert "".join(deltas) == final.output_text != ""
    # llama-cpp-python streams no usage: the output is counted by the model's own tokenizer (the
    # server's endpoint), the input by Tether's.
    sources = final.model_extra["server_timing"]["usage_sources"]
    assert sources["output"] == "model_tokenizer" and sources["input"] == "tether"
    async with httpx.AsyncClient(timeout=30) as c:
        count = await c.post(f"http://127.0.0.1:{real.server.port}/extras/tokenize/count",
                             json={"input": final.output_text})  # fmt: skip
    assert final.usage.output_tokens == count.json()["count"] > 0
    assert final.usage.input_tokens > 0
    metrics = await real.metrics()
    assert 'tether_usage_source_total{kind="output",source="model_tokenizer"} 1.0' in metrics
    assert 'tether_usage_source_total{kind="input",source="tether"} 1.0' in metrics


async def test_max_output_tokens_ends_incomplete(real: RealStack) -> None:
    async with real.client() as client:
        r = await client.responses.create(
            model="smol-exact", input="Write a long story about a dragon.", max_output_tokens=8, temperature=0
        )
        s = await client.responses.create(
            model=ALIAS, input="Write a long story about a dragon.", max_output_tokens=8, temperature=0
        )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 8  # the server stopped at the cap (its own count)
    assert s.status == "incomplete" and s.incomplete_details.reason == "max_output_tokens"


async def test_websocket_memory_with_store_false(real: RealStack) -> None:
    async with real.client() as client, client.responses.connect() as conn:
        await conn.response.create(
            model="smol-exact", input="My name is Ada.", store=False, max_output_tokens=8, temperature=0
        )
        _, first = await one_response(conn)
        assert first.type in ("response.completed", "response.incomplete"), first
        await conn.response.create(
            model="smol-exact",
            previous_response_id=first.response.id,
            input="What is my name?",
            store=False,
            max_output_tokens=8,
            temperature=0,
        )
        _, second = await one_response(conn)
    assert second.type in ("response.completed", "response.incomplete"), second
    u1, u2 = first.response.usage, second.response.usage
    # The server saw the first exchange again (its own prompt count covers it), though nothing was stored.
    assert u2.input_tokens > u1.input_tokens + u1.output_tokens
    direct = await real.upstream(
        {
            "messages": [
                {"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": first.response.output_text},
                {"role": "user", "content": "What is my name?"},
            ],
            "max_tokens": 8,
            "temperature": 0,
        }
    )
    assert u2.input_tokens == direct["usage"]["prompt_tokens"]


def chat_tool(tool: dict) -> dict:
    return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")}}


async def test_tool_round_trip_forced_over_websocket(real: RealStack) -> None:
    """The agent loop: a forced call, its result sent back (content "" on the assistant message:
    llama-cpp-python refuses null), an answer; both turns billed with the server's own counts."""
    forced = {"type": "function", "name": "get_weather"}
    question = "What is the weather in Paris?"
    async with real.client() as client, client.responses.connect() as conn:
        await conn.response.create(
            model="smol-exact", input=question, tools=[WEATHER], tool_choice=forced,
            store=False, max_output_tokens=48, temperature=0,
        )  # fmt: skip
        _, done = await one_response(conn)
        assert done.type == "response.completed", done
        call = done.response.output[-1]
        assert call.type == "function_call" and call.name == "get_weather"
        assert isinstance(json.loads(call.arguments), dict)
        result = '{"temp_c": 21}'
        await conn.response.create(
            model="smol-exact", previous_response_id=done.response.id, tools=[WEATHER], store=False,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": result}],
            max_output_tokens=16, temperature=0,
        )  # fmt: skip
        _, answer = await one_response(conn)
    assert answer.type in ("response.completed", "response.incomplete"), answer
    assert answer.response.output_text
    # The same two calls made straight to the server: Tether's usage is the server's own.
    first = [{"role": "user", "content": question}]
    direct1 = await real.upstream(
        {"messages": first, "tools": [chat_tool(WEATHER)], "max_tokens": 48, "temperature": 0,
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    )  # fmt: skip
    tool_call = {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    second = [*first, {"role": "assistant", "content": "", "tool_calls": [tool_call]},
              {"role": "tool", "tool_call_id": call.call_id, "content": result}]  # fmt: skip
    direct2 = await real.upstream(
        {"messages": second, "tools": [chat_tool(WEATHER)], "max_tokens": 16, "temperature": 0}
    )
    for turn, direct in ((done.response, direct1), (answer.response, direct2)):
        assert turn.usage.input_tokens == direct["usage"]["prompt_tokens"]
        assert turn.usage.output_tokens == direct["usage"]["completion_tokens"]


async def test_forced_custom_tool_through_its_emulating_function(real: RealStack) -> None:
    """llama-cpp-python has no custom tools: the emulating function `{"input": string}` is forced
    (its schema constrains the model's output), and its call comes back as a custom tool call whose
    input is the string; the output goes back as a tool message and the model answers."""
    patch = {"type": "custom", "name": "apply_patch", "description": "Apply a patch to the workspace.",
             "format": {"type": "text"}}  # fmt: skip
    async with real.client() as client:
        r = await client.responses.create(
            model=ALIAS, input="Add a file hello.txt saying hi.", tools=[patch],
            tool_choice={"type": "custom", "name": "apply_patch"}, max_output_tokens=96, temperature=0,
        )  # fmt: skip
        assert r.status == "completed", (r.status, r.output)
        call = r.output[-1]
        assert call.type == "custom_tool_call" and call.name == "apply_patch"
        assert isinstance(call.input, str) and not call.input.lstrip().startswith('{"input"')
        follow = await client.responses.create(
            model=ALIAS, previous_response_id=r.id, tools=[patch], max_output_tokens=16, temperature=0,
            input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"}],
        )  # fmt: skip
    assert follow.status in ("completed", "incomplete") and follow.output[-1].type in ("message", "custom_tool_call")


async def test_required_tool_choice_with_one_tool_calls_it(real: RealStack) -> None:
    async with real.client() as client:
        r = await client.responses.create(
            model=ALIAS, input="Weather in Rome?", tools=[WEATHER], tool_choice="required",
            max_output_tokens=48, temperature=0,
        )  # fmt: skip
    assert r.status == "completed" and r.output[-1].type == "function_call"


async def test_automatic_tool_choice(real: RealStack) -> None:
    async with real.client() as client:
        r = await client.responses.create(
            model=ALIAS, input="What is the weather in Paris? Use the tool.", tools=[WEATHER],
            max_output_tokens=48, temperature=0, include=TIMING,
        )  # fmt: skip
        assert r.status in ("completed", "incomplete"), r.error
        assert r.output  # a call or an answer, from a call the server made without streaming
        kinds = {o.type for o in r.output}
        assert kinds <= {"function_call", "message"}
        if "function_call" in kinds:
            call = next(o for o in r.output if o.type == "function_call")
            follow = await client.responses.create(
                model=ALIAS, previous_response_id=r.id, tools=[WEATHER], max_output_tokens=16, temperature=0,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}],
            )  # fmt: skip
            assert follow.status in ("completed", "incomplete") and follow.output_text
    # Auto tool choice went upstream as one JSON reply: the usage is the server's own.
    assert r.model_extra["server_timing"]["usage_sources"]["output"] == "upstream"


async def test_required_tool_choice_among_several_tools_is_400_before_created(real: RealStack) -> None:
    other = {**WEATHER, "name": "get_time", "description": "Current time."}
    async with httpx.AsyncClient(timeout=30) as c:
        resp = await c.post(
            f"http://127.0.0.1:{real.port}/v1/responses",
            headers={"authorization": "Bearer sk-real"},
            json={"model": ALIAS, "input": "x", "tools": [WEATHER, other], "tool_choice": "required", "stream": True},
        )
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "tool_choice" and "name the function" in err["message"]


async def test_unknown_model_is_model_not_found(real: RealStack) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        resp = await c.post(
            f"http://127.0.0.1:{real.port}/v1/responses",
            headers={"authorization": "Bearer sk-real"},
            json={"model": "gpt-4o", "input": "x"},
        )
        models = await c.get(f"http://127.0.0.1:{real.port}/v1/models", headers={"authorization": "Bearer sk-real"})
    assert resp.status_code in (400, 404) and resp.json()["error"]["code"] == "model_not_found"
    assert {m["id"] for m in models.json()["data"]} == {ALIAS, "smol-exact"}


async def test_cancellation_stops_the_upstream(real: RealStack) -> None:
    before = real.server.log().count("Disconnected from client")
    async with real.client() as client, client.responses.connect() as conn:
        await conn.response.create(
            model=ALIAS, input="Write a very long story about the sea.", store=False, max_output_tokens=2000
        )
        rid = None
        async for ev in conn:
            if ev.type == "response.created":
                rid = ev.response.id
            elif ev.type == "response.output_text.delta":
                await conn.send({"type": "response.cancel", "response_id": rid})
                break
        async for ev in conn:
            if ev.type in TERMINAL:
                break
    assert ev.type == "response.incomplete" and ev.response.status == "cancelled" and ev.response.incomplete_details is None
    # The server noticed the hang-up and stopped generating (it logs it), well before 2,000 tokens.
    assert await wait_for(lambda: real.server.log().count("Disconnected from client") > before, within=30)


async def test_log_probabilities_from_the_model(real: RealStack) -> None:
    """The server's own log probabilities, streamed (on the deltas) and in one JSON reply."""
    ask = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}
    async with real.client() as client:
        stream = await client.responses.create(
            model=ALIAS, input="Name one colour.", max_output_tokens=8, temperature=0, stream=True, **ask
        )
        deltas, final = [], None
        async for ev in stream:
            if ev.type == "response.output_text.delta":
                deltas.append(ev)
            elif ev.type in TERMINAL:
                final = ev.response
        exact = await client.responses.create(
            model="smol-exact", input="Name one colour.", max_output_tokens=8, temperature=0, **ask
        )
    assert final is not None and final.output_text
    for r in (final, exact):
        entries = r.output[0].content[0].logprobs
        assert "".join(e.token for e in entries) == r.output_text
        assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
        assert all(e.bytes == list(e.token.encode()) for e in entries)
    assert [lp.token for d in deltas for lp in d.logprobs] == [e.token for e in final.output[0].content[0].logprobs]
    assert [e.token for e in exact.output[0].content[0].logprobs] == [
        e.token for e in final.output[0].content[0].logprobs
    ]  # the same greedy tokens either way
