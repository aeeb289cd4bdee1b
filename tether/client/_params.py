"""Building requests from friendly Python values, and reading results.

Everything that takes "input" accepts a plain string (one user message), a list of `Item` protos,
or a list of JSON-shaped dicts (`{"type": "message", "role": "user", "content": "hi"}`, the
OpenAI Responses item shapes, read with `tether.protocol.json_codec.item_from_json`), mixed
freely. Tools may be `Tool` protos, JSON dicts (`{"type": "function", "name": ..., "parameters":
{...}}`, `{"type": "custom", "name": ..., "format": {...}}`) or plain Python functions
(`function_tool` derives the schema from the signature; `custom_tool` declares a freeform tool,
whose calls carry one input text instead of JSON arguments).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import orjson

from tether.protocol.calls import CUSTOM_OUTPUT, Call, call_of
from tether.protocol.json_codec import item_from_json, params_from_json
from tether.responses.v1 import items_pb2, request_pb2, response_pb2

InputLike = str | Sequence[items_pb2.Item | Mapping[str, Any]] | None
ToolLike = request_pb2.Tool | Mapping[str, Any] | Callable[..., Any]

__all__ = [
    "build_params",
    "to_items",
    "to_tools",
    "user_message",
    "function_call_output",
    "custom_tool_call_output",
    "tool_call_output",
    "function_tool",
    "custom_tool",
    "output_text",
    "function_calls",
    "tool_calls",
]


def user_message(text: str, *, role: str = "user") -> items_pb2.Item:
    """A message item with one `input_text` part."""
    item = items_pb2.Item()
    item.message.role = role
    item.message.content.add().input_text.text = text
    return item


def function_call_output(call_id: str, output: Any) -> items_pb2.Item:
    """The answer to a function call; non-string outputs are sent as JSON text."""
    item = items_pb2.Item()
    item.function_call_output.call_id = call_id
    item.function_call_output.output_text = output if isinstance(output, str) else orjson.dumps(output).decode()
    return item


def custom_tool_call_output(call_id: str, output: Any) -> items_pb2.Item:
    """The answer to a custom (freeform) tool call; non-string outputs are sent as JSON text."""
    text = output if isinstance(output, str) else orjson.dumps(output).decode()
    return item_from_json({"type": CUSTOM_OUTPUT, "call_id": call_id, "output": text})


def tool_call_output(call: Call, output: Any) -> items_pb2.Item:
    """The answer to `call` (from `tool_calls`): a `function_call_output` or a
    `custom_tool_call_output`, whichever answers its kind of call."""
    if call.output_type == CUSTOM_OUTPUT:
        return custom_tool_call_output(call.call_id, output)
    return function_call_output(call.call_id, output)


def to_items(value: InputLike, *, path: str = "input") -> list[items_pb2.Item]:
    """Items from a string, protos and/or JSON dicts."""
    if value is None:
        return []
    if isinstance(value, str):
        return [user_message(value)]
    if isinstance(value, items_pb2.Item | Mapping):
        value = [value]
    out: list[items_pb2.Item] = []
    for i, item in enumerate(value):
        if isinstance(item, items_pb2.Item):
            out.append(item)
        elif isinstance(item, Mapping):
            out.append(item_from_json(dict(item), f"{path}[{i}]"))
        else:
            raise TypeError(f"{path}[{i}]: expected an Item or a dict, got {type(item).__name__}")
    return out


_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                               list: "array", tuple: "array", dict: "object"}


def _schema_for(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args: Sequence[Any] = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _schema_for(args[0]) if len(args) == 1 else {}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    if origin in (list, tuple, Sequence, Iterable):
        args = typing.get_args(annotation)
        return {"type": "array", "items": _schema_for(args[0]) if args else {}}
    if origin in (dict, Mapping):
        return {"type": "object"}
    kind = _JSON_TYPES.get(annotation)
    return {"type": kind} if kind else {}


def function_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    strict: bool | None = None,
) -> request_pb2.Tool:
    """A function tool declaration. With `fn`, the name, description (first docstring paragraph)
    and JSON schema (from the annotated parameters; those without a default are required) are
    derived from it; explicit arguments win."""
    tool = request_pb2.Tool()
    f = tool.function
    f.name = name or (fn.__name__ if fn is not None else "")
    if not f.name:
        raise ValueError("function_tool needs a name or a function")
    doc = description if description is not None else (inspect.getdoc(fn) or "").split("\n\n")[0] if fn else None
    if doc:
        f.description = doc
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
        if fn is not None:
            try:
                hints = typing.get_type_hints(fn)
            except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to no types
                hints = {}
            props: dict[str, Any] = {}
            required: list[str] = []
            for pname, param in inspect.signature(fn).parameters.items():
                if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                    continue
                props[pname] = _schema_for(hints.get(pname, param.annotation))
                if param.default is param.empty:
                    required.append(pname)
            parameters = {"type": "object", "properties": props, "required": required}
    f.parameters_json = orjson.dumps(dict(parameters)).decode()
    if strict is not None:
        f.strict = strict
    return tool


def custom_tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    format: Mapping[str, Any] | None = None,
) -> request_pb2.Tool:
    """A custom (freeform) tool declaration: the model calls it with one input text (the tool
    function gets it as its single argument) instead of JSON arguments. `format` is
    `{"type": "text"}` (the default: any text) or `{"type": "grammar", "syntax": "lark" | "regex",
    "definition": ...}`. With `fn`, the name and description (first docstring paragraph) are
    taken from it; explicit arguments win."""
    tool_name = name or (fn.__name__ if fn is not None else "")
    if not tool_name:
        raise ValueError("custom_tool needs a name or a function")
    doc = description if description is not None else (inspect.getdoc(fn) or "").split("\n\n")[0] if fn else None
    body: dict[str, Any] = {"type": "custom", "name": tool_name}
    if doc:
        body["description"] = doc
    if format is not None:
        body["format"] = dict(format)
    return params_from_json({"tools": [body]}).tools[0]


def to_tools(value: Iterable[ToolLike] | Mapping[str, Callable[..., Any]] | None) -> list[request_pb2.Tool]:
    """Tool declarations from protos, JSON dicts, functions, or a `{name: function}` mapping."""
    if value is None:
        return []
    if isinstance(value, Mapping) and not _is_tool_dict(value):
        return [function_tool(fn, name=name) for name, fn in value.items()]
    out: list[request_pb2.Tool] = []
    for i, tool in enumerate(value):
        if isinstance(tool, request_pb2.Tool):
            out.append(tool)
        elif isinstance(tool, Mapping):
            decoded = params_from_json({"tools": [dict(tool)]}).tools
            if len(decoded) != 1:
                raise ValueError(f"tools[{i}]: not a tool object")
            out.append(decoded[0])
        elif callable(tool):
            out.append(function_tool(tool))
        else:
            raise TypeError(f"tools[{i}]: expected a Tool, a dict or a function, got {type(tool).__name__}")
    return out


def _is_tool_dict(value: Mapping[str, Any]) -> bool:
    return isinstance(value.get("type"), str)


def build_params(
    model: str,
    input: InputLike = None,
    *,
    tools: Iterable[ToolLike] | Mapping[str, Callable[..., Any]] | None = None,
    **fields: Any,
) -> request_pb2.ResponseCreateParams:
    """A `ResponseCreateParams`. `fields` are the create body's other keys with their JSON values
    (`instructions`, `previous_response_id`, `store`, `stream_id`, `generate`, `tool_choice`,
    `reasoning={"effort": "low"}`, `text={"format": {...}}`, `metadata`, `include`, ...);
    `None` means "not sent". Shapes are checked here, semantics by the server."""
    body = {key: value for key, value in fields.items() if value is not None}
    body["model"] = model
    params = params_from_json(body)
    if isinstance(input, str):
        params.input_text = input
    elif input is not None:
        params.input.extend(to_items(input))
    params.tools.extend(to_tools(tools))
    return params


# -- reading results ------------------------------------------------------------------------------


def output_text(response: response_pb2.Response) -> str:
    """The concatenated `output_text` of the response's assistant messages."""
    parts: list[str] = []
    for item in response.output:
        if item.WhichOneof("item") != "message":
            continue
        msg = item.message
        if msg.HasField("content_text"):
            parts.append(msg.content_text)
        for part in msg.content:
            if part.WhichOneof("part") == "output_text":
                parts.append(part.output_text.text)
    return "".join(parts)


def function_calls(response: response_pb2.Response) -> list[items_pb2.FunctionCall]:
    """The function calls the model made in this response, in order (`tool_calls` has the
    custom tool calls too)."""
    return [item.function_call for item in response.output if item.WhichOneof("item") == "function_call"]


def tool_calls(response: response_pb2.Response) -> list[Call]:
    """Every tool call the model made in this response, function and custom (freeform) alike, in
    order: `Call(call_id, name, output_type, text)`, `text` being a function's JSON arguments or a
    custom tool's input; answer each with `tool_call_output(call, output)`."""
    return [call for item in response.output if (call := call_of(item)) is not None]
