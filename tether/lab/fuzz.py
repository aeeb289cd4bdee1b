"""`tether fuzz`: generated and mutated inputs against every surface of a running Tether.

    tether fuzz --iterations 10000 --seed 1             # starts its own `tether serve` subprocess
    tether fuzz --iterations 2000 --target 127.0.0.1:8000,127.0.0.1:50051 --api-key KEY

Surfaces (each gets `--iterations` inputs):

- `ws`: WebSocket text (and a few binary) frames on long-lived connections to `/v1/responses`;
- `http`: HTTP requests: create bodies (JSON and SSE), input_tokens, compact, retrieve, delete,
  input_items (mutated ids and query strings), unknown paths and methods, bad auth headers;
- `grpc`: the `Session` stream fed semantically mutated `SessionRequest` protos (60%); raw
  mutated/random bytes on a fresh `Session` stream through a generic stub with identity
  serializers (25%); raw bytes to the unary RPCs (15%).

Inputs are seeded from valid traffic: at start the fuzzer runs a real rollout (a tool loop:
create with tools -> function_call -> function_call_output with `previous_response_id` -> text;
store=true and store=false; lanes; steer, append, cancel, processed) and records what it sent.
Mutations: JSON-level (drop/add/retype keys, boundary values, type swaps, duplication, deep
nesting, cross-over between seeds, real and foreign ids), text-level (truncate, splice, insert
brackets/escapes/control characters), proto-level (every field kind, oneof switches, unknown
fields) and raw-byte level; plus inputs generated from scratch.

Checks, per input: an answer within the deadline (`--deadline-s`; a WS frame or gRPC message is
followed by a sentinel `response.cancel` for an unknown id, whose `response_not_found` error
marks "everything before me was processed"; a create must then be answered by an `error` or a
`response.created`, and a created response must reach its terminal event); every reply well
formed (strict parse with the official SDK's pydantic types, the JSON error shapes, and the
event-sequence rules: created first, contiguous sequence numbers, exactly one terminal event);
no 5xx / `server_error`; the server process alive. After the campaign: the server still healthy
(a normal rollout over WebSocket, HTTP and gRPC succeeds), its RSS growth after warmup within
`--rss-growth-mib`, and no error lines in its log (own server only).

Findings are classes of outcomes that must not happen (`hang`, `malformed`, `http_5xx`,
`server_error`, `closed`, `crash`, ...); `deviation:*` classes are known, documented protocol
deviations counted separately. Exit status 0 when there are no findings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import random
import re
import statistics
import sys
import tempfile
import time
import typing
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tether.lab.load import ServerProcess, write_config
from tether.lab.metrics import ProcStat
from tether.protocol import json_codec

FUZZ_KEY = "sk-fuzz-0123456789abcdef"
SESSION_METHOD = "/tether.responses.v1.ResponsesService/Session"
UNARY_METHODS = (
    "GetResponse", "DeleteResponse", "ListInputItems", "CountInputTokens", "CompactResponse", "ListModels",
    "CreateResponse",
)  # fmt: skip
TERMINAL = ("response.completed", "response.failed", "response.incomplete")
SURFACES = ("ws", "http", "grpc")

# -- the official SDK's types (strict parsing of every reply) ---------------------------------------


class _Sdk:
    """Lazy TypeAdapters over the `openai` package's event and object types."""

    def __init__(self) -> None:
        from openai.types.responses import Response, ResponseError, ResponseStreamEvent
        from openai.types.responses.responses_server_event import ResponsesServerEvent
        from pydantic import TypeAdapter

        self.ws_event = _ByType(ResponsesServerEvent, TypeAdapter)
        self.sse_event = _ByType(ResponseStreamEvent, TypeAdapter)
        self.response = TypeAdapter(Response)
        self.error_codes = frozenset(typing.get_args(ResponseError.model_fields["code"].annotation))
        from openai.types.responses import Tool

        self.tool = TypeAdapter(Tool)
        self.notes: Counter[str] = Counter()

    def lenient(self, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The object with two known deviations neutralised, so the strict parse checks the rest:
        a `response.error.code` outside the SDK's enum (replaced; returns True), and hosted tools
        echoed as the client sent them, valid or not (dropped, counted in `notes`)."""
        if "response" in obj:
            holder = obj["response"]
        elif obj.get("object") == "response":
            holder = obj
        else:
            return obj, False  # an error envelope's code is a free string
        if not isinstance(holder, dict):
            return obj, False
        replaced = False
        err = holder.get("error")
        if isinstance(err, dict) and err.get("code") not in self.error_codes:
            obj = copy.deepcopy(obj)
            holder = obj["response"] if "response" in obj else obj
            holder["error"]["code"] = "server_error"
            replaced = True
        tools = holder.get("tools")
        if isinstance(tools, list) and any(
            isinstance(t, dict) and t.get("type") != "function" for t in tools
        ):
            keep = []
            for t in tools:
                if isinstance(t, dict) and t.get("type") != "function":
                    try:
                        self.tool.validate_python(t)
                    except Exception:  # noqa: BLE001
                        self.notes["hosted tool echoed unvalidated (not an SDK Tool)"] += 1
                        continue
                keep.append(t)
            if len(keep) != len(tools):
                if not replaced:
                    obj = copy.deepcopy(obj)
                    holder = obj["response"] if "response" in obj else obj
                holder["tools"] = keep
        return obj, replaced


class _ByType:
    """Validate an event against the one SDK model its `type` names (a discriminated union), so a
    failure says which field of which event is wrong; an unknown `type` is a failure too."""

    def __init__(self, union: Any, adapter: Any) -> None:
        if typing.get_origin(union) is typing.Annotated:
            union = typing.get_args(union)[0]
        self._models: dict[str, Any] = {}
        for cls in typing.get_args(union):
            for t in typing.get_args(cls.model_fields["type"].annotation):
                self._models[t] = adapter(cls)

    def validate_python(self, obj: Any) -> None:
        t = obj.get("type") if isinstance(obj, dict) else None
        model = self._models.get(t)  # type: ignore[arg-type]
        if model is None:
            raise ValueError(f"no SDK event type {t!r}")
        model.validate_python(obj)


def _sdk_sig(exc: Exception) -> str:
    """`sdk:<path>` of the first problem a pydantic ValidationError reports (indices as `*`)."""
    try:
        loc = exc.errors()[0]["loc"]  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        return "sdk:" + type(exc).__name__
    parts = ["*" if isinstance(x, int) else str(x) for x in loc]
    parts = [x for x in parts if not x[:1].isupper()]  # drop union member names
    return "sdk:" + ".".join(parts[:3])


# -- outcomes ---------------------------------------------------------------------------------------

FINDING_PREFIXES = (
    "hang",
    "malformed",
    "http_5xx",
    "server_error",
    "closed",
    "crash",
    "unanswered",
    "sequence",
)


@dataclass
class SurfaceStats:
    name: str
    inputs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    findings: Counter[str] = field(default_factory=Counter)
    deviations: Counter[str] = field(default_factory=Counter)
    signatures: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    warmup_inputs: int = 0

    def outcome(self, cls: str) -> None:
        self.outcomes[cls] += 1

    def finding(self, cls: str, example: Any, sig: str = "") -> None:
        """Count a finding; `sig` names its root cause as precisely as the fuzzer can tell."""
        self.findings[cls] += 1
        self.signatures[f"{cls}|{sig}"] += 1
        if cls not in self.examples:
            text = example if isinstance(example, str) else repr(example)
            self.examples[cls] = text[:3000]

    def deviation(self, cls: str) -> None:
        self.deviations[cls] += 1

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "inputs": self.inputs,
            "warmup_inputs": self.warmup_inputs,
            "seconds": round(self.seconds, 1),
            "outcomes": dict(self.outcomes.most_common()),
            "findings": dict(self.findings),
            "signatures": dict(self.signatures),
            "deviations": dict(self.deviations),
            "examples": self.examples,
            "latency_ms": {
                "p50": round(1000 * statistics.median(lat), 2) if lat else None,
                "p99": round(1000 * lat[int(0.99 * (len(lat) - 1))], 2) if lat else None,
                "max": round(1000 * lat[-1], 2) if lat else None,
            },
        }


@dataclass
class Report:
    surfaces: dict[str, SurfaceStats]
    rss: dict[str, int] = field(default_factory=dict)
    health: dict[str, Any] = field(default_factory=dict)
    server_log_errors: int = 0
    server_log_examples: list[str] = field(default_factory=list)
    server_log_signatures: Counter[str] = field(default_factory=Counter)
    seed: int = 0

    @property
    def findings(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for s in self.surfaces.values():
            total.update({f"{s.name}:{k}": v for k, v in s.findings.items()})
        if not self.health.get("ok", True):
            total["server:unhealthy_after"] += 1
        if self.rss.get("growth_exceeded"):
            total["server:rss_growth"] += 1
        if self.server_log_errors:
            total["server:log_errors"] += self.server_log_errors
        return total

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "surfaces": {k: v.summary() for k, v in self.surfaces.items()},
            "rss": self.rss,
            "health": self.health,
            "server_log_errors": self.server_log_errors,
            "server_log_signatures": dict(self.server_log_signatures),
            "server_log_examples": self.server_log_examples,
            "findings": dict(self.findings),
        }


# -- seeds ------------------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "name": "read_file", "description": "Read a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                    "additionalProperties": False}, "strict": True},
    {"type": "function", "name": "run_tests", "description": "Run the test suite.",
     "parameters": {"type": "object", "properties": {"filter": {"type": "string"}}}},
    {"type": "web_search", "external_web_access": False},
]  # fmt: skip

STATIC_SEEDS: list[dict[str, Any]] = [
    {"type": "response.create", "model": "gpt-5-codex", "instructions": "You are a coding agent.",
     "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]}],
     "tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False, "store": False, "stream": True,
     "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "medium", "summary": "auto"},
     "prompt_cache_key": "sess-1", "client_metadata": {"x-codex-turn-metadata": "{}"}},
    {"type": "response.create", "model": "m", "input": "hello", "store": True, "metadata": {"k": "v"},
     "max_output_tokens": 64, "temperature": 0.5, "top_p": 0.9, "user": "u1", "stream_id": "lane-a"},
    {"type": "response.create", "model": "m", "input": "json please",
     "text": {"format": {"type": "json_schema", "name": "answer", "strict": True,
                         "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}},
    {"type": "response.create", "model": "m", "input": "warm", "generate": False, "store": False},
    {"type": "response.create", "model": "m", "input": "compact me " * 50,
     "context_management": [{"type": "compaction", "compact_threshold": 1000}]},
    {"type": "response.create", "model": "m", "input": [
        {"type": "message", "role": "developer", "content": "be brief"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{\"path\":\"a\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "contents"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
    {"type": "response.steer", "previous_response_id": "resp_0", "input": "go left"},
    {"type": "response.append", "input": [{"type": "message", "role": "user", "content": "more"}]},
    {"type": "response.cancel", "response_id": "resp_0"},
    {"type": "response.processed", "response_id": "resp_0"},
]  # fmt: skip

KEYS = (
    "model input instructions tools tool_choice stream store previous_response_id max_output_tokens temperature "
    "top_p metadata include reasoning text parallel_tool_calls truncation user prompt_cache_key safety_identifier "
    "service_tier background stream_id generate context_management max_tool_calls conversation prompt "
    "client_metadata type role content id call_id name arguments output status summary encrypted_content "
    "image_url detail file_id filename text effort format schema strict parameters response_id compact_threshold"
).split()
TYPES = (
    "response.create response.steer response.append response.cancel response.processed response.explode "
    "message function_call function_call_output reasoning compaction item_reference input_text output_text "
    "input_image input_file refusal function web_search json_schema json_object text summary_text compaction"
).split()


def record_seeds(ws_url: str, api_key: str) -> list[dict[str, Any]]:
    """Run a real rollout and return every frame it sent (with real ids in them)."""
    return asyncio.run(_record_seeds(ws_url, api_key))


async def _record_seeds(ws_url: str, api_key: str) -> list[dict[str, Any]]:
    from websockets.asyncio.client import connect

    sent: list[dict[str, Any]] = []
    async with connect(
        ws_url, additional_headers={"Authorization": f"Bearer {api_key}"}, max_size=None
    ) as conn:

        async def turn(frame: dict[str, Any]) -> dict[str, Any]:
            sent.append(frame)
            await conn.send(orjson.dumps(frame).decode())
            while True:
                ev = orjson.loads(await asyncio.wait_for(conn.recv(), 30))
                if ev["type"] in TERMINAL or ev["type"] == "error":
                    return ev

        for store in (True, False):
            first = await turn({"type": "response.create", "model": "gpt-5-codex", "instructions": "You are a coding agent.",
                                "input": "fix the failing test", "tools": TOOLS, "store": store, "stream_id": f"rec-{store}"})  # fmt: skip
            if first["type"] != "response.completed":
                continue
            rid = first["response"]["id"]
            calls = [o for o in first["response"]["output"] if o["type"] == "function_call"]
            outputs = [{"type": "function_call_output", "call_id": c["call_id"], "output": "def f():\n    return 1\n"}
                       for c in calls]  # fmt: skip
            second = await turn({"type": "response.create", "model": "gpt-5-codex", "previous_response_id": rid,
                                 "input": outputs, "tools": TOOLS, "store": store, "stream_id": f"rec-{store}"})  # fmt: skip
            if second["type"] == "response.completed":
                rid2 = second["response"]["id"]
                await turn({"type": "response.create", "model": "gpt-5-codex", "previous_response_id": rid2,
                            "input": "now run the tests", "store": store})  # fmt: skip
                sent.append({"type": "response.processed", "response_id": rid2})
                sent.append({"type": "response.steer", "previous_response_id": rid2, "input": "also lint"})
                sent.append({"type": "response.cancel", "response_id": rid2})
    return sent


# -- mutation ---------------------------------------------------------------------------------------

_NUMBERS = [0, -1, 1, 2, 7, 255, 256, 65535, 2**31 - 1, 2**31, -(2**31) - 1, 2**32, 2**53 + 1, 2**63 - 1, -(2**63),
            2**64 - 1, 1.5, -0.0, 1e-320, 3.4e38, 1e308, -1e308, 0.1]  # fmt: skip
_PALETTE = '{}[]",:\\ \t\n0123456789abcdefxyz-.eE+éü😀\u2028\u0000\u001f/'


class Mutator:
    def __init__(self, rng: random.Random, seeds: list[dict[str, Any]], *, huge_rate: float = 0.002) -> None:
        self.rng = rng
        self.seeds = seeds
        self.huge_rate = huge_rate
        self.ids = sorted(
            {v for s in seeds for v in _strings(s) if v.startswith(("resp_", "call_", "msg_", "fc_"))}
        )
        self.keys = sorted({*KEYS, *(k for s in seeds for k in _keys(s))})

    # values
    def string(self) -> str:
        r = self.rng
        choice = r.random()
        if choice < self.huge_rate:
            return "huge " * 220_000  # 1.1 million characters (within every byte limit)
        if choice < 0.15:
            return r.choice(self.ids) if self.ids else "resp_missing"
        if choice < 0.25:
            return r.choice(TYPES)
        if choice < 0.35:
            return f"resp_{r.getrandbits(128):032x}"
        if choice < 0.45:
            return r.choice(["", " ", "\u0000", "\ud7ff\ue000", "é" * 300, "😀" * 50, "<|start|>user<|message|>hi<|end|>",
                             "../../etc/passwd", "%s%n%x", "null", "true", "-0", "\\", '"', "\u2028", "a b", "lane.1"])  # fmt: skip
        if choice < 0.55:
            return r.choice("ab_-.Z9") * r.choice(
                [1, 64, 65, 128, 129, 255, 256, 257, 512, 513, 1024, 70_000]
            )
        n = r.randint(0, 40)
        return "".join(r.choice(_PALETTE) for _ in range(n))

    def number(self) -> Any:
        return self.rng.choice(_NUMBERS)

    def value(self, depth: int = 0) -> Any:
        r = self.rng
        kind = r.randint(0, 7 if depth < 4 else 4)
        if kind == 0:
            return None
        if kind == 1:
            return r.random() < 0.5
        if kind == 2:
            return self.number()
        if kind in (3, 4):
            return self.string()
        if kind == 5:
            return [self.value(depth + 1) for _ in range(r.randint(0, 4))]
        if kind == 6 and self.seeds:
            return copy.deepcopy(r.choice(self.seeds))
        return {self.key(): self.value(depth + 1) for _ in range(r.randint(0, 4))}

    def key(self) -> str:
        return self.rng.choice(self.keys) if self.rng.random() < 0.85 else self.string()[:40]

    # structures
    def mutate_obj(self, obj: Any, ops: int = 1) -> Any:
        obj = copy.deepcopy(obj)
        for _ in range(ops):
            obj = self._one(obj)
        return obj

    def _one(self, root: Any) -> Any:
        r = self.rng
        slots = list(_slots(root))
        if not slots:
            return self.value()
        parent, key = r.choice(slots)
        op = r.randint(0, 11)
        current = parent[key]
        if op == 0 and isinstance(parent, dict):
            del parent[key]
        elif op == 1:
            parent[key] = self.value()
        elif op == 2:
            parent[key] = self.string()
        elif op == 3:
            parent[key] = self.number()
        elif op == 4 and isinstance(current, list) and current:
            parent[key] = current * r.choice([2, 3, 50, 300])
        elif op == 5 and isinstance(parent, dict):
            parent[self.key()] = self.value()
        elif op == 6:
            nested: Any = current
            for _ in range(r.choice([2, 30, 62, 63, 64, 65, 70, 200])):
                nested = [nested] if r.random() < 0.5 else {"k": nested}
            parent[key] = nested
        elif op == 7 and isinstance(current, dict) and "type" in current:
            current["type"] = r.choice(TYPES)
        elif op == 8 and self.seeds:
            donor = r.choice(self.seeds)
            if isinstance(donor, dict) and donor:
                k = r.choice(list(donor))
                parent[key] = copy.deepcopy(donor[k])
        elif op == 9:
            parent[key] = r.choice([None, True, False, [], {}, "", 0])
        elif op == 10 and isinstance(current, str) and self.ids:
            parent[key] = r.choice(self.ids)
        else:
            parent[key] = [current, copy.deepcopy(current)] if r.random() < 0.5 else {"v": current}
        return root

    def mutate_text(self, text: str) -> str:
        r = self.rng
        if not text:
            return self.string()
        i = r.randrange(len(text) + 1)
        j = min(len(text), i + r.randint(0, 20))
        op = r.randint(0, 8)
        if op == 0:
            return text[:i]
        if op == 1:
            return text[:i] + text[j:]
        if op == 2:
            return text[:i] + text[i:j] * r.randint(2, 20) + text[j:]
        if op == 3:
            return text[:i] + "".join(r.choice(_PALETTE) for _ in range(r.randint(1, 8))) + text[i:]
        if op == 4:
            return text[:i] + "[" * r.choice([10, 64, 65, 1000]) + text[i:]
        if op == 5:
            return text[:i] + r.choice(['\\ud800', '\\u0000', '\\"', "\\x", "\\", "\u0000", '"', "18446744073709551616",
                                        "1e400", "-", "NaN", "Infinity", ",,", "}"]) + text[i:]  # fmt: skip
        if op == 6:
            k = r.randrange(len(text))
            return text[:k] + r.choice(_PALETTE) + text[k + 1 :]
        if op == 7:
            return text + r.choice(["", " ", "\n", "{}", "x", "]"])
        return text[j:] + text[:i]

    def ws_input(self) -> tuple[str | bytes, str]:
        """One WebSocket frame and a label of how it was made."""
        r = self.rng
        seed = r.choice(self.seeds)
        roll = r.random()
        if roll < 0.10:
            return orjson.dumps(seed).decode(), "seed"
        if roll < 0.50:
            return _dumps(self.mutate_obj(seed, r.choice([1, 1, 1, 2, 3, 4]))), "json"
        if roll < 0.75:
            text = orjson.dumps(seed).decode()
            for _ in range(r.choice([1, 1, 2, 3])):
                text = self.mutate_text(text)
            return text, "text"
        if roll < 0.85:
            obj = self.value()
            if isinstance(obj, dict) and r.random() < 0.7:
                obj["type"] = r.choice(TYPES[:6])
            return _dumps(obj), "generated"
        if roll < 0.88:
            data = orjson.dumps(seed) if r.random() < 0.5 else r.randbytes(r.randint(0, 200))
            return data, "binary"
        return "".join(r.choice(_PALETTE) for _ in range(r.randint(0, 200))), "chars"


def _dumps(obj: Any) -> str:
    try:
        return orjson.dumps(obj).decode()
    except (TypeError, orjson.JSONEncodeError):
        return repr(obj)


def _slots(obj: Any) -> Iterable[tuple[Any, Any]]:
    stack = [obj]
    seen = 0
    while stack and seen < 2000:
        node = stack.pop()
        seen += 1
        if isinstance(node, dict):
            for k, v in node.items():
                yield node, k
                stack.append(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield node, i
                stack.append(v)


def _strings(obj: Any) -> Iterable[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _keys(obj: Any) -> Iterable[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _keys(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _keys(v)


# -- the event oracle (shared by WebSocket and gRPC sessions) ---------------------------------------


class StreamChecker:
    """Checks server events of one connection: strict SDK parse, error shapes, per-response order."""

    def __init__(self, sdk: _Sdk, stats: SurfaceStats) -> None:
        self.sdk = sdk
        self.stats = stats
        self.seq: dict[str, int] = {}  # response id -> next sequence number
        self.lane_current: dict[str, str] = {}  # lane -> in-flight response id
        self.in_flight: set[str] = set()

    def check(self, ev: Any, raw: Any) -> str:
        """Validate one event; returns its type ("" when malformed)."""
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
            self.stats.finding("malformed", raw)
            return ""
        lenient, replaced = self.sdk.lenient(ev)
        if replaced:
            self.stats.deviation("response.error.code not in the SDK enum")
        try:
            self.sdk.ws_event.validate_python(lenient)
        except Exception as exc:  # noqa: BLE001 - any validation failure is a finding
            self.stats.finding("malformed", f"{exc!s:.1500} :: {raw!s:.200}", _sdk_sig(exc))
            if not isinstance(ev.get("response", {}), dict) or not isinstance(ev.get("error", {}), dict):
                return ""  # too broken to follow; otherwise keep the bookkeeping going
        t = ev["type"]
        lane = ev.get("stream_id", "")
        if t == "error":
            err = ev.get("error") or {}
            if not isinstance(ev.get("status"), int) or not isinstance(err.get("code"), str):
                self.stats.finding("malformed", raw)
            elif ev["status"] >= 500 or err["code"] == "server_error":
                self.stats.finding("server_error", raw, "error-event")
                stuck = self.lane_current.get(lane)
                if stuck in self.in_flight:  # the server gave up on it without a terminal event
                    self.stats.finding(
                        "sequence",
                        f"{stuck}: server_error, no terminal event",
                        "no-terminal-after-server-error",
                    )
                    self.in_flight.discard(stuck)
            return t
        if t.startswith("response.steer."):
            return t
        rid = ev["response"]["id"] if "response" in ev else self.lane_current.get(lane)
        if rid is None:
            self.stats.finding("sequence", f"{t} with no response in flight on lane {lane!r}")
            return t
        if t == "response.created":
            if rid in self.seq:
                self.stats.finding("sequence", f"{rid} created twice")
            self.seq[rid] = 0
            self.lane_current[lane] = rid
            self.in_flight.add(rid)
        expected = self.seq.get(rid)
        if expected is None or ev.get("sequence_number") != expected:
            self.stats.finding("sequence", f"{rid}: {t} seq {ev.get('sequence_number')} != {expected}")
        else:
            self.seq[rid] = expected + 1
        if t in TERMINAL:
            self.in_flight.discard(rid)
            self.seq.pop(rid, None)
            if (
                ev["response"].get("status") == "failed"
                and (ev["response"].get("error") or {}).get("code") == "server_error"
            ):
                self.stats.finding("server_error", raw, "response.failed")
        return t


def is_sentinel(ev: Any, sentinel: str) -> bool:
    return (
        isinstance(ev, dict)
        and ev.get("type") == "error"
        and isinstance(ev.get("error"), dict)
        and sentinel in str(ev["error"].get("message", ""))
    )


def client_kind(frame: str | bytes, max_bytes: int, max_depth: int) -> str:
    """What the bridge will make of a frame: its client event arm, or "undecodable"."""
    if isinstance(frame, bytes):
        return "undecodable"
    try:
        if len(frame.encode()) > max_bytes:
            return "undecodable"
        obj = json_codec.loads(frame, max_depth=max_depth)
        if not isinstance(obj, dict):
            return "undecodable"
        return json_codec.client_event_from_json(obj).WhichOneof("event") or "undecodable"
    except Exception:  # noqa: BLE001 - any decode failure
        return "undecodable"


def _outcome_of(events: list[dict[str, Any]]) -> str:
    for ev in events:
        t = ev.get("type") if isinstance(ev, dict) else None
        if t == "error":
            return f"error:{(ev.get('error') or {}).get('code')}"
        if t in TERMINAL:
            return f"{t}:{ev['response'].get('status')}"
        if t and t.startswith("response.steer."):
            return f"{t}:{(ev.get('error') or {}).get('code', 'ok')}"
    return "silent"


# -- the WebSocket surface ----------------------------------------------------------------------------


@dataclass
class Target:
    bridge: str  # host:port
    grpc: str  # host:port
    api_key: str
    max_request_bytes: int = 32 * 1024 * 1024
    max_json_depth: int = 64

    @property
    def ws_url(self) -> str:
        return f"ws://{self.bridge}/v1/responses"

    @property
    def http_url(self) -> str:
        return f"http://{self.bridge}"


async def fuzz_ws(target: Target, mutator: Mutator, n: int, stats: SurfaceStats, *, workers: int = 4,
                  deadline_s: float = 15.0, rotate: int = 400) -> None:  # fmt: skip
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    sdk = _Sdk()
    inputs = [mutator.ws_input() for _ in range(n)]
    headers = {"Authorization": f"Bearer {target.api_key}"}

    async def worker(w: int, share: list[tuple[str | bytes, str]]) -> None:
        conn = None
        checker = StreamChecker(sdk, stats)
        for i, (frame, how) in enumerate(share):
            if conn is None or i % rotate == 0:
                if conn is not None:
                    await conn.close()
                conn = await connect(
                    target.ws_url, additional_headers=headers, max_size=None, compression=None
                )
                checker = StreamChecker(sdk, stats)
            sentinel = f"fuzzsentinel{w}x{i}"
            kind = client_kind(frame, target.max_request_bytes, target.max_json_depth)
            started = time.perf_counter()
            try:
                answer = await asyncio.wait_for(_ws_one(conn, checker, frame, kind, sentinel), deadline_s)
                stats.outcome(answer)
            except TimeoutError:
                stats.finding("hang", f"{how}: {frame!s:.300}", "ws")
                await conn.close()
                conn = None
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd else None
                if code == 1009 and isinstance(frame, str) and len(frame) > 4 * target.max_request_bytes:
                    stats.outcome("closed:1009")
                else:
                    stats.finding("closed", f"code={code} after {how}: {frame!s:.300}")
                conn = None
            stats.latencies.append(time.perf_counter() - started)
            stats.inputs += 1
        if conn is not None:
            await conn.close()

    shares = [inputs[w::workers] for w in range(workers)]
    await asyncio.gather(*(worker(w, s) for w, s in enumerate(shares)))
    stats.deviations.update(sdk.notes)


async def _ws_one(conn: Any, checker: StreamChecker, frame: str | bytes, kind: str, sentinel: str) -> str:
    await conn.send(frame)
    await conn.send(orjson.dumps({"type": "response.cancel", "response_id": sentinel}).decode())
    replies: list[dict[str, Any]] = []

    async def next_event() -> Any:
        raw = await conn.recv()
        if not isinstance(raw, str):
            checker.stats.finding("malformed", f"binary frame from the server: {raw!r:.100}")
            return {}
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            checker.stats.finding("malformed", raw)
            return {}

    while True:  # everything before the sentinel's answer
        ev = await next_event()
        if is_sentinel(ev, sentinel):
            break
        checker.check(ev, ev)
        replies.append(ev)
    answered = any(e.get("type") in ("error", "response.created") for e in replies)
    if kind in ("create", "append") and not answered:
        while True:  # the lane worker answers: an error, or a response
            ev = await next_event()
            t = checker.check(ev, ev)
            replies.append(ev)
            if t in ("error", "response.created"):
                break
    elif kind not in ("processed",) and not replies:
        checker.stats.finding("unanswered", f"{kind}: {frame!s:.300}")
    while checker.in_flight:  # every response runs to its terminal event
        ev = await next_event()
        checker.check(ev, ev)
        replies.append(ev)
    return _outcome_of(replies)


# -- the HTTP surface ---------------------------------------------------------------------------------


def http_input(mutator: Mutator) -> tuple[str, str, dict[str, str], bytes | None, str]:
    """(method, path, extra headers, body, label)."""
    r = mutator.rng
    seed = {k: v for k, v in r.choice([s for s in mutator.seeds if s.get("type") == "response.create"]).items()
            if k not in ("type", "stream_id")}  # fmt: skip
    roll = r.random()
    headers: dict[str, str] = {"content-type": "application/json"}
    if r.random() < 0.04:
        headers["authorization"] = r.choice(
            ["", "Bearer", "Bearer wrong-key", "Basic abc", "Bearer " + "x" * 5000]
        )
    if roll < 0.45:
        body = mutator.mutate_obj(seed, r.choice([1, 1, 2, 3]))
        if isinstance(body, dict) and r.random() < 0.4:
            body["stream"] = True
        return "POST", "/v1/responses", headers, _dumps(body).encode(), "create-json"
    if roll < 0.60:
        text = orjson.dumps(seed).decode()
        for _ in range(r.choice([1, 2])):
            text = mutator.mutate_text(text)
        return "POST", "/v1/responses", headers, text.encode(), "create-text"
    if roll < 0.66:
        return "POST", "/v1/responses", headers, orjson.dumps(seed), "create-seed"
    if roll < 0.74:
        path = r.choice(["/v1/responses/input_tokens", "/v1/responses/compact"])
        return "POST", path, headers, _dumps(mutator.mutate_obj(seed)).encode(), "count-compact"
    if roll < 0.90:
        rid = mutator.string() if r.random() < 0.5 else (r.choice(mutator.ids) if mutator.ids else "resp_x")
        rid = "".join(c if c.isprintable() and c not in "/?#% " else "_" for c in rid)[:300] or "x"
        method, suffix = r.choice([("GET", ""), ("DELETE", ""), ("GET", "/input_items")])
        query = ""
        if suffix and r.random() < 0.7:
            query = "?" + "&".join(
                f"{r.choice(['limit', 'order', 'after', 'include', 'x'])}={r.choice(['0', '1', '100', '101', '-1', 'asc', 'desc', 'up', '', 'abc', rid])}"
                for _ in range(r.randint(1, 3))
            )  # fmt: skip
        return method, f"/v1/responses/{rid}{suffix}{query}", headers, None, "by-id"
    if roll < 0.95:
        path = r.choice(["/v1/models", "/v1", "/", "/v1/responses/a/b/c", "/healthz", "/readyz", "/v1/chat/completions",
                         "/v1/responses/%2e%2e/x", "/metrics"])  # fmt: skip
        method = r.choice(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])
        return method, path, headers, b"{}" if method in ("POST", "PUT", "PATCH") else None, "routes"
    return "POST", "/v1/responses", {"content-type": r.choice(["text/plain", "application/x-www-form-urlencoded", ""])}, \
        r.randbytes(r.randint(0, 300)), "bytes"  # fmt: skip


async def fuzz_http(target: Target, mutator: Mutator, n: int, stats: SurfaceStats, *, workers: int = 8,
                    deadline_s: float = 15.0) -> None:  # fmt: skip
    import httpx

    sdk = _Sdk()
    inputs = [http_input(mutator) for _ in range(n)]
    queue: asyncio.Queue[tuple[str, str, dict[str, str], bytes | None, str]] = asyncio.Queue()
    for item in inputs:
        queue.put_nowait(item)

    async with httpx.AsyncClient(base_url=target.http_url, timeout=deadline_s,
                                 headers={"authorization": f"Bearer {target.api_key}"}) as client:  # fmt: skip

        async def worker() -> None:
            while not queue.empty():
                method, path, headers, body, how = queue.get_nowait()
                started = time.perf_counter()
                try:
                    r = await asyncio.wait_for(
                        client.request(method, path, headers=headers, content=body), deadline_s
                    )
                    stats.outcome(_check_http(sdk, stats, method, path, r, how))
                except (TimeoutError, httpx.TimeoutException):
                    stats.finding("hang", f"{method} {path} {body!r:.300}", "http")
                except httpx.HTTPError as exc:
                    stats.finding("closed", f"{type(exc).__name__} on {method} {path} {body!r:.200}")
                stats.latencies.append(time.perf_counter() - started)
                stats.inputs += 1

        await asyncio.gather(*(worker() for _ in range(workers)))
    stats.deviations.update(sdk.notes)


def _check_http(sdk: _Sdk, stats: SurfaceStats, method: str, path: str, r: Any, how: str) -> str:
    status = r.status_code
    ctype = r.headers.get("content-type", "")
    if status >= 500:
        try:
            code = r.json()["error"]["code"]
        except Exception:  # noqa: BLE001
            code = "?"
        stats.finding("http_5xx", f"{status} {method} {path}: {r.text[:300]}", f"{status}:{code}")
        return f"http:{status}"
    if method == "HEAD":
        return f"http:{status}"
    if status != 200:
        try:
            err = r.json()["error"]
            assert isinstance(err["message"], str) and isinstance(err["type"], str)
            assert err["code"] is None or isinstance(err["code"], str)
            assert err["param"] is None or isinstance(err["param"], str)
        except Exception:  # noqa: BLE001
            stats.finding("malformed", f"{status} {method} {path}: {r.text[:300]}")
            return f"http:{status}"
        if status == 429 and "retry-after" not in r.headers and err["code"] == "rate_limit_exceeded":
            stats.finding("malformed", "429 without Retry-After")
        return f"http:{status}:{err['code']}"
    if ctype.startswith("text/event-stream"):
        return _check_sse(sdk, stats, r.text)
    try:
        obj = r.json()
    except ValueError:
        if path.startswith("/metrics"):
            return "http:200:metrics"
        stats.finding("malformed", f"200 not JSON on {method} {path}: {r.text[:200]}")
        return "http:200"
    if method == "POST" and path == "/v1/responses" or (method == "GET" and obj.get("object") == "response"):
        lenient, replaced = sdk.lenient(obj)
        if replaced:
            stats.deviation("response.error.code not in the SDK enum")
        try:
            sdk.response.validate_python(lenient)
        except Exception as exc:  # noqa: BLE001
            stats.finding("malformed", f"{exc!s:.1500}", _sdk_sig(exc))
        if obj.get("status") == "failed" and (obj.get("error") or {}).get("code") == "server_error":
            stats.finding("server_error", obj.get("error"), "response.failed")
        return f"http:200:{obj.get('object')}:{obj.get('status')}"
    return f"http:200:{obj.get('object')}"


def _check_sse(sdk: _Sdk, stats: SurfaceStats, text: str) -> str:
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        if len(lines) < 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            stats.finding("malformed", f"SSE block {block[:200]!r}")
            continue
        ev = orjson.loads(lines[1][6:])
        if ev.get("type") != lines[0][7:]:
            stats.finding("malformed", f"SSE event name {lines[0]!r} vs type {ev.get('type')!r}")
        lenient, replaced = sdk.lenient(ev)
        if replaced:
            stats.deviation("response.error.code not in the SDK enum")
        try:
            sdk.sse_event.validate_python(lenient)
        except Exception as exc:  # noqa: BLE001
            stats.finding("malformed", f"{exc!s:.1500}", _sdk_sig(exc))
        events.append(ev)
    if events and events[0].get("type") == "response.created":
        terminal = [e for e in events if e.get("type") in TERMINAL]
        body = [e for e in events if e.get("type") != "error"]
        if [e.get("sequence_number") for e in body] != list(range(len(body))):
            stats.finding(
                "sequence", f"SSE sequence numbers {[e.get('sequence_number') for e in events][:20]}", "order"
            )
        if len(terminal) != 1 or events[-1] is not terminal[0]:
            stats.finding("sequence", f"SSE stream without one final terminal event: {[e.get('type') for e in events[-3:]]}",
                          "no-terminal" if not terminal else "after-terminal")  # fmt: skip
    for e in events:
        if e.get("type") == "error" and e.get("code") == "server_error":
            stats.finding("server_error", e, "error-event")
    return "sse:" + _outcome_of(events)


# -- the gRPC surface ---------------------------------------------------------------------------------


def mutate_proto(rng: random.Random, msg: Any, depth: int = 0) -> None:
    """Set a random field (any kind, any depth) of `msg` to a random or boundary value."""
    from google.protobuf.descriptor import FieldDescriptor as F

    fields = list(msg.DESCRIPTOR.fields)
    if not fields:
        return
    fd = rng.choice(fields)
    name = fd.name
    try:
        if fd.type == F.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                getattr(msg, name)[_rand_str(rng)[:60]] = (
                    _rand_str(rng) if fd.message_type.fields_by_name["value"].type == F.TYPE_STRING else 0
                )
            elif fd.label == F.LABEL_REPEATED:
                container = getattr(msg, name)
                roll = rng.random()
                if roll < 0.2:
                    del container[:]
                elif roll < 0.4 and len(container):
                    for _ in range(rng.choice([2, 50, 5000])):
                        container.add().CopyFrom(container[0])
                else:
                    child = container.add()
                    mutate_proto(rng, child, depth + 1)
            else:
                child = getattr(msg, name)
                if rng.random() < 0.2:
                    msg.ClearField(name)
                else:
                    child.SetInParent()
                    if depth < 6:
                        mutate_proto(rng, child, depth + 1)
        elif fd.label == F.LABEL_REPEATED:
            container = getattr(msg, name)
            container.append(_rand_scalar(rng, fd))
        else:
            setattr(msg, name, _rand_scalar(rng, fd))
    except (ValueError, TypeError, AttributeError):
        pass


def _rand_str(rng: random.Random) -> str:
    return rng.choice(["", "x", f"resp_{rng.getrandbits(128):032x}", "é" * 100, "<|end|>", "a" * 300, "lane-1",
                       "response.create", "function_call", "\u0000", "😀", "{\"a\": 1}", "[[[", "call_1"])  # fmt: skip


def _rand_scalar(rng: random.Random, fd: Any) -> Any:
    from google.protobuf.descriptor import FieldDescriptor as F

    t = fd.type
    if t == F.TYPE_STRING:
        return _rand_str(rng)
    if t == F.TYPE_BYTES:
        return rng.randbytes(rng.randint(0, 40))
    if t == F.TYPE_BOOL:
        return rng.random() < 0.5
    if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return rng.choice([0.0, -1.0, 1e-9, 2.0, 3.0, 1e30, -1e30, float("inf"), float("nan")])
    if t == F.TYPE_ENUM:
        return rng.choice([0, 1, 2, 99])
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return rng.choice([0, -1, 1, 7, 1000, 2**31 - 1, -(2**31)])
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return rng.choice([0, 1, 2**32 - 1])
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return rng.choice([0, 1, 2**64 - 1])
    return rng.choice([0, -1, 1, 2**63 - 1, -(2**63)])


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4, 8])):
        op = rng.randint(0, 5)
        i = rng.randrange(len(b) + 1) if b else 0
        if op == 0 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1:
            del b[i : i + rng.randint(1, 16)]
        elif op == 2:
            b[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 3:
            b[i:i] = rng.choice([b"\xff\xff\xff\xff\x0f", b"\x0a\xff\xff\xff\xff\x07", b"\xc0\x3e\x01", b"\x0a\x03\xff\xfe\xfd",
                                 b"\xfa\x3e\x00", b"\x12\x80\x80\x80\x80\x10"])  # fmt: skip
        elif op == 4:
            b = b[:i]
        else:
            b[i:i] = b[i : i + rng.randint(1, 32)]
    return bytes(b)


async def fuzz_grpc(target: Target, mutator: Mutator, n: int, stats: SurfaceStats, *, deadline_s: float = 15.0,
                    raw_deadline_s: float = 1.0, sessions: int = 4, raw_concurrency: int = 32) -> None:  # fmt: skip
    import grpc

    from tether.responses.v1 import service_pb2

    sdk = _Sdk()
    rng = mutator.rng
    seeds = []
    for s in mutator.seeds:
        with contextlib.suppress(Exception):
            seeds.append(json_codec.client_event_from_json(copy.deepcopy(s)))
    n_semantic = int(n * 0.60)
    n_raw = int(n * 0.25)
    n_unary = n - n_semantic - n_raw

    semantic = []
    for _ in range(n_semantic):
        req = service_pb2.SessionRequest()
        req.CopyFrom(rng.choice(seeds))
        for _ in range(rng.choice([1, 1, 2, 3, 5])):
            mutate_proto(rng, req)
        semantic.append(req)
    raw = []
    for _ in range(n_raw):
        base = rng.choice(seeds).SerializeToString()
        raw.append(mutate_bytes(rng, base) if rng.random() < 0.85 else rng.randbytes(rng.randint(0, 200)))
    unary = []
    for _ in range(n_unary):
        method = rng.choice(UNARY_METHODS)
        base = rng.choice(seeds).create.SerializeToString() if rng.random() < 0.5 else b"\x0a\x05resp_"
        data = (
            mutate_bytes(rng, b"\x0a" + bytes([len(base) & 0x7F]) + base)
            if rng.random() < 0.8
            else rng.randbytes(rng.randint(0, 100))
        )
        unary.append((method, data))

    metadata = (("authorization", f"Bearer {target.api_key}"),)
    ident: Callable[[bytes], bytes] = lambda b: b  # noqa: E731

    async with grpc.aio.insecure_channel(
        target.grpc, options=[("grpc.max_receive_message_length", -1)]
    ) as channel:
        # 1. Semantic mutations on long-lived sessions, sentinel-checked like the WebSocket.
        async def session_worker(w: int, share: list[Any]) -> None:
            call = None
            reader: asyncio.Queue[Any] = asyncio.Queue()
            checker = StreamChecker(sdk, stats)

            async def pump(c: Any) -> None:
                try:
                    async for batch in c:
                        for ev in batch.events:
                            await reader.put(ev)
                except grpc.aio.AioRpcError as exc:
                    await reader.put(exc)
                await reader.put(None)

            pump_task = None
            for i, req in enumerate(share):
                if call is None or i % 400 == 0:
                    if call is not None:
                        call.cancel()
                    call = channel.stream_stream(SESSION_METHOD, request_serializer=ident,
                                                 response_deserializer=service_pb2.SessionResponse.FromString)(metadata=metadata)  # fmt: skip
                    reader = asyncio.Queue()
                    pump_task = asyncio.create_task(pump(call))
                    checker = StreamChecker(sdk, stats)
                sentinel = f"fuzzsentinel{w}x{i}"
                cancel = service_pb2.SessionRequest()
                cancel.cancel.response_id = sentinel
                started = time.perf_counter()
                try:
                    answer = await asyncio.wait_for(
                        _grpc_one(call, reader, checker, req, cancel.SerializeToString(), sentinel),
                        deadline_s,
                    )
                    stats.outcome(answer)
                except TimeoutError:
                    stats.finding("hang", f"semantic: {req!s:.300}", "grpc-session")
                    call.cancel()
                    call = None
                except _StreamEnded as exc:
                    stats.finding("closed", f"session ended ({exc}) after {req!s:.300}")
                    call = None
                stats.latencies.append(time.perf_counter() - started)
                stats.inputs += 1
            if call is not None:
                call.cancel()
            if pump_task is not None:
                pump_task.cancel()

        shares = [semantic[w::sessions] for w in range(sessions)]
        await asyncio.gather(*(session_worker(w, s) for w, s in enumerate(shares)))

        # 2. Raw bytes on a fresh Session stream each.
        sem = asyncio.Semaphore(raw_concurrency)
        sentinel_req = service_pb2.SessionRequest()
        sentinel_req.cancel.response_id = "fuzzsentinelraw"

        async def raw_one(data: bytes) -> None:
            async with sem:
                call = channel.stream_stream(
                    SESSION_METHOD, request_serializer=ident, response_deserializer=ident
                )(metadata=metadata)
                started = time.perf_counter()
                try:
                    outcome = await asyncio.wait_for(
                        _raw_session(call, data, sentinel_req.SerializeToString()), raw_deadline_s
                    )
                    stats.outcome(outcome)
                except TimeoutError:
                    stats.finding("hang", f"raw session bytes {data[:120]!r}", "grpc-raw-session")
                finally:
                    call.cancel()
                stats.latencies.append(time.perf_counter() - started)
                stats.inputs += 1

        await asyncio.gather(*(raw_one(d) for d in raw))

        # 3. Raw bytes to the unary RPCs.
        usem = asyncio.Semaphore(8)

        async def unary_one(method: str, data: bytes) -> None:
            async with usem:
                path = f"/tether.responses.v1.ResponsesService/{method}"
                started = time.perf_counter()
                try:
                    if method == "CreateResponse":
                        call = channel.unary_stream(
                            path, request_serializer=ident, response_deserializer=ident
                        )
                        replies = [r async for r in call(data, metadata=metadata, timeout=deadline_s)]
                        for r in replies:
                            service_pb2.CreateResponseResponse.FromString(r)
                        stats.outcome(f"grpc:OK:{method}")
                    else:
                        call = channel.unary_unary(
                            path, request_serializer=ident, response_deserializer=ident
                        )
                        await call(data, metadata=metadata, timeout=deadline_s)
                        stats.outcome(f"grpc:OK:{method}")
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
                    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        stats.finding("hang", f"{method} {data[:120]!r}", "grpc-unary")
                    elif code == grpc.StatusCode.INTERNAL:
                        stats.finding("server_error", f"{method}: {exc.details()}", "grpc-internal")
                    else:
                        if code == grpc.StatusCode.UNKNOWN and "DecodeError" in (exc.details() or ""):
                            stats.deviation("undecodable unary request -> UNKNOWN (not INVALID_ARGUMENT)")
                        stats.outcome(f"grpc:{code.name}")
                stats.latencies.append(time.perf_counter() - started)
                stats.inputs += 1

        await asyncio.gather(*(unary_one(m, d) for m, d in unary))
    stats.deviations.update(sdk.notes)


class _StreamEnded(Exception):
    pass


async def _grpc_one(call: Any, reader: asyncio.Queue[Any], checker: StreamChecker, req: Any, sentinel_bytes: bytes,
                    sentinel: str) -> str:  # fmt: skip
    await call.write(req.SerializeToString())
    await call.write(sentinel_bytes)
    kind = req.WhichOneof("event") or "undecodable"
    replies: list[dict[str, Any]] = []

    async def next_event() -> dict[str, Any]:
        ev = await reader.get()
        if ev is None or isinstance(ev, Exception):
            raise _StreamEnded(repr(ev))
        return json_codec.event_to_json(ev, ws=True)

    while True:
        ev = await next_event()
        if is_sentinel(ev, sentinel):
            break
        checker.check(ev, ev)
        replies.append(ev)
    answered = any(e.get("type") in ("error", "response.created") for e in replies)
    if kind in ("create", "append") and not answered:
        while True:
            ev = await next_event()
            t = checker.check(ev, ev)
            replies.append(ev)
            if t in ("error", "response.created"):
                break
    elif kind not in ("processed",) and not replies:
        checker.stats.finding("unanswered", f"{kind}: {req!s:.300}")
    while checker.in_flight:
        ev = await next_event()
        checker.check(ev, ev)
        replies.append(ev)
    return _outcome_of(replies)


async def _raw_session(call: Any, data: bytes, sentinel: bytes) -> str:
    import grpc

    from tether.responses.v1 import service_pb2

    try:
        try:
            await call.write(data)
            await call.write(sentinel)
        except asyncio.InvalidStateError:  # the server ended the stream (a refused message) first
            return f"status:{(await call.code()).name}"
        async for raw in call:
            batch = service_pb2.SessionResponse.FromString(raw)
            for ev in batch.events:
                if ev.WhichOneof("event") == "error" and "fuzzsentinelraw" in ev.error.error.message:
                    return "answered"
        return "stream-ended:OK"
    except grpc.aio.AioRpcError as exc:
        return f"status:{exc.code().name}"
    except asyncio.InvalidStateError:  # the server ended the RPC (a malformed message) before the sentinel went out
        return f"status:{(await call.code()).name}"


# -- health after the campaign --------------------------------------------------------------------------


async def healthy_rollout(target: Target) -> dict[str, Any]:
    """A normal tool loop over WebSocket (store=true), its retrieval over HTTP and a gRPC session."""
    import grpc
    import httpx
    from websockets.asyncio.client import connect

    from tether.responses.v1 import service_pb2, service_pb2_grpc

    out: dict[str, Any] = {"ok": False}
    auth = {"Authorization": f"Bearer {target.api_key}"}
    try:
        async with connect(target.ws_url, additional_headers=auth, max_size=None) as conn:
            seeds = await asyncio.wait_for(_record_seeds(target.ws_url, target.api_key), 60)
            out["ws_frames"] = len(seeds)
            await conn.send(
                orjson.dumps({"type": "response.create", "model": "m", "input": "hi", "store": True}).decode()
            )
            while True:
                ev = orjson.loads(await asyncio.wait_for(conn.recv(), 30))
                if ev["type"] in TERMINAL:
                    break
            out["ws"] = ev["response"]["status"]
            rid = ev["response"]["id"]
        async with httpx.AsyncClient(base_url=target.http_url, headers=auth, timeout=30) as h:
            out["http_retrieve"] = (await h.get(f"/v1/responses/{rid}")).status_code
            out["healthz"] = (await h.get("/healthz")).status_code
            out["readyz"] = (await h.get("/readyz")).status_code
        async with grpc.aio.insecure_channel(target.grpc) as channel:
            stub = service_pb2_grpc.ResponsesServiceStub(channel)
            call = stub.Session(metadata=(("authorization", f"Bearer {target.api_key}"),))
            req = service_pb2.SessionRequest()
            req.create.model, req.create.input_text, req.create.previous_response_id = "m", "and again", rid
            await call.write(req)
            status = None
            async for batch in call:
                for e in batch.events:
                    if e.WhichOneof("event") in ("completed", "failed", "incomplete"):
                        status = getattr(e, e.WhichOneof("event")).response.status
                if status:
                    break
            call.cancel()
            out["grpc"] = status
        out["ok"] = (out["ws"] == "completed" and out["http_retrieve"] == 200 and out["healthz"] == 200
                     and out["readyz"] == 200 and out["grpc"] == "completed" and out["ws_frames"] > 0)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


# -- the campaign ------------------------------------------------------------------------------------------


async def run_campaign(target: Target, *, iterations: int, seed: int, surfaces: Iterable[str] = SURFACES,
                       server: ServerProcess | None = None, deadline_s: float = 15.0, raw_deadline_s: float = 1.0,
                       huge_rate: float = 0.002, rss_growth_mib: float = 96.0, warmup: int = 500,
                       progress: Callable[[str], None] | None = None) -> Report:  # fmt: skip
    surfaces = list(surfaces)
    say = progress or (lambda _m: None)
    rng = random.Random(seed)
    recorded = await _record_seeds(target.ws_url, target.api_key)
    seeds = [*recorded, *copy.deepcopy(STATIC_SEEDS)]
    mutator = Mutator(rng, seeds, huge_rate=huge_rate)
    report = Report({name: SurfaceStats(name) for name in surfaces}, seed=seed)
    rss = report.rss
    proc = ProcStat(server.pid) if server else None
    if proc:
        rss["start"] = proc.rss_bytes()
    peak = 0
    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling and proc:
            peak = max(peak, proc.rss_bytes())
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample())
    try:
        # Warm-up: a slice of every surface, so the baseline includes caches, codecs, pools.
        warm = {name: SurfaceStats(name) for name in surfaces}
        for name in surfaces:
            await _run_surface(
                name, target, mutator, min(warmup, iterations), warm[name], deadline_s, raw_deadline_s
            )
        if proc:
            rss["after_warmup"] = proc.rss_bytes()
        for name in surfaces:
            say(f"fuzz: {name}: {iterations} inputs")
            stats = report.surfaces[name]
            started = time.perf_counter()
            await _run_surface(name, target, mutator, iterations, stats, deadline_s, raw_deadline_s)
            stats.seconds = time.perf_counter() - started
            say(f"fuzz: {name}: done in {stats.seconds:.1f}s, findings {dict(stats.findings) or 'none'}")
            if server is not None and server.proc is not None and server.proc.poll() is not None:
                stats.finding("crash", f"server exited with {server.proc.returncode}")
                break
        # Warm-up findings count too (they are real inputs), under their own label.
        for name, w in warm.items():
            stats = report.surfaces[name]
            stats.warmup_inputs = w.inputs
            for cls, count in w.findings.items():
                stats.findings[f"{cls} (warm-up)"] += count
                stats.examples.setdefault(f"{cls} (warm-up)", w.examples.get(cls, ""))
            stats.signatures.update(w.signatures)
            stats.deviations.update(w.deviations)
    finally:
        sampling = False
        sampler.cancel()
    report.health = await healthy_rollout(target)
    if proc:
        await asyncio.sleep(1.0)
        rss["end"] = proc.rss_bytes()
        rss["peak"] = peak
        growth = rss["end"] - rss.get("after_warmup", rss["end"])
        rss["growth_after_warmup"] = growth
        rss["growth_exceeded"] = int(growth > rss_growth_mib * 1024 * 1024)
    if server is not None:
        errors = [
            line
            for line in server.log_text().splitlines()
            if '"level":"error"' in line or "Traceback" in line
        ]
        report.server_log_errors = len(errors)
        report.server_log_examples = [e[:4000] for e in errors[:5]]
        report.server_log_signatures = Counter(log_signature(e) for e in errors)
    return report


_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\w+)')


def log_signature(line: str) -> str:
    """`<logger>: <exception type> at <file>:<function>` of an error log line (JSON or text)."""
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line[:80]
    exc = rec.get("exc") or ""
    frames = _FRAME.findall(exc)
    last = exc.strip().splitlines()[-1] if exc.strip() else rec.get("msg", "")
    where = ""
    if frames:
        file, func = frames[-1]
        where = f" at {file.rsplit('/', 1)[-1]}:{func}"
    kind = last.split(":", 1)[0][:60]
    return f"{rec.get('logger')}: {kind}{where}"


async def _run_surface(name: str, target: Target, mutator: Mutator, n: int, stats: SurfaceStats, deadline_s: float,
                       raw_deadline_s: float) -> None:  # fmt: skip
    if name == "ws":
        await fuzz_ws(target, mutator, n, stats, deadline_s=deadline_s)
    elif name == "http":
        await fuzz_http(target, mutator, n, stats, deadline_s=deadline_s)
    elif name == "grpc":
        await fuzz_grpc(target, mutator, n, stats, deadline_s=deadline_s, raw_deadline_s=raw_deadline_s)
    else:
        raise ValueError(f"unknown surface {name!r}")


def own_server(tmp: Path, *, extra_args: list[str] | None = None) -> ServerProcess:
    """A `tether serve` subprocess for fuzzing: fast simulated model, SQLite store in `tmp`."""
    config = write_config(tmp / "fuzz.toml", store=f"sqlite:///{tmp / 'fuzz.db'}",
                          sim={"ttft_ms": 0, "tokens_per_s": 0, "output_tokens": 12, "tick_ms": 1})  # fmt: skip
    return ServerProcess(config, args=list(extra_args or []), env={"TETHER_API_KEYS": f"{FUZZ_KEY}:fuzz"},
                         log_path=tmp / "server.log")  # fmt: skip


def format_report(report: Report) -> str:
    lines = [f"tether fuzz, seed {report.seed}", ""]
    header = f"{'surface':<6} {'inputs':>7} {'secs':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  findings"
    lines += [header, "-" * len(header)]
    for name, s in report.surfaces.items():
        d = s.summary()
        lat = d["latency_ms"]
        lines.append(f"{name:<6} {s.inputs:>7} {s.seconds:>6.1f} {lat['p50']!s:>8} {lat['p99']!s:>8} {lat['max']!s:>8}  "
                     f"{dict(s.findings) or 'none'}")  # fmt: skip
    for name, s in report.surfaces.items():
        lines += ["", f"{name}: outcomes by class"]
        for cls, count in s.outcomes.most_common(25):
            lines.append(f"  {count:>7}  {cls}")
        if len(s.outcomes) > 25:
            rest = sum(c for _, c in s.outcomes.most_common()[25:])
            lines.append(f"  {rest:>7}  ({len(s.outcomes) - 25} more classes)")
        for cls, count in s.deviations.items():
            lines.append(f"  deviation x{count}: {cls}")
        for sig, count in s.signatures.most_common():
            lines.append(f"  finding x{count}: {sig}")
        for cls, ex in s.examples.items():
            lines.append(f"  e.g. {cls}: {ex[:300]}")
    if report.rss:
        mib = {k: round(v / 2**20, 1) for k, v in report.rss.items() if k != "growth_exceeded"}
        lines += ["", f"server RSS (MiB): {mib}"]
    lines += [f"health after: {report.health}", f"server log error lines: {report.server_log_errors}"]
    for sig, count in report.server_log_signatures.most_common():
        lines.append(f"  {count:>7}  {sig}")
    findings = report.findings
    lines += ["", f"FINDINGS: {dict(findings)}" if findings else "FINDINGS: none"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tether fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=10_000, help="inputs per surface (default 10000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--surfaces", default=",".join(SURFACES), help="comma-separated: ws,http,grpc")
    p.add_argument(
        "--target", help="BRIDGE_HOST:PORT,GRPC_HOST:PORT of a running Tether (default: start one)"
    )
    p.add_argument("--api-key", default=FUZZ_KEY, help="API key for --target")
    p.add_argument("--deadline-s", type=float, default=15.0, help="answer deadline per input")
    p.add_argument("--raw-deadline-s", type=float, default=1.0, help="deadline for raw gRPC stream bytes")
    p.add_argument("--huge-rate", type=float, default=0.002, help="share of strings of 1.1M characters")
    p.add_argument("--rss-growth-mib", type=float, default=96.0, help="allowed RSS growth after warm-up")
    p.add_argument(
        "--warmup", type=int, default=500, help="warm-up inputs per surface before the RSS baseline"
    )
    p.add_argument("--json", help="write the report as JSON to this file")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `tether fuzz -- --iterations N` (see docs/reliability.md on the CLI)
        argv = argv[1:]
    args = p.parse_args(argv)
    surfaces = [s.strip() for s in args.surfaces.split(",") if s.strip()]

    async def go(target: Target, server: ServerProcess | None) -> Report:
        return await run_campaign(target, iterations=args.iterations, seed=args.seed, surfaces=surfaces, server=server,
                                  deadline_s=args.deadline_s, raw_deadline_s=args.raw_deadline_s,
                                  huge_rate=args.huge_rate, rss_growth_mib=args.rss_growth_mib, warmup=args.warmup,
                                  progress=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip

    if args.target:
        bridge, _, grpc_addr = args.target.partition(",")
        report = asyncio.run(go(Target(bridge, grpc_addr, args.api_key), None))
    else:
        with tempfile.TemporaryDirectory(prefix="tether-fuzz-") as tmp:
            with own_server(Path(tmp)) as server:
                target = Target(f"127.0.0.1:{server.bridge_port}", server.grpc_target, FUZZ_KEY)
                report = asyncio.run(go(target, server))
                code = server.terminate(60)
                if code != 0:
                    report.surfaces[surfaces[0]].finding("crash", f"server exit code {code} after SIGTERM")
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode())
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
