"""Which items are tool calls the client answers, and which items answer them.

Function calls are modelled items (`function_call` / `function_call_output`); custom (freeform)
tool calls and their outputs travel whole as `OtherItem`s (`custom_tool_call` /
`custom_tool_call_output`, e.g. Codex's freeform `apply_patch`). The chain's open calls, the
validate stage's call-id check, steering's `required_input` and the simulated model all ask here,
so a custom call is a call everywhere a function call is.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from tether.responses.v1 import items_pb2

CUSTOM_CALL = "custom_tool_call"
CUSTOM_OUTPUT = "custom_tool_call_output"


@dataclass(frozen=True, slots=True)
class Call:
    call_id: str
    name: str
    output_type: str  # the item type that answers it
    text: str  # what the model generated: a function's arguments, a custom tool's input


def _other_fields(item: items_pb2.Item, kind: str) -> dict | None:
    if item.WhichOneof("item") != "other" or item.other.type != kind:
        return None
    try:
        obj = orjson.loads(item.other.json)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def call_of(item: items_pb2.Item) -> Call | None:
    """The tool call `item` makes (a function call or a custom tool call), else None."""
    arm = item.WhichOneof("item")
    if arm == "function_call":
        fc = item.function_call
        return Call(fc.call_id, fc.name, "function_call_output", fc.arguments)
    obj = _other_fields(item, CUSTOM_CALL)
    if obj is None:
        return None
    text = obj.get("input")
    return Call(str(obj.get("call_id") or ""), str(obj.get("name") or ""), CUSTOM_OUTPUT,
                text if isinstance(text, str) else "")  # fmt: skip


def answered_call_id(item: items_pb2.Item) -> str | None:
    """The call_id `item` answers (a function call output or a custom tool call output), else None."""
    if item.WhichOneof("item") == "function_call_output":
        return item.function_call_output.call_id
    obj = _other_fields(item, CUSTOM_OUTPUT)
    if obj is None:
        return None
    return str(obj.get("call_id") or "")


def custom_call_item(item_id: str, call_id: str, name: str, input_text: str, status: str) -> items_pb2.Item:
    """A `custom_tool_call` output item."""
    obj = {"type": CUSTOM_CALL, "id": item_id, "call_id": call_id, "name": name, "input": input_text,
           "status": status}  # fmt: skip
    item = items_pb2.Item()
    item.other.type = CUSTOM_CALL
    item.other.json = orjson.dumps(obj).decode()
    return item
