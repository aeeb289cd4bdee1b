"""Turn kinds: what a turn does between `response.in_progress` and its ending, as step functions
over the run rather than subclasses of `Turn`.

A kind's `steps(io, prepared, builder)` makes the backend calls of one response and returns how
the last one stopped (`Finish`); it sees its turn only through `StepIO`, the narrow interface the
turn provides (build a backend request, stream one call into the builder and the outbox, emit
events, the params, the clock, the ids, the process-wide services). Preparing, the bounds (output
cap, deadline), interruptions and ending stay the turn's, so every kind ends the same way.

  `STANDARD` (`OneCall`)  one backend call (the launched WebSocket mode); a create that names
                          remote MCP servers runs the hosted MCP loop's calls instead
                          (`tether.core.mcp.McpLoop`, a kind over the same interface)
  `MultiAgentRollout`     `multi_agent` enabled: the root and its subagents as concurrent model
                          calls within one response (`tether.core.multi_agent`)
  the lab's prototype     `tether_lab.prototype.PrototypeKind`: the whole tool loop in one
                          response, waiting for `response.append`s between calls

`compact` is the step composed after the generation steps of any kind: in-turn compaction
(`context_management`). `Prepared` (what the stages before the backend produced) lives here so
that the kinds can read it without importing the turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from tether import ids
from tether.backends.base import Backend, BackendRequest, Finish
from tether.compaction_codec import encode_payload
from tether.core.builder import OutputBuilder
from tether.core.chain import CachedResponse, Node, Segment
from tether.core.context import TurnServices
from tether.core.stages.route import Resolved
from tether.core.timing import StageClock
from tether.errors import TetherError
from tether.mcp.sessions import McpSessions
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, response_pb2


class Rendered:
    """The new input tokenised onto the cached chain."""

    __slots__ = ("new_segments", "node", "input_tokens", "cached_tokens")

    def __init__(self, new_segments: tuple[Segment, ...], node: Node, input_tokens: int, cached_tokens: int) -> None:
        self.new_segments = new_segments
        self.node = node  # the effective input chain
        self.input_tokens = input_tokens
        self.cached_tokens = cached_tokens


class Prepared:
    """Everything the stages before the backend produced.

    The new input's tokens (`new_segments`, `node`, `input_tokens`, `cached_tokens`) come from
    `render()`. The turn calls it at once when something before the backend needs the exact
    count; otherwise the standard kind calls it while the backend computes its first token, and
    any earlier reader of those attributes renders on first access."""

    def __init__(self, response: response_pb2.Response, parent: CachedResponse | None, parent_from_cache: bool,
                 route: Resolved, request: BackendRequest, tokenise: Callable[[], Rendered]) -> None:  # fmt: skip
        self.response = response
        self.parent = parent
        self.parent_from_cache = parent_from_cache
        self.route = route
        self.request = request  # the backend call, already checked by the backend (`prepare`)
        self._tokenise: Callable[[], Rendered] | None = tokenise
        self._rendered: Rendered | None = None

    @property
    def rendered(self) -> bool:
        return self._rendered is not None

    def render(self) -> Rendered:
        if self._rendered is None:
            assert self._tokenise is not None
            self._rendered, self._tokenise = self._tokenise(), None
        return self._rendered

    @property
    def new_segments(self) -> tuple[Segment, ...]:
        return self.render().new_segments

    @property
    def node(self) -> Node:
        return self.render().node

    @property
    def cached_tokens(self) -> int:
        return self.render().cached_tokens

    @property
    def input_tokens(self) -> int:
        return self.render().input_tokens

    @input_tokens.setter
    def input_tokens(self, value: int) -> None:
        self.render().input_tokens = value


class Steps(Protocol):
    """A kind's backend calls: returns how the last one stopped; raises TetherError (a backend
    error, or a rule of the kind) to fail the response."""

    async def steps(self, io: StepIO, prepared: Prepared, builder: OutputBuilder) -> Finish: ...


class TurnKind(Steps, Protocol):
    def finish_so_far(self) -> Finish | None:
        """What a response whose steps failed or were cancelled reports as its finish (its
        usage); None: estimated from the output."""
        ...

    def take_injected(self, items: Sequence[items_pb2.Item]) -> bool:
        """`response.inject` while the steps run: True when an agent of the response waits for
        `items` and took them (a multi-agent response, `tether.core.multi_agent`)."""
        ...


class StepIO(Protocol):
    """What a turn kind may use of its turn, and nothing more."""

    params: request_pb2.ResponseCreateParams
    clock: StageClock
    services: TurnServices  # the process-wide parts (telemetry, limits, classify, summarize)
    stream_id: str
    response_id: str

    @property
    def mcp(self) -> Steps | None:
        """The hosted MCP loop, when the create names remote MCP servers."""
        ...

    @property
    def tenant(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def mcp_sessions(self) -> McpSessions: ...

    def backend_request(self, route: Resolved, items: list[items_pb2.Item], input_tokens: int, *,
                        affinity: str | None = None) -> BackendRequest:  # fmt: skip
        """A backend call with the create's parameters over `items`."""
        ...

    async def stream(self, builder: OutputBuilder, backend: Backend, request: BackendRequest,
                     while_waiting: Callable[[], None] | None = None) -> None:  # fmt: skip
        """One backend call streamed into `builder` and the outbox (`builder.finish`: how it stopped)."""
        ...

    def event(self) -> events_pb2.ServerEvent:
        """A new event of this response (its stream and response ids set)."""
        ...

    async def emit_all(self, events: Sequence[events_pb2.ServerEvent]) -> None:
        """Queue `events` to the client, in order, with this response's ids."""
        ...

    async def emit_error(self, error: TetherError) -> None:
        """An in-band `error` event for this create; the response goes on."""
        ...


