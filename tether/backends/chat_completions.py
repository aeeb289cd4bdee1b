"""Responses -> Chat Completions: the request mapping, the SSE stream parser, and the shared adapter.

`ChatCompletionsBackend` talks to any `/v1/chat/completions` server over one `httpx.AsyncClient`;
`cerebras.CerebrasBackend` and `openai_compat.OpenAICompatBackend` are thin subclasses that only
change defaults (config) and a few class attributes (which delta fields carry reasoning).

Pieces, usable on their own (tests, the lab):
- `to_chat_request(request, options)`: the upstream JSON body (only fields we know are accepted;
  never store/metadata/previous_response_id/include/truncation/background).
- `SSEDecoder`: bytes in (any split), `(event, data)` pairs out.
- `StreamParser`: upstream chunk objects in, base chunks (`TextDelta`...) out, `finish()` at the end.
- `error_from_status(...)`: upstream HTTP errors -> `BackendError` with Tether's codes.
- Retry policy (`should_retry`, `retry_delay`): a copy of the Cerebras/OpenAI SDK rules, applied
  only before the first byte of a stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
import orjson

from tether import errors, ids
from tether.backends.base import (
    BackendError,
    BackendRequest,
    Capabilities,
    Chunk,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    Timing,
    ToolCallDelta,
    Usage,
)
from tether.compaction_codec import decode_summary
from tether.errors import TetherError
from tether.responses.v1 import items_pb2, request_pb2

log = logging.getLogger(__name__)


DEFAULT_EFFORT_MAP: Mapping[str, str] = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
}

COMPACTION_PREFIX = "Summary of the earlier conversation:\n\n"


def decode_compaction(item: items_pb2.CompactionItem) -> str:
    """The summary text a compaction item carries ("" when the blob is not Tether's)."""
    try:
        return decode_summary(item.encrypted_content)
    except ValueError as exc:
        raise TetherError(errors.INVALID_ITEM, str(exc), param="input", status=400) from exc


# --- request mapping -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MappingOptions:
    images: bool = False
    hosted_tools: bool = False
    reasoning: bool = False  # send reasoning_effort
    reasoning_field: str | None = "reasoning"  # earlier reasoning on assistant messages; None drops it
    developer_role: str = "system"  # role used for `developer` messages
    max_tokens_field: str = "max_completion_tokens"
    default_max_output_tokens: int | None = None
    effort_map: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_EFFORT_MAP))
    include_usage: bool = True  # stream_options.include_usage
    extra_body: Mapping[str, Any] = field(default_factory=dict)


