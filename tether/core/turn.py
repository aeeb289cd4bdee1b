"""One turn: the only place that knows what answering a `response.create` means.

A turn gets a narrow `TurnContext` (its connection's outbox, cache, parents and memos, and the
process-wide services); it never sees its session or the engine. Its stages, in order (each
timed, each incremental over the cached chain):
  validate  the params (before anything is read), unless the create's entry checked them
            already (`tether.core.checked`: a create is checked once)
  resolve   previous_response_id -> the connection cache, else one store read (hydration)
  validate  the new items (call ids against the chain's open calls)
  classify  the new items' rendered text (safety)
  render    the new items -> tokens appended to the cached prefix; the header's tokens reused
            (when only `usage` needs the count, tokenising overlaps the backend's first token)
  route     model -> backend (memoised per connection); the backend checks the request
  backend   stream chunks, a wake-up at a time -> events (OutputBuilder) -> the outbox
  finalize  terminal event; the new state goes into the connection cache; the store/ledger
            write is queued for the post-inference worker (overlapping the client's next turn)

The backend stage is the turn's kind (tether.core.kinds): a step function over `StepIO`, the
narrow interface a `Turn` provides (`backend_request`, `stream`, `event`, `emit_all`, ...). The
standard kind makes one backend call (or runs the hosted MCP loop); the lab's prototype loops
over tool calls in one response. `Turn` is never subclassed: a `TurnStrategy` picks the kind.

How a turn ends is its `Outcome` (tether.core.outcome): the session interrupts a turn only through
its `TurnControl` (steer, cancel, cut), and `ending(outcome, finish reason, error)` alone says the
Response's status and terminal event. Finishing is named steps, in this order: settle the Response
(status, usage, timing), append to the conversation, then publish: the terminal event and the
bookkeeping (connection cache, store/ledger write), durable first or overlapped as
`store_durability` says.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson

from tether import errors, ids, offload, render
from tether.backends.base import Backend, BackendError, BackendRequest, Finish
from tether.core import multi_agent
from tether.core.accounting import OutputCap, TurnUsage, account, capped
from tether.core.builder import OutputBuilder
from tether.core.chain import CachedResponse, Node, Segment, segments_of
from tether.core.checked import CheckedCreate, check_create
from tether.core.context import LastHeader, TurnContext
from tether.core.conversations import check_new_ids
from tether.core.intake import Intake
from tether.core.items import assign_ids, item_key, request_input
from tether.core.kinds import STANDARD, Prepared, Rendered, TurnKind, compact
from tether.core.lane import Lane
from tether.core.mcp import McpLoop, check_approval_responses, redacted_tools
from tether.core.outcome import COMPLETED_ENDING, Ending, Outcome, TurnControl, ending
from tether.core.postinference import PostJob
from tether.core.run import ResponseRun
from tether.core.stages import fields, validate
from tether.core.stages.route import Resolved
from tether.core.telemetry import TurnFacts
from tether.core.timing import StageClock
from tether.core.wakeups import WakeupReader
from tether.errors import TetherError
from tether.mcp.sessions import McpSessions
from tether.protocol.calls import answered_call_id
from tether.protocol.wire import SERVER_TIMING_INCLUDE
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, response_pb2, service_pb2
from tether.store.base import KeyedItem, ResponseRecord, UsageRecord

log = logging.getLogger("tether.turn")

REASONING_INCLUDE = "reasoning.encrypted_content"


class Phase(enum.Enum):
    """Where a turn is; a steer interrupts only a turn that is generating."""

    PREPARING = "preparing"
    GENERATING = "generating"
    FINISHING = "finishing"


@dataclass(frozen=True, slots=True)
class Parent:
    """What a create continues: the previous response's cached state (`entry`; None for a
    conversation or a first turn), whether it came from this connection's cache, and its chain."""

    entry: CachedResponse | None
    from_cache: bool
    node: Node | None


