"""Every create field and what Tether does with it: the one table behind "nothing silently ignored".

A `response.create` (HTTP body, WebSocket frame or gRPC `ResponseCreateParams`) may carry any field
of the OpenAI API. Each one has exactly one declared `Treatment` here:

- `HONOURED`: the session core implements it (state, limits, output shape);
- `BACKEND`: passed to the backend in `BackendRequest` (each adapter maps it per dialect);
- `ECHOED`: recorded and echoed in the Response; it has no effect on generation by definition
  (`metadata`, `service_tier`);
- `ACCEPTED`: sent by real clients and deliberately without effect, with the reason written down
  (Codex's `client_metadata`, `stream` inside a WebSocket frame);
- `REJECTED`: a 400 `unsupported_parameter` naming it, when sent with a non-null value.

Fields the proto does not model arrive in `ResponseCreateParams.extra_json` (the codec keeps them
for faithful echo); `check_declared` reads that once per create and answers 400
`unknown_parameter` for a key with no treatment, unless the operator listed it in
`ServerConfig.accept_unknown_parameters` (forward compatibility for new client fields, empty by
default). `include` values get the same treatment per value (`INCLUDES`).

`python -m tether.core.stages.fields` prints the docs table (docs/fields.md); a test keeps the two
equal and walks the openai SDK's `ResponseCreateParams` so a new SDK field fails until declared.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from tether import errors
from tether.errors import TetherError
from tether.protocol.wire import PROTOTYPE_APPEND_INCLUDE, SERVER_TIMING_INCLUDE
from tether.responses.v1 import request_pb2


class Treatment(enum.Enum):
    HONOURED = "honoured"
    BACKEND = "backend"
    ECHOED = "echoed"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Field:
    treatment: Treatment
    note: str


def _unsupported(param: str, why: str) -> TetherError:
    return TetherError(errors.UNSUPPORTED_PARAMETER, f"Unsupported parameter: '{param}'. {why}", param=param)


LOGPROBS_INCLUDE = "message.output_text.logprobs"

H, B, E, A, R = Treatment.HONOURED, Treatment.BACKEND, Treatment.ECHOED, Treatment.ACCEPTED, Treatment.REJECTED

CREATE_FIELDS: dict[str, Field] = {
    "model": Field(H, "Routed to a backend by `[models]`; unknown names are 400 `model_not_found`."),
    "input": Field(H, "The new items, validated and appended to the chain; every item type is carried into "
                   "the model's context or refused with a 400 naming `input[i]` (see the items table)."),
    "instructions": Field(B, "System prompt of this turn (not inherited from the previous response)."),
    "previous_response_id": Field(H, "Continues a chain from the connection cache, else one store read."),
    "conversation": Field(H, "Prepends the conversation's items, appends this turn's input and output (not with "
                          "`store: false`, which keeps nothing, nor for a `generate: false` warm-up); exclusive "
                          "with `previous_response_id`. A conversation that with this input would pass "
                          "`Limits.max_conversation_items` / `max_conversation_bytes` is a 400 `conversation_too_large`."),
    "store": Field(H, "false: nothing is kept (the response lives in connection memory only and a `conversation` "
                   "is read, not written); true: written to the store."),
    "stream": Field(H, "HTTP: SSE or one JSON body. WebSocket and gRPC always stream: accepted there."),
    "tools": Field(B, "Function and custom (freeform) tools go to the backend (custom tools natively on "
                   "`openai`, else as an emulating function taking `{\"input\"}`; see Custom tools); `mcp` tools "
                   "are honoured: Tether lists and calls the remote MCP server inside the response, on every "
                   "backend, where `[mcp] allowed_servers` allows it (docs/mcp.md); other hosted tool types are "
                   "carried to the adapter."),
    "tool_choice": Field(B, "Modes, `function` and `custom` (a name not in `tools` is a 400) and `allowed_tools` "
                         "are mapped; `mcp` forces that server's tool (or any of its tools) on the first model call "
                         "(docs/mcp.md); hosted-tool types are a 400 naming `tool_choice` on every dialect "
                         "(`Dialect.tool_choice_types`; see the tool_choice table)."),
    "parallel_tool_calls": Field(B, "Passed to the backend (function and custom tool calls alike)."),
    "max_output_tokens": Field(B, "Passed to the backend; bounded by `Limits.max_output_tokens`."),
    "max_tool_calls": Field(H, "Bounds the tool calls (function, custom and MCP) of one response: at the cap the backend "
                            "stream is closed and the response completes with the calls it has."),
    "temperature": Field(B, "Passed to the backend (0..2)."),
    "top_p": Field(B, "Passed to the backend (0..1)."),
    "reasoning": Field(B, "`effort` passed to the backend; with `summary` set the backend's reasoning "
                       "streams as the item's summary (`response.reasoning_summary_*`)."),
    "text": Field(B, "`format` passed to the backend; `verbosity` sent on the `openai` dialect, 400 on dialects without it."),
    "metadata": Field(E, "Up to `Limits.max_metadata_pairs` pairs, stored and echoed."),
    "context_management": Field(H, "`compaction` with `compact_threshold`: server-side compaction."),
    "prompt_cache_key": Field(B, "Passed to the backend as its cache key, scoped to the tenant (a digest of the "
                              "tenant and the key; as is on an open server), so two tenants' equal keys never "
                              "meet upstream (docs/replicas.md)."),
    "include": Field(H, "Each value has its own treatment (see the include table)."),
    "user": Field(B, "Passed to the backend as `user`."),
    "safety_identifier": Field(B, "Passed to the backend as `user` when `user` is not set."),
    "truncation": Field(H, "`disabled` (default): over the window is 400 `context_length_exceeded`; "
                        "`auto` drops the oldest whole items (never the last) until it fits."),
    "service_tier": Field(E, "The requested value is validated and echoed; a backend that reports the tier it used (Cerebras: `auto` resolves to one) has that tier on the finished Response (docs/cerebras.md)."),
    "background": Field(H, "HTTP: true returns the Response `queued` at once and runs it; poll, stream "
                        "(`?stream=true&starting_after=N`) or cancel it by id (docs/background.md). Needs "
                        "store=true (400 naming `store`); bounded per key and per process (429). gRPC: the "
                        "`CreateBackgroundResponse` RPC. On a WebSocket, a gRPC Session or `CreateResponse` "
                        "true is 400 `background_not_supported`."),
    "stream_options": Field(A, "`include_obfuscation`: Tether never pads deltas, so there is nothing to turn off."),
    "prompt_cache_options": Field(A, "Tether's prefix cache is per connection and automatic; `prewarm: true` makes the "
                                  "create a warm-up (`generate: false`)."),
    "prompt_cache_retention": Field(A, "Cached state lives as long as the connection (and the store for store=true)."),
    "client_metadata": Field(A, "Codex sends it on every create; client-side bookkeeping, no model effect."),
    "prompt": Field(H, "An operator-defined template (`[prompts.<id>]` in config, the README's Configuration): its "
                    "`instructions` go before the request's, its `input` messages before the request's input, "
                    "`{{variables}}` substituted; unknown id/version or a missing/extra variable is a 400 "
                    "naming `prompt.id` / `prompt.version` / `prompt.variables.<name>`; an expansion past "
                    "`max_request_bytes` (413) or a message past `max_item_bytes` (400) names `prompt`. A template "
                    "with `tenants` exists only for those tenants: to any other it is an unknown id, and the "
                    "error lists only the caller's own ids. Echoed."),
    "top_logprobs": Field(B, "0..20 alternatives per output token; above 0 it asks for log probabilities (as "
                          "the include value does). Sent as Chat Completions' `logprobs`/`top_logprobs`; a 400 on dialects "
                          "without them (ollama, lmstudio). With log probabilities the output is capped at "
                          "`Limits.max_logprobs` / (1 + top_logprobs) tokens (a larger `max_output_tokens` is a 400). "
                          "Echoed."),
    "multi_agent": Field(H, "Beta (`OpenAI-Beta: responses_multi_agent=v1` on JSON surfaces): the model may "
                         "delegate to subagents Tether runs concurrently within the response, every item and event "
                         "tagged with its `agent` (docs/multi-agent.md). `max_concurrent_subagents` 1.."
                         "`Limits.max_concurrent_subagents` (default 3); with `max_tool_calls`, `reasoning.summary`, "
                         "`background` or an `mcp` tool a 400 naming it; `context_management` compacts per agent."),
    "access_programs": Field(R, "OpenAI account programs do not apply to a self-hosted server."),
    "background_options": Field(R, "No background options exist in Tether; `background: true` takes none."),
    "image": Field(R, "Request-level image options are not supported."),
    "moderation": Field(R, "Moderation runs are not supported; see `[safety]`."),
    # Tether extensions and transport envelopes.
    "type": Field(A, "WebSocket frame type `response.create`; any other value is an unknown key."),
    "generate": Field(H, "WebSocket-mode warm-up: false prepares state without output (and adds nothing to a "
                      "`conversation`)."),
    "stream_id": Field(H, "Tether lanes: creates on one stream_id run in order, lanes concurrently."),
}

INCLUDES: dict[str, Field] = {
    "reasoning.encrypted_content": Field(H, "Output reasoning items carry a signed, tenant-bound blob of "
                                         "their texts; resent, it is checked and its texts restored."),
    "message.input_image.image_url": Field(H, "Input images are always stored and returned whole."),
    LOGPROBS_INCLUDE: Field(B, "Output text carries token log probabilities (`logprobs` on "
                            "`output_text` parts and `response.output_text.delta`/`.done`), from Chat Completions' "
                            "`logprobs` (the simulated model makes deterministic ones); a 400 naming `include` on "
                            "dialects without them (ollama, lmstudio)."),
    "file_search_call.results": Field(A, "Tether runs no hosted tools: these items never appear."),
    "web_search_call.results": Field(A, "Tether runs no hosted tools: these items never appear."),
    "web_search_call.action.sources": Field(A, "Tether runs no hosted tools: these items never appear."),
    "code_interpreter_call.outputs": Field(A, "Tether runs no hosted tools: these items never appear."),
    "computer_call_output.output.image_url": Field(A, "Tether runs no hosted tools: these items never appear."),
    SERVER_TIMING_INCLUDE: Field(H, "Tether extension: per-stage timing in `server_timing`."),
    PROTOTYPE_APPEND_INCLUDE: Field(H, "Tether extension (a server running the lab's prototype turns, `tether_lab.prototype`): the create stays open."),
}

del H, B, E, A, R


def requested_logprobs(params: request_pb2.ResponseCreateParams) -> int | None:
    """The alternatives per token when log probabilities are asked for (`include` or
    `top_logprobs`), else None (`BackendRequest.logprobs`)."""
    top = params.top_logprobs if params.HasField("top_logprobs") else 0
    return top if top > 0 or LOGPROBS_INCLUDE in params.include else None

_PROTO_FIELDS = frozenset(request_pb2.ResponseCreateParams.DESCRIPTOR.fields_by_name)
# Proto-only spellings of JSON keys (`input` as a string is `input_text`).
_PROTO_ALIASES = {"input_text": "input", "extra_json": None}


def check_declared(params: request_pb2.ResponseCreateParams, accept_unknown: Iterable[str] = ()) -> None:
    """Refuse what Tether would otherwise ignore: rejected fields (400 `unsupported_parameter`),
    fields with no treatment (400 `unknown_parameter`) and `include` values of either kind."""
    if params.extra_json:
        try:  # JSON clients cannot get this wrong (the codec writes it); a gRPC client can
            extra = orjson.loads(params.extra_json)
        except orjson.JSONDecodeError:
            extra = None
        if not isinstance(extra, dict):
            raise TetherError(errors.INVALID_REQUEST, "extra_json must be a JSON object.", param="extra_json")
        for key, value in extra.items():
            field = CREATE_FIELDS.get(key)
            if field is None:
                if key in accept_unknown:
                    continue
                raise TetherError(errors.UNKNOWN_PARAMETER, f"Unknown parameter: '{key}'.", param=key)
            if value is None:
                continue  # null is "not sent" for every field
            if field.treatment is Treatment.REJECTED:
                raise _unsupported(key, field.note)
    for i, value in enumerate(params.include):
        field = INCLUDES.get(value)
        param = f"include[{i}]"
        if field is None:
            raise TetherError(
                errors.INVALID_REQUEST,
                f"Invalid value for '{param}': {value!r} is not a supported include value.",
                param=param,
            )
        if field.treatment is Treatment.REJECTED:
            raise TetherError(
                errors.UNSUPPORTED_PARAMETER, f"Unsupported value for '{param}': {value!r}. {field.note}",
                param=param,
            )


def json_keys_of_proto() -> set[str]:
    """The JSON keys the proto models (each must have a treatment too)."""
    out = set()
    for name in _PROTO_FIELDS:
        key = _PROTO_ALIASES.get(name, name)
        if key:
            out.add(key)
    return out


def markdown_table() -> str:
    """The docs table (docs/fields.md holds exactly this)."""
    lines = ["| field | treatment | what Tether does |", "|---|---|---|"]
    lines += [f"| `{k}` | {f.treatment.value} | {f.note} |" for k, f in CREATE_FIELDS.items()]
    lines += ["", "| `include` value | treatment | what Tether does |", "|---|---|---|"]
    lines += [f"| `{k}` | {f.treatment.value} | {f.note} |" for k, f in INCLUDES.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
