"""The simulated backend: an offline, deterministic model with realistic timing.

It sleeps `ttft_ms`, then emits tokens at `tokens_per_s`. It never sleeps per token: each wake-up
emits every token that is due by the elapsed time, then sleeps until the next one is due (at least
one `tick_ms`), so 4,000 tok/s costs ~250 wake-ups per second, not 4,000.

A "token" is one word of a fixed vocabulary (or ~4 characters of tool-call arguments / JSON text).
What it says is decided per turn, in this order:

1. instructions starting with "Summarize"/"Summarise": a summary of ~`summary_tokens` tokens that
   names how many items it summarised (used by compaction);
2. a script (config `script`, or the per-request hint `script`): step N of the script, where N is
   the number of earlier model turns in the context (maximal runs of assistant messages,
   function_call and reasoning items), or the hint `turn`; after the last step, the script's
   `after` step (default: a text answer);
3. a model named `tether-lab/<workload>[@<speed>]` (e.g. `tether-lab/bugfix20@1000`): the script
   of that lab workload (`tether.workloads`) at that speed, exactly the one `tether bench`
   generates, so the console's transport race and the bench run the same rollout;
4. a multi-agent response's root (`BackendRequest.agent`) whose last user message contains
   "delegate" and that has not spawned yet: two `spawn_agent` calls (`worker_1`, `worker_2`)
   and a `wait_agent` (tether.core.multi_agent); each worker then behaves as below;
5. no script: when function or custom tools are offered and the context has no tool output yet
   (for an MCP tool: no `mcp_call` or approval verdict since the last user message), one call to the first of them (a function's arguments built from its JSON
   schema; a custom tool's `input` the fixed text `CUSTOM_INPUT`, whatever its grammar; a remote
   MCP server's tool only when `tool_choice` names it or the last user message mentions its
   name, and then before any other tool), else a text answer of
   `output_tokens` tokens (or a JSON value when `text.format` asks for one).

Asked for log probabilities (`BackendRequest.logprobs`), every text token carries deterministic
ones (`token_logprob`): the token itself first among its `top_logprobs`, then vocabulary words,
each less likely. A `tool_choice` object other than `function` / `custom` / `allowed_tools` is a
400 naming `tool_choice`, as on every Chat Completions dialect.

An unscripted text answer says what it is, so a newcomer's first call explains itself: that it
comes from the simulated model, what it received (items, the last user message's start, tools,
input tokens) and how to configure a real backend; it is cut, or padded with marked deterministic
filler words, to exactly `output_tokens` tokens, so speed and length stay tunable.

Script format (JSON or TOML; a bare JSON list is also accepted as `steps`)::

    {"steps": [
        {"reasoning_tokens": 8, "tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]},
        {"text": "Two calls at once.", "tool_calls": [{"name": "a"}, {"name": "b", "arguments": "{}"}]},
        {"text_tokens": 40}
     ],
     "after": {"text_tokens": 20}}

A multi-agent response's agent follows `agents[<its path>]` (a script of the same format) when the
script has one, e.g. `{"steps": [...], "agents": {"/root/a": {"steps": [...]}}}`.

Step keys: `text` (literal, split into word tokens), `text_tokens` (N generated words),
`reasoning` / `reasoning_tokens` (emitted first, as reasoning), `refusal` (literal, emitted as a
refusal instead of text), `tool_calls` (list of `name`,
optional `arguments` object or JSON string, optional `call_id`; a call with `input` (a string) is
a custom tool call with that input), `finish` (override the finish
reason, e.g. "content_filter"), `ttft_ms` / `tokens_per_s` (per-step timing), `error`
(`{"code","message","status"}`: raise a BackendError after `error_after_tokens` tokens, default 0).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import os
import tomllib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import orjson

from tether import errors
from tether.backends.balancer import prefix_chain
from tether.backends.base import (
    BackendBase,
    BackendError,
    BackendRequest,
    Chunk,
    Finish,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    Timing,
    ToolCallDelta,
    Usage,
)
from tether.backends.kvsim import ReplicaPhysics
from tether.errors import TetherError
from tether.protocol.calls import answered_call_id, call_of
from tether.responses.v1 import items_pb2, request_pb2

log = logging.getLogger(__name__)

LAB_MODEL_PREFIX = "tether-lab/"
# The name GET /v1/models shows for a "*" route to a simulated backend (the default config routes it).
DEFAULT_MODEL = "tether-sim"

SCRIPTS_DIR = Path(__file__).parent / "scripts"

_VOCAB = (
    "the", "model", "reads", "a", "file", "and", "then", "runs", "tests", "to", "check", "that",
    "each", "change", "works", "as", "expected", "so", "we", "can", "move", "on", "with", "next",
    "step", "of", "plan", "while", "keeping", "output", "short", "clear", "results", "look", "good",
    "here", "is", "summary", "what", "was", "done", "in", "this", "session", "code", "now", "passes",
    "all", "checks", "without", "errors", "or", "warnings", "update", "config", "function", "returns",
    "value", "from", "cache", "when", "present", "otherwise", "computes", "it",
)  # fmt: skip
_SENTENCE = 12  # words per sentence
_ARG_CHARS = 4  # characters of JSON text per "token"

_STEP_KEYS = frozenset(
    {
        "text", "text_tokens", "reasoning", "reasoning_tokens", "refusal", "tool_calls", "finish",
        "ttft_ms", "tokens_per_s", "error", "error_after_tokens", "comment",
    }
)  # fmt: skip
_CALL_KEYS = frozenset({"name", "arguments", "call_id", "input"})
# The `input` of an unscripted custom tool call.
CUSTOM_INPUT = "input from the simulated model"


@dataclass(kw_only=True)
class SimulatedConfig:
    ttft_ms: float = 150.0  # time to first token
    tokens_per_s: float = 1000.0  # 0 means "as fast as possible"
    output_tokens: int = 80  # length of an unscripted text answer (the explanation is ~60-75)
    reasoning_tokens: int = 0  # reasoning emitted before an unscripted answer
    summary_tokens: int = 120  # length of a compaction summary
    script: str | None = None  # path of a JSON/TOML script (relative paths also tried in scripts/)
    call_tools: bool = True  # unscripted: call the first function or custom tool before answering
    tokens_per_chunk: int = 1  # tokens merged into one delta (1 = one delta per token, like upstreams)
    tick_ms: float = 4.0  # the shortest sleep between emissions
    # Prefill like a real replica (tether/backends/kvsim.py); 0 keeps the flat `ttft_ms`. With it,
    # `ttft_ms` is the fixed part of TTFT and `tokens_per_s` the rate of one sequence alone.
    prefill_tokens_per_s: float = 0.0
    kv_cache_tokens: int = 400_000  # this replica's KV prefix cache (LRU, in tokens)
    decode_slowdown: float = 0.0  # per extra sequence decoding at once on this replica


@dataclass(frozen=True)
class ScriptCall:
    name: str
    arguments: str  # JSON text; a custom call's input text
    call_id: str | None = None
    custom: bool = False


@dataclass(frozen=True)
class ScriptStep:
    text: str | None = None
    text_tokens: int = 0
    reasoning: str | None = None
    reasoning_tokens: int = 0
    refusal: str | None = None
    tool_calls: tuple[ScriptCall, ...] = ()
    finish: str | None = None
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    error: dict[str, Any] | None = None
    error_after_tokens: int = 0


@dataclass(frozen=True)
class Script:
    steps: tuple[ScriptStep, ...]
    after: ScriptStep | None = None
    source: str = ""
    # A multi-agent response's agents (`BackendRequest.agent`) that follow a script of their own.
    agents: dict[str, Script] = field(default_factory=dict)

    def for_agent(self, agent: str) -> Script:
        return self.agents.get(agent, self) if agent else self

    def step_for(self, turn: int) -> ScriptStep | None:
        if turn < len(self.steps):
            return self.steps[turn]
        return self.after


# --- scripts -----------------------------------------------------------------------------------


def resolve_script_path(path: str) -> Path:
    p = Path(os.path.expanduser(path))
    if p.is_file():
        return p
    if not p.is_absolute() and (SCRIPTS_DIR / p).is_file():
        return SCRIPTS_DIR / p
    raise ValueError(f"simulated backend: script file not found: {path}")


def _parse_step(raw: Any, where: str) -> ScriptStep:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a step must be an object, got {type(raw).__name__}")
    unknown = set(raw) - _STEP_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown step key(s) {sorted(unknown)}; allowed: {sorted(_STEP_KEYS)}")
    calls = []
    raw_calls = raw.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ValueError(f"{where}: tool_calls must be a list")
    for j, c in enumerate(raw_calls):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
            raise ValueError(f"{where}.tool_calls[{j}]: needs a non-empty string 'name'")
        bad = set(c) - _CALL_KEYS
        if bad:
            raise ValueError(f"{where}.tool_calls[{j}]: unknown key(s) {sorted(bad)}")
        if "input" in c:
            if not isinstance(c["input"], str) or "arguments" in c:
                raise ValueError(f"{where}.tool_calls[{j}]: a custom call's 'input' is a string, without 'arguments'")
            calls.append(ScriptCall(c["name"], c["input"], c.get("call_id"), custom=True))
            continue
        args = c.get("arguments", {})
        if not isinstance(args, str):
            args = orjson.dumps(args).decode()
        calls.append(ScriptCall(c["name"], args, c.get("call_id")))
    err = raw.get("error")
    if err is not None and not (isinstance(err, dict) and "message" in err):
        raise ValueError(f"{where}: error must be an object with a 'message'")
    try:
        step = ScriptStep(
            text=raw.get("text"),
            text_tokens=int(raw.get("text_tokens", 0)),
            reasoning=raw.get("reasoning"),
            reasoning_tokens=int(raw.get("reasoning_tokens", 0)),
            refusal=raw.get("refusal"),
            tool_calls=tuple(calls),
            finish=raw.get("finish"),
            ttft_ms=None if raw.get("ttft_ms") is None else float(raw["ttft_ms"]),
            tokens_per_s=None if raw.get("tokens_per_s") is None else float(raw["tokens_per_s"]),
            error=err,
            error_after_tokens=int(raw.get("error_after_tokens", 0)),
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc
    for key in ("ttft_ms", "tokens_per_s"):
        value = getattr(step, key)
        if value is not None and not 0 <= value < math.inf:  # nan fails too
            raise ValueError(f"{where}: {key} must be a finite number >= 0, got {raw[key]!r}")
    return step


def parse_script(data: Any, source: str = "<script>") -> Script:
    if isinstance(data, list):
        data = {"steps": data}
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise ValueError(f"{source}: a script needs a 'steps' list")
    unknown = set(data) - {"steps", "after", "description", "comment", "agents"}
    if unknown:
        raise ValueError(f"{source}: unknown top-level key(s) {sorted(unknown)}")
    steps = tuple(_parse_step(s, f"{source}: steps[{i}]") for i, s in enumerate(data["steps"]))
    after = _parse_step(data["after"], f"{source}: after") if data.get("after") is not None else None
    agents = data.get("agents") or {}
    if not isinstance(agents, dict):
        raise ValueError(f"{source}: 'agents' must map agent paths to scripts")
    scripts = {name: parse_script(sub, f"{source}: agents[{name!r}]") for name, sub in agents.items()}
    return Script(steps, after, source, scripts)


def load_script(path: str) -> Script:
    p = resolve_script_path(path)
    raw = p.read_bytes()
    try:
        data = tomllib.loads(raw.decode()) if p.suffix.lower() == ".toml" else orjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"simulated backend: cannot parse script {p}: {exc}") from exc
    return parse_script(data, str(p))


_SCRIPT_CACHE: dict[str, tuple[float, Script]] = {}


def _cached_script(path: str) -> Script:
    p = resolve_script_path(path)
    mtime = p.stat().st_mtime
    hit = _SCRIPT_CACHE.get(str(p))
    if hit is None or hit[0] != mtime:
        hit = (mtime, load_script(str(p)))
        _SCRIPT_CACHE[str(p)] = hit
    return hit[1]


_LAB_SCRIPTS: dict[str, Script] = {}


def lab_script(model: str) -> Script:
    """The script of lab model `tether-lab/<workload>[@<speed>]` (speed as `tether bench --speeds`,
    default 1000 tok/s). An unknown workload or a bad speed fails the response with
    `model_not_found` / `invalid_request` naming the model (routing happened before, so the
    response exists by then)."""
    hit = _LAB_SCRIPTS.get(model)
    if hit is not None:
        return hit
    from tether import workloads  # the lab workload files; imported only for lab models

    name, _, speed = model[len(LAB_MODEL_PREFIX) :].partition("@")
    if name not in workloads.available():
        known = ", ".join(workloads.available())
        raise BackendError(errors.MODEL_NOT_FOUND, f"The model '{model}' names no lab workload; known: {known}.")
    try:
        profile = workloads.SpeedProfile.parse(speed or "1000")
    except ValueError as exc:
        raise BackendError(
            errors.INVALID_REQUEST, f"Invalid speed in model '{model}': use tokens/s[@ttft_min:ttft_max] ({exc})."
        ) from None
    script = parse_script(workloads.load(name).simulated_script(profile), model)
    if len(_LAB_SCRIPTS) < 64:
        _LAB_SCRIPTS[model] = script
    return script


# --- deterministic content ---------------------------------------------------------------------


def model_turns(items: Sequence[items_pb2.Item]) -> int:
    """How many model turns the context holds: maximal runs of model-produced items."""
    turns = 0
    in_run = False
    for item in items:
        arm = item.WhichOneof("item")
        produced = arm == "reasoning" or call_of(item) is not None or (
            arm == "message" and item.message.role == "assistant"
        )
        if produced and not in_run:
            turns += 1
        in_run = produced
    return turns


def words(n: int, seed: int = 0) -> list[str]:
    """n deterministic word tokens forming sentences ("The model reads ... tests.")."""
    out: list[str] = []
    v = len(_VOCAB)
    for i in range(n):
        w = _VOCAB[(seed * 7 + i * 5 + i // v) % v]
        pos = i % _SENTENCE
        if pos == 0:
            w = w.capitalize()
        if pos == _SENTENCE - 1 or i == n - 1:
            w += "."
        out.append(w if i == 0 else " " + w)
    return out


@functools.lru_cache(maxsize=64)
def _filler(n: int, seed: int) -> tuple[str, ...]:
    """`n` filler words after an answer's explanation, built once per (n, seed)."""
    return tuple(" " + w.lstrip() for w in words(n, seed))


