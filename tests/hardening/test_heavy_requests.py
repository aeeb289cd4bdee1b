"""One request must not hold the event loop for long (issue: a tenant's single request stalled
every other tenant): the explicit limits on what a request can make the server do, each at its
edge and past it, and the large CPU work that runs off the loop (tether/offload.py).

The fairness campaign (`python -m tether_lab.fairness`, tests/lab/test_fairness_smoke.py)
measures the stalls themselves; these tests pin the rules."""

from __future__ import annotations

import openai
import pytest

from tether.backends.base import Finish, TextDelta
from tether.core.builder import OutputBuilder

from .support import full_stack, instant_config

LOGPROBS = "message.output_text.logprobs"


def _sdk(stack) -> openai.AsyncOpenAI:  # noqa: ANN001
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{stack.port}/v1", api_key="sk-a", max_retries=0)


# -- log probabilities: tokens x (1 + top_logprobs) <= max_logprobs ------------------------------


async def test_logprobs_volume_caps_the_output_and_refuses_a_cap_above_it() -> None:
    # 40 log probabilities with top_logprobs 3: at most 10 output tokens (the model answers 12).
    async with full_stack(instant_config(max_logprobs=40)) as stack:
        client = _sdk(stack)
        r = await client.responses.create(model="sim-model", input="hi", top_logprobs=3)
        entries = r.output[0].content[0].logprobs
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert len(entries) == 10 and sum(1 + len(e.top_logprobs) for e in entries) == 40
        assert r.max_output_tokens is None  # the echo is what the client sent
        # The edge: an explicit cap of 10 is accepted; 11 is refused, naming the field.
        r = await client.responses.create(model="sim-model", input="hi", top_logprobs=3, max_output_tokens=10)
        assert r.status == "incomplete" and len(r.output[0].content[0].logprobs) == 10
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", input="hi", top_logprobs=3, max_output_tokens=11)
        assert info.value.body["param"] == "max_output_tokens" and "at most 10" in info.value.body["message"]
        # Log probabilities without alternatives count one per token; without logprobs no cap.
        r = await client.responses.create(model="sim-model", input="hi", include=[LOGPROBS], max_output_tokens=40)
        assert r.status == "completed" and len(r.output[0].content[0].logprobs) == 12
        r = await client.responses.create(model="sim-model", input="hi", max_output_tokens=1000)
        assert r.status == "completed"


def test_an_upstream_that_ignores_the_cap_is_cut_by_tether() -> None:
    """The builder counts what arrives: the chunk that would pass the budget is not taken."""
    lp = {"token": "a", "bytes": [97], "logprob": -0.1, "top_logprobs": [{"token": "a", "bytes": [97], "logprob": -0.1}]}
    builder = OutputBuilder(max_logprobs=10)
    events = builder.feed([TextDelta("a", [lp]) for _ in range(8)] + [Finish(reason="stop")])
    assert builder.capped and builder.finish == Finish(reason="length")
    builder.close_all("incomplete")
    part = builder.output[0].message.content[0].output_text
    assert part.text == "aaaaa"  # 5 tokens x 2 entries = the budget; the 6th chunk was refused
    assert sum(len(e.logprobs or ()) for e in events if hasattr(e, "logprobs")) == 5


# -- large CPU work runs off the event loop ------------------------------------------------------


