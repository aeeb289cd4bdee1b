"""Workloads: agent rollouts described as data (`tether/workloads/*.toml`).

A workload fixes everything a rollout sends and receives, so every transport does identical work:
the instructions block, the tools (real JSON schemas), the user prompt, and one step per model
turn: what the model emits (reasoning tokens, optional text, one or more tool calls with their
arguments) and how large each tool's output is. The final turn is a text answer.

From a workload the lab derives both sides of the rollout:
- the simulated model's script (`simulated_script`): step N is what the model says on its N-th
  turn, with a per-step TTFT that grows with the context (`SpeedProfile`), so the tool loop is
  deterministic whatever the transport;
- the client's tool results (`tool_output`): deterministic, realistic-looking text of the given
  size (Python source, pytest logs, grep hits, directory listings, diffs, lint output, JSON).

File format (TOML or JSON)::

    name = "bugfix20"
    description = "..."
    instructions = "instructions/coding_agent.toml" # a file next to the workloads (its `text`), or text
    tools = "tools/coding.json"                     # a file, or an inline list of tool objects
    user_prompt = "..."
    final_text = "Fixed: ..."                       # literal start of the final answer
    final_text_tokens = 140                         # generated words after it

    [[steps]]
    text = "Let me look first."                     # optional assistant text before the call
    reasoning_tokens = 45
    tool = "list_dir"                               # one call per step (or `calls = [...]`)
    args = {path = "src/app", depth = 2}
    output = {kind = "listing", bytes = 1400}       # kinds: see OUTPUT_KINDS

    [[steps]]                                       # a repeated group: {i} in strings = 1..repeat
    repeat = 19
    [[steps.steps]]
    tool = "read_file"
    args = {path = "src/app/handlers/module_{i}.py"}
    output = {kind = "file", bytes = 3600}

String argument values of the form "@gen KIND BYTES" are replaced by generated text of that kind
and size (edit_file's old/new text, ticket bodies).
"""

from __future__ import annotations

import json
import random
import tomllib
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

WORKLOADS_DIR = Path(__file__).parent / "workloads"

_STEP_KEYS = {"text", "text_tokens", "reasoning_tokens", "tool", "args", "output", "calls", "repeat", "steps",
              "tool_ms", "comment"}
_CALL_KEYS = {"tool", "args", "output"}
_TOP_KEYS = {"name", "description", "instructions", "tools", "user_prompt", "final_text", "final_text_tokens",
             "steps", "comment"}


# --- speed profiles -----------------------------------------------------------------------------

MIN_TOKENS_PER_S = 1.0  # a 1,000-token answer takes at most ~17 minutes
MAX_TOKENS_PER_S = 1e9
MAX_TTFT_MS = 600_000.0


@dataclass(frozen=True)
class SpeedProfile:
    """How fast the simulated model is: decode speed, and a TTFT that grows linearly from
    `ttft_min_ms` (empty context) to `ttft_max_ms` (at `ttft_ctx_tokens` of context and beyond),
    the way prefill time grows with the uncached part of a prompt."""

    name: str
    tokens_per_s: float
    ttft_min_ms: float = 200.0
    ttft_max_ms: float = 500.0
    ttft_ctx_tokens: int = 64_000

    def ttft_ms(self, context_tokens: int) -> float:
        frac = min(1.0, context_tokens / self.ttft_ctx_tokens) if self.ttft_ctx_tokens > 0 else 1.0
        return round(self.ttft_min_ms + (self.ttft_max_ms - self.ttft_min_ms) * frac, 3)

    @classmethod
    def parse(cls, spec: str, *, ttft: tuple[float, float] = (200.0, 500.0), ttft_ctx_tokens: int = 64_000) -> SpeedProfile:
        """"1000" (tokens/s, default TTFT range) or "1000@200:500" (tokens/s @ TTFT min:max ms).
        ValueError unless `MIN_TOKENS_PER_S` <= tokens/s <= `MAX_TOKENS_PER_S` and
        0 <= min <= max <= `MAX_TTFT_MS` (so `inf`, `nan` and `1e-300` are refused: a speed
        that is no number, or a turn that would never end)."""
        rate, _, ttft_spec = spec.partition("@")
        lo, hi = ttft
        if ttft_spec:
            a, _, b = ttft_spec.partition(":")
            lo = float(a)
            hi = float(b) if b else lo
        tps = float(rate)
        if not MIN_TOKENS_PER_S <= tps <= MAX_TOKENS_PER_S:  # also false for nan
            raise ValueError(f"tokens/s must be between {MIN_TOKENS_PER_S:g} and {MAX_TOKENS_PER_S:g}, got {rate!r}")
        if not 0 <= lo <= hi <= MAX_TTFT_MS:
            raise ValueError(f"TTFT must be 0 <= min <= max <= {MAX_TTFT_MS:g} ms, got {lo:g}:{hi:g}")
        name = f"{tps:g}tps" + (f"@{lo:g}-{hi:g}ms" if (lo, hi) != ttft else "")
        return cls(name=name, tokens_per_s=tps, ttft_min_ms=lo, ttft_max_ms=hi, ttft_ctx_tokens=ttft_ctx_tokens)


