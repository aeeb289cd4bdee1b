"""Inputs: seeds recorded from a real rollout, then JSON-, text-, proto- and byte-level mutations
(`Mutator`, `mutate_proto`, `mutate_bytes`)."""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Iterable
from typing import Any

import orjson

from tether.protocol.wire import TERMINAL_EVENT_TYPES

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
    "service_tier background stream_id generate context_management max_tool_calls conversation prompt top_logprobs "
    "variables version "
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
    return asyncio.run(recorded_seeds(ws_url, api_key))


async def recorded_seeds(ws_url: str, api_key: str) -> list[dict[str, Any]]:
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
                if ev["type"] in TERMINAL_EVENT_TYPES or ev["type"] == "error":
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
            return dumps(self.mutate_obj(seed, r.choice([1, 1, 1, 2, 3, 4]))), "json"
        if roll < 0.75:
            text = orjson.dumps(seed).decode()
            for _ in range(r.choice([1, 1, 2, 3])):
                text = self.mutate_text(text)
            return text, "text"
        if roll < 0.85:
            obj = self.value()
            if isinstance(obj, dict) and r.random() < 0.7:
                obj["type"] = r.choice(TYPES[:6])
            return dumps(obj), "generated"
        if roll < 0.88:
            data = orjson.dumps(seed) if r.random() < 0.5 else r.randbytes(r.randint(0, 200))
            return data, "binary"
        return "".join(r.choice(_PALETTE) for _ in range(r.randint(0, 200))), "chars"


def dumps(obj: Any) -> str:
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


# -- proto and byte mutation (the gRPC surface) ------------------------------------------------------


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


