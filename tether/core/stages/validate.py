"""Validation: structure, sizes and call_id bookkeeping of a create, O(new input).

Request-level checks look at the params only; item checks look only at the new items, using the
open tool calls carried on the parent chain node (a function_call_output or custom_tool_call_output
must answer a call that is still open in the conversation it continues, or one made earlier in the
same input).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence

import orjson

from tether import errors, ids
from tether.compaction_codec import is_tether_payload
from tether.config import Limits
from tether.core.stages import fields
from tether.errors import TetherError
from tether.protocol.calls import CUSTOM_CALL, CUSTOM_OUTPUT
from tether.responses.v1 import items_pb2, request_pb2

STREAM_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")
_ROLES = {"user", "developer", "system", "assistant"}
_FUNCTION_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_TOOL_CHOICE_MODES = {"auto", "none", "required"}
# Enumerated fields echoed in the Response: the values the Responses API (and its SDKs) accept.
_FORMAT_TYPES = {"text", "json_schema", "json_object"}
_EFFORTS = {"none", "minimal", "low", "medium", "high", "xhigh"}
_SUMMARIES = {"auto", "concise", "detailed"}
_VERBOSITY = {"low", "medium", "high"}
_TRUNCATION = {"auto", "disabled"}
_SERVICE_TIERS = {"auto", "default", "flex", "scale", "priority"}
MAX_TOP_LOGPROBS = 20  # the API's own bound


def check_stream_id(stream_id: str) -> None:
    if stream_id and not STREAM_ID_RE.match(stream_id):
        raise TetherError(
            errors.INVALID_STREAM_ID,
            "Invalid 'stream_id': expected 1-256 characters of [A-Za-z0-9_.-].",
            param="stream_id",
        )


def validate_params(
    params: request_pb2.ResponseCreateParams, limits: Limits, accept_unknown: Iterable[str] = ()
) -> None:
    """Request-level checks (everything but the items' call bookkeeping)."""
    fields.check_declared(params, accept_unknown)
    if not params.model:
        raise TetherError(errors.MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'model'.", param="model")
    if params.HasField("background") and params.background:
        raise TetherError(
            errors.BACKGROUND_NOT_SUPPORTED,
            "background=true is served by POST /v1/responses over HTTP and by the gRPC CreateBackgroundResponse "
            "RPC (then poll, stream or cancel it by id); a WebSocket, a gRPC Session or CreateResponse streams "
            "each response on its connection.",
            param="background",
        )
    check_stream_id(params.stream_id)
    if params.HasField("max_output_tokens") and not 1 <= params.max_output_tokens <= limits.max_output_tokens:
        raise TetherError(
            errors.INVALID_REQUEST,
            f"'max_output_tokens' must be between 1 and {limits.max_output_tokens}.",
            param="max_output_tokens",
        )
    if params.HasField("temperature") and not 0.0 <= params.temperature <= 2.0:
        raise TetherError(errors.INVALID_REQUEST, "'temperature' must be between 0 and 2.", param="temperature")
    if params.HasField("top_p") and not 0.0 <= params.top_p <= 1.0:
        raise TetherError(errors.INVALID_REQUEST, "'top_p' must be between 0 and 1.", param="top_p")
    if params.HasField("top_logprobs") and not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
        raise TetherError(
            errors.INVALID_REQUEST, f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}.", param="top_logprobs"
        )
    _check_logprobs_volume(params, limits)
    check_metadata(params.metadata, limits)
    if params.previous_response_id and not ids.well_formed(params.previous_response_id):
        raise TetherError(errors.PREVIOUS_RESPONSE_NOT_FOUND, "'previous_response_id' is not the id of a response.",
                          param="previous_response_id")  # fmt: skip
    if params.conversation and params.previous_response_id:
        raise TetherError(
            errors.INVALID_REQUEST,
            "Mutually exclusive parameters: send only one of 'previous_response_id' or 'conversation'.",
            param="conversation",
        )
    if len(params.input) > limits.max_input_items:
        raise TetherError(
            errors.TOO_MANY_ITEMS, f"'input' has {len(params.input)} items; the limit is {limits.max_input_items}.",
            param="input",
        )
    if len(params.tools) > limits.max_tools:
        raise TetherError(errors.INVALID_REQUEST, f"At most {limits.max_tools} tools are allowed.", param="tools")
    _check_tools(params)
    if params.tool_choice.WhichOneof("choice") == "mode" and params.tool_choice.mode not in _TOOL_CHOICE_MODES:
        raise TetherError(errors.INVALID_REQUEST, "'tool_choice' must be auto, none or required.", param="tool_choice")
    _check_enums(params)
    for i, cm in enumerate(params.context_management):
        if cm.type != "compaction":
            raise TetherError(
                errors.INVALID_REQUEST, "context_management supports only type 'compaction'.",
                param=f"context_management[{i}].type",
            )
        if cm.HasField("compact_threshold") and cm.compact_threshold < 1000:
            raise TetherError(
                errors.INVALID_REQUEST, "compact_threshold must be at least 1000.",
                param=f"context_management[{i}].compact_threshold",
            )


def logprobs_output_cap(params: request_pb2.ResponseCreateParams, limits: Limits) -> int | None:
    """The most output tokens a create asking for log probabilities may have (`max_logprobs` /
    (1 + top_logprobs)); None when it asks for none."""
    top = fields.requested_logprobs(params)
    return None if top is None else max(1, limits.max_logprobs // (1 + top))


def _check_logprobs_volume(params: request_pb2.ResponseCreateParams, limits: Limits) -> None:
    cap = logprobs_output_cap(params, limits)
    if cap is not None and params.HasField("max_output_tokens") and params.max_output_tokens > cap:
        top = params.top_logprobs if params.HasField("top_logprobs") else 0
        raise TetherError(
            errors.INVALID_REQUEST,
            f"With log probabilities (top_logprobs {top}) 'max_output_tokens' can be at most {cap}: a response "
            f"carries at most {limits.max_logprobs} log probabilities (tokens x (1 + top_logprobs)).",
            param="max_output_tokens",
        )


def check_metadata(metadata: Mapping[str, str], limits: Limits) -> None:
    """`metadata` of a create or a conversation: at most `max_metadata_pairs`, short keys and values."""
    if len(metadata) > limits.max_metadata_pairs:
        raise TetherError(
            errors.INVALID_REQUEST, f"'metadata' may hold at most {limits.max_metadata_pairs} pairs.", param="metadata"
        )
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise TetherError(
                errors.INVALID_REQUEST, "metadata keys are at most 64 and values 512 characters.", param="metadata"
            )


def _enum(value: str, allowed: set[str], param: str) -> None:
    if value not in allowed:
        raise TetherError(
            errors.INVALID_REQUEST, f"Invalid value for '{param}': expected one of {', '.join(sorted(allowed))}.",
            param=param,
        )


def _check_enums(params: request_pb2.ResponseCreateParams) -> None:
    """Fields the Response echoes: only values a client (and its SDK) can read back."""
    if params.HasField("text"):
        if params.text.HasField("format"):
            fmt = params.text.format
            _enum(fmt.type, _FORMAT_TYPES, "text.format.type")
            if fmt.type == "json_schema":
                if not fmt.name:
                    raise TetherError(
                        errors.MISSING_REQUIRED_PARAMETER, "Missing required parameter: 'text.format.name'.",
                        param="text.format.name",
                    )
                try:
                    schema = orjson.loads(fmt.schema_json) if fmt.schema_json else None
                except orjson.JSONDecodeError:
                    schema = None
                if not isinstance(schema, dict):
                    raise TetherError(
                        errors.INVALID_REQUEST, "'text.format.schema' must be a JSON Schema object.",
                        param="text.format.schema",
                    )
        if params.text.HasField("verbosity"):
            _enum(params.text.verbosity, _VERBOSITY, "text.verbosity")
    if params.HasField("reasoning"):
        if params.reasoning.HasField("effort"):
            _enum(params.reasoning.effort, _EFFORTS, "reasoning.effort")
        if params.reasoning.HasField("summary"):
            _enum(params.reasoning.summary, _SUMMARIES, "reasoning.summary")
    if params.tool_choice.WhichOneof("choice") == "other_json":
        try:
            choice = orjson.loads(params.tool_choice.other_json)
        except orjson.JSONDecodeError:
            choice = None
        if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
            raise TetherError(
                errors.INVALID_REQUEST, "'tool_choice' must be auto, none, required or an object with a 'type'.",
                param="tool_choice",
            )
    if params.truncation:
        _enum(params.truncation, _TRUNCATION, "truncation")
    if params.service_tier:
        _enum(params.service_tier, _SERVICE_TIERS, "service_tier")


def _check_tools(params: request_pb2.ResponseCreateParams) -> None:
    """Function and custom tools: valid, unique names, JSON Schema object parameters (functions),
    a text or lark/regex grammar `format` (custom tools); a custom `tool_choice` names a custom
    tool. An agent resends the same tools every turn, so the verdict is memoised on their names,
    schemas and custom tools' JSON (`_tools_problem`); hosted/unknown tool types are carried, not
    validated."""
    key = []
    for i, tool in enumerate(params.tools):
        arm = tool.WhichOneof("tool")
        if arm == "function":
            key.append((i, "function", tool.function.name, tool.function.parameters_json))
        elif arm == "other" and tool.other.type == "custom":
            key.append((i, "custom", "", tool.other.json))
    problem = _tools_problem(tuple(key))
    if problem is not None:
        message, param = problem
        raise TetherError(errors.INVALID_REQUEST, message, param=param)
    _check_custom_choice(params)


@functools.lru_cache(maxsize=64)
def _tools_problem(tools: tuple[tuple[int, str, str, str], ...]) -> tuple[str, str] | None:
    """The first problem of (index, "function", name, parameters JSON) function tools and
    (index, "custom", "", tool JSON) custom tools as (message, param)."""
    names = set()
    for i, kind, name, payload in tools:
        if kind == "custom":
            obj = _json_object(payload)
            if obj is None:
                return f"'tools[{i}]' must be a JSON object.", f"tools[{i}]"
            custom_name = obj.get("name")
            if not isinstance(custom_name, str) or not _FUNCTION_NAME_RE.match(custom_name):
                return f"Invalid custom tool name {custom_name!r}.", f"tools[{i}].name"
            name = custom_name
            if not _custom_format_ok(obj.get("format")):
                return (
                    f"Invalid 'tools[{i}].format': a custom tool's format is {{\"type\": \"text\"}} or "
                    "{\"type\": \"grammar\", \"syntax\": \"lark\" | \"regex\", \"definition\": ...}.",
                    f"tools[{i}].format",
                )
        elif not _FUNCTION_NAME_RE.match(name):
            return f"Invalid function name {name!r}.", f"tools[{i}].name"
        if name in names:
            return f"Duplicate tool name {name!r}.", f"tools[{i}].name"
        names.add(name)
        if kind == "function" and payload and _json_object(payload) is None:
            return "Tool parameters must be a JSON Schema object.", f"tools[{i}].parameters"
    return None


def _json_object(text: str) -> dict | None:
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _custom_format_ok(fmt: object) -> bool:
    """A custom tool's `format`: absent, `{"type": "text"}` or a lark/regex grammar."""
    return fmt is None or (
        isinstance(fmt, dict)
        and (
            fmt.get("type") == "text"
            or (
                fmt.get("type") == "grammar"
                and fmt.get("syntax") in ("lark", "regex")
                and isinstance(fmt.get("definition"), str)
            )
        )
    )


def _check_custom_choice(params: request_pb2.ResponseCreateParams) -> None:
    """`tool_choice: {"type": "custom", "name"}` names a custom tool in `tools` (on every backend)."""
    if params.tool_choice.WhichOneof("choice") != "other_json":
        return
    choice = _json_object(params.tool_choice.other_json)
    if choice is None or choice.get("type") != "custom":
        return  # not a JSON object: refused by _check_enums
    custom = {
        (_json_object(t.other.json) or {}).get("name")
        for t in params.tools
        if t.WhichOneof("tool") == "other" and t.other.type == "custom"
    }
    if choice.get("name") not in custom:
        raise TetherError(
            errors.INVALID_REQUEST,
            f"tool_choice names the custom tool {choice.get('name')!r}, which is not a custom tool in 'tools'.",
            param="tool_choice",
        )


def validate_items(
    items: Sequence[items_pb2.Item], open_calls: frozenset[str], limits: Limits, *, param: str = "input"
) -> None:
    """Check the new items against the conversation they extend."""
    pending = set(open_calls)
    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        if item.ByteSize() > limits.max_item_bytes:
            raise TetherError(
                errors.ITEM_TOO_LARGE, f"{where} is larger than {limits.max_item_bytes} bytes.", param=where
            )
        arm = item.WhichOneof("item")
        if arm is None:
            raise TetherError(errors.INVALID_ITEM, f"{where} is empty.", param=where)
        if arm == "message":
            if item.message.role not in _ROLES:
                raise TetherError(
                    errors.INVALID_ITEM, f"{where}.role must be one of user, developer, system, assistant.",
                    param=f"{where}.role",
                )
        elif arm == "function_call":
            fc = item.function_call
            if not fc.call_id or not fc.name:
                raise TetherError(errors.INVALID_ITEM, f"{where} needs 'call_id' and 'name'.", param=where)
            pending.add(fc.call_id)
        elif arm == "function_call_output":
            _answer_call(item.function_call_output.call_id, "function call output", where, pending)
        elif arm == "other" and item.other.type in (CUSTOM_CALL, CUSTOM_OUTPUT):
            _check_custom_item(item.other, where, pending)
        elif arm == "compaction" and not is_tether_payload(item.compaction.encrypted_content):
            raise TetherError(
                errors.INVALID_ITEM,
                f"{where} is a compaction item this server did not make: its encrypted_content cannot be read. "
                "Send the items it replaced instead.",
                param=f"{where}.encrypted_content",
            )
        elif arm == "item_reference":
            raise TetherError(
                errors.UNSUPPORTED, "item_reference inputs are not supported; send the item itself.", param=where
            )


def _check_custom_item(other: items_pb2.OtherItem, where: str, pending: set[str]) -> None:
    """A custom tool call (`call_id`, `name`, `input` string) opens a call; its output answers one."""
    try:
        obj = orjson.loads(other.json)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise TetherError(errors.INVALID_ITEM, f"{where} must be a JSON object.", param=where)
    call_id = obj.get("call_id")
    if other.type != CUSTOM_CALL:
        _answer_call(call_id if isinstance(call_id, str) else "", "custom tool call output", where, pending)
        return
    if not isinstance(call_id, str) or not call_id:
        raise TetherError(errors.MISSING_REQUIRED_PARAMETER, f"{where}.call_id is required.", param=f"{where}.call_id")
    if not isinstance(obj.get("name"), str) or not obj["name"] or not isinstance(obj.get("input"), str):
        raise TetherError(errors.INVALID_ITEM, f"{where} needs a 'name' and an 'input' string.", param=where)
    pending.add(call_id)


def _answer_call(call_id: str, kind: str, where: str, pending: set[str]) -> None:
    """An output item answers one open call of the chain (or of this input): its `call_id` must
    name one, and answers it."""
    if not call_id:
        raise TetherError(errors.MISSING_REQUIRED_PARAMETER, f"{where}.call_id is required.", param=f"{where}.call_id")
    if call_id not in pending:
        raise TetherError(
            errors.UNKNOWN_CALL_ID, f"No tool call found for {kind} with call_id {call_id}.", param=f"{where}.call_id"
        )
    pending.discard(call_id)
