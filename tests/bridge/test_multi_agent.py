"""Hosted multi-agent responses (`multi_agent`, beta; docs/multi-agent.md) driven by real clients:
the openai SDK's beta surface over HTTP (JSON and SSE) and WebSocket mode (with `response.inject`,
and `response_already_completed` followed by the resend it implies), the typed gRPC client, and
the Agents SDK's `OpenAIHostedMultiAgentModel`. The simulated model delegates deterministically:
asked to "delegate", the root spawns `/root/worker_1` and `/root/worker_2` and waits for them;
each worker calls the request's first function tool once, then answers; the root then writes the
`final_answer` message.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.extensions.experimental.hosted_multi_agent import OpenAIHostedMultiAgentModel

import tether.client

from .helpers import KEY_A, WEATHER_TOOL

set_tracing_disabled(True)  # no trace export (no network)

BETA = ["responses_multi_agent=v1"]
HEADER = {"OpenAI-Beta": "responses_multi_agent=v1"}  # WebSocket mode: a header of the upgrade
MA = {"enabled": True}
SIM = {"ttft_ms": 0, "output_tokens": 8}
WORKERS = {"/root/worker_1", "/root/worker_2"}


def _agent(item: Any) -> str | None:
    agent = item["agent"] if isinstance(item, dict) else item.agent
    if agent is None:
        return None
    return agent["agent_name"] if isinstance(agent, dict) else agent.agent_name


def _summary(output: list[Any]) -> list[tuple[str, str | None, str]]:
    """(type, agent, action / name / phase) of each output item."""
    out = []
    for it in output:
        d = it if isinstance(it, dict) else it.model_dump()
        what = d.get("action") or d.get("name") or d.get("phase") or ""
        out.append((d["type"], _agent(d), what))
    return out


def _outputs(output: list[Any], text: str = "sunny") -> list[dict]:
    return [{"type": "function_call_output", "call_id": it.call_id, "output": text}
            for it in output if it.type == "function_call"]  # fmt: skip


def _assert_final(output: list[Any]) -> None:
    final = output[-1]
    assert (final.type, _agent(final), final.phase) == ("message", "/root", "final_answer")
    waited = [it for it in output if it.type == "multi_agent_call_output" and it.action == "wait_agent"]
    assert len(waited) == 1
    status = json.loads(waited[0].output[0].text)["status"]
    assert set(status) == WORKERS and all("completed" in s for s in status.values())


async def test_http_json_delegates_pauses_on_client_calls_and_continues(make_stack: Any) -> None:
    async with make_stack(backend=SIM) as stack, stack.client() as client:
        plain = await client.responses.create(model="sim-model", input="Please delegate this.")
        first = await client.beta.responses.create(model="sim-model", input="Please delegate this.",
                                                   tools=[WEATHER_TOOL], multi_agent=MA, betas=BETA)  # fmt: skip
        assert first.status == "completed"
        kinds = _summary(first.output)
        assert kinds[:3] == [("multi_agent_call", "/root", "spawn_agent")] * 2 + [("multi_agent_call", "/root", "wait_agent")]
        spawned = [json.loads(it.output[0].text)["task_name"] for it in first.output
                   if it.type == "multi_agent_call_output" and it.action == "spawn_agent"]  # fmt: skip
        assert set(spawned) == WORKERS
        calls = [it for it in first.output if it.type == "function_call"]
        assert {(_agent(c), c.name) for c in calls} == {(w, "get_weather") for w in WORKERS}
        assert len({c.call_id for c in calls}) == 2
        assert not any(it.type == "message" for it in first.output)  # the root still waits for its workers
        # One usage for every agent's calls: three model calls read at least three inputs.
        assert first.usage.input_tokens > 2 * plain.usage.input_tokens
        assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens

        with pytest.raises(openai.BadRequestError) as refused:  # only a multi-agent turn reads the agents' items
            await client.responses.create(model="sim-model", previous_response_id=first.id,
                                          input=_outputs(first.output), tools=[WEATHER_TOOL])  # type: ignore[arg-type]
        assert refused.value.body["param"] == "multi_agent"  # type: ignore[index]

        # The client answers by call_id, without `agent`: the workers resume, then the root.
        second = await client.beta.responses.create(model="sim-model", previous_response_id=first.id,
                                                    input=_outputs(first.output), tools=[WEATHER_TOOL],
                                                    multi_agent=MA, betas=BETA)  # fmt: skip
        assert second.status == "completed"
        answers = [it for it in second.output if it.type == "message" and _agent(it) in WORKERS]
        assert {_agent(a) for a in answers} == WORKERS
        _assert_final(second.output)
        items = await client.responses.input_items.list(second.id, order="asc")
        assert {_agent(i) for i in items.data if i.type == "function_call_output"} == WORKERS


async def test_http_refusals_name_the_parameter(stack: Any) -> None:
    async with stack.client() as client:
        cases = [
            ({"multi_agent": MA}, [], "multi_agent"),  # no beta header
            ({"multi_agent": MA, "max_tool_calls": 3}, BETA, "max_tool_calls"),
            ({"multi_agent": MA, "reasoning": {"summary": "auto"}}, BETA, "reasoning.summary"),
            ({"multi_agent": {"enabled": True, "max_concurrent_subagents": 0}}, BETA, "multi_agent.max_concurrent_subagents"),
            ({"multi_agent": {"enabled": True, "max_concurrent_subagents": 9}}, BETA, "multi_agent.max_concurrent_subagents"),
        ]  # fmt: skip
        for body, betas, param in cases:
            with pytest.raises(openai.BadRequestError) as refused:
                await client.beta.responses.create(model="sim-model", input="delegate", betas=betas, **body)
            assert refused.value.body["param"] == param, body  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as refused:  # as OpenAI: not with /responses/compact
            await client.post("/responses/compact", cast_to=object,
                              body={"model": "sim-model", "input": "hi", "multi_agent": MA})  # fmt: skip
        assert refused.value.body["param"] == "multi_agent"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as refused:  # only a multi-agent turn reads these items
            await client.responses.create(model="sim-model", input=[  # type: ignore[list-item]
                {"type": "agent_message", "author": "/root", "recipient": "/root/w", "content": [
                    {"type": "input_text", "text": "hi"}]}])  # fmt: skip
        assert refused.value.body["param"] == "input[0]"  # type: ignore[index]
        # At the limit (limits.max_concurrent_subagents = 8) it is accepted.
        ok = await client.beta.responses.create(model="sim-model", input="hi", betas=BETA,
                                                multi_agent={"enabled": True, "max_concurrent_subagents": 8})  # fmt: skip
        assert ok.status == "completed" and ok.output[-1].phase == "final_answer"


async def test_max_concurrent_subagents_refuses_a_spawn_past_it(make_stack: Any) -> None:
    async with make_stack(backend=SIM) as stack, stack.client() as client:
        r = await client.beta.responses.create(model="sim-model", input="delegate", betas=BETA,
                                               multi_agent={"enabled": True, "max_concurrent_subagents": 1})  # fmt: skip
        spawns = [json.loads(it.output[0].text) for it in r.output
                  if it.type == "multi_agent_call_output" and it.action == "spawn_agent"]  # fmt: skip
        assert spawns[0] == {"task_name": "/root/worker_1"}
        assert "max_concurrent_subagents" in spawns[1]["error"]
        assert {_agent(it) for it in r.output if it.type == "message"} == {"/root/worker_1", "/root"}
        assert r.output[-1].phase == "final_answer"


async def test_compaction_runs_per_agent(make_stack: Any) -> None:
    """`context_management` with `multi_agent`: the root's context (a long user message) passes the
    threshold, the workers' (short tasks) do not; only the root's context is compacted, by a
    `compaction` item tagged `/root` (its `response.compaction.compacting` event too), and the
    continuation's calls read the root's summary instead of the long message, while the workers
    resume from their own contexts."""
    long = "Please delegate this. " + "filler words " * 700
    cm = [{"type": "compaction", "compact_threshold": 1000}]
    async with make_stack(backend=SIM) as stack, stack.client() as client:
        firsts, seconds = [], []
        for extra in ({"context_management": cm}, {}):
            first = await client.beta.responses.create(model="sim-model", input=long, tools=[WEATHER_TOOL],
                                                       multi_agent=MA, betas=BETA, **extra)  # type: ignore[arg-type]
            second = await client.beta.responses.create(model="sim-model", previous_response_id=first.id,
                                                        input=_outputs(first.output), tools=[WEATHER_TOOL],
                                                        multi_agent=MA, betas=BETA, **extra)  # type: ignore[arg-type]
            firsts.append(first)
            seconds.append(second)
        compacted, plain = firsts
        assert compacted.status == "completed"
        assert [(t, a) for t, a, _ in _summary(compacted.output) if t == "compaction"] == [("compaction", "/root")]
        assert not any(it.type == "compaction" for it in plain.output)
        for second in seconds:  # the workers resume and answer; the root collects them
            assert second.status == "completed"
            _assert_final(second.output)
        # The root's last call read its summary, not the long message: far fewer input tokens.
        assert seconds[0].usage.input_tokens < seconds[1].usage.input_tokens - 1000
        stream = await client.beta.responses.create(model="sim-model", input=long, tools=[WEATHER_TOOL],
                                                    multi_agent=MA, betas=BETA, stream=True,
                                                    context_management=cm)  # type: ignore[arg-type]
        compacting = [ev async for ev in stream if ev.type == "response.compaction.compacting"]
        assert len(compacting) == 1 and _agent(compacting[0].model_dump()) == "/root"


@pytest.mark.parametrize("rpm", [4, 3])
async def test_every_agents_call_counts_against_the_rate_limit(make_stack: Any, rpm: int) -> None:
    """The rollout makes four model calls (root, two workers, root): the create is admitted once,
    each further call like any model call. At four requests per minute it completes; at three the
    root's last call is refused and the response fails with `rate_limit_exceeded`."""
    async with make_stack(backend=SIM, requests_per_minute=rpm) as stack, stack.client() as client:
        r = await client.beta.responses.create(model="sim-model", input="delegate", multi_agent=MA, betas=BETA)
    if rpm == 4:
        assert r.status == "completed" and r.output[-1].phase == "final_answer"
    else:
        assert r.status == "failed" and r.error is not None and r.error.code == "rate_limit_exceeded"
        assert {_agent(it) for it in r.output if it.type == "message"} == WORKERS  # the workers' answers stay


