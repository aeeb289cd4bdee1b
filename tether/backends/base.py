"""The backend contract: what the turn pipeline hands an inference adapter and what comes back.

A backend turns a fully resolved request (the whole effective context, already validated and
tokenised by the pipeline) into a stream of small chunks. The session core alone turns chunks into
Responses events, so adapters stay ignorant of ids, sequence numbers and transports.

Cancellation: the pipeline consumes `stream()` as an async generator and calls `aclose()` on it
when the client goes away or cancels; adapters must release the upstream (close the HTTP
response) in a `finally`/`async with`, so the upstream stops generating.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

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
    # Free-form per-request hints (e.g. the simulated backend's script step); never sent upstream.
    hints: dict[str, str] = field(default_factory=dict)
    # What the adapter's `prepare` made of this request (its upstream body), reused by `stream`.
    prepared: Any = None
    # The replica that served the parent response (chain-affine routing in a backend pool).
    affinity: str | None = None
    # Fields a backend pool adds to the upstream request body (cache/slot hints, e.g. llama.cpp's
    # `id_slot`); adapters that build a JSON body merge them in.
    upstream_fields: dict[str, object] = field(default_factory=dict)


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
    """A fragment of tool call number `index`; `call_id`/`name` arrive on its first fragment."""

    index: int
    arguments: str = ""
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Usage:
    """Token counts as the backend reports them; None where it reports nothing (the turn then
    counts with Tether's tokenizer and says which source each figure came from)."""

    input_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
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


class Backend(Protocol):
    """An inference adapter. One instance per configured backend, shared by all sessions."""

    kind: ClassVar[str]  # registry key: "simulated", "cerebras", "openai"
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

    def stream(self, request: BackendRequest) -> AsyncIterator[Chunk]:
        """Yield chunks, ending with exactly one `Finish`. Raise `BackendError` on failure."""
        ...

    async def aclose(self) -> None:
        """Release connections (called once at server shutdown)."""
        ...


class BackendBase:
    """Defaults for the parts of the contract most adapters need nothing for: every request shape
    accepted, no model list of its own, nothing to release."""

    async def prepare(self, request: BackendRequest) -> None:
        return None

    def reads_input_tokens(self, request: BackendRequest) -> bool:
        return False

    async def discover(self) -> Sequence[str]:
        return []

    async def aclose(self) -> None:
        return None
