"""Regressions for the smaller findings of the red-team run of issue 24, against the real bridge
driven by the openai SDK: client-chosen item ids in a conversation, and the lab model's speeds.
(A conversation deleted while its metadata is updated is a store conformance test:
`tests/store/test_conformance.py::test_a_metadata_update_racing_a_delete_leaves_it_deleted`.)
No wall-clock assertions: deadlines bound the waits.
"""

from __future__ import annotations

import asyncio
import logging

import openai
import pytest
from openai import AsyncOpenAI

from .support import KEY_A, full_stack


def _client(stack) -> AsyncOpenAI:  # noqa: ANN001
    return AsyncOpenAI(base_url=f"http://127.0.0.1:{stack.port}/v1", api_key=KEY_A, max_retries=0)


def _message(item_id: str, text: str) -> dict:
    return {"type": "message", "id": item_id, "role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_a_client_chosen_item_id_is_unique_within_its_conversation() -> None:
    """Before, two items with one id were stored: one DELETE removed both, and the SDK's
    auto-pagination (`after` = the last id of a page) asked for the same page forever. Now a
    duplicate id is a 400 naming it, wherever the item comes in: conversation create, items
    create, a turn's input."""
    async with full_stack() as stack, _client(stack) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.conversations.create(items=[_message("msg_dup", "a"), _message("msg_dup", "b")])
        assert (info.value.body["code"], info.value.body["param"]) == ("invalid_item", "items[1].id")

        conv = await client.conversations.create(items=[_message("msg_dup", "a")])
        with pytest.raises(openai.BadRequestError) as info:
            await client.conversations.items.create(conv.id, items=[_message("msg_new", "b"), _message("msg_dup", "c")])
        assert (info.value.body["code"], info.value.body["param"]) == ("invalid_item", "items[1].id")
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", conversation=conv.id, input=[_message("msg_dup", "d")])
        assert (info.value.body["code"], info.value.body["param"]) == ("invalid_item", "input[0].id")

        # Nothing of the refused requests was kept; new ids are taken.
        await client.conversations.items.create(conv.id, items=[_message("msg_b", "b")])
        await client.responses.create(model="sim-model", conversation=conv.id, input=[_message("msg_c", "c")])

        async def every_item() -> list[str]:
            return [i.id async for i in client.conversations.items.list(conv.id, limit=1, order="asc")]

        ids = await asyncio.wait_for(every_item(), 10)  # auto-pagination ends
        assert ids[:3] == ["msg_dup", "msg_b", "msg_c"] and len(ids) == len(set(ids)) == 4
        await client.conversations.items.delete("msg_b", conversation_id=conv.id)
        assert await asyncio.wait_for(every_item(), 10) == [ids[0], *ids[2:]]  # one item deleted, one only


@pytest.mark.parametrize("speed", ["inf", "nan", "1e-300", "0", "-5", "1000@nan:5", "1000@0:inf", "1000@9:1"])
async def test_a_lab_model_speed_that_is_no_speed_fails_cleanly(speed: str, caplog) -> None:
    """`tether-lab/<workload>@<speed>`: before, `@inf` and `@nan` logged a traceback per request
    and `@1e-300` never ended. Now they fail the response at once with `invalid_request` and a
    message saying what a speed is, and nothing is logged as an error."""
    async with full_stack() as stack, _client(stack) as client:
        with caplog.at_level(logging.WARNING):
            r = await asyncio.wait_for(client.responses.create(model=f"tether-lab/chat3@{speed}", input="x"), 10)
        ok = await client.responses.create(model="tether-lab/chat3@100000@0:0", input="x")
    assert r.status == "failed" and r.error.model_extra["tether_code"] == "invalid_request"
    assert "Invalid speed" in r.error.message and "tokens/s" in r.error.message
    # Tether's own records: a client an earlier test left unclosed may be collected here, and
    # asyncio then logs its task's error, which says nothing about this request.
    assert not [rec for rec in caplog.records
                if rec.name.startswith("tether") and (rec.levelno >= logging.ERROR or rec.exc_info)]
    assert ok.status == "completed"