@functools.lru_cache(maxsize=4096)
def _text_unit(text: str) -> TextDelta:
    """One text chunk, shared (chunks are immutable): the simulated model runs inside the server,
    and building 4,000 chunk objects per request would charge the model's own work to the
    server's core."""
    return TextDelta(text)


# The subagents a multi-agent root spawns when asked to "delegate" (`/root/worker_1`, ...).
DELEGATE_WORKERS = ("worker_1", "worker_2")


def _last_user_text(items: Sequence[items_pb2.Item]) -> str:
    for item in reversed(items):
        if item.WhichOneof("item") == "message" and item.message.role == "user":
            m = item.message
            if m.HasField("content_text"):
                return m.content_text
            return " ".join(p.input_text.text for p in m.content if p.WhichOneof("part") == "input_text")
    return ""


def split_text(text: str) -> list[str]:
    """Literal text as word tokens (leading spaces kept on the words, so they join back exactly)."""
    out: list[str] = []
    cur = ""
    for ch in text:
        if ch in " \n" and cur.strip():
            out.append(cur)
            cur = ""
        cur += ch
    if cur:
        out.append(cur)
    return out


def _pieces(s: str, size: int = _ARG_CHARS) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


_STRING_HINTS = {
    "path": "README.md", "file": "README.md", "filename": "README.md", "file_path": "README.md",
    "command": "ls", "cmd": "ls", "query": "example", "url": "https://example.com",
    "city": "Paris", "location": "Paris", "language": "python", "pattern": "TODO",
}  # fmt: skip