# --- generated content --------------------------------------------------------------------------

_IDENTS = (
    "order", "request", "payload", "body", "user", "account", "session", "cache", "config", "result",
    "items", "total", "amount", "currency", "status", "handler", "response", "error", "record", "store",
    "price", "customer", "invoice", "token", "limit", "offset", "query", "filters", "schema", "value",
)  # fmt: skip
_WORDS = (
    "the", "request", "returns", "a", "response", "when", "body", "is", "empty", "and", "we", "validate",
    "each", "field", "before", "saving", "order", "to", "database", "with", "current", "user", "plan",
    "limits", "apply", "per", "minute", "account", "usage", "this", "month", "support", "team", "can",
    "raise", "on", "request", "documentation", "describes", "how", "errors", "are", "reported", "clients",
)  # fmt: skip
_FILES = ("handlers/orders.py", "handlers/users.py", "http/parsing.py", "http/models.py", "storage/orders.py",
          "errors.py", "logging.py", "config.py", "handlers/payments.py", "handlers/invoices.py")


def _rng(*seed: object) -> random.Random:
    return random.Random(zlib.crc32("\x1f".join(map(str, seed)).encode()))


def _fit(lines_iter, nbytes: int) -> str:
    """Join generated lines until `nbytes`, then cut to exactly `nbytes` (ASCII only)."""
    out: list[str] = []
    size = 0
    for line in lines_iter:
        out.append(line)
        size += len(line) + 1
        if size >= nbytes:
            break
    return "\n".join(out)[:nbytes]


def _ident(r: random.Random) -> str:
    return f"{r.choice(_IDENTS)}_{r.choice(_IDENTS)}" if r.random() < 0.5 else r.choice(_IDENTS)


def _code_lines(r: random.Random, numbered: bool = False, header: bool = True):
    n = 0

    def emit(s: str) -> str:
        nonlocal n
        n += 1
        return f"{n:>5}\t{s}" if numbered else s

    if header:
        yield emit('"""Order handlers: validation, persistence and the HTTP surface."""')
        yield emit("from __future__ import annotations")
        yield emit("")
        for mod in ("logging", "json", "dataclasses"):
            yield emit(f"import {mod}")
        yield emit("from app.errors import ApiError, invalid_body")
        yield emit("")
    while True:
        name = _ident(r)
        kind = r.random()
        if kind < 0.25:
            yield emit("@dataclasses.dataclass(frozen=True)")
            yield emit(f"class {name.title().replace('_', '')}:")
            for _ in range(r.randint(2, 6)):
                yield emit(f"    {_ident(r)}: {r.choice(('str', 'int', 'float', 'bool', 'list[str]', 'dict[str, Any]'))}")
            yield emit("")
        else:
            args = ", ".join(_ident(r) for _ in range(r.randint(1, 3)))
            yield emit(f"def {name}({args}) -> {r.choice(('Response', 'dict', 'int', 'None', 'bool'))}:")
            yield emit(f'    """{" ".join(r.choice(_WORDS) for _ in range(r.randint(5, 12))).capitalize()}."""')
            for _ in range(r.randint(3, 9)):
                a, b = _ident(r), _ident(r)
                if r.random() < 0.2:
                    yield emit(f"    if {a} is None:")
                    yield emit(f"        raise ApiError({json.dumps('invalid_' + a)}, status=400)")
                    continue
                yield emit(r.choice((
                    f"    {a} = {b}.get({json.dumps(r.choice(_IDENTS))})",
                    f"    log.info({json.dumps(a + '_loaded')}, extra={{{json.dumps('id')}: {b}.id}})",
                    f"    {a} = [{b} for {b} in {a}s if {b}.status == {json.dumps(r.choice(_IDENTS))}]",
                    f"    return {a}",
                    f"    # {' '.join(r.choice(_WORDS) for _ in range(r.randint(4, 10)))}",
                )))  # fmt: skip
            yield emit("")