class Turn:
    """One create's turn (see the module docstring). `kind`: its backend steps (tether.core.kinds);
    `clock`: its stage clock (a kind may count some of its waits as not overhead)."""

    def __init__(self, ctx: TurnContext, params: request_pb2.ResponseCreateParams, lane: Lane,
                 control: TurnControl, event_id: str = "", *, kind: TurnKind = STANDARD,
                 clock: StageClock | None = None) -> None:  # fmt: skip
        self.ctx = ctx
        self.services = ctx.services
        self.params = params
        self.lane = lane
        self.control = control  # how it ends; the session interrupts through it
        self.event_id = event_id  # the client's id of the create event (echoed on its error events)
        self.kind = kind
        self.stream_id = params.stream_id
        self.clock = StageClock() if clock is None else clock
        self.response_id = ""
        # What telemetry reads of this turn (its span: `Telemetry.turn_span`).
        self.facts = TurnFacts(ctx.transport, ctx.session_id, self.stream_id, params.model,
                               params.store if params.HasField("store") else True, params.previous_response_id,
                               self.clock)  # fmt: skip
        self.phase = Phase.PREPARING
        self.builder: OutputBuilder | None = None  # while generating
        self.output_cap: OutputCap | None = None  # while generating: the output cap Tether enforces
        self.replica = ""  # the backend-pool replica that served the turn (recorded with the response)
        self.mcp: McpLoop | None = None  # the create names remote MCP servers (tether.core.mcp)
        # The response's run: set once it is created (or before, by a background create that
        # reserved it); `refusal`: the request error that ended the turn before it was created.
        self.response_run: ResponseRun | None = None
        self.refusal: TetherError | None = None
        # The request's size as received (the session sets it; a template's expansion adds to it):
        # what decides whether its input is checked and rendered off the event loop.
        self.size_hint = 0
        # Its params as the create's entry checked them (`Engine.start_run`); None: the turn checks them.
        self.checked: CheckedCreate | None = None

    # -- what a kind sees (StepIO) -------------------------------------------------------------------

    @property
    def tenant(self) -> str:
        return self.ctx.tenant

    @property
    def session_id(self) -> str:
        return self.ctx.session_id

    @property
    def mcp_sessions(self) -> McpSessions:
        return self.ctx.mcp

    def event(self) -> events_pb2.ServerEvent:
        return events_pb2.ServerEvent(stream_id=self.stream_id, response_id=self.response_id)

    async def emit_all(self, events: Sequence[events_pb2.ServerEvent]) -> None:
        for ev in events:
            ev.stream_id, ev.response_id = self.stream_id, self.response_id
            await self.ctx.outbox.put(ev)

    async def emit_error(self, error: TetherError) -> None:
        await self.ctx.emit_error(error, stream_id=self.stream_id, event_id=self.event_id)

    async def _emit_response(self, arm: str, response: response_pb2.Response) -> None:
        ev = self.event()
        getattr(ev, arm).response.CopyFrom(response)
        await self.ctx.outbox.put(ev)

    def interrupt_for_steer(self) -> None:
        """A steer was accepted: stop generating now (the output so far is kept) so that the
        successor starts. A turn not generating, or already producing tool calls (it will wait
        for their output), ends as it would; the successor or `response.steer.pending` follows."""
        calling = self.builder is not None and self.builder.tool_calls_started > 0
        if self.phase is Phase.GENERATING and not calling:
            self.control.interrupt(Outcome.STEERED)

    def take_injected(self, items: Sequence[items_pb2.Item]) -> bool:
        """`response.inject`: commit `items` to this response now, because one of its agents waits
        for them (a multi-agent turn's client tool outputs): its kind decides. True: committed.
        Otherwise the session answers the inject when the response ends (`Session._inject`)."""
        return self.phase is Phase.GENERATING and self.kind.take_injected(items)

    # -- the turn ---------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            prepared = await self._prepare()
        except TetherError as exc:
            self.refusal = exc
            self._evict_parent_after_error()
            self.services.telemetry.turn_refused(exc.code)
            await self.emit_error(exc)
            return
        self.response_id = self.facts.response_id = prepared.response.id
        run = self.response_run = self.services.runs.open(self.ctx.tenant, prepared.response, self.control,
                                                          self.response_run)  # fmt: skip
        if run.state.final:  # a background run cancelled before it started: nothing is created
            return
        self.ctx.outbox.bind(run)
        self.ctx.register(self)
        with self.services.telemetry.active_turn():
            try:
                await self._emit_response("created", prepared.response)
                await self._emit_response("in_progress", prepared.response)
                if warm_up_only(self.params):
                    await self._finish(prepared, [], COMPLETED_ENDING, None, None)
                else:
                    await self._generate(prepared)
            except asyncio.CancelledError:
                # The client went away: no terminal event, but the turn ended and is counted as such.
                self.services.telemetry.turn_abandoned(self.ctx.transport)
                raise

    async def _prepare(self) -> Prepared:
        """The stages before the backend, in the order of the module docstring: each a method
        below, timed under its stage name."""
        await self._validate_params()
        parent = await self._resolve()
        new_items = self._new_items()
        # Checking, rendering and classifying megabytes of new input runs off the event loop
        # (tether.offload), by the request's size as received (measuring it would cost as much).
        texts, findings, new_bytes = await offload.run(self.size_hint, self._check_items, new_items, parent.node)
        header = await self._render_header()
        route = self._route()
        return await self._plan(parent, new_items, (texts, findings, new_bytes), header, route)

    async def _validate_params(self) -> None:
        """The params checked (`check_create`), here unless the create's entry checked them
        already (`checked`): never twice."""
        checked = self.checked
        if checked is None:
            checked = await check_create(self.services, self.ctx.tenant, self.params, self.size_hint)
        self.clock.add("validate", checked.seconds)
        self.mcp = checked.mcp
        self.size_hint += checked.expanded

    async def _resolve(self) -> Parent:
        """previous_response_id (the connection cache, else one store read) or the conversation."""
        params = self.params
        with self.clock.stage("resolve"):
            if params.conversation:
                return Parent(None, False, await self._conversation_node(params.conversation))
            entry, from_cache = await self.ctx.parents.resolve(params.previous_response_id, lane=self.lane.name)
            return Parent(entry, from_cache, entry.context_node if entry else None)

    def _check_items(self, new_items: list[items_pb2.Item], parent_node: Node | None) -> tuple[list[str], int, int]:
        """The new items checked against the chain's open calls, then their rendered text, the
        safety stage's findings in it, and its UTF-8 size."""
        with self.clock.stage("validate"):
            validate.validate_items(new_items, parent_node.open_calls if parent_node else frozenset(), self.services.limits)
            multi_agent.check_input(self.params, new_items, parent_node is not None and parent_node.agents)
            if any(item.WhichOneof("item") == "mcp_approval_response" for item in new_items):
                check_approval_responses(new_items, parent_node.items() if parent_node else (),
                                         self.services.reasoning, self.ctx.tenant)  # fmt: skip
            if self.params.conversation:  # they join the conversation: their ids must be new to it
                check_new_ids(new_items, parent_node.items() if parent_node else (), param="input")
        with self.clock.stage("render"):
            texts = [render.render_item(item) for item in new_items]
        with self.clock.stage("classify"):
            findings = self.services.classify(texts)
        return texts, findings, sum(len(t.encode()) for t in texts)

    async def _render_header(self) -> tuple[int, bool, LastHeader | None]:
        """The instructions+tools header's tokens (count, memoised on the connection), whether it
        was memoised already, and the connection's record of it when kept (`LastHeader`)."""
        params = self.params
        with self.clock.stage("render"):
            instructions = params.instructions if params.HasField("instructions") else None
            return await self.ctx.memo.header(instructions, params.tools)

    def _route(self) -> Resolved:
        with self.clock.stage("route"):
            return self.ctx.memo.route(self.params.model)

    async def _plan(self, parent: Parent, new_items: list[items_pb2.Item], checked: tuple[list[str], int, int],
                    header: tuple[int, bool, LastHeader | None], route: Resolved) -> Prepared:  # fmt: skip
        """The backend request: the new input tokenised now, or while the backend computes its
        first token when nothing before needs the count; the backend's own check; admission."""
        params, ctx, services, clock = self.params, self.ctx, self.services, self.clock
        texts, findings, new_bytes = checked
        header_tokens, header_cached, last_header = header
        parent_node, from_cache = parent.node, parent.from_cache

        def tokenise() -> Rendered:
            encode = services.token_cache.encode
            new_segments = tuple(
                Segment(ids.new_id("itm"), item, encode(ctx.tenant, text))
                for item, text in zip(new_items, texts, strict=True)
            )
            node = Node.continue_with(parent_node, new_segments, findings)
            if header_tokens + node.token_count > route.context_window and params.truncation == "auto":
                # Dropping the oldest items breaks the cached prefix: only the header stays cached.
                node = truncate(node, route.context_window - header_tokens)
                cached_tokens = header_tokens if header_cached else 0
                return Rendered(new_segments, node, header_tokens + node.token_count, cached_tokens)
            # The prefix is reused only when it came from this connection and was not compacted away.
            reused = parent_node.token_count if (parent_node and from_cache and node.parent is parent_node) else 0
            cached_tokens = reused + (header_tokens if header_cached else 0)
            return Rendered(new_segments, node, header_tokens + node.token_count, cached_tokens)

        limiter = services.rate_limiter
        compacting = any(item.WhichOneof("item") == "compaction" for item in new_items)
        # A token is at least one byte, so the new input's UTF-8 size bounds its token count: when
        # that bound fits the context window, no token budget is charged and the backend reads the
        # count only for `usage`, tokenising waits for the backend's first-token time.
        with clock.stage("route"):
            bound = header_tokens + (parent_node.token_count if parent_node else 0) + new_bytes
            # A large input is tokenised now, off the event loop, not while the backend waits.
            large = offload.large(new_bytes)
            defer = not large and not compacting and not limiter.charges_input_tokens and bound <= route.context_window
            items = [*(parent_node.items() if parent_node else ()), *new_items] if defer else []
            entry = parent.entry
            request = self.backend_request(route, items, 0, affinity=(entry.replica or None) if entry else None)
            defer = defer and not route.backend.reads_input_tokens(request)
        prepared = Prepared(self._response_skeleton(last_header), entry, from_cache, route, request, tokenise)
        if not defer:
            with clock.stage("render"):
                await offload.run(new_bytes, prepared.render)
                request.items = prepared.node.items()
                request.input_tokens = prepared.input_tokens
            if prepared.input_tokens > route.context_window:
                raise TetherError(
                    errors.CONTEXT_LENGTH_EXCEEDED,
                    f"Input of {prepared.input_tokens} tokens exceeds the context window of {route.context_window} tokens.",
                    param="input",
                )
        with clock.stage("route"):
            # What the backend cannot do is a request error now, before response.created.
            await route.backend.prepare(request)
        limiter.admit(ctx.tenant, prepared.input_tokens if prepared.rendered else 0)
        return prepared

    async def _conversation_node(self, conversation_id: str) -> Node | None:
        """A conversation's items as the chain a create continues (None when it has none yet)."""
        items = await self.services.conversations.context(self.ctx.tenant, conversation_id, request_input(self.params))
        if not items:
            return None
        # Tokenised and measured in the offload thread: a store read anyway, and its size unknown.
        return await offload.in_thread(_conversation_chain, items)

    def _new_items(self) -> list[items_pb2.Item]:
        """The request's new input, with ids assigned to items that came without one."""
        params = self.params
        items = request_input(params)
        for steer in self.lane.take_pending_steer(params.previous_response_id):
            items.extend(steer)
        assign_ids(items)
        for i, item in enumerate(items):  # a stateless client's reasoning comes back sealed
            if item.WhichOneof("item") == "reasoning" and item.reasoning.HasField("encrypted_content"):
                self.services.reasoning.open_item(self.ctx.tenant, item, f"input[{i}]")
        return items

    def _response_skeleton(self, header: LastHeader | None) -> response_pb2.Response:
        """The Response this turn creates: the one a background create reserved (built once, at
        its entry: the turn only moves it to `in_progress`), else a new one."""
        run = self.response_run
        if run is not None and run.response is not None:
            r = response_pb2.Response()
            r.CopyFrom(run.response)
            r.status = "in_progress"
            return r
        echo = None
        if header is not None:
            if header.echo is None:
                header.echo = header_echo(self.params)
            echo = header.echo
        return response_skeleton(self.params, self.services.clock.wall(), echo)

    # -- generation -------------------------------------------------------------------------------

    def backend_request(
        self, route: Resolved, items: list[items_pb2.Item], input_tokens: int, *, affinity: str | None = None
    ) -> BackendRequest:
        p = self.params
        # Asked for log probabilities without a cap: the cap their volume allows (limits.max_logprobs).
        cap = p.max_output_tokens if p.HasField("max_output_tokens") else validate.logprobs_output_cap(p, self.services.limits)
        tool_choice = p.tool_choice if p.HasField("tool_choice") else None
        return BackendRequest(
            model=route.upstream_model,
            instructions=p.instructions if p.HasField("instructions") else None,
            items=items,
            tools=self.mcp.backend_tools(p.tools, with_mcp=False) if self.mcp else list(p.tools),
            tool_choice=self.mcp.tool_choice(tool_choice, first=True) if self.mcp else tool_choice,
            parallel_tool_calls=p.parallel_tool_calls if p.HasField("parallel_tool_calls") else True,
            max_output_tokens=cap,
            temperature=p.temperature if p.HasField("temperature") else None,
            top_p=p.top_p if p.HasField("top_p") else None,
            reasoning_effort=p.reasoning.effort if p.reasoning.HasField("effort") else None,
            text_format=p.text.format if p.text.HasField("format") else None,
            verbosity=p.text.verbosity if p.text.HasField("verbosity") else None,
            logprobs=fields.requested_logprobs(p),
            user=p.user or p.safety_identifier or None,
            prompt_cache_key=p.prompt_cache_key or None,
            service_tier=p.service_tier,
            input_tokens=input_tokens,
            affinity=affinity,
            tenant=self.ctx.tenant,
        )

    async def stream(
        self, builder: OutputBuilder, backend: Backend, request: BackendRequest,
        while_waiting: Callable[[], None] | None = None,
    ) -> None:
        """One backend call streamed into `builder` and the outbox, one wake-up's chunks at a time
        (`WakeupReader`: their text deltas merge into one event), or each network read handled
        in the step that read it where the backend pushes runs to the turn's `Intake` while it
        waits; `while_waiting` runs once, when the backend first has to wait. Raises
        BackendError, or CancelledError when the client goes away or cancels (the upstream is
        closed either way)."""
        self.phase = Phase.GENERATING
        cap = self.output_cap
        assert cap is not None
        outbox = self.ctx.outbox
        intake = Intake(builder, outbox, cap, self.stream_id, self.response_id, self.control)
        request.sink = intake
        reader = WakeupReader(backend.stream_runs(request), while_waiting)
        started = time.perf_counter()
        builder.finish = None
        try:
            with self.services.coalesce.generating():  # counted: many streams widen the outboxes' window
                while True:
                    intake.armed = True
                    try:
                        chunks = await reader.next()
                    finally:
                        intake.armed = False
                    if intake.held:  # pushed while the task had to handle them: they came first
                        intake.consume(intake.take_held())
                    if chunks:
                        intake.consume(chunks)
                    if intake.error is not None:
                        raise intake.error
                    backlog = intake.backlog
                    while backlog:
                        await outbox.put(backlog.popleft())
                    if intake.stopped or reader.ended:
                        break
        finally:
            request.sink = None
            await reader.aclose()
            if intake.first_at is not None:
                self.clock.add("backend_ttft", intake.first_at - started)
            self.clock.add("backend_wait", reader.waited - intake.spent)
            self.clock.add("backend", time.perf_counter() - started)

    def _builder(self) -> OutputBuilder:
        p = self.params
        seal = None
        if REASONING_INCLUDE in p.include:
            sealer, tenant = self.services.reasoning, self.ctx.tenant
            seal = lambda item: sealer.seal(tenant, item)  # noqa: E731
        self.builder = OutputBuilder(
            max_tool_calls=p.max_tool_calls if p.HasField("max_tool_calls") else None,
            reasoning_summary=p.reasoning.HasField("summary"),
            seal_reasoning=seal,
            max_logprobs=self.services.limits.max_logprobs if fields.requested_logprobs(p) is not None else None,
        )
        return self.builder

    def _output_limit(self) -> int:
        """The output cap: the request's `max_output_tokens`, else `limits.max_output_tokens`."""
        p = self.params
        return p.max_output_tokens if p.HasField("max_output_tokens") else self.services.limits.max_output_tokens

    async def _generate(self, prepared: Prepared) -> None:
        """Run the kind's steps and end the response however they stop: the model's finish, a
        backend error, or the interruption the control carries (steer, client cancel, server cut).
        Two bounds hold over all the steps: the output cap (`OutputCap`: past it the stream is
        closed and the response ends incomplete, `max_output_tokens`, billed at most the cap) and
        the deadline (`limits.max_turn_s` from here: past it the response fails with
        `backend_timeout`)."""
        builder = self._builder()
        self.output_cap = OutputCap(self._output_limit())
        deadlines = self.services.deadlines
        deadlines.watch(self.control)  # past `limits.max_turn_s`: interrupted as a CUT (backend_timeout)
        outcome, error = Outcome.COMPLETED, None
        finish: Finish | None = None
        try:
            try:
                finish = await self.kind.steps(self, prepared, builder)
            finally:
                deadlines.forget(self.control)
        except TetherError as exc:  # a BackendError, or a rule of the steps (e.g. an append timeout)
            outcome, error = Outcome.FAILED, exc
        except Exception:  # a bug in a backend adapter fails this response, not the session
            log.exception("backend %s failed", prepared.route.backend.name)
            outcome, error = Outcome.FAILED, BackendError(errors.BACKEND_ERROR, "The model backend failed.")
        except asyncio.CancelledError:
            interruption = self.control.claim()  # claimed here: the lane must not swallow a second cancel
            if interruption is None:  # the session is going away
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]  # in a task: the lane's
            outcome, error = interruption, self.control.reason if interruption is Outcome.CUT else None
            if interruption is not Outcome.STEERED and error is None:
                outcome, error = Outcome.CANCELLED, TetherError(errors.CANCELLED, "The response was cancelled by the client.")
        if error is not None:
            finish = self.kind.finish_so_far()
        await self._end(prepared, builder, outcome, finish, error)

    async def _end(self, prepared: Prepared, builder: OutputBuilder, outcome: Outcome, finish: Finish | None,
                   error: TetherError | None) -> None:  # fmt: skip
        """Close the open items and finish: the one ending of every generation. `outcome`: how
        the steps ended (`error`: what a failed or cancelled one reports; `finish`: how the model
        stopped, or the usage so far of steps that failed)."""
        self.phase = Phase.FINISHING
        self.control.end(outcome)
        end = ending(outcome, finish.reason if finish is not None and error is None else None, error)
        if error is not None:
            await self.emit_all(builder.close_all("incomplete"))
            self.services.telemetry.error(error.code)
            await self._finish(prepared, builder.output, end, finish, error)
            return
        # A message cut by the output cap (or a filter) is itself incomplete, not just the response.
        await self.emit_all(builder.close_all(end.status))
        # A multi-agent rollout compacts each agent's context itself, after that agent's calls.
        output = builder.output if multi_agent.enabled(self.params) else await compact(self, prepared, builder, finish)
        await self._finish(prepared, output, end, finish, None)

    # -- finalisation: named steps, in order ------------------------------------------------------

    async def _finish(self, prepared: Prepared, output: list[items_pb2.Item], end: Ending, finish: Finish | None,
                      error: TetherError | None) -> None:  # fmt: skip
        """Settle the Response, append to the conversation, publish (terminal event and bookkeeping)."""
        usage = self._settle(prepared.response, prepared, output, end, finish)
        if self._joins_conversation(prepared, end):
            await self._append_to_conversation(prepared, output)
        await self._publish(prepared, output, end, error, usage)

    def _settle(self, r: response_pb2.Response, prepared: Prepared, output: list[items_pb2.Item], end: Ending,
                finish: Finish | None) -> TurnUsage:  # fmt: skip
        """The finished Response: status, output, usage (charged to the rate limiter), backend
        timing, error or incomplete reason, server_timing when asked. Returns the usage."""
        r.status = end.status
        r.completed_at = int(self.services.clock.wall())
        del r.output[:]
        r.output.extend(output)
        usage = capped(account(
            finish.usage if finish else None,
            input_tokens=prepared.input_tokens,
            cached_tokens=prepared.cached_tokens,
            output=output,
        ), self._output_limit())  # fmt: skip
        u = r.usage
        u.input_tokens, u.cached_tokens = usage.input_tokens, usage.cached_tokens
        u.output_tokens, u.reasoning_tokens = usage.output_tokens, usage.reasoning_tokens
        u.total_tokens = usage.input_tokens + usage.output_tokens
        reported = finish.usage if finish else None
        if reported is not None:  # what only the backend can count (Cerebras's image and prediction tokens)
            u.image_tokens = reported.image_tokens or 0
            u.accepted_prediction_tokens = reported.accepted_prediction_tokens or 0
            u.rejected_prediction_tokens = reported.rejected_prediction_tokens or 0
        if finish and finish.service_tier:  # the tier the backend used (`auto` picks one)
            r.service_tier = finish.service_tier
        self.services.rate_limiter.charge_output(self.ctx.tenant, usage.output_tokens)
        self.replica = finish.replica if finish else ""
        if finish and finish.timing:
            t = finish.timing
            r.backend_timing.queue_time, r.backend_timing.prompt_time = t.queue_time, t.prompt_time
            r.backend_timing.completion_time, r.backend_timing.total_time = t.completion_time, t.total_time
        error = end.error
        if error is not None:
            r.error.code, r.error.message = error.code, error.message
            if error.retry_after:
                r.error.retry_after_s = error.retry_after
        elif end.incomplete_reason:
            r.incomplete_details.reason = end.incomplete_reason
        if SERVER_TIMING_INCLUDE in self.params.include:
            clock, st = self.clock, r.server_timing
            for name, seconds in clock.stages.items():
                st.stages_ms[name] = seconds * 1000
            st.overhead_ms = clock.overhead() * 1000
            st.usage_sources.update(usage.sources)
        return usage

    def _joins_conversation(self, prepared: Prepared, end: Ending) -> bool:
        """A create with `conversation` adds its input and output to it when it completed or is
        incomplete, and stored. `store: false` keeps nothing: the conversation is read, not
        written. A warm-up generated nothing and leaves the conversation as it was: the real
        turn that follows sends the same input with `conversation` and appends it once."""
        return (bool(self.params.conversation) and end.status in ("completed", "incomplete")
                and prepared.response.store and not warm_up_only(self.params))  # fmt: skip

    async def _append_to_conversation(self, prepared: Prepared, output: list[items_pb2.Item]) -> None:
        with self.clock.stage("finalize"):  # before the terminal event: the next create reads them
            added = [seg.item for seg in prepared.new_segments]
            await self.services.conversations.append(self.ctx.tenant, self.params.conversation, [*added, *output])

    async def _publish(self, prepared: Prepared, output: list[items_pb2.Item], end: Ending, error: TetherError | None,
                       usage: TurnUsage) -> None:  # fmt: skip
        """The terminal event and the bookkeeping, while continuations of this response wait
        for it (`parents.begin_finishing`): the store write first, then the event, when
        `store_durability` is `before_terminal`; else the event first, the bookkeeping paced
        with other turns ending (the write overlapping the client's next turn)."""
        r, services, clock = prepared.response, self.services, self.clock
        parents = self.ctx.parents
        finishing = parents.begin_finishing(r.id)
        if self.response_run is not None:
            self.response_run.terminal_produced = True
        services.telemetry.response_finished(r)
        try:
            if r.store and services.config.store_durability == "before_terminal":
                # Durable first: a crash after the client saw the terminal event loses nothing.
                with clock.stage("finalize"):
                    out_segments, context = self._state_after(prepared, output)
                    await services.post.write_now(self._post_job(prepared, out_segments, context))
                await self._emit_response(end.arm, r)
                self._remember(prepared, end, error, context)
            else:
                await self._emit_response(end.arm, r)

                def bookkeeping() -> None:
                    with clock.stage("finalize"):
                        out_segments, context = self._state_after(prepared, output)
                        self._remember(prepared, end, error, context)
                        services.post.submit(self._post_job(prepared, out_segments, context))

                await services.post.after_terminal(bookkeeping)  # paced with other turns ending
            services.telemetry.turn_finished(
                self.ctx.transport, end.arm, clock.stages, clock.overhead(), clock.elapsed(), r.usage, usage.sources
            )
        finally:
            finishing.set_result(None)
            parents.end_finishing(r.id)

    def _state_after(self, prepared: Prepared, output: list) -> tuple[tuple[Segment, ...], Node]:
        """The output as rendered segments, and the context a continuation builds on."""
        out_segments = tuple(Segment.of(item_key(item), item) for item in output)
        return out_segments, Node.continue_with(prepared.node, out_segments)

    def _remember(self, prepared: Prepared, end: Ending, error: TetherError | None, context: Node) -> None:
        """Put the finished response into the connection cache (or evict its parent on error)."""
        r = prepared.response
        if error is not None:
            self._evict_parent_after_error()
        elif end.status in ("completed", "incomplete"):
            entry = CachedResponse(
                response=r,
                input_node=prepared.node,
                context_node=context,
                lane=self.lane.name,
                store=r.store,
                tenant=self.ctx.tenant,
                nbytes=prepared.node.nbytes + context.nbytes,
                replica=self.replica,
            )
            self.ctx.cache.put(entry)
            self.lane.last_response_id = r.id

    def _post_job(self, prepared: Prepared, out_segments: tuple[Segment, ...], context: Node) -> PostJob:
        r = prepared.response
        if not r.store:
            return PostJob(usage=None, record=None)
        usage = UsageRecord(
            tenant=self.ctx.tenant,
            response_id=r.id,
            model=r.model,
            backend=prepared.route.backend.name,
            input_tokens=r.usage.input_tokens,
            cached_tokens=r.usage.cached_tokens,
            output_tokens=r.usage.output_tokens,
            reasoning_tokens=r.usage.reasoning_tokens,
            status=r.status,
            created_at=float(r.created_at),
        )
        record = ResponseRecord(
            tenant=self.ctx.tenant,
            response=r,
            input_keys=[s.key for s in prepared.node.all_segments()],
            output_keys=[s.key for s in out_segments],
            new_items=[KeyedItem(s.key, s.item) for s in _unstored(prepared, out_segments)],
            conversation_tokens=context.token_count,
            replica=self.replica,
            epoch=self.response_run.epoch if self.response_run is not None else 0,  # the store fences it
        )
        return PostJob(usage=usage, record=record, context=context)

    def _evict_parent_after_error(self) -> None:
        parent_id = self.params.previous_response_id
        if not parent_id:
            return
        cache = self.ctx.cache
        entry = cache.get(parent_id)
        if entry is not None and entry.lane == self.lane.name:
            cache.evict(parent_id, reason="error")