def example_from_schema(schema: Any, key: str = "", depth: int = 0) -> Any:
    """A small value that satisfies common JSON schemas (required props only; one array element)."""
    if not isinstance(schema, dict) or depth > 6:
        return "example"
    for k in ("const", "default"):
        if k in schema:
            return schema[k]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for k in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(k), list) and schema[k]:
            return example_from_schema(schema[k][0], key, depth + 1)
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "null")
    if t is None:
        t = "object" if "properties" in schema else "string"
    if t == "object":
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        names = required or list(props)
        return {n: example_from_schema(props.get(n, {}), n, depth + 1) for n in names}
    if t == "array":
        return [example_from_schema(schema.get("items", {}), key, depth + 1)]
    if t == "integer" or t == "number":
        return schema.get("minimum", 1)
    if t == "boolean":
        return True
    if t == "null":
        return None
    return _STRING_HINTS.get(key.lower(), "example")


def _call_id(request: BackendRequest, turn: int, index: int, name: str) -> str:
    # A multi-agent response's agents make their calls in one response: their ids differ by agent.
    agent = f":{request.agent}" if request.agent else ""
    h = hashlib.sha1(f"{turn}:{index}:{name}:{len(request.items)}{agent}".encode()).hexdigest()[:24]
    return f"call_{h}"