def _test_log_lines(r: random.Random, failures: int):
    yield "============================= test session starts =============================="
    yield "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0"
    yield "rootdir: /workspace/app\nconfigfile: pyproject.toml\nplugins: asyncio-0.23.8, cov-5.0.0"
    yield f"collected {r.randint(40, 400)} items"
    yield ""
    tests = [f"tests/{r.choice(_FILES).replace('.py', '')}_test.py::test_{_ident(r)}" for _ in range(60)]
    for i, t in enumerate(tests[:40]):
        yield f"{t} {'FAILED' if i < failures else 'PASSED'} [{(i + 1) * 100 // 40:>3}%]"
    for _ in range(failures):
        yield ""
        yield f"________________________________ test_{_ident(r)} ________________________________"
        yield ""
        for line in _code_lines(_rng(r.random()), header=False):
            if r.random() < 0.08:
                break
            yield "    " + line
        yield ">       assert response.status_code == 400"
        yield "E       assert 500 == 400"
        yield "E        +  where 500 = <Response [500]>.status_code"
        yield ""
        yield f"src/app/{r.choice(_FILES)}:{r.randint(10, 300)}: AssertionError"
        yield "----------------------------- Captured log call ------------------------------"
        yield "ERROR    app.handlers:orders.py:88 unhandled error in create_order"
        yield "Traceback (most recent call last):"
        yield '  File "/workspace/app/src/app/handlers/orders.py", line 88, in create_order'
        yield "    total = body[\"items\"]"
        yield "TypeError: 'NoneType' object is not subscriptable"
    yield "=========================== short test summary info ============================"
    for i in range(failures):
        yield f"FAILED {tests[i]} - assert 500 == 400"
    passed = r.randint(40, 400)
    yield f"======================== {failures} failed, {passed} passed in {r.uniform(1, 30):.2f}s ========================"
    while True:  # pad with warnings summary lines
        yield f"  {r.choice(_FILES)}:{r.randint(1, 400)}: DeprecationWarning: {' '.join(r.choice(_WORDS) for _ in range(8))}"


def _grep_lines(r: random.Random):
    while True:
        f = r.choice(_FILES)
        yield f"src/app/{f}:{r.randint(1, 400)}:    {_ident(r)} = parse_body(request)  # {' '.join(r.choice(_WORDS) for _ in range(r.randint(2, 8)))}"


def _listing_lines(r: random.Random):
    yield "src/app/"
    while True:
        d = r.choice(("handlers", "http", "storage", "jobs", "models", "utils"))
        yield f"  {d}/{_ident(r)}.py  {r.randint(200, 20000)} bytes"


def _diff_lines(r: random.Random):
    while True:
        f = r.choice(_FILES)
        yield f"diff --git a/src/app/{f} b/src/app/{f}"
        yield f"index {r.getrandbits(28):07x}..{r.getrandbits(28):07x} 100644"
        yield f"--- a/src/app/{f}\n+++ b/src/app/{f}"
        yield f"@@ -{r.randint(1, 200)},7 +{r.randint(1, 200)},9 @@ def {_ident(r)}(request):"
        for line in _code_lines(_rng(r.random()), header=False):
            if r.random() < 0.1:
                break
            yield r.choice((" ", " ", " ", "+", "-")) + line


def _lint_lines(r: random.Random):
    codes = ("F401 `os` imported but unused", "E501 Line too long (118 > 110)", "B904 raise without from inside except",
             "UP007 Use `X | Y` for type annotations", "error: Incompatible return value type (got \"None\", expected \"Response\")")
    while True:
        yield f"src/app/{r.choice(_FILES)}:{r.randint(1, 300)}:{r.randint(1, 80)}: {r.choice(codes)}"


