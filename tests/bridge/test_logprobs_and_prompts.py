"""Log probabilities (`include: ["message.output_text.logprobs"]`, `top_logprobs`) and prompt
templates (`prompt`), on HTTP (the openai SDK), WebSocket and gRPC, against the simulated model's
deterministic log probabilities and templates set in the engine's config."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import openai
import orjson
import pytest

from tether.prompts import PromptLibrary
from tether.protocol import json_codec

from ..support.grpc_client import RawSession
from .conftest import Stack
from .helpers import KEY_A, KEY_B, check_sse_events, recv_response, recv_until, send_json

LOGPROBS = "message.output_text.logprobs"
PROMPTS = {
    "support": {
        "instructions": "You answer for {{company}}.",
        "input": [{"role": "user", "content": "Context: {{context}}"}, {"role": "user", "content": "{{attachment}}"}],
    },
    "triage": {
        "versions": {"1": {"instructions": "Sort the ticket."}, "2": {"instructions": "Sort it into {{queues}}."}},
        "default_version": "2",
    },
}


def _check_logprobs(deltas: list[dict[str, Any]], done: dict[str, Any], part: dict[str, Any], top: int) -> None:
    """Each delta's entries spell its own text (merged deltas concatenate theirs, in order); the
    done event and the output_text part carry every token's entry."""
    assert deltas
    for d in deltas:
        assert "".join(lp["token"] for lp in d["logprobs"]) == d["delta"]
    every = [lp for d in deltas for lp in d["logprobs"]]
    assert done["logprobs"] == every and part["logprobs"] == every
    assert "".join(lp["token"] for lp in every) == done["text"] == part["text"]
    assert len(every) > 1 and any(len(d["logprobs"]) > 1 for d in deltas)  # a merged delta
    for lp in every:
        assert lp["bytes"] == list(lp["token"].encode()) and lp["logprob"] < 0
        assert len(lp["top_logprobs"]) == top
        if top:
            assert lp["top_logprobs"][0] == {k: lp[k] for k in ("token", "bytes", "logprob")}
            ranked = [t["logprob"] for t in lp["top_logprobs"]]
            assert ranked == sorted(ranked, reverse=True)


async def test_http_logprobs_on_deltas_done_and_parts(stack: Stack) -> None:
    async with stack.client() as client:
        stream = await client.responses.create(
            model="sim-model", input="hi", include=[LOGPROBS], top_logprobs=3, stream=True
        )
        events = [ev.to_dict() async for ev in stream]
        plain = await client.responses.create(model="sim-model", input="hi")
    check_sse_events(events)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    final = events[-1]["response"]
    assert final["top_logprobs"] == 3
    _check_logprobs(deltas, done, final["output"][0]["content"][0], 3)
    # Not asked for: none, and the response says top_logprobs 0.
    assert plain.top_logprobs == 0 and plain.output[0].content[0].logprobs == []


async def test_top_logprobs_alone_asks_and_its_bound_is_checked(stack: Stack) -> None:
    async with stack.client() as client:
        r = await client.responses.create(model="sim-model", input="hi", top_logprobs=2)
        entries = r.output[0].content[0].logprobs
        assert entries and all(len(lp.top_logprobs) == 2 for lp in entries)
        r = await client.responses.create(model="sim-model", input="hi", include=[LOGPROBS])
        assert r.output[0].content[0].logprobs and r.output[0].content[0].logprobs[0].top_logprobs == []
        for bad in (-1, 21):
            with pytest.raises(openai.BadRequestError) as info:
                await client.responses.create(model="sim-model", input="hi", top_logprobs=bad)
            assert info.value.body["param"] == "top_logprobs"


async def test_websocket_logprobs(stack: Stack) -> None:
    async with stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "hi",
                               "include": [LOGPROBS], "top_logprobs": 1})  # fmt: skip
        events = await recv_response(conn)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    (part,) = [e["part"] for e in events if e["type"] == "response.content_part.done"]
    _check_logprobs(deltas, done, part, 1)
    assert events[-1]["response"]["output"][0]["content"][0] == part


