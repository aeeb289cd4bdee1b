"""Item helpers every part of the core shares: the user message a plain string stands for, and
the server-made ids of items that came without one."""

from __future__ import annotations

from collections.abc import Iterable

from tether import ids
from tether.responses.v1 import items_pb2, request_pb2

_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def user_message(text: str) -> items_pb2.Item:
    """A plain-string input (`"input": "hi"`) as the one user message it stands for."""
    item = items_pb2.Item()
    item.message.role = "user"
    item.message.content.add().input_text.text = text
    return item


def request_input(params: request_pb2.ResponseCreateParams) -> list[items_pb2.Item]:
    """A create's new input as items (`input` as a string is one user message)."""
    if params.input:
        return list(params.input)
    if params.HasField("input_text"):
        return [user_message(params.input_text)]
    return []


def assign_ids(items: Iterable[items_pb2.Item]) -> None:
    """Give items that came without an `id` a server-made one (`msg_`, `fc_`, `fco_`, `rs_`)."""
    for item in items:
        arm = item.WhichOneof("item")
        prefix = _ID_PREFIX.get(arm or "")
        if prefix and arm:
            inner = getattr(item, arm)
            if not inner.id:
                inner.id = ids.new_id(prefix)


def item_key(item: items_pb2.Item) -> str:
    """Storage key of an output item: its own id (server-made, 128 random bits)."""
    arm = item.WhichOneof("item")
    inner = getattr(item, arm) if arm else None
    return getattr(inner, "id", "") or ids.new_id("itm")
