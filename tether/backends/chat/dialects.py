"""Chat Completions dialects: what each server family accepts and sends, declared in one table.

Every "OpenAI-compatible" server differs in a few places that decide whether a turn works at
all: which field caps the output (llama.cpp's Python server and Ollama ignore
`max_completion_tokens`), what `content` an assistant message carrying only tool calls must have
(llama-cpp-python rejects `null`), whether usage arrives in a stream, where reasoning text travels,
whether `tool_choice: "required"` is honoured, and which request fields are refused. A `Dialect`
declares those facts; the mapping and the stream parser read them, nothing else branches on a
server's name.

A backend picks its dialect in config (`dialect = "vllm"`), or `"auto"`: the first call asks
`GET {base_url}/models` and matches the servers' `owned_by` marks (`DETECT_OWNED_BY`); a server
that says nothing recognisable gets the generic `openai` dialect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tether import errors
from tether.errors import TetherError


@dataclass(frozen=True)
class ReasoningControls:
    """The request fields that carry `reasoning.effort` for one model (empty: send nothing)."""

    fields: Mapping[str, object]


# The Cerebras API version the adapter is written for (its validation rules: `$defs` only,
# closed strict schemas, tool messages in order), pinned so that the next version's rules reach
# Tether only with an adapter written for them.
CEREBRAS_VERSION_HEADER = "x-cerebras-version-patch"
CEREBRAS_API_VERSION = "2"


@dataclass(frozen=True)
class Dialect:
    name: str
    server: str  # who speaks it (the table in docs/backends.md)
    max_tokens_field: str = "max_completion_tokens"
    # `content` of an assistant message that carries only tool calls: None sends null, "" an empty string.
    tool_calls_content: str | None = None
    # Usage arrives in the stream when asked (`stream_options.include_usage`); when False Tether
    # counts the output itself (or set `stream_upstream = false` to get the server's own counts).
    usage_in_stream: bool = True
    # Streamed reasoning arrives in these delta fields (first non-empty wins).
    reasoning_deltas: tuple[str, ...] = ("reasoning_content", "reasoning")
    # Earlier reasoning goes back on assistant messages in this field (None: not sent back).
    reasoning_history_field: str | None = None
    # How `reasoning.effort` is sent: "effort" (`reasoning_effort`), "cerebras" (per model family,
    # see `cerebras_reasoning`), or "none" (no control: a request for a reasoning effort other than
    # the default is refused with a 400).
    reasoning_controls: str = "effort"
    # `tool_choice: "required"` (and allowed_tools mode required) is honoured. When False, a
    # request that forces a call is sent as the one named function when exactly one tool is
    # offered, and refused (400) otherwise: the server would answer with plain text.
    tool_choice_required: bool = True
    # `tool_choice: {"type": "allowed_tools", ...}` is understood (OpenAI): `allowed_tools`
    # constrains the choice and the tool list goes out whole (its prompt prefix stays the same, so
    # it stays cached). When False, the tool list is narrowed to the allowed tools instead.
    allowed_tools_choice: bool = False
    # The `tool_choice` object types this dialect maps (`function`: the named function; `custom`:
    # the named custom tool, natively or as its emulating function, see `custom_tools`;
    # `allowed_tools`: see above). Any other type (`mcp`, the hosted tools' `web_search_preview`,
    # `file_search`, `code_interpreter`, `image_generation`, `computer_use_preview`, ...) is a 400
    # naming `tool_choice`: Tether runs no hosted tools (with the backend option
    # `hosted_tools = true` a hosted choice is forwarded with the hosted tools themselves).
    tool_choice_types: frozenset[str] = frozenset({"function", "custom", "allowed_tools"})
    # Custom (freeform) tools are taken natively (OpenAI: `tools: [{"type": "custom", "custom":
    # {...}}]`, `delta.tool_calls[i].custom.input`). When False each is emulated as a function of
    # the same name taking `{"input": string}` (its format described in the parameter's
    # description, a grammar not enforced) and its calls are read back as custom tool calls.
    custom_tools: bool = False
    # The server's tokenizer endpoint (path from the server root, POST {"input": text} ->
    # {"count": n}): output a stream did not count is counted there, with the model's own tokenizer.
    tokenize_path: str | None = None
    # Automatic tool choice works in a stream. When False (llama-cpp-python's
    # chatml-function-calling raises "Automatic streaming tool choice is not supported" inside the
    # stream and closes it without a word), such a call is made without streaming.
    stream_auto_tool_choice: bool = True
    # Request fields this server refuses or silently ignores; the mapping never sends them and a
    # request whose meaning depends on one is refused with a 400 naming the Responses parameter.
    rejected_fields: frozenset[str] = frozenset()
    # Tool parameter schemas are reduced to this subset (`tether.backends.chat.schema`); None: as is.
    schema_subset: str | None = None
    # The service tiers the server offers (None: whatever the client names is passed on).
    service_tiers: tuple[str, ...] | None = None
    # The server takes a `cache_salt` (vLLM): prefix-cache blocks are shared only between requests
    # with the same salt. Tether sends one per tenant (`BackendRequest.cache_salt`), so a tenant
    # cannot time another's cached prefixes on a shared server.
    cache_salt: bool = False
    # Headers every request carries (Cerebras: the API version the adapter is written for).
    headers: tuple[tuple[str, str], ...] = ()
    # The server refuses a history whose tool messages are out of order (Cerebras version 2: an
    # assistant tool call not answered right after it, an answer to no call, a call id used
    # twice). The mapping checks the order first and refuses with a 400 naming the input item.
    tool_order_checked: bool = False
    # `GET {base_url}/models/{id}` reports the model's capabilities and limits (`ModelCaps`),
    # read at discovery and refreshed; the mapping follows them.
    model_info: bool = False
    # The server drops earlier turns' reasoning unless `clear_thinking: false` (Cerebras); it is
    # sent whenever the history carries reasoning back, so what Tether renders is what the
    # model sees.
    clear_thinking: bool = False
    # The server's prompt cache is shared by every call made with one key (Cerebras: across an
    # organisation) and takes no per-tenant salt: tenants on one key can time each other's cached
    # prefixes. A warning at startup says so when several tenants share a key (see the backend's
    # `tenant_api_key_envs` and `isolate_tenants`).
    shared_prompt_cache: bool = False


DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        Dialect("openai", "OpenAI and any server not listed here", allowed_tools_choice=True, custom_tools=True),
        Dialect("vllm", "vLLM", rejected_fields=frozenset({"service_tier", "verbosity"}), cache_salt=True),
        Dialect("sglang", "SGLang", rejected_fields=frozenset({"service_tier", "verbosity"})),
        Dialect(
            "llamacpp",
            "llama.cpp `llama-server` (--jinja)",
            max_tokens_field="max_tokens",
            tool_calls_content="",
            rejected_fields=frozenset({"service_tier", "prompt_cache_key", "verbosity"}),
        ),
        Dialect(
            "llama-cpp-python",
            "llama-cpp-python `python -m llama_cpp.server`",
            max_tokens_field="max_tokens",
            tool_calls_content="",
            usage_in_stream=False,
            tokenize_path="/extras/tokenize/count",
            stream_auto_tool_choice=False,
            reasoning_controls="none",
            tool_choice_required=False,
            rejected_fields=frozenset(
                {"service_tier", "prompt_cache_key", "reasoning_effort", "parallel_tool_calls", "verbosity"}
            ),
        ),
        Dialect(
            "ollama",
            "Ollama (/v1)",
            max_tokens_field="max_tokens",
            tool_calls_content="",
            reasoning_deltas=("reasoning", "reasoning_content"),
            tool_choice_required=False,
            rejected_fields=frozenset(
                {"service_tier", "prompt_cache_key", "parallel_tool_calls", "verbosity", "logprobs", "top_logprobs"}
            ),
        ),
        Dialect(
            "lmstudio",
            "LM Studio",
            max_tokens_field="max_tokens",
            tool_calls_content="",
            rejected_fields=frozenset(
                {"service_tier", "prompt_cache_key", "reasoning_effort", "verbosity", "logprobs", "top_logprobs"}
            ),
            reasoning_controls="none",
        ),
        Dialect(
            "cerebras",
            "Cerebras Inference",
            reasoning_deltas=("reasoning",),
            reasoning_history_field="reasoning",
            reasoning_controls="cerebras",
            schema_subset="cerebras",
            service_tiers=("auto", "default", "flex", "priority"),
            rejected_fields=frozenset({"verbosity"}),
            headers=((CEREBRAS_VERSION_HEADER, CEREBRAS_API_VERSION),),
            tool_order_checked=True,
            model_info=True,
            clear_thinking=True,
            shared_prompt_cache=True,
        ),
    )
}

# `GET /models` → data[].owned_by values that identify a server family.
DETECT_OWNED_BY: Mapping[str, str] = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llamacpp",
    "me": "llama-cpp-python",
    "library": "ollama",
    "organization_owner": "lmstudio",
    "cerebras": "cerebras",
    "openai": "openai",
    "system": "openai",
}


def dialect_named(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown dialect {name!r}; known: auto, {', '.join(DIALECTS)}") from None


def detect(models_listing: object) -> Dialect | None:
    """The dialect a `GET /models` body names through `owned_by`, or None when it says nothing known."""
    if not isinstance(models_listing, dict):
        return None
    for m in models_listing.get("data") or ():
        if isinstance(m, dict) and isinstance(m.get("owned_by"), str):
            name = DETECT_OWNED_BY.get(m["owned_by"].lower())
            if name:
                return DIALECTS[name]
    return None


# --- reasoning controls ---------------------------------------------------------------------------

_EFFORT_LEVEL = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def _refuse(message: str) -> TetherError:
    return TetherError(errors.UNSUPPORTED, message, param="reasoning.effort")


def reasoning_controls(
    dialect: Dialect, model: str, effort: str | None, enabled: bool, caps: ModelCaps | None = None
) -> ReasoningControls:
    """The fields that carry `reasoning.effort` to this server for `model`. `enabled` is the
    backend's reasoning capability (config); `caps` what the server reports about the model.
    Raises a 400 for an effort the server cannot honour."""
    if dialect.reasoning_controls == "cerebras":
        return cerebras_reasoning(model, effort, caps or ModelCaps())
    if effort is None:
        return ReasoningControls({})
    if dialect.reasoning_controls == "none" or not enabled:
        raise _refuse(
            f"reasoning.effort {effort!r} cannot be honoured: this backend ({dialect.server}) has no "
            "reasoning control; leave reasoning.effort unset"
        )
    if effort == "none":
        return ReasoningControls({"reasoning_effort": "none"})
    return ReasoningControls({"reasoning_effort": _EFFORT_LEVEL[effort]})


# --- model capabilities ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCaps:
    """What one model can do, as the server reports it (Cerebras: `GET /v1/models/{id}`,
    `capabilities` and `limits`); None where it says nothing (the family table decides)."""

    reasoning: bool | None = None
    vision: bool | None = None
    structured_outputs: bool | None = None
    tools: bool | None = None
    max_completion_tokens: int | None = None
    context_length: int | None = None

    @classmethod
    def from_model(cls, obj: object) -> ModelCaps:
        """From a `GET /models/{id}` body (the SDK's `PublicModel`); fields of another shape or
        type count as unsaid."""
        if not isinstance(obj, Mapping):
            return cls()
        caps = obj.get("capabilities")
        caps = caps if isinstance(caps, Mapping) else {}
        limits = obj.get("limits")
        limits = limits if isinstance(limits, Mapping) else {}

        def flag(*keys: str) -> bool | None:
            for k in keys:
                if isinstance(caps.get(k), bool):
                    return bool(caps[k])
            return None

        def count(key: str) -> int | None:
            v = limits.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

        return cls(
            reasoning=flag("reasoning"),
            vision=flag("vision"),
            structured_outputs=flag("structured_outputs"),
            tools=flag("tools", "function_calling"),
            max_completion_tokens=count("max_completion_tokens"),
            context_length=count("max_context_length"),
        )


@dataclass(frozen=True)
class CerebrasFamily:
    """The fallback for what `GET /v1/models/{id}` leaves unsaid, per family of model ids (from
    Cerebras's reasoning guide and model pages). `efforts`: the `reasoning_effort` values the
    model takes (empty: no effort parameter; the model decides how long it thinks)."""

    name: str
    reasoning: bool
    efforts: frozenset[str] = frozenset()
    vision: bool = False
    structured_outputs: bool = True


_ALL_EFFORTS = frozenset({"none", "low", "medium", "high"})
CEREBRAS_FAMILIES: tuple[tuple[str, CerebrasFamily], ...] = (
    # (id prefix or fragment, family), first match wins
    ("gpt-oss", CerebrasFamily("gpt-oss", True, frozenset({"low", "medium", "high"}))),
    ("glm", CerebrasFamily("glm", True, _ALL_EFFORTS)),  # `reasoning_effort: "none"` turns it off
    ("qwen-3-", CerebrasFamily("qwen3", True)),  # the 2025 Qwen3 ids: no effort control
    ("qwen", CerebrasFamily("qwen", True, _ALL_EFFORTS)),  # later Qwen: none/low/medium/high
    ("gemma", CerebrasFamily("gemma", True, vision=True)),  # thinks; no effort parameter
)
_PLAIN = CerebrasFamily("plain", False)


def cerebras_family(model: str) -> CerebrasFamily:
    """The family of a Cerebras model id (`plain`: no reasoning, text only)."""
    m = model.lower()
    for mark, family in CEREBRAS_FAMILIES:
        if mark in m:
            return family
    return _PLAIN


def known_caps(dialect: Dialect, model: str, caps: ModelCaps) -> ModelCaps:
    """`caps` (the server's word) with what it leaves unsaid filled from the dialect's family
    table (Cerebras); as is for any other dialect."""
    if dialect.reasoning_controls != "cerebras":
        return caps
    family = cerebras_family(model)
    return replace(
        caps,
        reasoning=family.reasoning if caps.reasoning is None else caps.reasoning,
        vision=family.vision if caps.vision is None else caps.vision,
        structured_outputs=family.structured_outputs if caps.structured_outputs is None else caps.structured_outputs,
    )


def cerebras_reasoning(model: str, effort: str | None, caps: ModelCaps) -> ReasoningControls:
    """Whether the model reasons comes from the server (`caps.reasoning`), else the family table;
    its effort levels from the family table (the server does not list them). A reasoning model
    always gets `reasoning_format: "parsed"`, so its thinking arrives in its own field and never
    inside `content` (Qwen's default is raw `<think>` text, GLM's and GPT-OSS's `text_parsed`).
    An effort the model cannot take is a 400 naming `reasoning.effort`: GPT-OSS cannot turn
    reasoning off, a model without effort levels takes none; `minimal` is sent as `low` and
    `xhigh` as `high`."""
    family = cerebras_family(model)
    reasons = family.reasoning if caps.reasoning is None else caps.reasoning
    if not reasons:
        if effort not in (None, "none"):
            raise _refuse(f"model {model!r} does not reason on Cerebras; leave reasoning.effort unset")
        return ReasoningControls({})
    fields: dict[str, object] = {"reasoning_format": "parsed"}
    if effort is None:
        return ReasoningControls(fields)
    efforts = family.efforts if family.reasoning else frozenset()
    if not efforts:
        raise _refuse(f"model {model!r} has no reasoning effort control on Cerebras; leave reasoning.effort unset")
    level = "none" if effort == "none" else _EFFORT_LEVEL[effort]
    if level not in efforts:
        if level == "none":
            raise _refuse(f"model {model!r} cannot turn reasoning off on Cerebras (efforts: low, medium, high)")
        raise _refuse(f"model {model!r} takes reasoning.effort {', '.join(sorted(efforts))} on Cerebras")
    fields["reasoning_effort"] = level
    return ReasoningControls(fields)