async def test_grpc_logprobs(stack: Stack, grpc_port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        session = RawSession(channel, KEY_A)
        await session.create(model="sim-model", input="hi", include=[LOGPROBS], top_logprobs=2)
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "completed" and ev.completed.response.top_logprobs == 2
        deltas = [e.output_text_delta for e in session.events if e.WhichOneof("event") == "output_text_delta"]
        (done,) = [e.output_text_done for e in session.events if e.WhichOneof("event") == "output_text_done"]
        part = ev.completed.response.output[0].message.content[0].output_text
        _check_logprobs(
            [{"delta": d.delta, "logprobs": orjson.loads(d.logprobs_json)} for d in deltas],
            {"text": done.text, "logprobs": orjson.loads(done.logprobs_json)},
            {"text": part.text, "logprobs": orjson.loads(part.logprobs_json)},
            2,
        )
        session.call.cancel()


def _with_prompts(stack: Stack) -> None:
    stack.config.prompts = PromptLibrary.from_config(PROMPTS)


async def test_http_prompt_template_fills_instructions_and_input(stack: Stack) -> None:
    _with_prompts(stack)
    prompt = {"id": "support", "variables": {
        "company": "Acme", "context": {"type": "input_text", "text": "order 42"},
        "attachment": {"type": "input_image", "image_url": "https://example.invalid/a.png"}}}  # fmt: skip
    async with stack.client() as client:
        r = await client.responses.create(
            model="sim-model", input="where is it?", instructions="Be brief.", prompt=prompt, store=True
        )
        assert r.instructions == "You answer for Acme.\n\nBe brief."
        assert r.prompt.id == "support" and r.prompt.variables["company"] == "Acme"
        items = await client.responses.input_items.list(r.id, order="asc")
        contents = [i.content if isinstance(i.content, str) else i.content[0] for i in items.data]
        assert contents[0] == "Context: order 42" and contents[2] == "where is it?"
        assert (contents[1].type, contents[1].image_url) == ("input_image", "https://example.invalid/a.png")
        # versions: the default, and one named
        r = await client.responses.create(model="sim-model", input="x", prompt={"id": "triage", "variables": {"queues": "A, B"}})
        assert r.instructions == "Sort it into A, B."
        r = await client.responses.create(model="sim-model", input="x", prompt={"id": "triage", "version": "1"})
        assert r.instructions == "Sort the ticket." and r.prompt.version == "1"
        plain = await client.responses.create(model="sim-model", input="x")
        assert plain.prompt is None


async def test_a_background_prompt_template_is_expanded_once(stack: Stack) -> None:
    """Its entry checks a background create (and expands its template) before answering `queued`;
    its turn takes it as checked: the instructions and input are expanded once, in the queued
    Response and the finished one alike."""
    _with_prompts(stack)
    prompt = {"id": "support", "variables": {
        "company": "Acme", "context": {"type": "input_text", "text": "order 42"},
        "attachment": {"type": "input_image", "image_url": "https://example.invalid/a.png"}}}  # fmt: skip
    async with stack.client() as client:
        queued = await client.responses.create(model="sim-model", input="where is it?", instructions="Be brief.",
                                               prompt=prompt, background=True)  # fmt: skip
        assert queued.instructions == "You answer for Acme.\n\nBe brief."
        stream = await client.responses.retrieve(queued.id, stream=True)
        done = [ev async for ev in stream][-1].response
        assert done.status == "completed" and done.instructions == queued.instructions
        items = await client.responses.input_items.list(done.id, order="asc")
        assert len(items.data) == 3  # the template's two messages and the input, once


PROMPT_ERRORS = [
    ({"id": "nope"}, "prompt.id"),
    ({"id": "triage", "version": "9"}, "prompt.version"),
    ({"id": "triage"}, "prompt.variables.queues"),
    ({"id": "triage", "variables": {"queues": "A", "extra": "x"}}, "prompt.variables.extra"),
    ({"id": "support", "variables": {"company": {"type": "input_image", "image_url": "https://e.invalid/x.png"},
                                     "context": "c", "attachment": "a"}}, "prompt.variables.company"),
    ({"id": "support", "variables": {"company": 7, "context": "c", "attachment": "a"}}, "prompt.variables.company"),
]  # fmt: skip


@pytest.mark.parametrize(("prompt", "param"), PROMPT_ERRORS, ids=[p for _, p in PROMPT_ERRORS])
async def test_http_prompt_errors_name_the_parameter(stack: Stack, prompt: dict[str, Any], param: str) -> None:
    _with_prompts(stack)
    async with stack.client() as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", input="x", prompt=prompt)
    assert (info.value.body["code"], info.value.body["param"]) == ("invalid_request", param)
    assert param in info.value.body["message"]


async def test_websocket_prompt_template(stack: Stack) -> None:
    _with_prompts(stack)
    async with stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "x",
                               "prompt": {"id": "triage", "variables": {"queues": "bugs"}}})  # fmt: skip
        done = (await recv_response(conn))[-1]
        assert done["response"]["instructions"] == "Sort it into bugs."
        assert done["response"]["prompt"] == {"id": "triage", "variables": {"queues": "bugs"}}
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "x",
                               "prompt": {"id": "triage", "version": "3"}, "event_id": "ev_7"})  # fmt: skip
        (err,) = await recv_response(conn)
        assert (err["error"]["param"], err["event_id"]) == ("prompt.version", "ev_7")


async def test_grpc_prompt_template(stack: Stack, grpc_port: int) -> None:
    _with_prompts(stack)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        session = RawSession(channel, KEY_A)
        req = json_codec.client_event_from_json({"type": "response.create", "model": "sim-model", "input": "x",
                                                 "prompt": {"id": "triage", "variables": {"queues": "ops"}}})  # fmt: skip
        await session.send(req)
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "completed"
        assert ev.completed.response.instructions == "Sort it into ops."
        assert ev.completed.response.prompt.id == "triage"
        session.call.cancel()