class TurnStrategy(Protocol):
    """The kind of turn a session runs (injected through the engine by the composition root):
    the `Turn` that answers a create (a plain `Turn` with the kind, tether.core.kinds, the create
    asks for), and whether a `response.append` belongs to one of its turns."""

    def turn(self, ctx: TurnContext, params: request_pb2.ResponseCreateParams, lane: Lane,
             control: TurnControl, event_id: str) -> Turn: ...  # fmt: skip

    def deliver_append(self, session_id: str, append: service_pb2.AppendRequest) -> bool:
        """Take `append` for a waiting turn of session `session_id`; False: the session handles
        it (the legacy `response.append`, a new response continuing the lane)."""
        ...


class StandardTurns:
    """The launched WebSocket mode: every create is a `Turn` of the standard kind, ended by its
    response; with `multi_agent` enabled, of the multi-agent kind (tether.core.multi_agent), which
    waits for injects only where a client can send them (a WebSocket, a gRPC Session)."""

    def turn(self, ctx: TurnContext, params: request_pb2.ResponseCreateParams, lane: Lane,
             control: TurnControl, event_id: str) -> Turn:  # fmt: skip
        if multi_agent.enabled(params):
            limits = ctx.services.limits
            wait = limits.multi_agent_inject_wait_s if ctx.transport in INJECTING_TRANSPORTS else 0.0
            kind = multi_agent.MultiAgentRollout(params, limits, wait)
            return Turn(ctx, params, lane, control, event_id, kind=kind)
        return Turn(ctx, params, lane, control, event_id)

    def deliver_append(self, session_id: str, append: service_pb2.AppendRequest) -> bool:
        return False


