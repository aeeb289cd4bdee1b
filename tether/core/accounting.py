"""Token accounting for one turn: the backend's own counts where it reports them, Tether's count
otherwise, and which source each figure came from.

The upstream's counts are the ones to bill on (its tokenizer, its chat template, its prefix cache):
`input_tokens` and `cached_tokens` reported by the server replace Tether's o200k estimate and
connection-cache figure. Where a server reports nothing (llama-cpp-python's streams, a failed or
cancelled stream, the simulated model's cache figure) the adapter may count with the model's own
tokenizer (a dialect's tokenizer endpoint), else Tether counts with its own. An
answer that produced output is never billed 0 output tokens: a reported 0 next to a non-empty
output is replaced by Tether's count. A server that reports its input but not what it reused gets
Tether's cached share of the input, scaled to the server's count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tether import render
from tether.backends.base import Usage
from tether.protocol.calls import call_of
from tether.responses.v1 import items_pb2

UPSTREAM = "upstream"  # reported by the backend
MODEL_TOKENIZER = "model_tokenizer"  # counted by the adapter with the model's own tokenizer
TETHER = "tether"  # counted here with Tether's tokenizer (o200k)
KINDS = ("input", "cached", "output", "reasoning")


@dataclass(frozen=True)
class TurnUsage:
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int
    sources: dict[str, str]  # kind (KINDS) -> UPSTREAM | MODEL_TOKENIZER | TETHER


def output_tokens(output: Sequence[items_pb2.Item], *, reasoning_only: bool = False) -> tuple[int, int]:
    """(all output tokens, the reasoning part) of the output items, by Tether's tokenizer; with
    `reasoning_only` only the reasoning items are counted (the total is then that part too)."""
    total = reasoning = 0
    for item in output:
        is_reasoning = item.WhichOneof("item") == "reasoning"
        if reasoning_only and not is_reasoning:
            continue
        n = len(render.encode(_generated_text(item)))
        total += n
        if is_reasoning:
            reasoning += n
    return total, reasoning


def _generated_text(item: items_pb2.Item) -> str:
    """The text the model generated for an output item (no prompt framing)."""
    arm = item.WhichOneof("item")
    if arm == "message":
        return render.message_text(item.message)
    call = call_of(item)  # a function call's arguments, a custom tool call's input
    if call is not None:
        return call.name + call.text
    if arm == "mcp_call":  # the call the model generated (not the server's result)
        return item.mcp_call.name + item.mcp_call.arguments
    if arm == "mcp_approval_request":
        return item.mcp_approval_request.name + item.mcp_approval_request.arguments
    if arm == "reasoning":
        r = item.reasoning
        return "\n".join(r.content) if r.content else "\n".join(r.summary)
    return ""


class OutputCap:
    """The output cap (`max_output_tokens`, else `limits.max_output_tokens`) enforced by Tether,
    for an upstream that ignores the cap it was sent. The turn `add`s the text each wake-up
    generated (text, refusals, reasoning, tool calls' arguments: its delta events' text), then asks
    `over()` whether the output so far passed the cap, so it stops reading.

    Cheap while the output is short: every token is at least one UTF-8 byte, so output of at most
    `limit` bytes cannot pass the cap and is not tokenised. Past that, the text not counted yet is
    tokenised (each piece once: the count is exact to about a token per check, see
    `render.encode`), and checks come when the bytes since the last count could hold the rest of
    the budget, so an answer is tokenised about once in all."""

    __slots__ = ("limit", "counted", "pending", "room")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counted = 0  # tokens of the text already tokenised
        self.pending: list[str] = []  # text not tokenised yet
        # UTF-8 bytes that may still come before a count is due (each byte is at most a token);
        # below 0 `over()` has to tokenise. The turn reads it on every wake-up (`room < 0`) rather
        # than calling `over()`: a method call per wake-up was a measurable share of a cached
        # turn's streaming overhead.
        self.room = limit

    def add(self, text: str) -> None:
        self.pending.append(text)
        self.room -= len(text) if text.isascii() else len(text.encode())

    def over(self) -> bool:
        if self.room >= 0:
            return False
        self.counted += len(render.encode("".join(self.pending)))
        self.pending.clear()
        self.room = self.limit - self.counted
        return self.room < 0


def capped(usage: TurnUsage, limit: int) -> TurnUsage:
    """`usage` billing at most `limit` output tokens (an upstream that ignored the cap may report
    more than it was allowed to produce; the reasoning part stays within the output)."""
    if usage.output_tokens <= limit:
        return usage
    return TurnUsage(
        input_tokens=usage.input_tokens,
        cached_tokens=usage.cached_tokens,
        output_tokens=limit,
        reasoning_tokens=min(usage.reasoning_tokens, limit),
        sources=usage.sources,
    )


def account(
    reported: Usage | None, *, input_tokens: int, cached_tokens: int, output: Sequence[items_pb2.Item]
) -> TurnUsage:
    """The turn's usage: each figure from `reported` when the backend gave it, else counted here."""
    up = reported or Usage()
    sources: dict[str, str] = {}

    def pick(kind: str, value: int | None, fallback: int) -> int:
        if value is None:
            sources[kind] = TETHER
            return fallback
        sources[kind] = MODEL_TOKENIZER if kind in up.model_counted else UPSTREAM
        return value

    # Counting tokenises the output: only what a figure falls back to. A server that reports its
    # output but not the reasoning part (vLLM) costs a count of the reasoning items only, none
    # when there are none (tokenising a 200-token answer was ~8% of the CPU of streaming it).
    counted_out = counted_reasoning = 0
    if output and not up.output_tokens:
        counted_out, counted_reasoning = output_tokens(output)
    elif output and up.reasoning_tokens is None:
        _, counted_reasoning = output_tokens(output, reasoning_only=True)
    out = up.output_tokens
    if out == 0 and counted_out > 0:
        out = None  # a non-empty answer is never billed as nothing
    inp = pick("input", up.input_tokens, input_tokens)
    if up.input_tokens is not None and input_tokens > 0:
        # Tether's cached share, in the server's units (its tokenizer counts the input differently).
        cached_tokens = up.input_tokens * cached_tokens // input_tokens
    cached = pick("cached", up.cached_tokens, cached_tokens)
    return TurnUsage(
        input_tokens=inp,
        cached_tokens=min(cached, inp),
        output_tokens=pick("output", out, counted_out),
        reasoning_tokens=pick("reasoning", up.reasoning_tokens, counted_reasoning),
        sources=sources,
    )


def add_usage(sums: list[int], reported: Usage | None, estimate: int, produced: list[items_pb2.Item]) -> None:
    """Add one model call's usage to [input, output, reasoning] of a response that makes several
    (the MCP loop, a multi-agent response): what the backend reported, else Tether's count."""
    up = reported or Usage()
    counted, counted_reasoning = (0, 0)
    if up.output_tokens is None or up.reasoning_tokens is None:
        counted, counted_reasoning = output_tokens(produced)
    sums[0] += up.input_tokens if up.input_tokens is not None else estimate
    sums[1] += up.output_tokens if up.output_tokens is not None else counted
    sums[2] += up.reasoning_tokens if up.reasoning_tokens is not None else counted_reasoning