async def test_prompt_templates_are_scoped_to_tenants(stack: Stack) -> None:
    """A template with `tenants` exists only for them: another tenant naming it gets the 400 of an
    id that does not exist, and no error lists another tenant's ids."""
    stack.config.prompts = PromptLibrary.from_config({
        **PROMPTS,
        "a-secret-playbook": {"tenants": ["a"], "instructions": "Escalate {{who}}."},
        "b-private": {"tenants": ["b"], "versions": {"1": {"instructions": "B only."}}},
    })  # fmt: skip
    async with stack.client(KEY_A) as a, stack.client(KEY_B) as b:
        r = await a.responses.create(model="sim-model", input="x",
                                     prompt={"id": "a-secret-playbook", "variables": {"who": "ops"}})  # fmt: skip
        assert r.instructions == "Escalate ops."
        assert (await b.responses.create(model="sim-model", input="x", prompt={"id": "b-private"})).instructions == "B only."
        assert (await b.responses.create(model="sim-model", input="x", prompt={"id": "triage", "version": "1"})).status == "completed"
        messages = {}
        for pid in ("a-secret-playbook", "no-such-prompt"):
            with pytest.raises(openai.BadRequestError) as info:
                await b.responses.create(model="sim-model", input="x", prompt={"id": pid, "variables": {"who": "x"}})
            assert (info.value.body["code"], info.value.body["param"]) == ("invalid_request", "prompt.id")
            messages[pid] = info.value.body["message"].replace(pid, "<id>")
        assert messages["a-secret-playbook"] == messages["no-such-prompt"]  # no existence oracle
        assert "a-secret-playbook" not in messages["no-such-prompt"] and "'b-private'" in messages["no-such-prompt"]
        with pytest.raises(openai.BadRequestError) as info:
            await a.responses.create(model="sim-model", input="x", prompt={"id": "nope"})
        assert "b-private" not in info.value.body["message"] and "'a-secret-playbook'" in info.value.body["message"]
    headers = {"Authorization": f"Bearer {KEY_B}"}  # input_tokens and compact apply the same scope
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=30) as http:
        body = {"model": "sim-model", "input": "x", "prompt": {"id": "a-secret-playbook", "variables": {"who": "x"}}}
        for path in ("/responses/input_tokens", "/responses/compact"):
            bad = await http.post(path, json=body)
            assert (bad.status_code, bad.json()["error"]["param"]) == (400, "prompt.id")
            assert "a-secret-playbook'" not in bad.json()["error"]["message"].split(":", 1)[1]


def test_prompt_config_is_checked_at_load() -> None:
    from tether.config import from_dict

    assert "support" in from_dict({"prompts": PROMPTS}).prompts.templates
    for bad, where in [
        ({"x": {}}, "needs instructions or input"),
        ({"x": {"instructions": 3}}, "prompts.x.instructions"),
        ({"x": {"input": [{"role": "robot", "content": "hi"}]}}, "prompts.x.input[0].role"),
        ({"x": {"instructions": "a", "colour": "red"}}, "colour"),
        ({"x": {"versions": {"1": {"instructions": "a"}}, "default_version": "2"}}, "default_version"),
        ({"x": {"instructions": "a", "tenants": "a"}}, "prompts.x.tenants"),
    ]:
        with pytest.raises(ValueError, match=where.replace("[", r"\[")):
            from_dict({"prompts": bad})


async def test_input_token_count_and_compaction_apply_the_template(stack: Stack) -> None:
    _with_prompts(stack)
    headers = {"Authorization": f"Bearer {KEY_A}"}
    body = {"model": "sim-model", "input": "x"}
    prompt = {"id": "support", "variables": {"company": "Acme " * 50, "context": "c", "attachment": "a"}}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=30) as http:
        plain = (await http.post("/responses/input_tokens", json=body)).json()["input_tokens"]
        templated = (await http.post("/responses/input_tokens", json={**body, "prompt": prompt})).json()
        assert templated["input_tokens"] > plain + 50  # the template's instructions and messages count
        bad = await http.post("/responses/input_tokens", json={**body, "prompt": {"id": "nope"}})
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "prompt.id")
        bad = await http.post("/responses/compact", json={**body, "prompt": {"id": "nope"}})
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "prompt.id")


async def test_a_steered_responses_successor_does_not_apply_the_template_twice(make_stack: Any) -> None:
    slow = {"ttft_ms": 0, "tokens_per_s": 40, "output_tokens": 400}
    async with make_stack(backend=slow) as stack, stack.ws() as conn:
        _with_prompts(stack)
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "write a lot", "store": False,
                               "prompt": {"id": "triage", "variables": {"queues": "bugs"}}})  # fmt: skip
        first = await recv_until(conn, lambda e: e["type"] == "response.output_text.delta")
        target = first[0]["response"]["id"]
        await send_json(conn, {"type": "response.steer", "previous_response_id": target, "input": "go left"})
        events = await recv_until(conn, lambda e: e["type"] == "response.completed", 30)
    steered = next(e for e in events if e["type"] == "response.incomplete")["response"]
    successor = events[-1]["response"]
    assert steered["prompt"]["id"] == "triage" and steered["instructions"] == "Sort it into bugs."
    assert successor["previous_response_id"] == target
    assert successor["instructions"] == "Sort it into bugs." and successor["prompt"] is None
