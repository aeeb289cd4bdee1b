"""Upstream `chat.completion.chunk` objects (or one `chat.completion`) -> base chunks.

`StreamParser.feed(event, data)` per SSE event; `done` turns true at `[DONE]`; `finish()` builds
the closing `Finish`. Custom tool calls arrive natively (`tool_calls[i].type == "custom"`,
`custom: {name, input}`) or, on a dialect that emulates custom tools, as calls of the emulating
function (`emulated` names it): the `input` string of its `{"input": ...}` arguments streams as
it arrives (`EmulatedInput`), and `calls_done()` gives what is left at the end (arguments that
are not such an object are passed on whole as the input text, unchanged). Usage is taken field by field: what the server
reports is kept, what it leaves out stays None, so the turn can count the rest itself (and say so).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from tether import errors, ids
from tether.backends.base import (
    BackendError,
    Chunk,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    Timing,
    ToolCallDelta,
    Usage,
)
from tether.backends.chat.upstream_errors import error_from_status, parse_error_body

_FINISH = {
    "stop": "stop",
    "length": "length",
    "content_filter": "content_filter",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
}


def _count(obj: Any, key: str) -> int | None:
    v = obj.get(key) if isinstance(obj, Mapping) else None
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else None


def _usage(u: Mapping[str, Any]) -> Usage:
    """The server's counts; a field it does not report stays None (vLLM without prefix caching
    sends no `prompt_tokens_details`; some servers send no reasoning details). Image tokens come
    at the top (Cerebras) or in `prompt_tokens_details` (OpenAI's shape)."""
    prompt, completion = u.get("prompt_tokens_details"), u.get("completion_tokens_details")
    images = _count(u, "image_tokens")
    return Usage(
        input_tokens=_count(u, "prompt_tokens"),
        cached_tokens=_count(prompt, "cached_tokens"),
        output_tokens=_count(u, "completion_tokens"),
        reasoning_tokens=_count(completion, "reasoning_tokens"),
        image_tokens=images if images is not None else _count(prompt, "image_tokens"),
        accepted_prediction_tokens=_count(completion, "accepted_prediction_tokens"),
        rejected_prediction_tokens=_count(completion, "rejected_prediction_tokens"),
    )


def _timing(t: Mapping[str, Any]) -> Timing:
    return Timing(
        queue_time=float(t.get("queue_time") or 0.0),
        prompt_time=float(t.get("prompt_time") or 0.0),
        completion_time=float(t.get("completion_time") or 0.0),
        total_time=float(t.get("total_time") or 0.0),
    )


def _logprob(entry: Any) -> dict[str, Any] | None:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("token"), str):
        return None
    token = entry["token"]
    raw = entry.get("bytes")
    lp = entry.get("logprob")
    return {
        "token": token,
        "bytes": raw if isinstance(raw, list) else list(token.encode()),
        "logprob": float(lp) if isinstance(lp, int | float) and not isinstance(lp, bool) else 0.0,
    }


def _logprobs(obj: Any) -> list[dict[str, Any]] | None:
    """A choice's `logprobs.content` in the Responses shape (`bytes` filled in where the server
    sends none, `top_logprobs` always a list); None when the chunk carries none."""
    content = obj.get("content") if isinstance(obj, Mapping) else None
    if not isinstance(content, list) or not content:
        return None
    out = []
    for entry in content:
        lp = _logprob(entry)
        if lp is None:
            continue
        top = entry.get("top_logprobs")
        lp["top_logprobs"] = [t for t in map(_logprob, top if isinstance(top, list) else ()) if t is not None]
        out.append(lp)
    return out or None


_INPUT_OPEN = re.compile(r'\s*\{\s*"input"\s*:\s*"')


def _string_end(s: str, i: int) -> tuple[int, bool]:
    """How far `s[i:]` holds whole JSON string characters (an escape is whole or not taken), and
    whether the string's closing quote is there."""
    n, j = len(s), i
    while j < n:
        c = s[j]
        if c == '"':
            return j, True
        if c != "\\":
            j += 1
            continue
        if j + 1 >= n:
            break
        if s[j + 1] != "u":
            j += 2
            continue
        if j + 6 > n:
            break
        if s[j + 2 : j + 4].lower() in ("d8", "d9", "da", "db"):  # a high surrogate: its pair too
            if j + 12 > n:
                break
            j += 12
        else:
            j += 6
    return j, False