async def test_the_output_cap_and_the_deadline_hold_over_every_agent(make_stack: Any) -> None:
    slow = {"ttft_ms": 0, "output_tokens": 400, "tokens_per_s": 200}  # 2 s per answer
    async with make_stack(backend=slow, max_turn_s=0.5) as stack, stack.client() as client:
        capped = await client.beta.responses.create(model="sim-model", input="delegate", multi_agent=MA, betas=BETA,
                                                    max_output_tokens=30)  # fmt: skip
        assert capped.status == "incomplete" and capped.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
        assert capped.usage.output_tokens <= 30
        timed_out = await client.beta.responses.create(model="sim-model", input="delegate", multi_agent=MA, betas=BETA)
        assert timed_out.status == "failed" and timed_out.error.tether_code == "backend_timeout"  # type: ignore[union-attr]
        assert {(_agent(it), it.status) for it in timed_out.output if it.type == "message"} == {
            (w, "incomplete") for w in WORKERS}  # fmt: skip


async def test_the_other_actions(make_stack: Any, tmp_path: Path) -> None:
    """A scripted root (the simulated model's per-agent scripts) spawns a subagent, lists, messages
    and interrupts it, and follows up an agent that does not exist; then it answers."""
    calls = [("spawn_agent", {"task_name": "a", "message": "count to 400"}), ("list_agents", {}),
             ("send_message", {"target": "/root/a", "message": "hello"}), ("interrupt_agent", {"target": "/root/a"}),
             ("followup_task", {"target": "/root/nobody", "message": "x"})]  # fmt: skip
    script = tmp_path / "agents.json"
    script.write_text(json.dumps({
        "steps": [{"tool_calls": [{"name": name, "arguments": args} for name, args in calls]}],
        "after": {"text": "Done."},
        "agents": {"/root/a": {"steps": [{"text_tokens": 400, "tokens_per_s": 100}]}},
    }))  # fmt: skip
    async with make_stack(backend={**SIM, "script": str(script)}) as stack, stack.client() as client:
        r = await client.beta.responses.create(model="sim-model", input="go", multi_agent=MA, betas=BETA)
    results = {it.action: json.loads(it.output[0].text) for it in r.output if it.type == "multi_agent_call_output"}
    assert results["spawn_agent"] == {"task_name": "/root/a"}
    assert {"agent_name": "/root/a", "status": "running"} in results["list_agents"]["agents"]
    assert results["send_message"] == {"delivered": True} and results["interrupt_agent"] == {"interrupted": True}
    assert "nobody" in results["followup_task"]["error"]
    [message] = [it for it in r.output if it.type == "agent_message"]
    assert (message.author, message.recipient, message.content[0].text) == ("/root", "/root/a", "hello")
    assert not [it for it in r.output if it.type == "message" and _agent(it) == "/root/a" and it.status == "completed"]
    assert r.output[-1].content[0].text == "Done." and r.output[-1].phase == "final_answer"