def _prose_lines(r: random.Random):
    while True:
        yield " ".join(r.choice(_WORDS) for _ in range(r.randint(8, 20))).capitalize() + "."


def _json_text(r: random.Random, nbytes: int) -> str:
    obj: dict[str, Any] = {"id": f"obj_{r.getrandbits(40):010x}", "object": "record", "status": "active"}
    while len(json.dumps(obj)) < nbytes:
        obj[_ident(r) + f"_{len(obj)}"] = r.choice((r.randint(0, 10**6), " ".join(r.choice(_WORDS) for _ in range(6)), True))
    return json.dumps(obj)[:nbytes]


OUTPUT_KINDS = ("file", "code", "test_log", "grep", "listing", "diff", "lint", "prose", "json", "edit")


def generate(kind: str, nbytes: int, *seed: object, **opts: Any) -> str:
    """Deterministic text of `kind` and exactly `nbytes` bytes (ASCII)."""
    r = _rng(kind, nbytes, *seed)
    if kind == "file":
        return _fit(_code_lines(r, numbered=True), nbytes)
    if kind == "code":
        return _fit(_code_lines(r, header=False), nbytes)
    if kind == "test_log":
        return _fit(_test_log_lines(r, int(opts.get("failures", 0))), nbytes)
    if kind == "grep":
        return _fit(_grep_lines(r), nbytes)
    if kind == "listing":
        return _fit(_listing_lines(r), nbytes)
    if kind == "diff":
        return _fit(_diff_lines(r), nbytes)
    if kind == "lint":
        return _fit(_lint_lines(r), nbytes)
    if kind == "prose":
        return _fit(_prose_lines(r), nbytes)
    if kind == "json":
        return _json_text(r, nbytes)
    if kind == "edit":
        head = f"Applied 1 edit to {opts.get('path', 'the file')}: replaced {r.randint(2, 12)} lines with {r.randint(2, 20)} lines."
        return (head + " " + "".join(_fit(_prose_lines(r), nbytes)))[:nbytes]
    raise ValueError(f"unknown output kind {kind!r}; known: {', '.join(OUTPUT_KINDS)}")