class EmulatedInput:
    """The `input` of an emulated custom tool call, decoded as its `{"input": "..."}` arguments
    stream: `feed` returns the input text that became certain, `end` the rest once they are whole
    (arguments of another shape, never streamed, are then the input text as they are)."""

    def __init__(self) -> None:
        self.raw = ""
        self.start: int | None = None  # where the input string's characters begin in `raw`
        self.decoded_to = 0  # `raw` index up to which the input has been given out
        self.given = ""  # the input given out so far
        self.closed = False  # the input string ended (or cannot be read as it streams)

    def feed(self, fragment: str) -> str:
        self.raw += fragment
        if self.closed:
            return ""
        if self.start is None:
            m = _INPUT_OPEN.match(self.raw)
            if m is None:
                return ""
            self.start = self.decoded_to = m.end()
        end, self.closed = _string_end(self.raw, self.decoded_to)
        try:
            piece = orjson.loads('"' + self.raw[self.decoded_to : end] + '"')
        except orjson.JSONDecodeError:
            self.closed = True  # not a JSON string after all: `end()` decides
            return ""
        self.decoded_to = end
        self.given += piece
        return piece

    def end(self) -> str:
        try:
            obj = orjson.loads(self.raw)
        except orjson.JSONDecodeError:
            obj = None
        value = obj.get("input") if isinstance(obj, dict) else None
        if not self.given:
            return value if isinstance(value, str) else self.raw
        if isinstance(value, str) and value.startswith(self.given):
            return value[len(self.given) :]
        return ""  # arguments cut short (an output cap): the input is what streamed


class StreamParser:
    """Upstream chat.completion.chunk objects -> base chunks. Call `feed` per SSE event; `done`
    turns true at `[DONE]`; `finish()` builds the closing `Finish`."""

    def __init__(
        self, reasoning_fields: Sequence[str] = ("reasoning",), emulated: frozenset[str] = frozenset()
    ) -> None:
        self.reasoning_fields = tuple(reasoning_fields)
        self.emulated = emulated  # names of the functions that emulate custom tools
        self._held: dict[int, EmulatedInput] = {}  # our index -> an emulated custom tool call
        self.done = False
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.timing: Timing | None = None
        self.service_tier: str | None = None
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
            raise self.stream_error(obj)
        return self.chunk(obj)

    @staticmethod
    def stream_error(obj: dict[str, Any]) -> BackendError:
        """A mid-stream (or JSON-reply) error payload as a BackendError, never retried."""
        message, etype, code = parse_error_body(obj)
        status = obj.get("status_code")
        err = obj.get("error")
        if status is None and isinstance(err, dict) and isinstance(err.get("code"), int):
            status = err["code"]
        try:
            status = int(status) if status is not None else 500
        except (TypeError, ValueError):
            status = 500
        out = error_from_status(status, message, code, upstream_type=etype)
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
        tier = obj.get("service_tier")
        if isinstance(tier, str) and tier:
            self.service_tier = tier
        for choice in obj.get("choices") or ():
            if choice.get("index") or 0:
                continue
            fr = choice.get("finish_reason")
            if fr:
                self.finish_reason = fr
            delta = choice.get("delta") or choice.get("message") or {}
            c = delta.get("content")
            text_only = c and len(delta) == 1  # a streamed token's usual delta: no other part to look for
            if not text_only:
                for f in self.reasoning_fields:
                    r = delta.get(f)
                    if r:
                        out.append(ReasoningDelta(r))
                        break
            if c:
                lp = choice.get("logprobs")  # null on most chunks: no call for it
                out.append(TextDelta(c, _logprobs(lp) if lp else None))
            if text_only:
                continue
            refusal = delta.get("refusal")
            if refusal:
                out.append(RefusalDelta(refusal))
            tcs = delta.get("tool_calls")
            if tcs:
                for pos, tc in enumerate(tcs):
                    d = self._tool_delta(tc, pos if "message" in choice else None)
                    if d is not None:
                        out.append(d)
        return out

    def _tool_delta(self, tc: Mapping[str, Any], default_index: int | None) -> ToolCallDelta | None:
        native = tc.get("type") == "custom" or "custom" in tc
        fn = (tc.get("custom") if native else tc.get("function")) or {}
        cid = tc.get("id")
        key = tc.get("index", default_index)
        if key is None:
            key = ("id", cid) if cid else self._last_key
            if key is None:
                key = ("id", None)
        self._last_key = key
        args = fn.get("input" if native else "arguments") or ""
        if not isinstance(args, str):
            args = orjson.dumps(args).decode()
        ours = self._calls.get(key)
        if ours is None:
            ours = self._calls[key] = len(self._calls)
            name = fn.get("name") or ""
            if not native and name in self.emulated:
                held = self._held[ours] = EmulatedInput()
                return ToolCallDelta(ours, held.feed(args), cid or ids.call_id(), name, custom=True)
            return ToolCallDelta(ours, args, cid or ids.call_id(), name, custom=native)
        if ours in self._held:
            args = self._held[ours].feed(args)
        if not args:
            return None
        return ToolCallDelta(ours, args)

    def calls_done(self) -> list[Chunk]:
        """The rest of each emulated custom tool call's input, once its arguments are complete."""
        out: list[Chunk] = [
            ToolCallDelta(index, rest) for index, held in self._held.items() if (rest := held.end())
        ]
        self._held.clear()
        return out

    @property
    def calls(self) -> int:
        """Tool calls seen so far."""
        return len(self._calls)

    def finish(self) -> Finish:
        reason = _FINISH.get(self.finish_reason or "stop", "stop")
        if reason == "stop" and self._calls:
            reason = "tool_calls"
        return Finish(reason=reason, usage=self.usage, timing=self.timing, service_tier=self.service_tier)