class OneCall:
    """The standard kind: one backend call, tokenising the new input while the backend computes
    its first token when nothing before needed the count; with remote MCP servers, the MCP
    loop's calls (`tether.core.mcp`)."""

    __slots__ = ()

    async def steps(self, io: StepIO, prepared: Prepared, builder: OutputBuilder) -> Finish:
        if io.mcp is not None:
            return await io.mcp.steps(io, prepared, builder)
        request, clock = prepared.request, io.clock

        def render_while_waiting() -> None:
            with clock.stage("render_overlapped"):
                request.input_tokens = prepared.render().input_tokens

        while_waiting = None if prepared.rendered else render_while_waiting
        await io.stream(builder, prepared.route.backend, request, while_waiting)
        return builder.finish or Finish()

    def finish_so_far(self) -> Finish | None:
        """None: a single call's usage is estimated from its output."""
        return None

    def take_injected(self, items: Sequence[items_pb2.Item]) -> bool:
        """False: its response ends when it calls a client tool, so nothing in it waits."""
        return False


STANDARD = OneCall()


def compact_threshold(params: request_pb2.ResponseCreateParams) -> int | None:
    """The `context_management` compaction threshold (None: no compaction asked, or no threshold)."""
    for cm in params.context_management:
        if cm.type == "compaction":
            return cm.compact_threshold if cm.HasField("compact_threshold") else None
    return None


async def compact(io: StepIO, prepared: Prepared, builder: OutputBuilder, finish: Finish | None) -> list[items_pb2.Item]:
    """In-turn compaction, after the generation steps of a response that ended by itself: when
    its input and output pass the create's threshold, a summary of the context is added to the
    output as a `compaction` item (a continuation starts from it). Returns the output."""
    threshold = compact_threshold(io.params)
    if threshold is None:
        return builder.output
    produced = (finish.usage.output_tokens if finish and finish.usage else None) or 0
    if prepared.input_tokens + produced <= threshold:
        return builder.output
    context = [*prepared.node.items(), *builder.output]
    await add_compaction(io, prepared, builder, context, (finish.replica if finish else "") or None)
    return builder.output


async def add_compaction(io: StepIO, prepared: Prepared, builder: OutputBuilder, context: Sequence[items_pb2.Item],
                         affinity: str | None, agent: str | None = None) -> items_pb2.Item:  # fmt: skip
    """A summary of `context` added to the output as a `compaction` item, announced first with
    `response.compaction.compacting` (its output index is taken then, so that items other
    agents start meanwhile come after it). `agent`: whose context it compacts (a multi-agent
    response compacts per agent, `tether.core.multi_agent`): the events and the item carry it."""
    item_id = ids.compaction_id()
    index = builder.reserve()
    ev = io.event()
    ev.compaction_compacting.item_id = item_id
    ev.compaction_compacting.output_index = index
    if agent is not None:
        ev.agent.agent_name = agent
    await io.emit_all((ev,))
    summary = await io.services.summarize(
        io.tenant, prepared.route, context, io.params.instructions or None,
        ledger_id=item_id, store=prepared.response.store, affinity=affinity,
    )  # fmt: skip
    item = items_pb2.Item()
    item.compaction.id = item_id
    item.compaction.encrypted_content = encode_payload(summary.text, summary.keep)
    if agent is not None:
        item.agent.agent_name = agent
    _, events = builder.add_finished_item(item, index)
    if agent is not None:
        for done in events:
            done.agent.agent_name = agent
    await io.emit_all(events)
    return item