# --- the workload -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallSpec:
    name: str
    arguments: str  # canonical JSON text
    output_kind: str
    output_bytes: int
    output_opts: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Step:
    index: int  # the model turn this step is (0-based)
    calls: tuple[CallSpec, ...]
    reasoning_tokens: int = 0
    text: str | None = None
    text_tokens: int = 0
    tool_ms: float = 0.0  # simulated tool execution time on the client


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    instructions: str
    tools: tuple[dict, ...] = field(repr=False)
    user_prompt: str = ""
    steps: tuple[Step, ...] = ()
    final_text: str = ""
    final_text_tokens: int = 0
    source: str = ""

    @property
    def tool_calls(self) -> int:
        return sum(len(s.calls) for s in self.steps)

    @property
    def turns(self) -> int:
        """Model turns in one rollout: one per step plus the final answer."""
        return len(self.steps) + 1

    def tool_output(self, step: int, call: int) -> str:
        return self._outputs[step][call]

    @cached_property
    def _outputs(self) -> list[list[str]]:
        out = []
        for s in self.steps:
            outs = []
            for j, c in enumerate(s.calls):
                opts = dict(c.output_opts)
                if c.output_kind == "edit":
                    opts.setdefault("path", json.loads(c.arguments).get("path", "the file"))
                outs.append(generate(c.output_kind, c.output_bytes, self.name, s.index, j, **opts))
            out.append(outs)
        return out

    def user_message(self) -> dict:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": self.user_prompt}]}

    def header_bytes(self) -> int:
        return len(self.instructions.encode()) + len(json.dumps(list(self.tools)).encode())

    def context_bytes_before_turn(self) -> list[int]:
        """Approximate bytes of conversation (header excluded) the model sees at each turn."""
        sizes = []
        total = len(self.user_prompt)
        for s in self.steps:
            sizes.append(total)
            total += (s.reasoning_tokens + s.text_tokens) * 6 + len(s.text or "")
            total += sum(len(c.arguments) + 80 + c.output_bytes for c in s.calls)
        sizes.append(total)
        return sizes

    def simulated_script(self, speed: SpeedProfile) -> dict:
        """The simulated backend's script for this workload at `speed` (JSON-ready). Each step
        carries its own timing, so the script alone sets the speed: the bench's per-workload
        backends and the simulated model's `tether-lab/<workload>@<speed>` names play it alike."""
        header_tokens = self.header_bytes() // 4
        steps = []
        for s, ctx in zip(self.steps, self.context_bytes_before_turn(), strict=False):
            step: dict[str, Any] = {
                "reasoning_tokens": s.reasoning_tokens,
                "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in s.calls],
                "ttft_ms": speed.ttft_ms(header_tokens + ctx // 4),
                "tokens_per_s": speed.tokens_per_s,
            }
            if s.text:
                step["text"] = s.text
            if s.text_tokens:
                step["text_tokens"] = s.text_tokens
            steps.append(step)
        last_ctx = self.context_bytes_before_turn()[-1]
        final: dict[str, Any] = {
            "reasoning_tokens": 20,
            "ttft_ms": speed.ttft_ms(header_tokens + last_ctx // 4),
            "tokens_per_s": speed.tokens_per_s,
        }
        if self.final_text:
            final["text"] = self.final_text
        if self.final_text_tokens:
            final["text_tokens"] = self.final_text_tokens
        if not self.final_text and not self.final_text_tokens:
            final["text_tokens"] = 40
        steps.append(final)
        return {
            "description": f"generated by tether.workloads from workload {self.name} at {speed.name}",
            "steps": steps,
            "after": {"text": "The task is complete.", "ttft_ms": speed.ttft_min_ms, "tokens_per_s": speed.tokens_per_s},
        }

    def summary(self) -> dict:
        outputs = [c.output_bytes for s in self.steps for c in s.calls]
        return {
            "name": self.name,
            "description": self.description,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "instructions_bytes": len(self.instructions.encode()),
            "tools": len(self.tools),
            "tools_bytes": len(json.dumps(list(self.tools)).encode()),
            "tool_output_bytes_total": sum(outputs),
            "tool_output_bytes_max": max(outputs, default=0),
            "model_output_tokens_est": sum(
                s.reasoning_tokens + s.text_tokens + len((s.text or "").split()) + sum(len(c.arguments) // 4 + 1 for c in s.calls)
                for s in self.steps
            ) + 20 + self.final_text_tokens + len(self.final_text.split()),
        }


# --- loading ------------------------------------------------------------------------------------


def available() -> list[str]:
    return sorted(p.stem for p in WORKLOADS_DIR.iterdir() if p.suffix in (".toml", ".json"))


def _resolve_file_or_text(value: Any, base: Path, what: str) -> Any:
    """A file next to the workloads (`.json`: its value; `.toml`: its `text` key, or its `tools`
    list; anything else: its text), or the value itself."""
    if isinstance(value, str) and "\n" not in value and len(value) < 300:
        p = (base / value) if not Path(value).is_absolute() else Path(value)
        if p.is_file():
            if p.suffix == ".json":
                return json.loads(p.read_text())
            if p.suffix == ".toml":
                table = tomllib.loads(p.read_text())
                return table["text"] if "text" in table else table.get("tools", table)
            return p.read_text()
        if value.endswith((".md", ".txt", ".json", ".toml")):
            raise ValueError(f"{what}: file not found: {p}")
    return value


def _expand_args(args: Any, rep: int | None, seed: tuple) -> Any:
    if isinstance(args, dict):
        return {k: _expand_args(v, rep, (*seed, k)) for k, v in args.items()}
    if isinstance(args, list):
        return [_expand_args(v, rep, (*seed, i)) for i, v in enumerate(args)]
    if isinstance(args, str):
        if rep is not None:
            args = args.replace("{i}", str(rep))
        if args.startswith("@gen "):
            parts = args.split()
            if len(parts) != 3 or not parts[2].isdigit():
                raise ValueError(f"bad generator directive {args!r}; expected '@gen KIND BYTES'")
            return generate(parts[1], int(parts[2]), *seed)
    return args


def _flatten(raw_steps: list, where: str, rep: int | None = None) -> list[tuple[dict, int | None]]:
    out: list[tuple[dict, int | None]] = []
    for i, raw in enumerate(raw_steps):
        if not isinstance(raw, dict):
            raise ValueError(f"{where}[{i}]: a step must be a table")
        unknown = set(raw) - _STEP_KEYS
        if unknown:
            raise ValueError(f"{where}[{i}]: unknown key(s) {sorted(unknown)}")
        if "repeat" in raw or "steps" in raw:
            n = int(raw.get("repeat", 1))
            inner = raw.get("steps") or []
            for k in range(1, n + 1):
                out.extend(_flatten(inner, f"{where}[{i}].steps", k))
        else:
            out.append((raw, rep))
    return out


def _call(raw: dict, where: str, rep: int | None, seed: tuple) -> CallSpec:
    if not isinstance(raw.get("tool"), str):
        raise ValueError(f"{where}: needs a 'tool' name")
    output = dict(raw.get("output") or {})
    kind = output.pop("kind", "prose")
    nbytes = int(output.pop("bytes", 200))
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"{where}: unknown output kind {kind!r}")
    args = _expand_args(raw.get("args") or {}, rep, seed)
    return CallSpec(
        name=raw["tool"],
        arguments=json.dumps(args, separators=(",", ":")),
        output_kind=kind,
        output_bytes=nbytes,
        output_opts=tuple(sorted(output.items())),
    )


def parse(data: dict, *, base: Path = WORKLOADS_DIR, source: str = "<workload>") -> Workload:
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ValueError(f"{source}: unknown top-level key(s) {sorted(unknown)}")
    name = data.get("name") or Path(source).stem
    instructions = _resolve_file_or_text(data.get("instructions", ""), base, f"{source}: instructions")
    tools = _resolve_file_or_text(data.get("tools", []), base, f"{source}: tools")
    if not isinstance(tools, list):
        raise ValueError(f"{source}: tools must be a list of tool objects or a JSON file holding one")
    steps = []
    for idx, (raw, rep) in enumerate(_flatten(data.get("steps") or [], f"{source}: steps")):
        where = f"{source}: step {idx}"
        if "calls" in raw:
            calls = tuple(_call(c, f"{where}.calls[{j}]", rep, (name, idx, j)) for j, c in enumerate(raw["calls"]))
        else:
            calls = (_call({k: raw[k] for k in _CALL_KEYS if k in raw}, where, rep, (name, idx, 0)),)
        text = raw.get("text")
        if isinstance(text, str) and rep is not None:
            text = text.replace("{i}", str(rep))
        steps.append(Step(
            index=idx,
            calls=calls,
            reasoning_tokens=int(raw.get("reasoning_tokens", 0)),
            text=text,
            text_tokens=int(raw.get("text_tokens", 0)),
            tool_ms=float(raw.get("tool_ms", 0.0)),
        ))  # fmt: skip
    tool_names = {t.get("name") for t in tools if isinstance(t, dict)}
    for s in steps:
        for c in s.calls:
            if tool_names and c.name not in tool_names:
                raise ValueError(f"{source}: step {s.index} calls {c.name!r}, which is not among the tools")
    return Workload(
        name=name,
        description=data.get("description", ""),
        instructions=instructions,
        tools=tuple(tools),
        user_prompt=data.get("user_prompt", ""),
        steps=tuple(steps),
        final_text=data.get("final_text", ""),
        final_text_tokens=int(data.get("final_text_tokens", 0)),
        source=source,
    )


_CACHE: dict[str, Workload] = {}


def load(name_or_path: str) -> Workload:
    """A shipped workload by name (`bugfix20`) or a workload file path."""
    if name_or_path in _CACHE:
        return _CACHE[name_or_path]
    p = Path(name_or_path)
    if not p.is_file():
        for ext in (".toml", ".json"):
            cand = WORKLOADS_DIR / f"{name_or_path}{ext}"
            if cand.is_file():
                p = cand
                break
        else:
            raise ValueError(f"unknown workload {name_or_path!r}; shipped: {', '.join(available())}")
    raw = p.read_bytes()
    data = tomllib.loads(raw.decode()) if p.suffix == ".toml" else json.loads(raw)
    wl = parse(data, base=WORKLOADS_DIR if p.parent == WORKLOADS_DIR else p.parent, source=str(p))
    _CACHE[name_or_path] = wl
    return wl