# The transports whose clients can send `response.inject` (a session with a client stream).
INJECTING_TRANSPORTS = frozenset(("websocket", "grpc"))

STANDARD_TURNS = StandardTurns()


def header_echo(p: request_pb2.ResponseCreateParams, into: response_pb2.Response | None = None) -> response_pb2.Response:
    """The part of a Response that echoes the create's header: its instructions and tools (MCP
    credentials are never echoed nor stored), set on `into` (else a new Response)."""
    r = response_pb2.Response() if into is None else into
    if p.HasField("instructions"):
        r.instructions = p.instructions
    r.tools.extend(redacted_tools(p.tools))
    return r


def response_skeleton(p: request_pb2.ResponseCreateParams, now: float,
                      echo: response_pb2.Response | None = None) -> response_pb2.Response:  # fmt: skip
    """The Response a create starts as (`in_progress`, a new id, created `now`). `echo`: its
    header's `header_echo` (memoised per connection: a turn copies it whole), else made here."""
    r = response_pb2.Response(
        id=ids.response_id(),
        created_at=int(now),
        status="in_progress",
        model=p.model,
        previous_response_id=p.previous_response_id,
        store=p.store if p.HasField("store") else True,
        parallel_tool_calls=p.parallel_tool_calls if p.HasField("parallel_tool_calls") else True,
        temperature=p.temperature if p.HasField("temperature") else 1.0,
        top_p=p.top_p if p.HasField("top_p") else 1.0,
        truncation=p.truncation or "disabled",
        user=p.user,
        prompt_cache_key=p.prompt_cache_key,
        safety_identifier=p.safety_identifier,
        service_tier=p.service_tier or "default",
    )
    if echo is None:
        header_echo(p, into=r)
    else:
        r.MergeFrom(echo)
    if p.HasField("max_output_tokens"):
        r.max_output_tokens = p.max_output_tokens
    if p.HasField("max_tool_calls"):
        r.max_tool_calls = p.max_tool_calls
    if p.conversation:
        r.conversation.id = p.conversation
    if p.HasField("prompt"):
        r.prompt.CopyFrom(p.prompt)
    r.top_logprobs = p.top_logprobs
    if p.HasField("tool_choice"):
        r.tool_choice.CopyFrom(p.tool_choice)
    else:
        r.tool_choice.mode = "auto"
    if p.HasField("text"):
        r.text.CopyFrom(p.text)
    else:
        r.text.format.type = "text"
    if p.HasField("reasoning"):
        r.reasoning.CopyFrom(p.reasoning)
    r.metadata.update(p.metadata)
    return r