def _invalid(message: str, param: str, code: str = errors.INVALID_REQUEST) -> TetherError:
    return TetherError(code, message, param=param, status=400)


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
                raise _invalid("this model does not accept images (input_image)", param)
            img = p.input_image
            if not img.HasField("image_url") or not img.image_url:
                raise _invalid(
                    "input_image needs an image_url (file_id is not supported here)",
                    param,
                    errors.UNSUPPORTED,
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


def to_chat_messages(
    instructions: str | None, items: Sequence[items_pb2.Item], opts: MappingOptions
) -> list[dict[str, Any]]:
    """The `messages` array (A10): consecutive function calls and the assistant text just before
    them become one assistant message; reasoning rides on the next assistant message."""
    msgs: list[dict[str, Any]] = []
    if instructions:
        msgs.append({"role": "system", "content": instructions})
    open_assistant: dict[str, Any] | None = None  # the assistant message that can still take tool_calls
    reasoning: list[str] = []

    def attach_reasoning(msg: dict[str, Any]) -> None:
        if reasoning and opts.reasoning_field:
            prev = msg.get(opts.reasoning_field)
            text = "\n".join(reasoning)
            msg[opts.reasoning_field] = f"{prev}\n{text}" if prev else text
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
            call = {
                "id": fc.call_id,
                "type": "function",
                "function": {"name": fc.name, "arguments": fc.arguments or "{}"},
            }
            if open_assistant is None:
                open_assistant = {"role": "assistant", "content": None}
                msgs.append(open_assistant)
            attach_reasoning(open_assistant)
            open_assistant.setdefault("tool_calls", []).append(call)
        elif arm == "function_call_output":
            out = item.function_call_output
            msgs.append({"role": "tool", "tool_call_id": out.call_id, "content": _tool_output_text(out)})
            open_assistant = None
            reasoning.clear()
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
    return msgs


def to_chat_tools(tools: Sequence[request_pb2.Tool], opts: MappingOptions) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, t in enumerate(tools):
        arm = t.WhichOneof("tool")
        if arm == "function":
            f = t.function
            try:
                params = (
                    orjson.loads(f.parameters_json)
                    if f.parameters_json
                    else {"type": "object", "properties": {}}
                )
            except orjson.JSONDecodeError:
                raise _invalid(
                    f"tool {f.name!r}: parameters is not valid JSON", f"tools[{i}].parameters"
                ) from None
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


def _tool_choice(
    choice: request_pb2.ToolChoice | None, tools: list[dict[str, Any]]
) -> tuple[Any | None, list[dict[str, Any]]]:
    """The upstream tool_choice (None: omit) and the tool list (allowed_tools narrows it)."""
    if choice is None:
        return None, tools
    arm = choice.WhichOneof("choice")
    if arm == "mode":
        return (choice.mode if choice.mode in ("auto", "none", "required") else None), tools
    if arm == "function_name":
        return {"type": "function", "function": {"name": choice.function_name}}, tools
    if arm == "other_json":
        try:
            obj = orjson.loads(choice.other_json)
        except orjson.JSONDecodeError:
            return None, tools
        if not isinstance(obj, dict):
            return None, tools
        if obj.get("type") == "function" and isinstance(obj.get("name"), str):
            return {"type": "function", "function": {"name": obj["name"]}}, tools
        if obj.get("type") == "allowed_tools":
            allowed = {t.get("name") for t in obj.get("tools") or [] if isinstance(t, dict)}
            narrowed = [t for t in tools if t.get("function", {}).get("name") in allowed]
            mode = obj.get("mode", "auto")
            return (mode if mode in ("auto", "required") else "auto"), narrowed
        log.debug("dropping tool_choice %s", obj.get("type"))
    return None, tools


def _response_format(fmt: request_pb2.TextFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type in ("", "text"):
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.type == "json_schema":
        try:
            schema = orjson.loads(fmt.schema_json) if fmt.schema_json else {}
        except orjson.JSONDecodeError:
            raise _invalid("text.format.schema is not valid JSON", "text.format.schema") from None
        js: dict[str, Any] = {"name": fmt.name or "response", "schema": schema}
        if fmt.HasField("strict"):
            js["strict"] = fmt.strict
        return {"type": "json_schema", "json_schema": js}
    raise _invalid(f"unsupported text.format type {fmt.type!r}", "text.format.type")


def to_chat_request(request: BackendRequest, opts: MappingOptions) -> dict[str, Any]:
    """The streaming chat-completions body for one backend request."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": to_chat_messages(request.instructions, request.items, opts),
    }
    tools = to_chat_tools(request.tools, opts)
    if tools:
        choice, tools = _tool_choice(request.tool_choice, tools)
        body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
        if not request.parallel_tool_calls:
            body["parallel_tool_calls"] = False
    limit = request.max_output_tokens or opts.default_max_output_tokens
    if limit:
        body[opts.max_tokens_field] = limit
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if opts.reasoning and request.reasoning_effort:
        effort = opts.effort_map.get(request.reasoning_effort.lower())
        if effort:
            body["reasoning_effort"] = effort
    fmt = _response_format(request.text_format)
    if fmt is not None:
        body["response_format"] = fmt
    if request.user:
        body["user"] = request.user
    if request.prompt_cache_key:
        body["prompt_cache_key"] = request.prompt_cache_key
    body["stream"] = True
    if opts.include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(opts.extra_body)
    return body


# --- SSE -----------------------------------------------------------------------------------------


class SSEDecoder:
    """Incremental text/event-stream decoder: `feed(bytes)` -> completed `(event, data)` pairs.

    Handles frames split anywhere across reads, CRLF or LF line ends, comment lines (`: keep-alive`),
    multi-line data. `event` is None for plain `data:` frames. llama.cpp's `error: {...}` lines are
    reported as event "error".
    """

    __slots__ = ("_buf", "_event", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        buf = self._buf + chunk if self._buf else chunk
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[tuple[str | None, bytes]] = []
        for line in lines:
            self._line(line, out)
        return out

    def flush(self) -> list[tuple[str | None, bytes]]:
        """End of stream: a final frame without its blank line still counts."""
        out: list[tuple[str | None, bytes]] = []
        if self._buf:
            line, self._buf = self._buf, b""
            self._line(line, out)
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[tuple[str | None, bytes]]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            if self._data:
                out.append((self._event, self._data[0] if len(self._data) == 1 else b"\n".join(self._data)))
            self._event = None
            self._data = []
            return
        if line[:1] == b":":
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"error":
            self._event = "error"
            self._data.append(value)


# --- errors ----------------------------------------------------------------------------------------


def parse_error_body(raw: bytes | Any) -> tuple[str, str | None, str | None]:
    """(message, type, code) from either `{message,type,param,code}` or `{"error":{...}}` (or text)."""
    obj = raw
    if isinstance(raw, bytes | bytearray | str):
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else raw
            return text.strip()[:500] or "no error body", None, None
    if not isinstance(obj, dict):
        return str(obj)[:500], None, None
    err = obj.get("error")
    if isinstance(err, str):
        return err, None, None
    if isinstance(err, dict):
        obj = err
    message = obj.get("message") or obj.get("detail") or "no error message"
    code = obj.get("code")
    etype = obj.get("type")
    return str(message), (str(etype) if etype else None), (str(code) if code is not None else None)


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """`retry-after-ms`, else `retry-after` (seconds or an HTTP date), in seconds; None if absent."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if ra:
        try:
            return float(ra)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(ra)
            except (TypeError, ValueError):
                return None
            return when.timestamp() - (time.time() if now is None else now)
    return None


def error_from_status(
    status: int, message: str, upstream_code: str | None = None, retry_after: float | None = None
) -> BackendError:
    """Map an upstream HTTP status (or a mid-stream `status_code`) to Tether's BackendError."""
    if status in (400, 422):
        low = message.lower()
        if upstream_code == "context_length_exceeded" or "context length" in low or "maximum context" in low:
            return BackendError(errors.CONTEXT_LENGTH_EXCEEDED, f"upstream: {message}", status=400)
        return BackendError(errors.INVALID_REQUEST, f"upstream rejected the request: {message}", status=400)
    if status in (401, 403):
        return BackendError(
            errors.BACKEND_AUTH_FAILED, f"upstream refused the server's credentials (HTTP {status}): {message}"
        )
    if status == 404:
        return BackendError(errors.MODEL_NOT_FOUND, f"upstream: not found (HTTP 404): {message}", status=400)
    if status == 408:
        return BackendError(
            errors.BACKEND_TIMEOUT, f"upstream timed out (HTTP 408): {message}", status=504, retryable=True
        )
    if status == 413:
        return BackendError(errors.REQUEST_TOO_LARGE, f"upstream: request too large: {message}", status=400)
    if status == 429:
        return BackendError(
            errors.RATE_LIMIT_EXCEEDED,
            f"upstream rate limit: {message}",
            status=429,
            retry_after=retry_after,
            retryable=True,
        )
    return BackendError(
        errors.BACKEND_ERROR,
        f"upstream error (HTTP {status}): {message}",
        status=502,
        retryable=status >= 500 or status == 409,
    )


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    flag = headers.get("x-should-retry")
    if flag == "true":
        return True
    if flag == "false":
        return False
    return status in (408, 409, 429) or status >= 500


def retry_delay(
    retries_so_far: int,
    headers: Mapping[str, str] | None = None,
    *,
    initial: float = 0.5,
    maximum: float = 8.0,
) -> float:
    """The SDK's delay: the server's retry-after(-ms) when 0..60 s, else min(initial*2**n, max) * U(0.75, 1)."""
    if headers is not None:
        ra = retry_after_seconds(headers)
        if ra is not None and 0 <= ra <= 60:
            return ra
    return min(initial * 2.0**retries_so_far, maximum) * (1 - 0.25 * random.random())


# --- stream parsing --------------------------------------------------------------------------------

_FINISH = {
    "stop": "stop",
    "length": "length",
    "content_filter": "content_filter",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
}


def _usage(u: Mapping[str, Any]) -> Usage:
    pd = u.get("prompt_tokens_details") or {}
    cd = u.get("completion_tokens_details") or {}
    return Usage(
        input_tokens=int(u.get("prompt_tokens") or 0),
        cached_tokens=int(pd.get("cached_tokens") or 0),
        output_tokens=int(u.get("completion_tokens") or 0),
        reasoning_tokens=int(cd.get("reasoning_tokens") or 0),
    )


def _timing(t: Mapping[str, Any]) -> Timing:
    return Timing(
        queue_time=float(t.get("queue_time") or 0.0),
        prompt_time=float(t.get("prompt_time") or 0.0),
        completion_time=float(t.get("completion_time") or 0.0),
        total_time=float(t.get("total_time") or 0.0),
    )


class StreamParser:
    """Upstream chat.completion.chunk objects -> base chunks. Call `feed` per SSE event; `done`
    turns true at `[DONE]`; `finish()` builds the closing `Finish`."""

    def __init__(self, reasoning_fields: Sequence[str] = ("reasoning",)) -> None:
        self.reasoning_fields = tuple(reasoning_fields)
        self.done = False
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.timing: Timing | None = None
        self._calls: dict[Any, int] = {}  # upstream key (index, else id) -> our index
        self._last_key: Any = None

    def feed(self, event: str | None, data: bytes) -> list[Chunk]:
        if data == b"[DONE]":
            self.done = True
            return []
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            if event == "error":
                raise error_from_status(500, data.decode("utf-8", "replace")[:500]) from None
            raise BackendError(errors.BACKEND_ERROR, "upstream sent invalid JSON in the stream") from None
        if not isinstance(obj, dict):
            raise BackendError(errors.BACKEND_ERROR, "upstream sent a non-object stream chunk")
        if event == "error" or obj.get("error"):
            raise self._stream_error(obj)
        return self.chunk(obj)

    @staticmethod
    def _stream_error(obj: dict[str, Any]) -> BackendError:
        message, _etype, code = parse_error_body(obj)
        status = obj.get("status_code")
        err = obj.get("error")
        if status is None and isinstance(err, dict) and isinstance(err.get("code"), int):
            status = err["code"]
        try:
            status = int(status) if status is not None else 500
        except (TypeError, ValueError):
            status = 500
        out = error_from_status(status, message, code)
        out.retryable = False  # never retried once streaming has begun
        return out

    def chunk(self, obj: Mapping[str, Any]) -> list[Chunk]:
        out: list[Chunk] = []
        u = obj.get("usage")
        if u:
            self.usage = _usage(u)
        ti = obj.get("time_info")
        if ti:
            self.timing = _timing(ti)
        for choice in obj.get("choices") or ():
            if choice.get("index") or 0:
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            for f in self.reasoning_fields:
                r = delta.get(f)
                if r:
                    out.append(ReasoningDelta(r))
                    break
            c = delta.get("content")
            if c:
                out.append(TextDelta(c))
            refusal = delta.get("refusal")
            if refusal:
                out.append(RefusalDelta(refusal))
            tcs = delta.get("tool_calls")
            if tcs:
                for pos, tc in enumerate(tcs):
                    d = self._tool_delta(tc, pos if "message" in choice else None)
                    if d is not None:
                        out.append(d)
            fr = choice.get("finish_reason")
            if fr:
                self.finish_reason = fr
        return out

    def _tool_delta(self, tc: Mapping[str, Any], default_index: int | None) -> ToolCallDelta | None:
        fn = tc.get("function") or {}
        cid = tc.get("id")
        key = tc.get("index", default_index)
        if key is None:
            key = ("id", cid) if cid else self._last_key
            if key is None:
                key = ("id", None)
        self._last_key = key
        args = fn.get("arguments") or ""
        if not isinstance(args, str):
            args = orjson.dumps(args).decode()
        ours = self._calls.get(key)
        if ours is None:
            ours = self._calls[key] = len(self._calls)
            return ToolCallDelta(ours, args, cid or ids.call_id(), fn.get("name") or "")
        if not args:
            return None
        return ToolCallDelta(ours, args)

    def finish(self) -> Finish:
        reason = _FINISH.get(self.finish_reason or "stop", "stop")
        if reason == "stop" and self._calls:
            reason = "tool_calls"
        return Finish(reason=reason, usage=self.usage, timing=self.timing)


# --- the adapter ---------------------------------------------------------------------------------


@dataclass(kw_only=True)
class ChatCompletionsConfig:
    base_url: str = ""
    api_key: str | None = None  # prefer api_key_env; a literal key is for tests and local servers
    api_key_env: str | None = None
    connect_timeout_s: float = 5.0
    write_timeout_s: float = 10.0
    pool_timeout_s: float = 10.0
    # Longest silence tolerated from upstream, both waiting for the response head and between stream
    # bytes; past it the call fails with backend_timeout.
    stream_idle_timeout_s: float = 60.0
    max_retries: int = 2
    retry_initial_delay_s: float = 0.5
    retry_max_delay_s: float = 8.0
    max_connections: int = 100
    max_keepalive_connections: int = 20
    headers: dict[str, str] = field(default_factory=dict)  # extra request headers
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request body
    reasoning_field: str | None = "reasoning"
    developer_role: str = "system"
    max_tokens_field: str = "max_completion_tokens"
    default_max_output_tokens: int | None = None
    include_usage: bool = True
    # Capabilities.
    tools: bool = True
    parallel_tool_calls: bool = True
    reasoning: bool = False
    json_schema: bool = False
    images: bool = False
    hosted_tools: bool = False


RetryHook = Callable[[int, float, str], None]  # (retry number from 1, delay seconds, reason)


class ChatCompletionsBackend:
    """One configured Chat Completions upstream. Subclasses set `kind`, `Config` and quirks."""

    kind: ClassVar[str] = "chat_completions"
    Config: ClassVar[type[ChatCompletionsConfig]] = ChatCompletionsConfig
    reasoning_delta_fields: ClassVar[tuple[str, ...]] = ("reasoning",)
    effort_map: ClassVar[Mapping[str, str]] = DEFAULT_EFFORT_MAP
    require_api_key: ClassVar[bool] = False
    drain_timeout_s: ClassVar[float] = 1.0

    def __init__(
        self, name: str, config: ChatCompletionsConfig, *, transport: httpx.AsyncBaseTransport | None = None
    ):
        self.name = name
        self.config = config
        if not config.base_url:
            raise ValueError(f"backend {name!r} ({self.kind}): base_url is required")
        if config.max_retries < 0:
            raise ValueError(f"backend {name!r}: max_retries must be >= 0")
        self.api_key = self._resolve_key()
        self.capabilities = Capabilities(
            tools=config.tools,
            parallel_tool_calls=config.parallel_tool_calls,
            reasoning=config.reasoning,
            json_schema=config.json_schema,
            images=config.images,
            hosted_tools=config.hosted_tools,
        )
        self.options = MappingOptions(
            images=config.images,
            hosted_tools=config.hosted_tools,
            reasoning=config.reasoning,
            reasoning_field=config.reasoning_field,
            developer_role=config.developer_role,
            max_tokens_field=config.max_tokens_field,
            default_max_output_tokens=config.default_max_output_tokens,
            effort_map=self.effort_map,
            include_usage=config.include_usage,
            extra_body=dict(config.extra_body),
        )
        self.base_url = config.base_url.rstrip("/")
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            "user-agent": "tether/0.1",
        }
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        headers.update({k.lower(): v for k, v in config.headers.items()})
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(
                connect=config.connect_timeout_s,
                read=config.stream_idle_timeout_s,
                write=config.write_timeout_s,
                pool=config.pool_timeout_s,
            ),
            limits=httpx.Limits(
                max_connections=config.max_connections,
                max_keepalive_connections=config.max_keepalive_connections,
            ),
            transport=transport,
        )
        # Observability: retries made (total), an optional hook, the last x-ratelimit-* headers seen.
        self.retries = 0
        self.on_retry: RetryHook | None = None
        self.ratelimit: dict[str, str] = {}

    def _resolve_key(self) -> str | None:
        c = self.config
        if c.api_key:
            return c.api_key
        if c.api_key_env:
            key = os.environ.get(c.api_key_env)
            if not key:
                raise ValueError(
                    f"backend {self.name!r} ({self.kind}): environment variable {c.api_key_env} "
                    "is not set (it must hold the upstream API key)"
                )
            return key
        if self.require_api_key:
            raise ValueError(f"backend {self.name!r} ({self.kind}): an API key is required (set api_key_env)")
        return None

    async def aclose(self) -> None:
        await self._client.aclose()

    def build_body(self, request: BackendRequest) -> dict[str, Any]:
        return to_chat_request(request, self.options)

    async def list_models(self) -> list[str]:
        """Model ids from `GET {base_url}/models`."""
        try:
            resp = await self._client.get(self.base_url + "/models", headers={"accept": "application/json"})
        except httpx.TimeoutException as exc:
            raise BackendError(errors.BACKEND_TIMEOUT, f"upstream timed out: {exc!r}", status=504) from exc
        except httpx.HTTPError as exc:
            raise BackendError(errors.BACKEND_ERROR, f"upstream unreachable: {exc!r}") from exc
        self._note_ratelimit(resp.headers)
        if resp.status_code >= 400:
            message, _t, code = parse_error_body(resp.content)
            raise error_from_status(resp.status_code, message, code, retry_after_seconds(resp.headers))
        data = orjson.loads(resp.content).get("data") or []
        return [m["id"] for m in data if isinstance(m, dict) and "id" in m]

    def _note_ratelimit(self, headers: httpx.Headers) -> None:
        rl = {k: v for k, v in headers.items() if k.startswith("x-ratelimit-")}
        if rl:
            self.ratelimit = rl

    def _count_retry(self, n: int, delay: float, reason: str) -> None:
        self.retries += 1
        log.info("backend %s: retry %d in %.3fs (%s)", self.name, n, delay, reason)
        if self.on_retry is not None:
            try:
                self.on_retry(n, delay, reason)
            except Exception:  # a metrics hook must never break a call
                log.exception("on_retry hook failed")

    async def stream(self, request: BackendRequest) -> AsyncIterator[Chunk]:
        payload = orjson.dumps(self.build_body(request))
        url = self.base_url + "/chat/completions"
        c = self.config
        attempt = 0
        while True:
            failure: BackendError
            headers: Mapping[str, str] = {}
            started = False
            try:
                async with self._client.stream("POST", url, content=payload) as resp:
                    self._note_ratelimit(resp.headers)
                    if resp.status_code < 400:
                        started = True
                        async with contextlib.aclosing(self._read(resp)) as chunks:
                            async for chunk in chunks:
                                yield chunk
                        return
                    raw = await resp.aread()
                    message, _t, code = parse_error_body(raw)
                    failure = error_from_status(
                        resp.status_code, message, code, retry_after_seconds(resp.headers)
                    )
                    headers = resp.headers
                    retry = should_retry(resp.status_code, resp.headers)
                    reason = f"HTTP {resp.status_code}"
            except httpx.TimeoutException as exc:
                failure = BackendError(
                    errors.BACKEND_TIMEOUT,
                    f"upstream timed out before responding ({type(exc).__name__})",
                    status=504,
                    retryable=True,
                )
                retry, reason = not started, type(exc).__name__
            except httpx.TransportError as exc:
                failure = BackendError(
                    errors.BACKEND_ERROR,
                    f"upstream connection failed: {type(exc).__name__}: {exc}",
                    retryable=True,
                )
                retry, reason = not started, type(exc).__name__
            if not retry or attempt >= c.max_retries:
                raise failure
            delay = retry_delay(
                attempt, headers, initial=c.retry_initial_delay_s, maximum=c.retry_max_delay_s
            )
            attempt += 1
            self._count_retry(attempt, delay, reason)
            await asyncio.sleep(delay)

    async def _read(self, resp: httpx.Response) -> AsyncIterator[Chunk]:
        """Parse one 2xx upstream response; every transport failure becomes a BackendError here
        (so the caller's retry handlers never see a mid-stream failure)."""
        parser = StreamParser(self.reasoning_delta_fields)
        if resp.headers.get("content-type", "").startswith("application/json"):
            # The server ignored stream=true (or was asked without it): one chat.completion object.
            try:
                raw = await resp.aread()
            except httpx.TimeoutException as exc:
                raise BackendError(errors.BACKEND_TIMEOUT, "upstream stalled", status=504) from exc
            except httpx.HTTPError as exc:
                raise BackendError(errors.BACKEND_ERROR, f"upstream connection broke: {exc!r}") from exc
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise BackendError(errors.BACKEND_ERROR, "upstream sent invalid JSON") from None
            if not isinstance(obj, dict) or obj.get("error"):
                raise StreamParser._stream_error(obj if isinstance(obj, dict) else {"error": str(obj)})
            for chunk in parser.chunk(obj):
                yield chunk
            yield parser.finish()
            return
        decoder = SSEDecoder()
        async with contextlib.aclosing(resp.aiter_bytes()) as it:
            try:
                async for data in it:
                    for event, payload in decoder.feed(data):
                        for chunk in parser.feed(event, payload):
                            yield chunk
                        if parser.done:
                            break
                    if parser.done:
                        break
                else:
                    for event, payload in decoder.flush():
                        for chunk in parser.feed(event, payload):
                            yield chunk
                        if parser.done:
                            break
            except httpx.TimeoutException as exc:
                raise BackendError(
                    errors.BACKEND_TIMEOUT,
                    f"upstream stream stalled: no data for {self.config.stream_idle_timeout_s:g}s",
                    status=504,
                ) from exc
            except httpx.HTTPError as exc:
                raise BackendError(
                    errors.BACKEND_ERROR, f"upstream connection broke mid-stream: {type(exc).__name__}"
                ) from exc
            if not parser.done:
                raise BackendError(errors.BACKEND_ERROR, "upstream stream ended without [DONE]")
            yield parser.finish()
            # Read to the end of the body so the connection goes back to the pool (normally instant).
            try:
                async with asyncio.timeout(self.drain_timeout_s):
                    async for _ in it:
                        pass
            except (TimeoutError, httpx.HTTPError):
                pass
