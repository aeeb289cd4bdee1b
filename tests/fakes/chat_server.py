"""A fake Chat Completions server that speaks Cerebras's wire format, on loopback only.

    with FakeChatServer(api_key="test-key") as server:          # binds 127.0.0.1:0
        server.push(rate_limited(), text("hi"))                  # next two chat calls, in order
        backend = build_backend("c", "cerebras", {"base_url": server.base_url, "api_key": "test-key"})
        ...
        body = server.chat_requests[-1].body                     # what the adapter sent

Routes: `POST /v1/chat/completions` (SSE when the body says `"stream": true`, else one JSON
`chat.completion`), `GET /v1/models`, `POST /extras/tokenize/count` (llama-cpp-python's; counts
words). Every request is recorded (`server.requests`: method, path,
lower-cased headers, parsed JSON body). The Bearer key is checked (401 with Cerebras's top-level
error body on mismatch). With `strict=True` (default) the body is validated like Cerebras does:
unknown top-level or message fields -> 400 `wrong_api_format`; with `models` set, an unknown model
-> 404 `model_not_found`.

Which reply a chat call gets: the next queued scenario (`push`), else the scenario named by a last
user message of the form `scenario: NAME` (see `BUILTIN_SCENARIOS`, or `register`), else
`server.default` (a short text stream).

A scenario is a `Reply` or a callable `(RecordedRequest) -> Reply`; the builders below (`text`,
`tool_calls`, `http_error`, `mid_stream_error`, `stall`, `paced`, ...) return callables that render a
stream or a JSON body depending on the request. A `Reply` streams `sse` parts in order: a dict is
one `data: {json}` frame, str/bytes are written raw (one write, flushed), `Pause(s)` waits while
watching for the client to hang up, `ABORT` drops the socket without ending the body.
Client disconnects are counted (`server.disconnects`, `wait_for_disconnect()`).

The server lives on daemon threads and shuts itself down after `lifetime_s`.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import select
import socket
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CREATED = 1_760_000_000

# Cerebras's accepted chat-completions fields (cerebras-cloud-sdk 1.91 CompletionCreateParams).
ALLOWED_FIELDS = frozenset(
    {
        "messages", "model", "max_completion_tokens", "max_tokens", "temperature", "top_p", "stop", "seed",
        "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls", "response_format",
        "reasoning_effort", "reasoning_format", "disable_reasoning", "clear_thinking", "logprobs",
        "top_logprobs", "logit_bias", "frequency_penalty", "presence_penalty", "n", "min_completion_tokens",
        "prediction", "prompt_cache_key", "service_tier", "user", "model_parameters",
    }
)  # fmt: skip
ALLOWED_MESSAGE_FIELDS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "reasoning", "tool_calls"},
    "tool": {"role", "content", "tool_call_id", "name"},
}


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any = None
    scenario: str | None = None  # the name that selected the reply, when a name did
    peer: tuple[str, int] | None = None  # the client's address (same port = same kept-alive connection)
    wire_bytes: int = 0  # the body's size as sent (before a `Content-Encoding: gzip` is undone)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list((self.body or {}).get("messages") or [])

    @property
    def last_user_text(self) -> str:
        for m in reversed(self.messages):
            if m.get("role") == "user":
                c = m.get("content")
                if isinstance(c, list):
                    return "\n".join(p.get("text", "") for p in c if isinstance(p, dict))
                return c or ""
        return ""

    @property
    def stream(self) -> bool:
        return bool((self.body or {}).get("stream"))


@dataclass(frozen=True)
class Pause:
    """Wait `seconds` (watching the socket: a client hang-up ends the reply and is counted)."""

    seconds: float


class _Abort:
    def __repr__(self) -> str:
        return "ABORT"


ABORT = _Abort()  # close the socket without finishing the chunked body

Part = dict[str, Any] | str | bytes | Pause | _Abort


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    json: Any = None  # a JSON body (used when sse is None)
    sse: list[Part] | None = None  # a text/event-stream body, written part by part


Scenario = Reply | Callable[[RecordedRequest], Reply]


# --- wire-format helpers --------------------------------------------------------------------------


def chunk(
    delta: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One chat.completion.chunk as Cerebras sends it (`choices=[]` when delta is None and no finish);
    `logprobs` is the choice's `logprobs.content`."""
    choices = []
    if delta is not None or finish_reason is not None:
        choices = [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}]
        if logprobs is not None:
            choices[0]["logprobs"] = {"content": logprobs}
    obj = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": extra.pop("model", "gpt-oss-120b"),
        "system_fingerprint": "fp_fake",
        "choices": choices,
    }
    obj.update(extra)
    return obj


