"""The backend contract: what the turn pipeline hands an inference adapter and what comes back.

A backend turns a fully resolved request (the whole effective context, already validated and
tokenised by the pipeline) into a stream of small chunks. The session core alone turns chunks into
Responses events, so adapters stay ignorant of ids, sequence numbers and transports.

Runs: most upstreams send one token per chunk, and one network read or timer tick often makes many
chunks ready at once. The turn reads `stream_runs()`, where each item is such a run (a list), so
it steps the adapter's generator once per wake-up, not once per token. An adapter implements
`stream_runs()` where it has the run in hand (the simulated model, the chat-completions SSE loop)
and gets `stream()` from it, or implements `stream()` alone and gets runs of one chunk
(`BackendBase` derives either from the other).

Cancellation: the pipeline consumes the stream as an async generator and calls `aclose()` on it
when the client goes away or cancels; adapters must release the upstream (close the HTTP
response) in a `finally`/`async with`, so the upstream stops generating.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tether.errors import TetherError
from tether.responses.v1 import items_pb2, request_pb2


@dataclass
class BackendRequest:
    """One model call. `items` is the complete effective context, oldest first."""

    model: str  # the upstream model name (after routing)
    instructions: str | None
    items: Sequence[items_pb2.Item]
    tools: Sequence[request_pb2.Tool] = ()
    tool_choice: request_pb2.ToolChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning_effort: str | None = None
    text_format: request_pb2.TextFormat | None = None
    # `text.verbosity` (low | medium | high): sent as Chat Completions' `verbosity` where the
    # dialect takes it (OpenAI); a 400 naming `text.verbosity` where it does not.
    verbosity: str | None = None
    # Output text log probabilities were asked for (`include` message.output_text.logprobs or
    # `top_logprobs`): None when not, else the alternatives per token (0..20). A backend that
    # cannot produce them refuses the request (400 naming the parameter) in `prepare`.
    logprobs: int | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str = ""  # as the client named it ("" = not set)
    # Tokens of the rendered input, counted by Tether's tokenizer (for simulated timing, limits).
    input_tokens: int = 0
    # Tools in `tools` that are a remote MCP server's (Tether runs them, tether.core.mcp): the
    # simulated model calls one only when `tool_choice` names it or the last user message does.
    mcp_tools: frozenset[str] = frozenset()
    # A multi-agent response's call (tether.core.multi_agent): the agent making it (`/root`,
    # `/root/worker_1`) and the names of the multi-agent action tools among `tools`; empty otherwise.
    agent: str = ""
    agent_actions: frozenset[str] = frozenset()
    # Free-form per-request hints (e.g. the simulated backend's script step); never sent upstream.
    hints: dict[str, str] = field(default_factory=dict)
    # What the adapter's `prepare` made of this request (its upstream body), reused by `stream`.
    prepared: Any = None
    # The replica that served the parent response (chain-affine routing in a backend pool).
    affinity: str | None = None
    # Fields a backend pool adds to the upstream request body (cache/slot hints, e.g. llama.cpp's
    # `id_slot`); adapters that build a JSON body merge them in.
    upstream_fields: dict[str, object] = field(default_factory=dict)
    # The tenant (API key's) making the call: it scopes every prefix-cache key (prefix-aware
    # routing, upstream cache hints, `cache_salt`), so one tenant's prompt never finds another's
    # cached prefix. Never sent upstream as such. "" on an open server (one tenant).
    tenant: str = ""
    # The caller's consumer of runs in the step that read them (`RunSink`); None: every run is
    # yielded. Set by the turn for its one call; never sent upstream.
    sink: RunSink | None = None

    def scoped_cache_key(self, key: str) -> str:
        """`key` (a client's `prompt_cache_key`, a conversation key) as this tenant's own: a
        digest of (tenant, key), so two tenants naming the same key get different ones; as is on
        an open server (a single tenant)."""
        if not self.tenant:
            return key
        data = self.tenant.encode() + b"\x00" + key.encode()
        return hashlib.blake2b(data, digest_size=16, person=b"tether-cachekey").hexdigest()

    def cache_salt(self) -> str | None:
        """The salt that keeps this tenant's prompts in a prefix-cache namespace of their own on
        a server that takes one (vLLM's `cache_salt`); None on an open server."""
        if not self.tenant:
            return None
        return hashlib.blake2b(self.tenant.encode(), digest_size=16, person=b"tether-cachesalt").hexdigest()


@dataclass(frozen=True)
class TextDelta:
    text: str
    # The tokens' log probabilities, when the request asked for them (`BackendRequest.logprobs`):
    # `{"token", "bytes", "logprob", "top_logprobs": [{"token", "bytes", "logprob"}]}` each.
    logprobs: list[dict] | None = None


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class RefusalDelta:
    """The model declining to answer (chat-completions `delta.refusal`): a `refusal` content part."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A fragment of tool call number `index`; `call_id`/`name` (and `custom`) arrive on its first
    fragment. `custom`: a call to a custom (freeform) tool, whose `arguments` fragments are pieces
    of its `input` text rather than of a JSON object (a `custom_tool_call` output item)."""

    index: int
    arguments: str = ""
    call_id: str | None = None
    name: str | None = None
    custom: bool = False


@dataclass(frozen=True)
class Usage:
    """Token counts as the backend reports them; None where it reports nothing (the turn then
    counts with Tether's tokenizer and says which source each figure came from)."""

    input_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    # Image tokens within the input (Cerebras's `usage.image_tokens`), and the tokens of a
    # predicted output the model kept or threw away (`completion_tokens_details`); None where
    # the server reports none.
    image_tokens: int | None = None
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    # Kinds the adapter counted itself with the model's own tokenizer (the server reported none).
    model_counted: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Timing:
    queue_time: float = 0.0
    prompt_time: float = 0.0
    completion_time: float = 0.0
    total_time: float = 0.0


@dataclass(frozen=True)
class Finish:
    """The last chunk. reason: stop | tool_calls | length | content_filter."""

    reason: str = "stop"
    usage: Usage | None = None
    timing: Timing | None = None
    replica: str = ""  # the pool replica that served the call ("" outside a pool)
    # The service tier the server says it used (with `auto` it picks one); None when it says none.
    service_tier: str | None = None


Chunk = TextDelta | ReasoningDelta | RefusalDelta | ToolCallDelta | Finish


class BackendError(TetherError):
    """An upstream failure. Raised before the first chunk (the pipeline may retry) or mid-stream."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(code, message, status=status, retry_after=retry_after)
        self.retryable = retryable


class RunSink(Protocol):
    """Where a backend may hand a run in the step that read it, instead of yielding it: the
    turn's own handling of its chunks (`tether.core.intake`), so that a streamed token is built,
    numbered and written to its client in the upstream socket's callback, without a switch to the
    turn's task (one pass of the event loop per token).

    The contract, for a backend that uses it (`BackendRequest.sink`; one that does not yields
    every run, as always): the first run and the run that ends the stream (its `Finish`) are
    yielded, never pushed (a backend pool decides failover on the first and tags the last);
    between them a run may be pushed with `take`. When `take` returns False the sink's owner must
    run before anything more is pushed: the backend yields an empty run `[]` (the one place a run
    is empty), and pushes again only after its generator was resumed."""

    def take(self, run: list[Chunk]) -> bool:
        """Handle `run` now (it is the sink's from here). False: resume the owner's task first."""
        ...


class Backend(Protocol):
    """An inference adapter. One instance per configured backend, shared by all sessions."""

    @property
    def kind(self) -> str:  # registry key: "simulated", "cerebras", "openai" (a pool: its replicas')
        ...

    name: str  # the configured instance name

    async def prepare(self, request: BackendRequest) -> None:
        """Check `request` against what this backend can do, before `response.created`: raise a
        400 `TetherError` for what it cannot (images to a text-only model, a tool schema outside
        its dialect, ...). May store its upstream form in `request.prepared`."""
        ...

    def reads_input_tokens(self, request: BackendRequest) -> bool:
        """Whether `stream(request)` reads `request.input_tokens` before its end. When it does
        not, the pipeline may pass 0 and fill the count in while the backend computes its first
        token (tokenising then costs the turn no latency)."""
        ...

    async def discover(self) -> Sequence[str]:
        """Model ids the backend serves, asked once at startup (routed here unless configured
        otherwise, listed by GET /v1/models); [] when it cannot say. Never raises."""
        ...

    def owned_by(self, model: str) -> str:
        """The `owned_by` GET /v1/models shows for `model` (an upstream name routed here): what
        the server's own model list says, else the backend's kind (`tether` for the simulated
        model)."""
        ...

    def catch_all_models(self) -> Sequence[str]:
        """Names GET /v1/models lists when a "*" route reaches this backend (and no route names
        them): the simulated model's default name and the lab's workload models; [] for a server
        whose names come from its own model list (`discover`)."""
        ...

    def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        """Yield chunks, ending with exactly one `Finish`. Raise `BackendError` on failure."""
        ...

    def stream_runs(self, request: BackendRequest) -> AsyncGenerator[list[Chunk], None]:
        """The same chunks as `stream`, as non-empty lists: the chunks one upstream read or
        timer tick made ready together (an empty list only where `request.sink` asked for its
        owner's task: `RunSink`)."""
        ...

    async def aclose(self) -> None:
        """Release connections (called once at server shutdown)."""
        ...


async def chunks_of(runs: AsyncGenerator[list[Chunk], None]) -> AsyncGenerator[Chunk, None]:
    """`stream()` from `stream_runs()`: the runs' chunks one at a time (closing `runs` with it)."""
    async with contextlib.aclosing(runs):
        async for run in runs:
            for chunk in run:
                yield chunk


async def runs_of(chunks: AsyncGenerator[Chunk, None]) -> AsyncGenerator[list[Chunk], None]:
    """`stream_runs()` from `stream()`: each chunk as a run of its own (closing `chunks` with it)."""
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            yield [chunk]


class BackendBase:
    """Defaults for the parts of the contract most adapters need nothing for: every request shape
    accepted, no model list of its own (`owned_by` its kind), nothing to release; `stream` and `stream_runs` each made
    from the other, so a subclass implements one of them."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.stream is BackendBase.stream and cls.stream_runs is BackendBase.stream_runs:
            raise TypeError(f"{cls.__name__} must implement stream() or stream_runs()")

    def stream(self, request: BackendRequest) -> AsyncGenerator[Chunk, None]:
        return chunks_of(self.stream_runs(request))

    def stream_runs(self, request: BackendRequest) -> AsyncGenerator[list[Chunk], None]:
        return runs_of(self.stream(request))

    async def prepare(self, request: BackendRequest) -> None:
        return None

    def reads_input_tokens(self, request: BackendRequest) -> bool:
        return False

    async def discover(self) -> Sequence[str]:
        return []

    def owned_by(self, model: str) -> str:
        return getattr(self, "kind", "tether")

    def catch_all_models(self) -> Sequence[str]:
        return []

    async def aclose(self) -> None:
        return None
