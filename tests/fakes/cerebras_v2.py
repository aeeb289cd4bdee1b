"""The fake upstream as Cerebras API version 2 (the default since 2026-07-21) answers it.

    with FakeCerebrasV2() as server:                      # binds 127.0.0.1:0, key "test-key"
        backend = build_backend("c", "cerebras", {"base_url": server.base_url, "api_key": "test-key"})

On top of `FakeChatServer` (routes, scenarios, recording, the field allow-list), from the
cerebras-cloud-sdk 1.91 types (`PublicModel`, `CompletionCreateParams`) and Cerebras's pages
(versions, reasoning, structured outputs, errors):

- `X-Cerebras-Version-Patch`: absent or "2" is version 2; any other value is refused (earlier
  versions are end-of-life).
- Version 2's validation: `definitions` in a schema refused (`$defs` only); with `strict: true`
  every object needs `additionalProperties: false`; each assistant tool call answered by the
  tool messages right after it, no tool message for another id, no call id twice, no
  `tool_choice` without `tools`.
- The roster (`ROSTER`) with capabilities and limits at `GET /v1/models/{id}`; each model's rules
  applied to a chat call: `reasoning_effort` values it takes, `reasoning_format` only for a
  reasoning model, images only for a vision model, a `json_schema` format only with structured
  outputs, `max_completion_tokens` within its limit; an
  unknown model is a 404 `model_not_found`. The deprecated `disable_reasoning` is refused too
  (stricter than documented: the adapter must not lean on it).
- `payment_required()` (402) and `unavailable()` (503) bodies as Cerebras sends them.

Every refusal is Cerebras's top-level `{message, type, param, code}` body.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tests.fakes.chat_server import CREATED, FakeChatServer, RecordedRequest, Reply, error_body, http_error

VERSION_HEADER = "x-cerebras-version-patch"


@dataclass(frozen=True)
class FakeModel:
    id: str
    reasoning: bool
    vision: bool = False
    efforts: frozenset[str] = frozenset()  # reasoning_effort values taken (empty: none)
    max_completion_tokens: int = 32_768
    max_context_length: int = 131_072
    deprecated: bool = False
    structured_outputs: bool = True

    def public(self) -> dict[str, Any]:
        """`GET /v1/models/{id}`: the SDK's `PublicModel`."""
        return {
            "id": self.id,
            "object": "model",
            "created": CREATED,
            "owned_by": "Cerebras",
            "name": self.id,
            "description": f"fake {self.id}",
            "architecture": {"modality": "text+vision" if self.vision else "text", "tokenizer": "fake"},
            "capabilities": {
                "function_calling": True,
                "json_mode": True,
                "parallel_tool_calls": True,
                "reasoning": self.reasoning,
                "response_format": True,
                "streaming": True,
                "structured_outputs": self.structured_outputs,
                "tool_choice": True,
                "tools": True,
                "vision": self.vision,
            },
            "limits": {
                "max_completion_tokens": self.max_completion_tokens,
                "max_context_length": self.max_context_length,
                "requests_per_minute": 30,
                "tokens_per_minute": 60_000,
            },
            "pricing": {"prompt": "0.00000035", "completion": "0.00000075"},
            "supported_parameters": {"temperature": True, "top_p": True, "max_completion_tokens": True},
            "deprecated": self.deprecated,
            "preview": False,
        }


_ALL = frozenset({"none", "low", "medium", "high"})
# The roster as of late 2026 (ids from Cerebras's model pages and third-party rosters).
ROSTER: tuple[FakeModel, ...] = (
    FakeModel("gpt-oss-120b", True, efforts=frozenset({"low", "medium", "high"}), max_completion_tokens=40_000),
    FakeModel("zai-glm-4.7", True, efforts=_ALL, max_completion_tokens=40_000),
    FakeModel("qwen-3.8-27b", True, efforts=_ALL),
    FakeModel("gemma-4-31b", True, vision=True, max_completion_tokens=16_384),
    FakeModel("llama3.1-8b", False, max_completion_tokens=8_192, max_context_length=32_768, deprecated=True),
    FakeModel("qwen-3-235b-a22b-thinking-2507", True, deprecated=True),
)


def _refusal(message: str, param: str | None = "validation_error", code: str = "wrong_api_format") -> tuple[int, Any]:
    return 400, error_body(message, "invalid_request_error", param, code)


def payment_required() -> Reply:
    """402 as Cerebras sends it when the organisation's balance or plan does not cover the call."""
    return http_error(
        402, error_body("Payment required: insufficient balance.", "payment_required_error", None, "payment_required")
    )


def unavailable() -> Reply:
    return http_error(
        503, error_body("We're experiencing high traffic right now.", "server_error", None, "service_unavailable")
    )