def warm_up_only(params: request_pb2.ResponseCreateParams) -> bool:
    """`generate: false`, or `prompt_cache_options.prewarm: true` (which forces it): prepare and
    cache the state, return a chainable id, generate nothing."""
    if params.HasField("generate") and not params.generate:
        return True
    if not params.extra_json:
        return False
    options = orjson.loads(params.extra_json).get("prompt_cache_options")
    return isinstance(options, dict) and options.get("prewarm") is True


def truncate(node: Node, budget: int) -> Node:
    """`truncation: "auto"`: the chain without its oldest whole items, so that it fits `budget`
    tokens. The last item always stays; a tool output (function or custom) whose call was dropped
    goes with it.
    Returns `node` itself when even the last item alone does not fit (the caller then answers
    `context_length_exceeded`)."""
    segments = node.all_segments()
    total = node.token_count
    start, last = 0, len(segments) - 1
    while total > budget and start < last:
        total -= len(segments[start].tokens)
        start += 1
    while start < last and answered_call_id(segments[start].item) is not None:
        total -= len(segments[start].tokens)
        start += 1
    if total > budget:
        return node
    log.info("truncation auto: dropped the %d oldest items (%d tokens)", start, node.token_count - total)
    return Node.extend(None, tuple(segments[start:]))


def _conversation_chain(items: list[items_pb2.Item]) -> Node:
    return Node.continue_with(None, segments_of(items))


def _unstored(prepared: Prepared, out_segments: tuple[Segment, ...]) -> list[Segment]:
    """The segments this turn adds to the store: new input, plus the whole window when the parent
    was not stored (store=false parent continued with store=true, or a conversation's items),
    plus the output."""
    parent = prepared.parent
    if parent is None or not parent.store:  # a conversation's items are not stored under keys
        return [*prepared.node.all_segments(), *out_segments]
    if prepared.node.parent is None:  # a compaction window: its kept items may be new to the store
        return [*prepared.node.segments, *out_segments]
    return [*prepared.new_segments, *out_segments]