def usage(prompt: int = 10, completion: int = 5, reasoning: int = 0, cached: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def time_info() -> dict[str, Any]:
    return {
        "queue_time": 0.0001,
        "prompt_time": 0.002,
        "completion_time": 0.01,
        "total_time": 0.0125,
        "created": CREATED,
    }


def error_body(message: str, type: str, param: str | None, code: str) -> dict[str, Any]:
    """Cerebras's usual top-level error shape."""
    return {"message": message, "type": type, "param": param, "code": code}


def _pieces(text: str) -> list[str]:
    """Split text into word pieces that join back exactly."""
    out: list[str] = []
    cur = ""
    for ch in text:
        if ch == " " and cur.strip():
            out.append(cur)
            cur = ""
        cur += ch
    return out + [cur] if cur else out


def _split3(s: str) -> list[str]:
    a, b = len(s) // 3, 2 * len(s) // 3
    return [s[:a], s[a:b], s[b:]]


def token_logprobs(piece: str, top: int) -> list[dict[str, Any]]:
    """The fake's log probabilities of one content piece (one token), with `top` alternatives; as
    OpenAI sends them (`bytes` present, a piece's first alternative is the piece itself)."""
    alts = [piece] + [f"alt{i}" for i in range(1, top)]
    return [
        {
            "token": piece,
            "logprob": -0.25,
            "bytes": list(piece.encode()),
            "top_logprobs": [
                {"token": a, "logprob": -0.25 - i, "bytes": list(a.encode())} for i, a in enumerate(alts[:top])
            ],
        }
    ]


def _prompt_tokens(req: RecordedRequest) -> int:
    n = 0
    for m in req.messages:
        c = m.get("content")
        if isinstance(c, str):
            n += len(c.split())
    return max(n, 1)


def _image_parts(req: RecordedRequest) -> int:
    return sum(
        1
        for m in req.messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and p.get("type") in ("image_url", "image")
    )


@dataclass(frozen=True)
class Call:
    """A tool call a scenario emits; `arguments` (a JSON string) is sent in `fragments` pieces.
    `custom`: a native custom tool call (OpenAI's `type: "custom"`), `arguments` being its input."""

    name: str
    arguments: str = "{}"
    id: str | None = None
    custom: bool = False


def _call_json(c: Call, cid: str | None, arguments: str) -> dict[str, Any]:
    """One `tool_calls` entry (the first of a stream carries id, type and name)."""
    key, field = ("custom", "input") if c.custom else ("function", "arguments")
    if cid is None:
        return {key: {field: arguments}}
    return {"id": cid, "type": key, key: {"name": c.name, field: arguments}}


def completion(
    *,
    content: str | None = "Hello from the fake server.",
    reasoning: str | None = None,
    calls: Sequence[Call] = (),
    finish_reason: str | None = None,
    usage_mode: str = "final",  # final | separate | none
    with_time_info: bool = True,
    keepalive: bool = False,
    split_frames: bool = False,
    done: bool = True,
    interleave_calls: bool = False,
    fragments: int = 3,
    error_after: dict[str, Any] | None = None,  # a mid-stream error payload sent after the content
    event_error: bool = False,  # send error_after with `event: error`
    headers: dict[str, str] | None = None,
    tail: Sequence[Part] = (),  # parts appended after everything (e.g. Pause, ABORT)
    usage_extra: dict[str, Any] | None = None,  # merged into `usage` (details dicts merged too)
) -> Callable[[RecordedRequest], Reply]:
    """The general builder: a role chunk, reasoning deltas, content deltas, tool-call fragments,
    the finish chunk with usage+time_info (or usage in a separate `choices: []` chunk), [DONE].
    As Cerebras does, the reply names the service tier it used when the request named one
    (`auto` -> `default`) and counts image inputs in `usage.image_tokens` (85 per image)."""

    def render(req: RecordedRequest) -> Reply:
        model = (req.body or {}).get("model", "gpt-oss-120b")
        call_ids = [c.id or f"call_fake_{i}" for i, c in enumerate(calls)]
        fr = finish_reason or ("tool_calls" if calls else "stop")
        r_pieces = _pieces(reasoning) if reasoning else []
        c_pieces = _pieces(content) if content else []
        u = usage(_prompt_tokens(req), len(r_pieces) + len(c_pieces) + 8 * len(calls), len(r_pieces))
        images = _image_parts(req)
        if images:
            u["image_tokens"] = 85 * images
            u["prompt_tokens"] += 85 * images
            u["total_tokens"] += 85 * images
        for k, v in (usage_extra or {}).items():
            u[k] = {**u[k], **v} if isinstance(v, dict) and isinstance(u.get(k), dict) else v
        tier = (req.body or {}).get("service_tier")
        tiered = {"service_tier": "default" if tier == "auto" else tier} if tier else {}
        hdrs = {"x-ratelimit-remaining-requests-day": "14399", "x-ratelimit-remaining-tokens-minute": "59000"}
        hdrs.update(headers or {})
        asked = bool((req.body or {}).get("logprobs"))
        top = int((req.body or {}).get("top_logprobs") or 0)
        if not req.stream:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if reasoning:
                message["reasoning"] = reasoning
            if calls:
                message["tool_calls"] = [
                    _call_json(c, cid, c.arguments) for cid, c in zip(call_ids, calls, strict=True)
                ]
            body = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": CREATED,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "message": message, "finish_reason": fr}],
                "usage": u,
                **tiered,
            }
            if asked:
                body["choices"][0]["logprobs"] = {"content": [lp for p in c_pieces for lp in token_logprobs(p, top)]}
            if with_time_info:
                body["time_info"] = time_info()
            return Reply(200, hdrs, json=body)
        parts: list[Part] = [chunk({"role": "assistant"}, model=model)]
        if keepalive:
            parts.append(": keep-alive\n\n")
        parts += [chunk({"reasoning": p}, model=model) for p in r_pieces]
        parts += [
            chunk({"content": p}, model=model, logprobs=token_logprobs(p, top) if asked else None) for p in c_pieces
        ]
        per_call: list[list[dict[str, Any]]] = []
        for i, (cid, c) in enumerate(zip(call_ids, calls, strict=True)):
            frags = _split3(c.arguments) if fragments == 3 else [c.arguments]
            frames = [chunk({"tool_calls": [{"index": i, **_call_json(c, cid, "")}]}, model=model)]
            frames += [chunk({"tool_calls": [{"index": i, **_call_json(c, None, f)}]}, model=model) for f in frags]
            per_call.append(frames)
        if interleave_calls:
            for group in itertools.zip_longest(*per_call):
                parts += [f for f in group if f is not None]
        else:
            for frames in per_call:
                parts += frames
        if keepalive:
            parts.append(": keep-alive\n\n")
        if error_after is not None:
            if event_error:
                parts.append("event: error\ndata: " + json.dumps(error_after) + "\n\n")
            else:
                parts.append(error_after)
            return Reply(200, hdrs, sse=_split(parts) if split_frames else parts)
        extra: dict[str, Any] = dict(tiered)
        if usage_mode == "final":
            extra["usage"] = u
            if with_time_info:
                extra["time_info"] = time_info()
        parts.append(chunk({}, fr, model=model, **extra))
        if usage_mode == "separate":
            sep: dict[str, Any] = {"usage": u}
            if with_time_info:
                sep["time_info"] = time_info()
            parts.append(chunk(None, model=model, **sep))
        if done:
            parts.append("data: [DONE]\n\n")
        parts += list(tail)
        return Reply(200, hdrs, sse=_split(parts) if split_frames else parts)

    return render


