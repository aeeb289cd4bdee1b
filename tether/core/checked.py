"""A create's params checked once: `check_create`, and its proof, `CheckedCreate`.

Every create is checked exactly once, where it enters: a session's create by its turn (the
first stage, `validate`), a create that no session carries (HTTP `POST /v1/responses`, gRPC
`CreateResponse`, a background create: `Engine.start_run`) at that entry, before anything is
queued or answered. The entry hands its `CheckedCreate` on, and the turn that runs it takes it
as it is: a type says the params were checked, not a flag that could be set by mistake.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tether import offload
from tether.core import multi_agent
from tether.core.context import TurnServices
from tether.core.mcp import McpLoop
from tether.core.stages import validate
from tether.responses.v1 import request_pb2


@dataclass(frozen=True, slots=True)
class CheckedCreate:
    """`params` checked by `check_create` (and their `prompt` expanded into instructions and
    input). `nbytes`: the request's size as received, before the expansion (what its queued
    bytes are charged, `tether.core.queued`); `mcp`: the remote MCP loop its tools name (None
    without one); `expanded`: the bytes its prompt template added (the turn's size hint is
    `nbytes` grown by them); `seconds`: how long the check took (the turn's `validate` stage)."""

    params: request_pb2.ResponseCreateParams
    nbytes: int
    mcp: McpLoop | None
    expanded: int
    seconds: float


async def check_create(services: TurnServices, tenant: str, params: request_pb2.ResponseCreateParams,
                       nbytes: int | None = None) -> CheckedCreate:  # fmt: skip
    """Check `params` (400s name the parameter) and expand their `prompt` template, bounded
    (variables of 16 KiB or more are expanded off the event loop: a template may repeat them).
    Mutates `params` (the expansion): it is done once per create. `nbytes`: their size as
    received, when the transport knows it (else their protobuf size, measured here first)."""
    started = time.perf_counter()
    if nbytes is None:
        nbytes = params.ByteSize()
    limits = services.limits
    validate.validate_params(params, limits, services.config.server.accept_unknown_parameters)
    multi_agent.validate(params, limits)
    mcp = None
    if params.tools or params.tool_choice.WhichOneof("choice") == "other_json":
        mcp = McpLoop.of(params, services.config.mcp)
    variables = len(params.prompt.variables_json) if params.HasField("prompt") else 0
    expanded = await offload.run(16 * variables, services.config.prompts.apply, params, tenant,
                                 limits.max_request_bytes, limits.max_item_bytes)  # fmt: skip
    return CheckedCreate(params, nbytes, mcp, expanded, time.perf_counter() - started)