# --- the plan: a list of one-token units, then paced emission ----------------------------------


@dataclass
class _Plan:
    units: list[Chunk] = field(default_factory=list)
    reasoning_units: int = 0
    finish: str = "stop"
    ttft_s: float = 0.15
    tokens_per_s: float = 1000.0
    error: dict[str, Any] | None = None
    error_after: int = 0


class SimulatedBackend(BackendBase):
    """Offline deterministic backend (kind "simulated"): takes every request shape, answers
    whatever model names are routed to it (it lists none of its own)."""

    kind: ClassVar[str] = "simulated"
    Config: ClassVar[type] = SimulatedConfig

    def __init__(self, name: str = "simulated", config: SimulatedConfig | None = None) -> None:
        self.name = name
        self.config = config or SimulatedConfig()
        c = self.config
        if c.ttft_ms < 0 or c.tokens_per_s < 0 or c.tick_ms <= 0:
            raise ValueError("simulated backend: ttft_ms/tokens_per_s must be >= 0 and tick_ms > 0")
        if c.output_tokens < 0 or c.summary_tokens < 0 or c.reasoning_tokens < 0 or c.tokens_per_chunk < 1:
            raise ValueError("simulated backend: token counts must be >= 0 and tokens_per_chunk >= 1")
        self.script: Script | None = load_script(c.script) if c.script else None
        self.physics: ReplicaPhysics | None = None
        if c.prefill_tokens_per_s > 0:
            self.physics = ReplicaPhysics(
                prefill_tokens_per_s=c.prefill_tokens_per_s,
                kv_cache_tokens=c.kv_cache_tokens,
                decode_slowdown=c.decode_slowdown,
            )

    def owned_by(self, model: str) -> str:
        return "tether"

    def catch_all_models(self) -> list[str]:
        """Its default name, and the lab's workload models (`tether-lab/<workload>`, 1,000 tok/s;
        any `@<speed>` suffix works too)."""
        from tether import workloads  # the workload files' names, read only when listing

        return [DEFAULT_MODEL, *(LAB_MODEL_PREFIX + name for name in workloads.available())]

    # planning ---------------------------------------------------------------------------------

    def _script_for(self, request: BackendRequest) -> Script | None:
        path = request.hints.get("script")
        if not path:
            if request.model.startswith(LAB_MODEL_PREFIX):
                return lab_script(request.model)
            return self.script
        try:
            return _cached_script(path)
        except (OSError, ValueError) as exc:
            raise TetherError(errors.INVALID_REQUEST, str(exc), param="script") from exc

    def reads_input_tokens(self, request: BackendRequest) -> bool:
        """The default text answer states the input token count; a script whose every step
        (and `after`) says something of its own (text, tool calls, an error) never reads it. Which
        step a request is would cost a walk of its whole context, so every step is checked. A
        request whose script cannot be had reads it (its error is raised by `stream`, as a failed
        response)."""
        if self.physics is not None:  # its prefix cache caps the cached count by the input's
            return True
        try:
            script = self._script_for(request)
        except TetherError:
            return True
        if script is None:
            return True
        return any(
            step is None or not (step.text or step.text_tokens or step.tool_calls or step.error is not None)
            for step in (*script.steps, script.after)
        )

    def plan(self, request: BackendRequest) -> _Plan:
        """What this request produces (exposed for tests and for the lab)."""
        c = self.config
        turn = model_turns(request.items)
        if request.hints.get("turn"):
            try:
                turn = int(request.hints["turn"])
            except ValueError:
                raise TetherError(
                    errors.INVALID_REQUEST, "hint 'turn' must be an integer", param="turn"
                ) from None
        plan = _Plan(ttft_s=c.ttft_ms / 1000.0, tokens_per_s=c.tokens_per_s)
        instructions = (request.instructions or "").lstrip().lower()
        if instructions.startswith("summarize") or instructions.startswith("summarise"):
            n = len(request.items)
            head = ["Summary", " of", f" {n}", " earlier", " items" if n != 1 else " item", ":"]
            plan.units = [
                TextDelta(t)
                for t in head + [" " + w.lstrip() for w in words(max(0, c.summary_tokens - len(head)), turn)]
            ]
            return plan
        script = self._script_for(request)
        step = script.for_agent(request.agent).step_for(turn) if script else None
        if step is not None:
            self._plan_step(plan, step, request, turn)
            return plan
        # Unscripted.
        plan.units.extend(ReasoningDelta(w) for w in words(c.reasoning_tokens, turn + 1))
        plan.reasoning_units = c.reasoning_tokens
        if self._delegates(request):
            for i, worker in enumerate(DELEGATE_WORKERS):
                task = {"task_name": worker, "message": f"Part {i + 1} of: {_last_user_text(request.items)[:200]}"}
                self._add_call(plan, i, _call_id(request, turn, i, "spawn_agent"), "spawn_agent", orjson.dumps(task).decode())
            n = len(DELEGATE_WORKERS)
            self._add_call(plan, n, _call_id(request, turn, n, "wait_agent"), "wait_agent", "{}")
            plan.finish = "tool_calls"
            return plan
        tool = self._auto_tool(request)
        if tool is not None:
            name, schema, custom = tool
            args = CUSTOM_INPUT if custom else orjson.dumps(example_from_schema(schema)).decode()
            self._add_call(plan, 0, _call_id(request, turn, 0, name), name, args, custom)
            plan.finish = "tool_calls"
            return plan
        n = c.output_tokens
        cap = request.max_output_tokens
        if cap is not None and 0 <= cap < n:  # one past the cap (its words are the same): cut as "length"
            n = cap + 1
        plan.units.extend(map(_text_unit, self._answer_tokens(request, n, turn)))
        return plan

    def _explanation(self, request: BackendRequest) -> str:
        """What the unscripted text answer says: what this is, what it got, how to get a real model."""
        last = _last_user_text(request.items)
        words = last[:1000].split()  # a megabyte of input is quoted from its start, not split whole
        quoted = " ".join(words[:12])
        if len(words) > 12 or len(last) > 1000 or len(quoted) > 120:
            quoted = quoted[:120] + " ..."
        said = f'last user message: "{quoted}"' if quoted else "no user message"
        n, tools = len(request.items), len(request.tools)
        return (
            f"This is Tether's simulated model (backend {self.name!r}), not a language model; it answers "
            f"deterministically so clients can be tested offline. It received {n} input "
            f"item{'s' if n != 1 else ''} ({said}), {tools} tool{'s' if tools != 1 else ''}, "
            f"{request.input_tokens} input tokens. For a real model, add an openai or cerebras backend "
            "to tether.toml and route model names to it under [models] (README, Configuration)."
        )

    async def prepare(self, request: BackendRequest) -> None:
        _choice(request)  # an unmapped tool_choice type is a 400 before response.created

    @staticmethod
    def _delegates(request: BackendRequest) -> bool:
        """A multi-agent response's root, asked to "delegate", that has not spawned yet."""
        if request.agent != "/root" or "spawn_agent" not in request.agent_actions:
            return False
        if "delegate" not in _last_user_text(request.items).lower():
            return False
        return not any(i.WhichOneof("item") == "function_call" and i.function_call.name == "spawn_agent"
                       for i in request.items)  # fmt: skip

    def _auto_tool(self, request: BackendRequest) -> tuple[str, Any, bool] | None:
        """(name, parameters schema, is custom) of the tool an unscripted turn calls, or None (a
        multi-agent response's actions are never called this way)."""
        if not self.config.call_tools:
            return None
        offered = [(name, t, custom) for t in request.tools for name, custom in [_tool_name(t)]
                   if name and name not in request.agent_actions]  # fmt: skip
        mode, named = _choice(request)
        if named is not None:
            offered = [o for o in offered if o[0] in named]
        elif request.mcp_tools:  # a remote MCP server's tool: only when the user asks for it by name
            asked = _last_user_text(request.items)
            mentioned = [o for o in offered if o[0] in request.mcp_tools and o[0] in asked]
            offered = mentioned or [o for o in offered if o[0] not in request.mcp_tools]
        if not offered or mode == "none":
            return None
        name, target, custom = offered[0]
        if name in request.mcp_tools:  # answered: an MCP call (or a verdict on one) since the user spoke
            answered = any(i.WhichOneof("item") in ("mcp_call", "mcp_approval_response")
                           for i in request.items[_last_user_index(request.items) + 1:])  # fmt: skip
        else:
            answered = any(answered_call_id(i) is not None for i in request.items)
        if answered and mode != "required":
            return None
        if custom:
            return name, None, True
        try:
            schema = orjson.loads(target.function.parameters_json) if target.function.parameters_json else {}
        except orjson.JSONDecodeError:
            schema = {}
        return name, schema, False

    def _answer_tokens(self, request: BackendRequest, n: int, seed: int) -> list[str]:
        fmt = request.text_format
        if fmt is not None and fmt.type in ("json_schema", "json_object"):
            value: Any = {"answer": " ".join(w.strip() for w in words(max(1, n // 2), seed))}
            if fmt.type == "json_schema" and fmt.schema_json:
                try:
                    value = example_from_schema(orjson.loads(fmt.schema_json))
                except orjson.JSONDecodeError:
                    pass
            return _pieces(orjson.dumps(value).decode())
        tokens = split_text(self._explanation(request))
        if len(tokens) < n:
            tokens += split_text(" Filler up to output_tokens:")
        tokens = tokens[:n]
        if len(tokens) < n:
            tokens += _filler(n - len(tokens), seed)
        elif tokens and tokens[-1][-1] not in ".;:!?":
            tokens[-1] += "."
        return tokens

    @staticmethod
    def _add_call(plan: _Plan, index: int, call_id: str, name: str, arguments: str, custom: bool = False) -> None:
        plan.units.append(ToolCallDelta(index=index, call_id=call_id, name=name, custom=custom))
        plan.units.extend(ToolCallDelta(index=index, arguments=p) for p in _pieces(arguments) if p)

    def _plan_step(self, plan: _Plan, step: ScriptStep, request: BackendRequest, turn: int) -> None:
        if step.ttft_ms is not None:
            plan.ttft_s = step.ttft_ms / 1000.0
        if step.tokens_per_s is not None:
            plan.tokens_per_s = step.tokens_per_s
        reasoning = split_text(step.reasoning) if step.reasoning else []
        reasoning += words(step.reasoning_tokens, turn + 1)
        plan.units.extend(ReasoningDelta(t) for t in reasoning)
        plan.reasoning_units = len(reasoning)
        text = split_text(step.text) if step.text else []
        if step.text_tokens:
            more = words(step.text_tokens, turn)
            text += [" " + more[0]] + more[1:] if text else more
        if not text and not step.tool_calls and step.error is None and step.refusal is None:
            text = self._answer_tokens(request, self.config.output_tokens, turn)
        plan.units.extend(TextDelta(t) for t in text)
        if step.refusal is not None:
            plan.units.extend(RefusalDelta(t) for t in split_text(step.refusal))
        for i, call in enumerate(step.tool_calls):
            self._add_call(
                plan, i, call.call_id or _call_id(request, turn, i, call.name), call.name, call.arguments, call.custom
            )
        plan.finish = step.finish or ("tool_calls" if step.tool_calls else "stop")
        plan.error = step.error
        plan.error_after = step.error_after_tokens

    # emission ---------------------------------------------------------------------------------

    async def stream_runs(self, request: BackendRequest) -> AsyncGenerator[list[Chunk], None]:
        """Each wake-up's due tokens as one run (`stream()`, inherited, yields them one by one)."""
        plan = self.plan(request)
        units = plan.units
        finish = plan.finish
        limit = request.max_output_tokens
        if limit is not None and limit >= 0 and len(units) > limit:
            units = units[:limit]
            finish = "length"
        error_at = min(plan.error_after, len(units)) if plan.error is not None else -1
        if error_at >= 0:
            units = units[:error_at]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ttft_s, cached = plan.ttft_s, None  # None: no prefix cache of its own, Tether counts the reuse
        physics = self.physics
        if physics is not None:
            chain = prefix_chain(request.instructions, request.tools, request.items, scope=request.tenant)
            admission = physics.admit(chain, plan.ttft_s, t0)
            ttft_s, cached = admission.ttft_s, min(admission.cached_tokens, request.input_tokens)
        if ttft_s > 0:
            await asyncio.sleep(ttft_s)
        start = loop.time()
        tps = plan.tokens_per_s
        tick = self.config.tick_ms / 1000.0
        group = self.config.tokens_per_chunk
        top = request.logprobs
        n = len(units)
        emitted = 0
        credit, last = 0.0, start  # tokens due so far, integrated over the (varying) decode rate
        if physics is not None:
            physics.decoding += 1
        try:
            while emitted < n:
                now = loop.time()
                rate = tps if physics is None else physics.decode_rate(tps)
                credit += (now - last) * rate
                last = now
                due = n if tps <= 0 else min(n, 1 + int(credit))
                if emitted < due:
                    # Log probabilities are made as their tokens are due: a long answer's would
                    # otherwise cost the server's loop (the model runs in its process) all at once.
                    piece = units[emitted:due] if top is None else [
                        TextDelta(u.text, [token_logprob(u.text, top)]) if type(u) is TextDelta else u
                        for u in units[emitted:due]
                    ]  # fmt: skip
                    emitted = due
                    if group == 1:
                        run = piece
                    else:
                        run, i = [], 0
                        while i < len(piece):
                            chunk, i = _merge(piece, i, min(len(piece), i + group))
                            run.append(chunk)
                    yield run
                if emitted < n:
                    await asyncio.sleep(max((emitted - credit) / rate, tick))
        finally:
            if physics is not None:
                physics.decoding -= 1
        end = loop.time()
        if error_at >= 0 and plan.error is not None:
            e = plan.error
            raise BackendError(
                str(e.get("code", errors.BACKEND_ERROR)),
                str(e["message"]),
                status=int(e["status"]) if "status" in e else None,  # the simulated upstream's word
                retry_after=e.get("retry_after"),
                retryable=bool(e.get("retryable", False)),
            )
        reasoning = min(plan.reasoning_units, n)
        yield [Finish(
            reason=finish,
            # The model has no tokenizer of its own: it echoes Tether's count, which is 0 when
            # Tether tokenises while the model streams and the stream never had to wait (then it
            # reports none, and Tether's own count is used).
            usage=Usage(
                input_tokens=request.input_tokens or None,
                cached_tokens=cached,
                output_tokens=n,
                reasoning_tokens=reasoning,
            ),
            timing=Timing(prompt_time=start - t0, completion_time=end - start, total_time=end - t0),
        )]


def _logprob_of(token: str, rank: int) -> float:
    """A deterministic log probability for `token` at `rank` (0: the chosen token, the likeliest)."""
    spread = int.from_bytes(hashlib.blake2s(token.encode(), digest_size=2).digest(), "big") / 65536.0
    return -round(0.05 + spread + rank * 1.5, 4)


def token_logprob(token: str, top: int) -> dict[str, Any]:
    """The simulated model's log probability of a token it emits, with `top` alternatives: the
    token itself first, then words of the vocabulary, each less likely than the one before."""
    alternatives = [token] + [w for w in _VOCAB if w != token.strip()][: max(0, top - 1)]
    return {
        "token": token,
        "bytes": list(token.encode()),
        "logprob": _logprob_of(token, 0),
        "top_logprobs": [
            {"token": t, "bytes": list(t.encode()), "logprob": _logprob_of(token, rank)}
            for rank, t in enumerate(alternatives[:top])
        ],
    }


def _last_user_index(items: Sequence[items_pb2.Item]) -> int:
    for i in range(len(items) - 1, -1, -1):
        if items[i].WhichOneof("item") == "message" and items[i].message.role == "user":
            return i
    return -1


def _tool_name(tool: request_pb2.Tool) -> tuple[str, bool]:
    """(name, is custom) of a function or custom tool; ("", False) for any other tool type."""
    arm = tool.WhichOneof("tool")
    if arm == "function":
        return tool.function.name, False
    if arm == "other" and tool.other.type == "custom":
        obj = orjson.loads(tool.other.json)
        name = obj.get("name") if isinstance(obj, dict) else None
        return (name, True) if isinstance(name, str) else ("", False)
    return "", False


def _choice(request: BackendRequest) -> tuple[str, frozenset[str] | None]:
    """`tool_choice` as (mode, the tool names it allows or None for all): a named function or
    custom tool forces that one, `allowed_tools` narrows the choice; other object types (mcp,
    hosted tools) are a 400 naming `tool_choice`, as on every Chat Completions dialect."""
    choice = request.tool_choice
    arm = choice.WhichOneof("choice") if choice is not None else None
    if arm == "mode":
        return choice.mode, None  # type: ignore[union-attr]  # an arm: `choice` is set
    if arm == "function_name":
        return "required", frozenset({choice.function_name})  # type: ignore[union-attr]  # as above
    if arm != "other_json":
        return "auto", None
    obj = orjson.loads(choice.other_json)  # type: ignore[union-attr]  # as above
    kind = obj.get("type")
    if kind in ("function", "custom"):
        return "required", frozenset({str(obj.get("name", ""))})
    if kind == "allowed_tools":
        listed = obj.get("tools")
        names = frozenset(str(t.get("name")) for t in listed if isinstance(t, dict)) if isinstance(listed, list) else frozenset()
        return ("required" if obj.get("mode") == "required" else "auto"), names
    raise TetherError(
        errors.UNSUPPORTED,
        f"tool_choice of type {kind!r} cannot be honoured by the simulated backend: it calls function and custom tools only",
        param="tool_choice",
        status=400,
    )


def _merge(units: list[Chunk], i: int, stop: int) -> tuple[Chunk, int]:
    """Merge units[i:stop] of the same kind (and tool call) into one chunk; return it and the next index."""
    first = units[i]
    j = i + 1
    if isinstance(first, TextDelta | ReasoningDelta | RefusalDelta):
        parts = [first.text]
        while j < stop and type(units[j]) is type(first):
            parts.append(units[j].text)  # type: ignore[union-attr]  # the type of `first`, checked above
            j += 1
        if type(first) is TextDelta and first.logprobs is not None:
            logprobs = [lp for u in units[i:j] for lp in u.logprobs or ()]  # type: ignore[union-attr]  # TextDeltas, as `first`
            return TextDelta("".join(parts), logprobs), j
        return type(first)("".join(parts)), j
    if isinstance(first, ToolCallDelta):
        parts = [first.arguments]
        while j < stop:
            u = units[j]
            if not isinstance(u, ToolCallDelta) or u.index != first.index or u.call_id is not None:
                break
            parts.append(u.arguments)
            j += 1
        return ToolCallDelta(first.index, "".join(parts), first.call_id, first.name, first.custom), j
    return first, j