def _frame_bytes(p: Part) -> bytes:
    if isinstance(p, dict):
        return b"data: " + json.dumps(p, separators=(",", ":")).encode() + b"\n\n"
    if isinstance(p, str):
        return p.encode()
    assert isinstance(p, bytes)
    return p


def _split(parts: Iterable[Part]) -> list[Part]:
    """Every frame written in two halves, with a short pause between, so reads see partial frames."""
    out: list[Part] = []
    for p in parts:
        if isinstance(p, Pause | _Abort):
            out.append(p)
            continue
        b = _frame_bytes(p)
        cut = max(1, len(b) // 2)
        out += [b[:cut], Pause(0.003), b[cut:]]
    return out


# --- scenario builders ----------------------------------------------------------------------------


def text(
    content: str = "Hello from the fake server.", reasoning: str | None = None, **kw: Any
) -> Callable[[RecordedRequest], Reply]:
    """A text stream (optionally reasoning first), usage + time_info on the final chunk."""
    return completion(content=content, reasoning=reasoning, **kw)


def text_tokens(n: int, **kw: Any) -> Callable[[RecordedRequest], Reply]:
    """A text stream of n one-word deltas."""
    return completion(content=" ".join(f"w{i}" for i in range(n)), **kw)


def tool_calls(*calls: Call, **kw: Any) -> Callable[[RecordedRequest], Reply]:
    """Tool calls, each call's arguments split across 3 fragments (default: two parallel calls)."""
    if not calls:
        calls = (
            Call("get_weather", '{"city": "Paris", "unit": "celsius"}', "call_weather_1"),
            Call("get_time", '{"timezone": "Europe/Paris"}', "call_time_2"),
        )
    kw.setdefault("content", None)
    return completion(calls=calls, **kw)


def length(**kw: Any) -> Callable[[RecordedRequest], Reply]:
    kw.setdefault("content", "This answer is cut")
    return completion(finish_reason="length", **kw)


def usage_separate(**kw: Any) -> Callable[[RecordedRequest], Reply]:
    return completion(usage_mode="separate", **kw)


def mid_stream_error(
    status_code: int = 500, message: str = "Internal server error", *, event: bool = False, **kw: Any
) -> Callable[[RecordedRequest], Reply]:
    payload = {
        "error": {"message": message, "type": "server_error", "param": None, "code": "internal_error"},
        "status_code": status_code,
    }
    kw.setdefault("content", "Partial answer")
    return completion(error_after=payload, event_error=event, **kw)


def no_done(**kw: Any) -> Callable[[RecordedRequest], Reply]:
    """A stream that ends cleanly (chunked body terminated) without `data: [DONE]`."""
    return completion(done=False, usage_mode="none", **kw)


def stall(after_chunks: int = 1, seconds: float = 10.0) -> Callable[[RecordedRequest], Reply]:
    """Sends `after_chunks` content chunks, then nothing for `seconds` (a hang-up ends it early)."""

    def render(req: RecordedRequest) -> Reply:
        parts: list[Part] = [chunk({"role": "assistant"})]
        parts += [chunk({"content": f"tok{i} "}) for i in range(after_chunks)]
        parts += [Pause(seconds), chunk({}, "stop"), "data: [DONE]\n\n"]
        return Reply(200, {}, sse=parts)

    return render


def slow(count: int = 200, interval: float = 0.02) -> Callable[[RecordedRequest], Reply]:
    """`count` content chunks, `interval` seconds apart."""

    def render(req: RecordedRequest) -> Reply:
        parts: list[Part] = [chunk({"role": "assistant"})]
        for i in range(count):
            parts += [chunk({"content": f"tok{i} "}), Pause(interval)]
        parts += [chunk({}, "stop", usage=usage(), time_info=time_info()), "data: [DONE]\n\n"]
        return Reply(200, {}, sse=parts)

    return render


def paced(
    count: int = 50, interval: float = 0.01, burst: int = 1, ttft: float = 0.0
) -> Callable[[RecordedRequest], Reply]:
    """A real server's pace: `count` content chunks of one token each (`" w<i>"`), `interval`
    seconds apart on average, after `ttft`. `burst` > 1 sends that many chunks back to back (each
    its own write) every `burst * interval` seconds, as vLLM and Cerebras deliver. Usage on the
    finish chunk, then `[DONE]`."""

    def render(req: RecordedRequest) -> Reply:
        parts: list[Part] = [chunk({"role": "assistant", "content": ""})]
        if ttft > 0:
            parts.append(Pause(ttft))
        for i in range(count):
            if i and i % burst == 0:
                parts.append(Pause(interval * burst))
            parts.append(chunk({"content": f" w{i}"}))
        parts += [chunk({}, "stop", usage=usage(_prompt_tokens(req), count)), "data: [DONE]\n\n"]
        return Reply(200, {}, sse=parts)

    return render


def runaway(count: int = 5000, completion_tokens: int | None = None) -> Callable[[RecordedRequest], Reply]:
    """An upstream that ignores the output cap it was sent: `count` content chunks of one token
    each (" word", one o200k token), then a `stop` finish whose usage reports `completion_tokens`
    (default `count`)."""

    def render(req: RecordedRequest) -> Reply:
        parts: list[Part] = [chunk({"role": "assistant"})]
        parts += [chunk({"content": " word"}) for _ in range(count)]
        reported = usage(_prompt_tokens(req), count if completion_tokens is None else completion_tokens)
        parts += [chunk({}, "stop", usage=reported), "data: [DONE]\n\n"]
        return Reply(200, {}, sse=parts)

    return render


def keepalive_forever(seconds: float = 10.0, interval: float = 0.05) -> Callable[[RecordedRequest], Reply]:
    """One content chunk, then nothing but SSE keep-alive comments every `interval` seconds for
    `seconds` (a read timeout never fires; a hang-up ends it early)."""

    def render(req: RecordedRequest) -> Reply:
        parts: list[Part] = [chunk({"role": "assistant"}), chunk({"content": "thinking"})]
        for _ in range(int(seconds / interval)):
            parts += [": keep-alive\n\n", Pause(interval)]
        parts += [chunk({}, "stop"), "data: [DONE]\n\n"]
        return Reply(200, {}, sse=parts)

    return render


def http_error(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
    if body is None:
        body = error_body(
            f"fake error {status}",
            "server_error" if status >= 500 else "invalid_request_error",
            None,
            f"http_{status}",
        )
    return Reply(status, dict(headers or {}), json=body)


def bad_request(message: str = "store: property 'store' is unsupported") -> Reply:
    """400 with Cerebras's top-level `wrong_api_format` body."""
    return http_error(
        400, error_body(message, "invalid_request_error", "validation_error", "wrong_api_format")
    )


def rate_limited(retry_after_ms: int | None = 20, retry_after: str | None = None) -> Reply:
    """429 with retry-after-ms (and/or retry-after) and the x-ratelimit-* headers."""
    headers = {
        "x-ratelimit-limit-requests-day": "14400",
        "x-ratelimit-limit-tokens-minute": "60000",
        "x-ratelimit-remaining-requests-day": "14000",
        "x-ratelimit-remaining-tokens-minute": "0",
        "x-ratelimit-reset-requests-day": "3600.5",
        "x-ratelimit-reset-tokens-minute": "12.25",
    }
    if retry_after_ms is not None:
        headers["retry-after-ms"] = str(retry_after_ms)
    if retry_after is not None:
        headers["retry-after"] = retry_after
    body = error_body(
        "Tokens per minute limit exceeded - too many tokens processed.",
        "too_many_tokens_error",
        "quota",
        "token_quota_exceeded",
    )
    return http_error(429, body, headers)


def unavailable(retry_after_ms: int | None = 10) -> Reply:
    headers = {"retry-after-ms": str(retry_after_ms)} if retry_after_ms is not None else {}
    return http_error(
        503,
        error_body("Service temporarily unavailable", "server_error", None, "service_unavailable"),
        headers,
    )


def sequence(*scenarios: Scenario) -> Callable[[RecordedRequest], Reply]:
    """Scenario i for the i-th call; the last one repeats (e.g. `sequence(rate_limited(), text())`)."""
    lock = threading.Lock()
    count = [0]

    def render(req: RecordedRequest) -> Reply:
        with lock:
            i = min(count[0], len(scenarios) - 1)
            count[0] += 1
        s = scenarios[i]
        return s(req) if callable(s) else s

    return render


# Named scenarios a test can select with a last user message "scenario: NAME" (fresh per server).
BUILTIN_SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "text": lambda: text(),
    "reasoning": lambda: text("The answer is 42.", reasoning="Let me think about it step by step."),
    "tools": lambda: tool_calls(),
    "tools_interleaved": lambda: tool_calls(interleave_calls=True),
    "length": lambda: length(),
    "content_filter": lambda: completion(content="I can't", finish_reason="content_filter"),
    "usage_separate": lambda: usage_separate(),
    "mid_stream_error": lambda: mid_stream_error(),
    "event_error": lambda: mid_stream_error(event=True),
    "bad_request": lambda: bad_request(),
    "rate_limit_once": lambda: sequence(rate_limited(), text()),
    "unavailable_once": lambda: sequence(unavailable(), text()),
    "unavailable": lambda: unavailable(),
    "no_done": lambda: no_done(),
    "abort": lambda: completion(done=False, usage_mode="none", tail=[ABORT]),
    "stall": lambda: stall(),
    "slow": lambda: slow(),
    "paced": lambda: paced(),
    "split": lambda: text(
        "Split frames arrive in pieces.", reasoning="Thinking in halves.", split_frames=True
    ),
    "keepalive": lambda: text("Kept alive.", keepalive=True),
}


# --- the server ------------------------------------------------------------------------------------


class _Disconnected(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        delay = self.server.fake.new_connection_delay_s
        if delay:  # what a TCP + TLS handshake costs a real client, paid once per connection
            time.sleep(delay)

    # plumbing -------------------------------------------------------------------------------

    def _record(self) -> RecordedRequest:
        n = int(self.headers.get("content-length") or 0)
        rate = self.server.fake.body_bytes_per_s
        if rate and n:  # the request body arrives over a link of this bandwidth
            parts, left = [], n
            while left:
                part = self.rfile.read(min(left, 16_384))
                if not part:
                    break
                parts.append(part)
                left -= len(part)
                time.sleep(len(part) / rate)
            raw = b"".join(parts)
        else:
            raw = self.rfile.read(n) if n else b""
        wire = len(raw)
        if raw and self.headers.get("content-encoding", "").lower() == "gzip":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError):
                raw = b"\xff"  # not gzip after all: answered as a body that is not JSON
        body = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        rec = RecordedRequest(
            self.command,
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            raw,
            body,
            peer=tuple(self.client_address[:2]),
            wire_bytes=wire,
        )
        self.server.fake._record(rec)
        return rec

    def _send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _authorized(self, rec: RecordedRequest) -> bool:
        key = self.server.fake.api_key
        if key is None or rec.headers.get("authorization") == f"Bearer {key}":
            return True
        self._send_json(401, error_body("Wrong API Key", "invalid_request_error", "api_key", "wrong_api_key"))
        return False

    def _wait(self, seconds: float) -> None:
        """Sleep, but notice a client hang-up (EOF on the socket) or the server closing."""
        fake = self.server.fake
        deadline = time.monotonic() + seconds
        sock = self.connection
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or fake._closing.is_set():
                return
            try:
                r, _, _ = select.select([sock], [], [], min(left, 0.05))
                gone = bool(r) and sock.recv(1, socket.MSG_PEEK) == b""
            except OSError as exc:
                raise _Disconnected from exc
            if gone:
                raise _Disconnected

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # routes ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        rec = self._record()
        if not self._authorized(rec):
            return
        fake = self.server.fake
        if self.path.startswith("/v1/models/"):
            info = fake.model_info(urllib.parse.unquote(self.path[len("/v1/models/") :].split("?")[0]))
            if info is None:
                self._send_json(404, error_body("Model not found", "not_found_error", "model", "model_not_found"))
            else:
                self._send_json(200, info)
        elif self.path.rstrip("/") in ("/v1/models", "/models"):
            data = [
                {"id": m, "object": "model", "created": CREATED, "owned_by": self.server.fake.owned_by}
                for m in self.server.fake.models
            ]
            self._send_json(200, {"object": "list", "data": data})
        elif self.path.startswith("/v1/tcp_warming"):
            self._send_json(200, {})
        else:
            self._send_json(404, error_body(f"no route {self.path}", "not_found_error", None, "not_found"))

    def do_POST(self) -> None:
        rec = self._record()
        fake = self.server.fake
        if self.path == "/extras/tokenize/count" and isinstance(rec.body, dict):
            # llama-cpp-python's tokenizer endpoint; the fake's "tokenizer" counts words.
            self._send_json(200, {"count": len(str(rec.body.get("input", "")).split())})
            return
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._send_json(404, error_body(f"no route {self.path}", "not_found_error", None, "not_found"))
            return
        if not self._authorized(rec):
            return
        if not isinstance(rec.body, dict):
            self._send_json(
                400,
                error_body(
                    "Request body is not valid JSON", "invalid_request_error", "body", "wrong_api_format"
                ),
            )
            return
        problem = fake._validate(rec)
        if problem is not None:
            status, body = problem
            self._send_json(status, body)
            return
        reply = fake._select(rec)
        if reply.sse is None:
            self._send_json(reply.status, reply.json if reply.json is not None else {}, reply.headers)
            return
        self.send_response(reply.status)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()
        try:
            for part in reply.sse:
                if isinstance(part, Pause):
                    self._wait(part.seconds)
                elif isinstance(part, _Abort):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                else:
                    self._write_chunk(_frame_bytes(part))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (_Disconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True
            fake._note_disconnect()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeChatServer


class FakeChatServer:
    """The fake upstream. Use as a context manager (or `start()` / `close()`)."""

    def __init__(
        self,
        *,
        api_key: str | None = "test-key",
        models: Sequence[str] = ("gpt-oss-120b", "llama3.1-8b", "zai-glm-4.7"),
        strict: bool = True,
        check_model: bool = False,
        default: Scenario | None = None,
        lifetime_s: float = 60.0,
        owned_by: str = "Cerebras",
        new_connection_delay_s: float = 0.0,
        body_bytes_per_s: float | None = None,
    ) -> None:
        self.api_key = api_key
        self.owned_by = owned_by  # what GET /v1/models says (dialect detection reads it)
        self.new_connection_delay_s = new_connection_delay_s  # a handshake's cost, per new connection
        self.body_bytes_per_s = body_bytes_per_s  # a request body's upload bandwidth (None: loopback's)
        self.models = list(models)
        self.strict = strict
        self.check_model = check_model
        self.default: Scenario = default or text()
        self.lifetime_s = lifetime_s
        self.requests: list[RecordedRequest] = []
        self.disconnects = 0
        self.scenarios: dict[str, Scenario] = {name: make() for name, make in BUILTIN_SCENARIOS.items()}
        self._queue: deque[Scenario] = deque()
        self._lock = threading.Lock()
        self._disconnected = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    # lifecycle ------------------------------------------------------------------------------

    def start(self) -> FakeChatServer:
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self._timer = threading.Timer(self.lifetime_s, self.close)
        self._timer.daemon = True
        self._timer.start()
        return self

    def close(self) -> None:
        self._closing.set()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (`.../v1`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # scenarios ------------------------------------------------------------------------------

    def push(self, *scenarios: Scenario) -> None:
        """Queue replies for the next chat calls, in order (they win over names and the default)."""
        with self._lock:
            self._queue.extend(scenarios)

    def register(self, name: str, scenario: Scenario) -> None:
        self.scenarios[name] = scenario

    def _select(self, rec: RecordedRequest) -> Reply:
        with self._lock:
            scenario = self._queue.popleft() if self._queue else None
        if scenario is None:
            text_ = rec.last_user_text.strip()
            if text_.startswith("scenario:"):
                name = text_.split(":", 1)[1].strip().split()[0] if text_.split(":", 1)[1].strip() else ""
                rec.scenario = name
                scenario = self.scenarios.get(name)
                if scenario is None:
                    return http_error(
                        400,
                        error_body(f"fake: unknown scenario {name!r}", "invalid_request_error", None, "fake"),
                    )
            else:
                scenario = self.default
        return scenario(rec) if callable(scenario) else scenario

    def model_info(self, model: str) -> dict[str, Any] | None:
        """`GET /v1/models/{id}`'s body (None: 404); this fake knows no capabilities (see
        `tests.fakes.cerebras_v2` for a server that does)."""
        return None

    def _validate(self, rec: RecordedRequest) -> tuple[int, Any] | None:
        body = rec.body
        if not self.strict:
            return None
        for k in body:
            if k not in ALLOWED_FIELDS:
                return 400, error_body(
                    f"{k}: property '{k}' is unsupported",
                    "invalid_request_error",
                    "validation_error",
                    "wrong_api_format",
                )
        if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
            return 400, error_body(
                "body: 'model' and 'messages' are required",
                "invalid_request_error",
                "validation_error",
                "wrong_api_format",
            )
        for i, m in enumerate(body["messages"]):
            role = m.get("role") if isinstance(m, dict) else None
            allowed = ALLOWED_MESSAGE_FIELDS.get(role or "")
            if allowed is None:
                return 400, error_body(
                    f"messages[{i}].role: invalid role {role!r}",
                    "invalid_request_error",
                    "validation_error",
                    "wrong_api_format",
                )
            extra = set(m) - allowed
            if extra:
                k = sorted(extra)[0]
                return 400, error_body(
                    f"messages[{i}].{k}: property '{k}' is unsupported",
                    "invalid_request_error",
                    "validation_error",
                    "wrong_api_format",
                )
        if self.check_model and body["model"] not in self.models:
            return 404, error_body(
                f"Model {body['model']} does not exist or you do not have access to it.",
                "not_found_error",
                "model",
                "model_not_found",
            )
        return None

    # records --------------------------------------------------------------------------------

    def _record(self, rec: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(rec)

    def _note_disconnect(self) -> None:
        with self._lock:
            self.disconnects += 1
            self._disconnected.notify_all()

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [
                r
                for r in self.requests
                if r.method == "POST" and r.path.rstrip("/").endswith("/chat/completions")
            ]

    @property
    def last_body(self) -> dict[str, Any]:
        reqs = self.chat_requests
        assert reqs, "no chat request recorded"
        return reqs[-1].body

    def wait_for_disconnect(self, timeout: float = 2.0, count: int = 1) -> bool:
        """Block until at least `count` client hang-ups were seen (thread-blocking; see `disconnected`)."""
        with self._disconnected:
            return self._disconnected.wait_for(lambda: self.disconnects >= count, timeout)

    async def disconnected(self, within: float = 2.0, count: int = 1) -> bool:
        """Async form of `wait_for_disconnect` (polls, never blocks the event loop)."""
        deadline = time.monotonic() + within
        while self.disconnects < count:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True