async def test_a_large_input_is_rendered_and_tokenised_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokenising a 1 MiB input took ~50 ms of the loop; it now runs in the offload thread, for
    the new input, a long header (instructions) and a conversation's items."""
    import threading

    from tether import render

    loop_thread = threading.get_ident()
    on_loop: list[int] = []
    real = render.encode

    def watched(text: str):  # noqa: ANN202
        if len(text) >= 256 * 1024 and threading.get_ident() == loop_thread:
            on_loop.append(len(text))
        return real(text)

    monkeypatch.setattr(render, "encode", watched)
    big = "lorem ipsum " * (1024 * 1024 // 12)
    async with full_stack(instant_config(max_input_tokens=10_000_000)) as stack:
        client = _sdk(stack)
        r = await client.responses.create(model="sim-model", input=big, store=False)
        assert r.status == "completed" and r.usage.input_tokens > 150_000
        r = await client.responses.create(model="sim-model", instructions=big, input="hi", store=False)
        assert r.status == "completed"
        conv = await client.conversations.create(items=[{"type": "message", "role": "user", "content": big}])
        r = await client.responses.create(model="sim-model", input="and?", conversation=conv.id)
        assert r.status == "completed" and r.usage.input_tokens > 150_000
        n = await client.responses.input_tokens.count(model="sim-model", input=big)
        assert n.input_tokens > 150_000
    assert on_loop == []


# -- conversation size: max_conversation_items, max_conversation_bytes ---------------------------


def _msg(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


async def test_conversation_items_edge_then_refused_when_adding_and_when_continuing() -> None:
    async with full_stack(instant_config(max_conversation_items=3)) as stack:
        client = _sdk(stack)
        conv = await client.conversations.create(items=[_msg("one"), _msg("two")])
        # A create whose input would make it 4 is refused before anything is generated.
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", input=[_msg("3"), _msg("4")], conversation=conv.id)
        assert info.value.body["code"] == "conversation_too_large" and info.value.body["param"] == "conversation"
        await client.conversations.items.create(conv.id, items=[_msg("three")])  # 3: the edge
        with pytest.raises(openai.BadRequestError) as info:
            await client.conversations.items.create(conv.id, items=[_msg("four")])
        assert info.value.body["code"] == "conversation_too_large" and info.value.body["param"] == "items"
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", input="more?", conversation=conv.id)
        assert info.value.body["code"] == "conversation_too_large"
        with pytest.raises(openai.BadRequestError):  # a new one with too many items at once
            await client.conversations.create(items=[_msg("a")] * 4)


async def test_conversation_bytes_edge_then_refused() -> None:
    from tether.protocol import json_codec

    async with full_stack(instant_config()) as stack:
        client = _sdk(stack)
        conv = await client.conversations.create(items=[_msg("x" * 1000)])
        held = sum(i.ByteSize() for i in await stack.engine.store.conversation_items("a", conv.id))
        adding = json_codec.item_from_json(_msg("y" * 500)).ByteSize()
        stack.config.limits.max_conversation_bytes = held + adding  # read as each call runs
        await client.conversations.items.create(conv.id, items=[_msg("y" * 500)])  # exactly the bound
        with pytest.raises(openai.BadRequestError) as info:
            await client.conversations.items.create(conv.id, items=[_msg("z")])
        assert info.value.body["code"] == "conversation_too_large" and "bytes" in info.value.body["message"]


# -- prompt templates: the expansion is bounded by max_request_bytes ----------------------------


async def test_a_template_expansion_edge_then_413_before_expanding() -> None:
    from tether.prompts import PromptLibrary

    limit = 65_539  # ten uses of {{v}} and nine spaces: 10 v + 9 bytes
    config = instant_config(max_request_bytes=limit)
    config.prompts = PromptLibrary.from_config({"tenfold": {"input": [{"role": "user", "content": " ".join(["{{v}}"] * 10)}]}})
    async with full_stack(config) as stack:
        client = _sdk(stack)
        r = await client.responses.create(model="sim-model", prompt={"id": "tenfold", "variables": {"v": "x" * 6553}})
        assert r.status == "completed" and r.usage.input_tokens > 0  # exactly the limit
        with pytest.raises(openai.APIStatusError) as info:
            await client.responses.create(model="sim-model", prompt={"id": "tenfold", "variables": {"v": "x" * 6554}})
        assert info.value.status_code == 413
        assert info.value.body["code"] == "request_too_large" and info.value.body["param"] == "prompt"
        # Multi-byte text counts its UTF-8 bytes.
        with pytest.raises(openai.APIStatusError) as info:
            await client.responses.create(model="sim-model", prompt={"id": "tenfold", "variables": {"v": "é" * 3300}})
        assert info.value.status_code == 413
        # One expanded message over max_item_bytes: 400 item_too_large, before it is built.
        stack.config.limits.max_item_bytes = limit - 1
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", prompt={"id": "tenfold", "variables": {"v": "x" * 6553}})
        assert info.value.body["code"] == "item_too_large" and info.value.body["param"] == "prompt"


def test_large_logprobs_are_written_verbatim_not_parsed_again() -> None:
    """The events that end a message each carry all its log probabilities: a large list is
    embedded as the JSON text the builder wrote (no parse per event), and reads back the same."""
    import orjson

    from tether.protocol import json_codec
    from tether.responses.v1 import events_pb2

    entries = [{"token": f"t{i}", "bytes": [116], "logprob": -0.5, "top_logprobs": []} for i in range(5000)]
    ev = events_pb2.ServerEvent()
    ev.output_text_done.text = "x"
    ev.output_text_done.logprobs_json = orjson.dumps(entries).decode()
    assert len(ev.output_text_done.logprobs_json) > 64 * 1024
    obj = json_codec.event_to_json(ev, ws=True)
    assert isinstance(obj["logprobs"], orjson.Fragment)
    assert orjson.loads(json_codec.dumps(obj))["logprobs"] == entries


async def test_a_large_websocket_text_message_is_decoded_off_the_loop_and_answered_as_any() -> None:
    """A text message of 256 KiB or more reaches the app as its UTF-8 bytes and is decoded (with
    its JSON) in the offload thread; to the client it behaves like any other frame."""
    from tests.bridge.helpers import recv_until, send_json

    from .support import CREATE, ws_error

    big = "lorem ipsum " * (300 * 1024 // 12)
    async with full_stack(instant_config(max_input_tokens=10_000_000)) as stack, stack.ws() as conn:
        await send_json(conn, {**CREATE, "input": big, "stream_id": "l1"})
        done = await recv_until(conn, lambda e: e["type"] in ("response.completed", "error"), 30)
        assert done[-1]["type"] == "response.completed" and done[-1]["stream_id"] == "l1"
        # Not JSON: the error names the lane the text names.
        await conn.send('{"type": "response.create", "stream_id": "l2", "input": "' + big + '", oops}')
        err = (await recv_until(conn, lambda e: e["type"] == "error"))[-1]
        ws_error(err, "invalid_json", 400)
        assert err["stream_id"] == "l2"
        # Invalid UTF-8 in a large text message: invalid_json, and the socket goes on.
        await conn.send(b'{"type": "response.create", "input": "' + b"\xff" * (300 * 1024) + b'"}', text=True)
        ws_error((await recv_until(conn, lambda e: e["type"] == "error"))[-1], "invalid_json", 400)
        await send_json(conn, CREATE)
        done = await recv_until(conn, lambda e: e["type"] in ("response.completed", "error"))
        assert done[-1]["type"] == "response.completed"


def test_the_new_limits_refuse_nonsense_at_load() -> None:
    from tether.config import load_config

    for name, bad in (("LIMITS__MAX_QUEUED_BYTES_PER_KEY", "-1"), ("LIMITS__MAX_CONVERSATION_BYTES", "-5"),
                      ("LIMITS__MAX_LOGPROBS", "0"), ("SERVER__LOOP_LAG_INTERVAL_S", "-0.1")):  # fmt: skip
        with pytest.raises(ValueError, match=name.split("__")[1].lower()):
            load_config(None, env={f"TETHER_{name}": bad})
    assert load_config(None, env={"TETHER_LIMITS__MAX_QUEUED_BYTES_PER_KEY": "0"}).limits.max_queued_bytes_per_key == 0
