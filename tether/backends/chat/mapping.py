"""Responses request -> Chat Completions body, shaped by the backend's dialect.

`to_chat_request(request, options)` returns the upstream JSON body, or raises a 400
`TetherError` for what this server cannot do (images to a text-only model, a tool schema outside
the dialect's subset, a forced tool choice the server ignores, a reasoning effort it has no control
for, a field it refuses). The pipeline calls it before `response.created`, so those problems are a
clear request error, never a failed response. Responses-only fields (store, metadata,
previous_response_id, include, truncation, background) are never sent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tether import errors
from tether.backends.base import BackendRequest
from tether.backends.chat.dialects import Dialect, ModelCaps, reasoning_controls
from tether.backends.chat.schema import reduce_schema
from tether.compaction_codec import decode_summary
from tether.errors import TetherError
from tether.protocol.json_codec import item_to_json
from tether.responses.v1 import items_pb2, request_pb2

log = logging.getLogger(__name__)

COMPACTION_PREFIX = "Summary of the earlier conversation:\n\n"

# Fields whose absence changes nothing the client can observe (hints and identifiers): dropped
# for a dialect that rejects them. Any other rejected field the request needs is refused (400).
ADVISORY_FIELDS = frozenset({"user", "prompt_cache_key", "parallel_tool_calls"})
# The Responses parameter behind each upstream field (for the 400's `param`).
_PARAM_OF = {
    "reasoning_effort": "reasoning.effort",
    "response_format": "text.format",
    "service_tier": "service_tier",
    "verbosity": "text.verbosity",
    "logprobs": "include",
    "top_logprobs": "top_logprobs",
}
_DEFAULT_TIERS = ("", "auto", "default")


@dataclass(frozen=True)
class MappingOptions:
    dialect: Dialect
    tools: bool = True  # the backend takes function tools (False: a request with tools is a 400)
    parallel_tool_calls: bool = True  # False: calls are always asked for one at a time
    images: bool = False
    hosted_tools: bool = False
    reasoning: bool = False  # the backend may send a reasoning effort (config capability)
    json_schema: bool = True  # the backend accepts response_format json_schema
    developer_role: str = "system"  # role used for `developer` messages
    default_max_output_tokens: int | None = None  # sent when the request sets no cap
    stream: bool = True  # stream upstream (False: one JSON reply, the server's exact usage)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    # What the server reports about the requested model (`Dialect.model_info`); `images`,
    # `json_schema` and `tools` above already include it, the output limit is checked here.
    model: ModelCaps = field(default_factory=ModelCaps)


def decode_compaction(item: items_pb2.CompactionItem) -> str:
    """The summary text a compaction item carries ("" when the blob is not Tether's)."""
    try:
        return decode_summary(item.encrypted_content)
    except ValueError as exc:
        raise TetherError(errors.INVALID_ITEM, str(exc), param="input") from exc


def _invalid(message: str, param: str, code: str = errors.INVALID_REQUEST) -> TetherError:
    return TetherError(code, message, param=param)


def _message_content(msg: items_pb2.Message, opts: MappingOptions, param: str) -> str | list[dict[str, Any]]:
    if msg.HasField("content_text"):
        return msg.content_text
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    has_image = False
    for p in msg.content:
        arm = p.WhichOneof("part")
        if arm == "input_text":
            text = p.input_text.text
        elif arm == "output_text":
            text = p.output_text.text
        elif arm == "refusal":
            text = p.refusal.refusal
        elif arm == "input_image":
            if not opts.images:
                raise _invalid("this model does not accept images (input_image)", param, errors.UNSUPPORTED)
            img = p.input_image
            if not img.HasField("image_url") or not img.image_url:
                raise _invalid(
                    "input_image needs an image_url (file_id is not supported here)", param, errors.UNSUPPORTED
                )
            url: dict[str, Any] = {"url": img.image_url}
            if img.detail and img.detail != "auto":
                url["detail"] = img.detail
            parts.append({"type": "image_url", "image_url": url})
            has_image = True
            continue
        elif arm == "input_file":
            raise _invalid("input_file is not supported by this backend", param, errors.UNSUPPORTED)
        else:
            log.debug("dropping unsupported content part %s", arm)
            continue
        texts.append(text)
        parts.append({"type": "text", "text": text})
    if has_image:
        return parts
    return "\n".join(texts)


def _tool_output_text(out: items_pb2.FunctionCallOutput) -> str:
    if out.WhichOneof("output") != "output_json":
        return out.output_text
    try:
        parts = orjson.loads(out.output_json)
    except orjson.JSONDecodeError:
        return out.output_json
    if isinstance(parts, list):
        texts = [p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if texts or not parts:
            return "\n".join(texts)
    return out.output_json


def _reasoning_text(r: items_pb2.ReasoningItem) -> str:
    return "\n".join(r.content) if r.content else "\n".join(r.summary)


# Responses item types Tether does not model (they travel whole in `Item.other`) that are tool
# calls and their outputs: carried into the chat history as function calls and tool messages, so
# the model sees a custom tool's (Codex's `apply_patch`) or a shell's calls and results.
_OTHER_CALLS = {"custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call"}
_OTHER_OUTPUTS = {"custom_tool_call_output", "local_shell_call_output", "shell_call_output", "apply_patch_call_output"}
# Hosted-tool items that hold a call and its result in one item: each becomes an assistant tool
# call (named after the tool, its inputs as arguments) followed by the tool message with its
# result, so the model sees what was searched or run and what came back. The value names the
# keys that are the call's inputs; every other key but the bookkeeping ones is its result.
_HOSTED_CALLS: dict[str, tuple[str, ...]] = {
    "web_search_call": ("action",),
    "file_search_call": ("queries",),
    "code_interpreter_call": ("code", "container_id"),
    "mcp_list_tools": ("server_label",),
}
_BOOKKEEPING = frozenset({"type", "id", "call_id", "status", "name"})
# Items that cannot be put into a Chat Completions context faithfully (an image in a tool result,
# a generated image): a 400 naming the item, never a silent drop.
_UNREPRESENTABLE = {
    "computer_call_output": "its screenshot is an image, which a Chat Completions tool message cannot carry",
    "image_generation_call": "its generated image cannot be put into a Chat Completions context",
}


Call = tuple[str, str, str]  # (call_id, name, arguments JSON)
Output = tuple[str, str]  # (call_id, text)


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _other_as_chat(item: items_pb2.OtherItem, param: str) -> tuple[Call | None, Output | None]:
    """An item Tether does not model as (the tool call, the tool output) it is in a chat history:
    a custom tool call (`{"input": ...}`), a shell, apply_patch or computer call (its `action` /
    `operation`, under the name `shell` / `local_shell` / `apply_patch` / `computer`), their
    outputs, a hosted-tool item (both at once), an MCP approval request (a call) and its response
    (an output). Raises a 400 naming `param` for an item that cannot be represented."""
    kind = item.type
    if kind in _UNREPRESENTABLE:
        raise _invalid(f"{param} ({kind}): {_UNREPRESENTABLE[kind]}", param, errors.UNSUPPORTED)
    try:
        obj = orjson.loads(item.json)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise _invalid(f"{param}: an item of type {kind!r} must be a JSON object", param)
    call_id = str(obj.get("call_id") or obj.get("id") or "")
    if kind == "custom_tool_call":
        return (call_id, str(obj.get("name", "")), orjson.dumps({"input": obj.get("input", "")}).decode()), None
    if kind == "apply_patch_call":
        return (call_id, "apply_patch", orjson.dumps(obj.get("operation", {})).decode()), None
    if kind in _OTHER_CALLS or kind == "computer_call":
        return (call_id, kind.removesuffix("_call"), orjson.dumps(obj.get("action", {})).decode()), None
    if kind in _OTHER_OUTPUTS:
        return None, (call_id, _json_text(obj.get("output", "")))
    if kind in _HOSTED_CALLS:
        inputs = {k: obj[k] for k in _HOSTED_CALLS[kind] if k in obj}
        name = kind.removesuffix("_call")
        result = {k: v for k, v in obj.items() if k not in _BOOKKEEPING and k not in inputs}
        if "status" in obj:
            result["status"] = obj["status"]
        return (call_id, name, orjson.dumps(inputs).decode()), (call_id, orjson.dumps(result).decode())
    if kind == "mcp_approval_request":
        args = {"server_label": obj.get("server_label"), "tool": obj.get("name"), "arguments": obj.get("arguments")}
        return (str(obj.get("id", "")), "mcp_approval_request", orjson.dumps(args).decode()), None
    if kind == "mcp_approval_response":
        reason = obj.get("reason")
        verdict = ("approved" if obj.get("approve") else "denied") + (f": {reason}" if reason else "")
        return None, (str(obj.get("approval_request_id", "")), verdict)
    raise _invalid(f"{param}: an item of type {kind!r} cannot be put into this backend's context", param,
                   errors.UNSUPPORTED)


_MCP_ARMS = frozenset({"mcp_list_tools", "mcp_approval_request", "mcp_approval_response"})


def _as_other(item: items_pb2.Item) -> items_pb2.OtherItem:
    """A modelled MCP item as the `OtherItem` (its JSON) that `_other_as_chat` reads."""
    obj = item_to_json(item)
    return items_pb2.OtherItem(type=obj["type"], json=orjson.dumps(obj).decode())


def _custom_input(item: items_pb2.OtherItem) -> str | None:
    """A custom tool call's `input` text (None for any other item)."""
    if item.type != "custom_tool_call":
        return None
    value = orjson.loads(item.json).get("input", "")
    return value if isinstance(value, str) else _json_text(value)


def to_chat_messages(
    instructions: str | None, items: Sequence[items_pb2.Item], opts: MappingOptions
) -> list[dict[str, Any]]:
    """The `messages` array: consecutive function calls and the assistant text just before them
    become one assistant message; reasoning rides on the next assistant message (when the dialect
    sends it back). Where the dialect checks tool-message order (`Dialect.tool_order_checked`)
    a history the server would refuse is a 400 naming the input item (`check_tool_order`)."""
    history_field = opts.dialect.reasoning_history_field
    msgs: list[dict[str, Any]] = []
    calls_from: dict[int, str] = {}  # id() of a tool call entry -> the input item it came from
    outputs_from: dict[int, str] = {}  # id() of a tool message -> the input item it came from
    if instructions:
        msgs.append({"role": "system", "content": instructions})
    open_assistant: dict[str, Any] | None = None  # the assistant message that can still take tool_calls
    reasoning: list[str] = []

    def attach_reasoning(msg: dict[str, Any]) -> None:
        if reasoning and history_field:
            prev = msg.get(history_field)
            text = "\n".join(reasoning)
            msg[history_field] = f"{prev}\n{text}" if prev else text
        reasoning.clear()

    def add_call(call_id: str, name: str, arguments: str, custom_input: str | None = None) -> None:
        """A function call; a custom tool call natively (`custom_input`) where the dialect takes it."""
        nonlocal open_assistant
        if custom_input is not None and opts.dialect.custom_tools:
            call: dict[str, Any] = {"id": call_id, "type": "custom", "custom": {"name": name, "input": custom_input}}
        else:
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        if open_assistant is None:
            open_assistant = {"role": "assistant", "content": opts.dialect.tool_calls_content}
            msgs.append(open_assistant)
        attach_reasoning(open_assistant)
        open_assistant.setdefault("tool_calls", []).append(call)
        calls_from[id(call)] = param

    def add_output(call_id: str, text: str) -> None:
        nonlocal open_assistant
        msg = {"role": "tool", "tool_call_id": call_id, "content": text}
        msgs.append(msg)
        outputs_from[id(msg)] = param
        open_assistant = None
        reasoning.clear()

    for i, item in enumerate(items):
        arm = item.WhichOneof("item")
        param = f"input[{i}]"
        if arm == "message":
            m = item.message
            role = m.role or "user"
            if role == "developer":
                role = opts.developer_role
            elif role not in ("user", "system", "assistant"):
                raise _invalid(f"unsupported message role {m.role!r}", f"{param}.role")
            content = _message_content(m, opts, f"{param}.content")
            msg: dict[str, Any] = {"role": role, "content": content}
            if role == "assistant":
                if not isinstance(content, str):
                    raise _invalid("assistant messages cannot carry images", f"{param}.content")
                attach_reasoning(msg)
                open_assistant = msg
            else:
                reasoning.clear()
                open_assistant = None
            msgs.append(msg)
        elif arm == "function_call":
            fc = item.function_call
            add_call(fc.call_id, fc.name, fc.arguments or "{}")
        elif arm == "function_call_output":
            out = item.function_call_output
            add_output(out.call_id, _tool_output_text(out))
        elif arm == "mcp_call":  # a call Tether made: the model's call as generated, then its result
            mc = item.mcp_call
            add_call(mc.id, mc.name, mc.arguments or "{}")
            add_output(mc.id, mc.output if mc.HasField("output") else f"error: {mc.error_json or 'no output'}")
        elif arm in _MCP_ARMS:
            call, output = _other_as_chat(_as_other(item), param)
            if call is not None:
                add_call(*call)
            if output is not None:
                add_output(*output)
        elif arm == "other":
            call, output = _other_as_chat(item.other, param)
            if call is not None:
                add_call(*call, custom_input=_custom_input(item.other))
            if output is not None:
                add_output(*output)
        elif arm == "reasoning":
            text = _reasoning_text(item.reasoning)
            if text:
                reasoning.append(text)
        elif arm == "compaction":
            summary = decode_compaction(item.compaction)
            if summary:
                msgs.append({"role": "system", "content": COMPACTION_PREFIX + summary})
            else:
                log.debug("dropping a compaction item without a readable summary")
            open_assistant = None
            reasoning.clear()
        else:
            log.debug("dropping %s item not understood by chat completions", arm)
    if opts.dialect.tool_order_checked:
        check_tool_order(msgs, calls_from, outputs_from, opts.dialect)
    return msgs


def check_tool_order(
    msgs: Sequence[Mapping[str, Any]], calls_from: Mapping[int, str], outputs_from: Mapping[int, str], dialect: Dialect
) -> None:
    """What Cerebras (API version 2) refuses, refused first with Tether's own 400 naming the input
    item: each tool call of an assistant message answered by the tool messages right after it, no
    tool message answering anything else, no call id used twice. A stateless history produces
    these (a call whose output was left out, an output kept past a compaction, a repeated id);
    the server would answer with a bare validation error about `messages[n]`."""
    seen: set[str] = set()
    pending: dict[str, str] = {}  # call id -> its input item, awaiting its tool message
    for msg in msgs:
        if msg.get("role") == "tool":
            cid = str(msg.get("tool_call_id", ""))
            if cid not in pending:
                where = outputs_from.get(id(msg), "input")
                why = "an earlier" if cid in seen else "no"
                raise _invalid(
                    f"{where}: the tool output for call {cid!r} answers {why} call just before it; "
                    f"{dialect.server} needs each output right after the call it answers",
                    where,
                    errors.INVALID_ITEM,
                )
            del pending[cid]
            continue
        if pending:
            _unanswered(pending, dialect)
        for call in msg.get("tool_calls") or ():
            cid = str(call.get("id", ""))
            where = calls_from.get(id(call), "input")
            if cid in seen:
                raise _invalid(
                    f"{where}: call id {cid!r} is used by an earlier call too; {dialect.server} needs "
                    "every call id of a request to be unique",
                    where,
                    errors.INVALID_ITEM,
                )
            seen.add(cid)
            pending[cid] = where
    if pending:
        _unanswered(pending, dialect)


def _unanswered(pending: Mapping[str, str], dialect: Dialect) -> None:
    cid, where = next(iter(pending.items()))
    raise _invalid(
        f"{where}: the call {cid!r} has no tool output right after it; {dialect.server} needs each "
        "call's output (function_call_output) to follow it before any other message",
        where,
        errors.INVALID_ITEM,
    )


def _format_note(fmt: Any) -> str:
    """What an emulated custom tool's `input` must be: its format in words (a grammar verbatim)."""
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        return (
            f"The raw input for the tool. It must match this {fmt.get('syntax')} grammar:\n"
            f"{fmt.get('definition', '')}"
        )
    return "The raw input for the tool, as free-form text."


def _custom_tool(obj: dict[str, Any], opts: MappingOptions) -> dict[str, Any]:
    """A custom (freeform) tool: natively (`{"type": "custom", "custom": {...}}`) where the dialect
    takes it, else the function that emulates it (`{"input": string}`)."""
    name = obj.get("name", "")
    fmt = obj.get("format")
    if opts.dialect.custom_tools:
        custom: dict[str, Any] = {"name": name}
        if isinstance(obj.get("description"), str):
            custom["description"] = obj["description"]
        if isinstance(fmt, dict) and fmt.get("type") == "grammar":
            custom["format"] = {
                "type": "grammar",
                "grammar": {"syntax": fmt.get("syntax"), "definition": fmt.get("definition")},
            }
        elif isinstance(fmt, dict):
            custom["format"] = {"type": "text"}
        return {"type": "custom", "custom": custom}
    fn: dict[str, Any] = {"name": name}
    if isinstance(obj.get("description"), str):
        fn["description"] = obj["description"]
    fn["parameters"] = {
        "type": "object",
        "properties": {"input": {"type": "string", "description": _format_note(fmt)}},
        "required": ["input"],
    }
    return {"type": "function", "function": fn}


def emulated_custom_tools(tools: Sequence[request_pb2.Tool], dialect: Dialect) -> frozenset[str]:
    """Names of the custom tools sent as emulating functions (their calls are read back as custom
    tool calls); empty where the dialect takes custom tools natively."""
    if dialect.custom_tools:
        return frozenset()
    names = set()
    for t in tools:
        if t.WhichOneof("tool") == "other" and t.other.type == "custom":
            obj = orjson.loads(t.other.json)
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                names.add(obj["name"])
    return frozenset(names)


def _tool_name(tool: Mapping[str, Any]) -> Any:
    """The name of an upstream tool entry (function or custom)."""
    return (tool.get(tool.get("type")) or {}).get("name")  # type: ignore[arg-type]  # no `type`: get(None) finds nothing


def _tool_ref(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The upstream named choice of one tool entry."""
    return {"type": tool["type"], tool["type"]: {"name": _tool_name(tool)}}


def to_chat_tools(tools: Sequence[request_pb2.Tool], opts: MappingOptions) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, t in enumerate(tools):
        arm = t.WhichOneof("tool")
        if arm == "other" and t.other.type == "custom":
            out.append(_custom_tool(orjson.loads(t.other.json), opts))
        elif arm == "function":
            f = t.function
            try:
                params = (
                    orjson.loads(f.parameters_json) if f.parameters_json else {"type": "object", "properties": {}}
                )
            except orjson.JSONDecodeError:
                raise _invalid(f"tool {f.name!r}: parameters is not valid JSON", f"tools[{i}].parameters") from None
            if opts.dialect.schema_subset:
                strict = f.HasField("strict") and f.strict
                params = reduce_schema(
                    params, opts.dialect.schema_subset, f"tools[{i}].parameters", f.name, strict=strict
                )
            fn: dict[str, Any] = {"name": f.name}
            if f.HasField("description"):
                fn["description"] = f.description
            fn["parameters"] = params
            if f.HasField("strict"):
                fn["strict"] = f.strict
            out.append({"type": "function", "function": fn})
        elif arm == "other" and opts.hosted_tools:
            out.append(orjson.loads(t.other.json))
        else:
            log.debug("dropping non-function tool %s", t.other.type if arm == "other" else arm)
    return out


def _forced(mode: str, tools: list[dict[str, Any]], dialect: Dialect) -> Any:
    """`required` for a server that does not honour it: the one tool by name, else a 400."""
    if mode != "required" or dialect.tool_choice_required:
        return mode
    if len(tools) == 1:
        return _tool_ref(tools[0])
    raise _invalid(
        f'tool_choice "required" with {len(tools)} tools cannot be honoured by {dialect.server}: it would '
        "answer with plain text; name the function to call in tool_choice",
        "tool_choice",
        errors.UNSUPPORTED,
    )


def _unmapped_choice(kind: str, dialect: Dialect) -> TetherError:
    why = "no mcp tool of this create names that server" if kind == "mcp" else "Tether runs no hosted tools"
    return _invalid(
        f"tool_choice of type {kind!r} cannot be honoured by {dialect.server}: {why}",
        "tool_choice",
        errors.UNSUPPORTED,
    )


def _named(name: str, tools: list[dict[str, Any]], kind: str = "function") -> dict[str, Any]:
    """The upstream choice of the `kind` tool (function, custom) called `name`: a custom tool's
    emulating function where the dialect has no custom tools."""
    for t in tools:
        if _tool_name(t) == name and (t["type"] == kind or kind == "custom"):
            return _tool_ref(t)
    raise _invalid(f"tool_choice names the {kind} tool {name!r}, which is not in 'tools'", "tool_choice")


def _tool_choice(
    choice: request_pb2.ToolChoice | None, tools: list[dict[str, Any]], opts: MappingOptions
) -> tuple[Any | None, list[dict[str, Any]]]:
    """The upstream tool_choice (None: omit) and the tool list (allowed_tools constrains the choice
    where the dialect takes it, else narrows the list). An object form the dialect does not map
    (`Dialect.tool_choice_types`) is a 400 naming `tool_choice`, with or without tools."""
    dialect = opts.dialect
    if choice is None:
        return None, tools
    arm = choice.WhichOneof("choice")
    if arm == "mode":
        if choice.mode not in ("auto", "none", "required") or not tools:
            return None, tools
        return _forced(choice.mode, tools, dialect), tools
    if arm == "function_name":
        return _named(choice.function_name, tools), tools
    if arm != "other_json":
        return None, tools
    try:
        obj = orjson.loads(choice.other_json)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):  # the validate stage refuses this first; a direct caller may not
        raise _invalid("tool_choice must be a mode or an object with a 'type'", "tool_choice")
    kind = obj.get("type")
    if kind not in dialect.tool_choice_types:
        if opts.hosted_tools and kind not in ("custom", "mcp", "function", "allowed_tools"):
            return obj, tools  # forwarded with the hosted tools themselves
        raise _unmapped_choice(str(kind), dialect)
    if kind in ("function", "custom"):
        return _named(str(obj.get("name", "")), tools, kind), tools
    # allowed_tools
    listed = obj.get("tools")
    allowed = {t.get("name") for t in listed if isinstance(t, dict)} - {None} if isinstance(listed, list) else set()
    narrowed = [t for t in tools if _tool_name(t) in allowed]
    mode = obj.get("mode", "auto")
    mode = mode if mode in ("auto", "required") else "auto"
    if dialect.allowed_tools_choice:  # a constraint on the choice; the list stays whole
        names = [_tool_ref(t) for t in narrowed]
        return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": names}}, tools
    return _forced(mode, narrowed, dialect), narrowed


def forces_tool_call(body: Mapping[str, Any]) -> bool:
    """The body obliges the model to call a tool (checked on the answer: see the adapter)."""
    choice = body.get("tool_choice")
    return bool(body.get("tools")) and (choice == "required" or isinstance(choice, dict))


def _response_format(fmt: request_pb2.TextFormat | None, opts: MappingOptions) -> dict[str, Any] | None:
    if fmt is None or fmt.type in ("", "text"):
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.type == "json_schema":
        if not opts.json_schema:
            raise _invalid("this backend cannot enforce a JSON schema (text.format json_schema)",
                           "text.format", errors.UNSUPPORTED)
        try:
            schema = orjson.loads(fmt.schema_json) if fmt.schema_json else {}
        except orjson.JSONDecodeError:
            raise _invalid("text.format.schema is not valid JSON", "text.format.schema") from None
        if opts.dialect.schema_subset:
            strict = fmt.HasField("strict") and fmt.strict
            schema = reduce_schema(
                schema, opts.dialect.schema_subset, "text.format.schema", fmt.name or "response", strict=strict
            )
        js: dict[str, Any] = {"name": fmt.name or "response", "schema": schema}
        if fmt.HasField("strict"):
            js["strict"] = fmt.strict
        return {"type": "json_schema", "json_schema": js}
    raise _invalid(f"unsupported text.format type {fmt.type!r}", "text.format.type")


def _sends_reasoning_back(messages: Sequence[Mapping[str, Any]], dialect: Dialect) -> bool:
    return dialect.reasoning_history_field is not None and any(
        m.get(dialect.reasoning_history_field) for m in messages if m.get("role") == "assistant"
    )


def to_chat_request(request: BackendRequest, opts: MappingOptions) -> dict[str, Any]:
    """The chat-completions body for one backend request (raises a 400 TetherError, see above)."""
    dialect = opts.dialect
    body: dict[str, Any] = {
        "model": request.model,
        "messages": to_chat_messages(request.instructions, request.items, opts),
    }
    tools = to_chat_tools(request.tools, opts)
    if tools and not opts.tools:
        raise _invalid("this backend does not take tools (backend option tools = false)", "tools", errors.UNSUPPORTED)
    if tools and opts.model.tools is False:
        raise _invalid(f"model {request.model!r} does not take tools (the server's model info says so)",
                       "tools", errors.UNSUPPORTED)
    choice, tools = _tool_choice(request.tool_choice, tools, opts)
    if tools:
        body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
        if not (request.parallel_tool_calls and opts.parallel_tool_calls):
            body["parallel_tool_calls"] = False
    most = opts.model.max_completion_tokens
    if request.max_output_tokens and most and request.max_output_tokens > most:
        raise _invalid(
            f"max_output_tokens {request.max_output_tokens} is over model {request.model!r}'s limit of {most}",
            "max_output_tokens",
        )
    limit = request.max_output_tokens or opts.default_max_output_tokens
    if limit and most:
        limit = min(limit, most)
    if limit:
        body[dialect.max_tokens_field] = limit
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    controls = reasoning_controls(dialect, request.model, request.reasoning_effort, opts.reasoning, opts.model)
    body.update(controls.fields)
    if dialect.clear_thinking and controls.fields and _sends_reasoning_back(body["messages"], dialect):
        body["clear_thinking"] = False  # keep the reasoning Tether sends back (the default drops it)
    fmt = _response_format(request.text_format, opts)
    if fmt is not None:
        body["response_format"] = fmt
    if request.verbosity:
        body["verbosity"] = request.verbosity
    if request.logprobs is not None:
        body["logprobs"] = True
        if request.logprobs:
            body["top_logprobs"] = request.logprobs
    if request.user:
        body["user"] = request.user
    if request.prompt_cache_key:  # the tenant's own key: two tenants' equal keys never meet upstream
        body["prompt_cache_key"] = request.scoped_cache_key(request.prompt_cache_key)
    salt = request.cache_salt() if dialect.cache_salt else None
    if salt is not None:
        body["cache_salt"] = salt
    if request.service_tier:
        tiers = dialect.service_tiers
        if tiers is not None and request.service_tier not in tiers:
            raise _invalid(
                f"service_tier {request.service_tier!r} is not offered by {dialect.server} ({', '.join(tiers)})",
                "service_tier",
                errors.UNSUPPORTED,
            )
        body["service_tier"] = request.service_tier
    stream = opts.stream and not (
        tools and body.get("tool_choice", "auto") == "auto" and not dialect.stream_auto_tool_choice
    )
    body["stream"] = stream
    if stream and dialect.usage_in_stream:
        body["stream_options"] = {"include_usage": True}
    for name in dialect.rejected_fields & set(body):
        if name not in ADVISORY_FIELDS and not (name == "service_tier" and body[name] in _DEFAULT_TIERS):
            raise _invalid(
                f"{dialect.server} does not accept {name!r}, which this request needs",
                _PARAM_OF.get(name, name),
                errors.UNSUPPORTED,
            )
        del body[name]
    body.update(opts.extra_body)
    body.update(request.upstream_fields)  # a backend pool's cache/slot hints
    return body