async def test_sse_interleaves_agents_in_one_sequence(make_stack: Any) -> None:
    async with make_stack(backend={"ttft_ms": 0, "output_tokens": 40, "tokens_per_s": 2000}) as stack, stack.client() as client:
        stream = await client.beta.responses.create(model="sim-model", input="delegate", betas=BETA,
                                                    multi_agent=MA, stream=True)  # fmt: skip
        events = [ev async for ev in stream]
    assert [ev.sequence_number for ev in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    deltas = [ev for ev in events if ev.type == "response.output_text.delta"]
    assert {_agent(ev) for ev in deltas} == WORKERS | {"/root"}
    agents_in_order = [_agent(ev) for ev in deltas]
    first_other = next(i for i, a in enumerate(agents_in_order) if a != agents_in_order[0])
    assert agents_in_order[0] in agents_in_order[first_other:], "the workers' deltas interleave"
    done = {ev.output_index: ev.item for ev in events if ev.type == "response.output_item.done"}
    final = events[-1].response.output
    assert [it.id for it in final] == [done[i].id for i in sorted(done)]
    assert all(_agent(ev) is not None for ev in events if ev.type.startswith("response.output_"))
    _assert_final(final)


async def _until(conn: Any, *types: str) -> list[Any]:
    events = []
    async with asyncio.timeout(20):  # a bound, not a timing assertion: a rollout takes well under 1 s
        async for ev in conn:
            events.append(ev)
            if ev.type in types:
                return events
    raise AssertionError(f"the connection ended before {types}")


async def test_websocket_inject_resumes_the_workers_in_the_same_response(make_stack: Any) -> None:
    async with make_stack(backend=SIM) as stack, stack.client() as client:
        async with client.beta.responses.connect(extra_headers=HEADER) as conn:
            await conn.response.create(model="sim-model", input="Please delegate this.", tools=[WEATHER_TOOL],
                                       multi_agent=MA)  # fmt: skip
            injected, acks, seen = 0, 0, []
            async with asyncio.timeout(20):
                async for ev in conn:
                    seen.append(ev)
                    if ev.type == "response.output_item.done" and ev.item.type == "function_call":
                        out = {"type": "function_call_output", "call_id": ev.item.call_id, "output": "sunny"}
                        await conn.response.inject(response_id=seen[0].response.id, input=[out])
                        injected += 1
                    elif ev.type == "response.inject.created":
                        acks += 1
                    elif ev.type in ("response.completed", "response.failed", "error", "response.inject.failed"):
                        break
            assert seen[-1].type == "response.completed", seen[-1]
            response = seen[-1].response
    assert injected == acks == 2
    assert {ev.response.id for ev in seen if ev.type.startswith("response.") and hasattr(ev, "response")} == {response.id}
    outputs = [it for it in response.output if it.type == "function_call_output"]
    assert {_agent(it) for it in outputs} == WORKERS  # committed into the response, with their agent
    _assert_final(response.output)


async def test_websocket_inject_after_completion_fails_and_is_resent(make_stack: Any) -> None:
    async with make_stack(backend=SIM, multi_agent_inject_wait_s=0) as stack, stack.client() as client:
        async with client.beta.responses.connect(extra_headers=HEADER) as conn:
            await conn.response.create(model="sim-model", input="delegate", tools=[WEATHER_TOOL], multi_agent=MA)
            done = (await _until(conn, "response.completed", "error"))[-1]
            assert done.type == "response.completed", done
            outputs = _outputs(done.response.output)
            assert len(outputs) == 2
            await conn.response.inject(response_id=done.response.id, input=outputs)
            failed = (await _until(conn, "response.inject.failed", "response.inject.created", "error"))[-1]
            assert failed.type == "response.inject.failed" and failed.error.code == "response_already_completed"
            resend = [item.model_dump(exclude_none=True) for item in failed.input]
            assert resend == outputs
            await conn.response.create(model="sim-model", previous_response_id=done.response.id, input=resend,
                                       tools=[WEATHER_TOOL], multi_agent=MA)  # fmt: skip
            answer = (await _until(conn, "response.completed", "error"))[-1]
            assert answer.type == "response.completed", answer
            _assert_final(answer.response.output)


async def test_websocket_without_the_beta_header_is_refused(stack: Any) -> None:
    async with stack.client() as client, client.beta.responses.connect() as conn:
        await conn.response.create(model="sim-model", input="delegate", multi_agent=MA)
        err = (await _until(conn, "error", "response.completed"))[-1]
        assert err.type == "error" and err.error.param == "multi_agent"
        assert "OpenAI-Beta: responses_multi_agent=v1" in err.error.message


async def test_cancel_ends_every_agent(make_stack: Any) -> None:
    slow = {"ttft_ms": 0, "output_tokens": 400, "tokens_per_s": 100}  # 4 s per answer
    async with make_stack(backend=slow) as stack, stack.client() as client:
        async with client.beta.responses.connect(extra_headers=HEADER) as conn:
            await conn.response.create(model="sim-model", input="delegate", multi_agent=MA)
            writing: set[str | None] = set()
            rid = ""
            async with asyncio.timeout(20):
                async for ev in conn:
                    if ev.type == "response.created":
                        rid = ev.response.id
                    if ev.type == "response.output_text.delta":
                        writing.add(_agent(ev))
                        if writing == WORKERS:
                            break
            await conn.send({"type": "response.cancel", "response_id": rid})  # type: ignore[arg-type,typeddict-unknown-key]  # Tether's extension
            end = (await _until(conn, "response.incomplete", "response.failed", "response.completed"))[-1]
            assert end.response.status == "cancelled"
            # Nothing of any agent comes after the terminal event.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(conn.recv(), 0.3)
            assert {it.status for it in end.response.output if it.type == "message"} == {"incomplete"}


async def test_grpc_typed_client_injects(stack: Any, grpc_port: int) -> None:
    async with tether.client.connect(f"127.0.0.1:{grpc_port}", api_key=KEY_A) as session:
        stream = await session.create("sim-model", "delegate", tools=[WEATHER_TOOL], multi_agent=MA)
        acks = 0
        async with asyncio.timeout(20):
            async for ev in stream:
                arm = ev.WhichOneof("event")
                if arm == "output_item_done" and ev.output_item_done.item.WhichOneof("item") == "function_call":
                    call = ev.output_item_done.item.function_call
                    assert ev.agent.agent_name in WORKERS
                    stream.inject([{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
                elif arm == "inject_created":
                    acks += 1
        response = await stream.final_response()
    assert acks == 2
    final = response.output[-1]
    assert final.agent.agent_name == "/root" and final.message.phase == "final_answer"
    assert {it.agent.agent_name for it in response.output if it.WhichOneof("item") == "function_call_output"} == WORKERS


async def test_agents_sdk_hosted_multi_agent_model(make_stack: Any) -> None:
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        asked.append(city)
        return f"sunny in {city}"

    async with make_stack(backend=SIM) as stack:
        model = OpenAIHostedMultiAgentModel(model="sim-model", openai_client=stack.client())
        agent = Agent(name="lead", instructions="Delegate when asked.", model=model, tools=[get_weather])
        try:
            result = await Runner.run(agent, "Please delegate the weather check.")
        finally:
            await model.close()
    assert len(asked) == 2  # one call per worker, run locally by the SDK and injected
    assert isinstance(result.final_output, str) and result.final_output


async def test_a_multi_agent_response_takes_one_active_response_slot(make_stack: Any) -> None:
    """`max_active_responses` counts responses, not model calls: at the edge (1), the delegating
    response runs its root and both workers within its one slot; past it, a create on another
    lane waits until that response has ended."""
    slow = {"ttft_ms": 0, "output_tokens": 40, "tokens_per_s": 400}
    async with make_stack(backend=slow, max_active_responses=1) as stack, stack.client() as client:
        async with client.beta.responses.connect(extra_headers=HEADER) as conn:
            await conn.response.create(model="sim-model", input="delegate", multi_agent=MA)
            await conn.send({"type": "response.create", "model": "sim-model", "input": "hi", "stream_id": "b"})  # type: ignore[arg-type, typeddict-unknown-key]
            events = await _until(conn, "response.created")
            events += await _until(conn, "response.completed", "error")
            events += await _until(conn, "response.completed", "error")
    terminal = [ev for ev in events if ev.type in ("response.completed", "error")]
    assert [ev.type for ev in terminal] == ["response.completed"] * 2, terminal
    multi, plain = terminal[0].response, terminal[1].response
    assert {_agent(it) for it in multi.output if it.type == "message"} == WORKERS | {"/root"}
    created = [ev.response.id for ev in events if ev.type == "response.created"]
    assert created == [multi.id, plain.id]
    order = [(ev.type, getattr(getattr(ev, "response", None), "id", None)) for ev in events]
    assert order.index(("response.completed", multi.id)) < order.index(("response.created", plain.id))


async def test_a_subagents_long_answer_compacts_its_context_only(make_stack: Any, tmp_path: Path) -> None:
    """A scripted subagent answers with 1,200 tokens: its context passes the threshold and is
    compacted (a `compaction` item tagged with it, after its answer). The root's context stays
    short until `wait_agent` brings it that answer: it is compacted after its last call only."""
    script = tmp_path / "agents.json"
    script.write_text(json.dumps({
        "steps": [{"tool_calls": [{"name": "spawn_agent", "arguments": {"task_name": "a", "message": "write"}}]},
                  {"tool_calls": [{"name": "wait_agent", "arguments": {}}]}],
        "after": {"text": "Done."},
        "agents": {"/root/a": {"steps": [{"text_tokens": 1200}]}},
    }))  # fmt: skip
    cm = [{"type": "compaction", "compact_threshold": 1000}]
    async with make_stack(backend={**SIM, "script": str(script)}) as stack, stack.client() as client:
        r = await client.beta.responses.create(model="sim-model", input="go", multi_agent=MA, betas=BETA,
                                               context_management=cm)  # type: ignore[arg-type]
    kinds = [(t, a) for t, a, _ in _summary(r.output)]
    assert [k for k in kinds if k[0] == "compaction"] == [("compaction", "/root/a"), ("compaction", "/root")]
    assert kinds.index(("message", "/root/a")) < kinds.index(("compaction", "/root/a"))
    assert kinds[-2:] == [("message", "/root"), ("compaction", "/root")]
    assert r.output[-2].phase == "final_answer" and r.output[-2].content[0].text == "Done."