def _objects(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object under `node`, with its JSON pointer."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            if k in ("properties", "$defs", "definitions") and isinstance(v, dict):
                for name, sub in v.items():
                    yield from _objects(sub, f"{path}/{k}/{name}")
            elif k in ("items", "additionalProperties"):
                yield from _objects(v, f"{path}/{k}")
            elif k == "anyOf" and isinstance(v, list):
                for i, sub in enumerate(v):
                    yield from _objects(sub, f"{path}/anyOf/{i}")


def check_schema(schema: Any, strict: bool, where: str) -> tuple[int, Any] | None:
    """Version 2's schema rules."""
    for path, obj in _objects(schema, "#"):
        if "definitions" in obj:
            return _refusal(f"{where}: 'definitions' is not supported at {path}, use '$defs'")
        ref = obj.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            return _refusal(f"{where}: $ref {ref!r} at {path} must point into '$defs'")
        is_object = obj.get("type") == "object" or "properties" in obj
        if strict and is_object and obj.get("additionalProperties") is not False:
            return _refusal(f"{where}: strict schemas need 'additionalProperties': false at {path}")
    return None


def check_tool_order(messages: list[Any]) -> tuple[int, Any] | None:
    """Version 2's tool-message rules."""
    seen: set[str] = set()
    pending: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool":
            cid = m.get("tool_call_id")
            if cid not in pending:
                return _refusal(f"messages[{i}]: tool message for unknown tool_call_id {cid!r}")
            pending.discard(cid)
            continue
        if pending:
            return _refusal(f"messages[{i}]: tool_call_ids {sorted(pending)} have no tool message right after them")
        for call in m.get("tool_calls") or ():
            cid = call.get("id") if isinstance(call, dict) else None
            if cid in seen:
                return _refusal(f"messages[{i}]: duplicate tool_call_id {cid!r}")
            seen.add(cid)
            pending.add(cid)
    if pending:
        return _refusal(f"messages: tool_call_ids {sorted(pending)} have no tool message")
    return None


class FakeCerebrasV2(FakeChatServer):
    """`FakeChatServer` with version 2's rules and the model roster (see the module docstring)."""

    def __init__(self, *, roster: tuple[FakeModel, ...] = ROSTER, **kw: Any) -> None:
        kw.setdefault("models", [m.id for m in roster])
        kw.setdefault("check_model", True)
        super().__init__(**kw)
        self.roster: dict[str, FakeModel] = {m.id: m for m in roster}

    def model_info(self, model: str) -> dict[str, Any] | None:
        m = self.roster.get(model)
        return m.public() if m is not None else None

    @property
    def warmings(self) -> int:
        """`GET /v1/tcp_warming` calls received."""
        with self._lock:
            return sum(1 for r in self.requests if r.path.startswith("/v1/tcp_warming"))

    def _validate(self, rec: RecordedRequest) -> tuple[int, Any] | None:
        problem = super()._validate(rec)
        if problem is not None:
            return problem
        version = rec.headers.get(VERSION_HEADER)
        if version not in (None, "2"):
            return _refusal(f"API version {version!r} is end-of-life; use 2", "version", "unsupported_version")
        body: Mapping[str, Any] = rec.body
        tools = body.get("tools") or []
        if "tool_choice" in body and not tools:
            return _refusal("tool_choice: requires tools")
        for i, t in enumerate(tools):
            fn = t.get("function") or {} if isinstance(t, dict) else {}
            problem = check_schema(fn.get("parameters"), fn.get("strict") is True, f"tools[{i}].function.parameters")
            if problem is not None:
                return problem
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") == "json_schema":
            js = rf.get("json_schema") or {}
            problem = check_schema(js.get("schema"), js.get("strict") is True, "response_format.json_schema.schema")
            if problem is not None:
                return problem
        problem = check_tool_order(body["messages"])
        if problem is not None:
            return problem
        return self._model_rules(body)

    def _model_rules(self, body: Mapping[str, Any]) -> tuple[int, Any] | None:
        m = self.roster.get(body["model"])
        if m is None:
            return None  # check_model answered already (or is off)
        effort = body.get("reasoning_effort")
        if effort is not None and effort not in m.efforts:
            return _refusal(f"reasoning_effort: {effort!r} is not supported by {m.id}")
        if "reasoning_format" in body and not m.reasoning:
            return _refusal(f"reasoning_format: {m.id} does not reason")
        if "disable_reasoning" in body:
            return _refusal("disable_reasoning: deprecated, use reasoning_effort 'none'")
        rf = body.get("response_format")
        if not m.structured_outputs and isinstance(rf, dict) and rf.get("type") == "json_schema":
            return _refusal(f"response_format: {m.id} does not support structured outputs")
        cap = body.get("max_completion_tokens")
        if isinstance(cap, int) and cap > m.max_completion_tokens:
            return _refusal(f"max_completion_tokens: at most {m.max_completion_tokens} for {m.id}")
        if not m.vision and any(
            isinstance(p, dict) and p.get("type") in ("image_url", "image")
            for msg in body["messages"]
            if isinstance(msg, dict) and isinstance(msg.get("content"), list)
            for p in msg["content"]
        ):
            return _refusal(f"messages: {m.id} does not accept images")
        return None
