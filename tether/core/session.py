"""A session: one agent connection's state and its lanes, independent of any transport.

Transports feed it client events (`send`) and drain server events (`events`, through the pump,
`tether.core.pump`, which asks `responses_in_flight` while the server drains); it never touches a
socket. It owns:
- the connection cache of recent responses (`ResponseCache`), so `previous_response_id` costs
  O(new input);
- lanes: creates on one `stream_id` run FIFO, lanes run concurrently, at most
  `max_active_responses` generate at once and at most `max_lanes` named lanes exist over the
  connection's life; the bytes of its pending creates count against the connection, its API key
  and the process (`tether.core.queued`);
- per-connection memos of the render and route stages (header tokens, model routes);
- its lifetime (`connection_lifetime_s`, then `websocket_connection_limit_reached`) and idle
  timeout (the rule: `tether.core.lifetime`, on the injected clock), and its outbox (coalescing,
  backpressure; each response's run numbers and logs the events as they are put there).
Request-scoped problems become in-band `error` events; the session stays usable.

When the client goes away (`close`) while stored (store=true) responses are in flight, the
session detaches instead of cancelling them: it takes no more creates, drops the queued ones,
cancels the turns of other responses, and discards what its outbox would have sent (the runs
already hold it) while the stored ones finish (or end `cancelled`, per `Limits.on_client_gone`)
and are stored; then it closes. Their runs stay retrievable and resumable by id (`tether.core.run`).

A session knows neither the engine nor any kind of turn but the one its `TurnStrategy` makes: it
gets the process-wide `TurnServices`, builds each turn a `TurnContext`, and interrupts a turn
only through the turn's `TurnControl` (steer, cancel, cut).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Literal, overload

import orjson

from tether import errors, ids
from tether.core import lifetime
from tether.core.chain import CacheBudget, ResponseCache
from tether.core.checked import CheckedCreate
from tether.core.context import TurnContext, TurnServices, send_error
from tether.core.delta import Outgoing
from tether.core.items import user_message
from tether.core.lane import Lane
from tether.core.outbox import InlineWriter, Outbox, OutboxClosed
from tether.core.outcome import Outcome, TurnControl, finish_or_cut
from tether.core.stages.validate import check_stream_id
from tether.core.turn import STANDARD_TURNS, Turn, TurnStrategy
from tether.errors import TetherError
from tether.protocol.calls import call_of
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, service_pb2

log = logging.getLogger("tether.session")

# `response.steer.failed` / `response.inject.failed`: the target response has ended.
RESPONSE_ALREADY_COMPLETED = "response_already_completed"

LIFETIME_MESSAGE = (
    "Responses websocket connection limit reached ({minutes} minutes). "
    "Create a new websocket connection to continue."
)


class SessionState(enum.Enum):
    """Where a connection is in its life. OPEN takes client events; DRAINING (the server ends it:
    lifetime, idle, shutdown) refuses new creates while its running turns finish within a grace;
    CLOSED has freed everything. The only ways: OPEN -> DRAINING -> CLOSED and OPEN -> CLOSED
    (`next_state`); a session never opens again."""

    OPEN = "open"
    DRAINING = "draining"
    CLOSED = "closed"


_TRANSITIONS = {
    SessionState.OPEN: {SessionState.DRAINING, SessionState.CLOSED},
    SessionState.DRAINING: {SessionState.CLOSED},
    SessionState.CLOSED: {SessionState.CLOSED},  # closing twice (client gone and server end racing) is a no-op
}


def next_state(current: SessionState, wanted: SessionState) -> SessionState:
    """The one transition function of `SessionState`: `wanted`, or ValueError for a way back."""
    if wanted not in _TRANSITIONS[current]:
        raise ValueError(f"session cannot go from {current.value} to {wanted.value}")
    return wanted


class Session:
    def __init__(self, services: TurnServices, tenant: str, transport: str, *, cache_budget: CacheBudget,
                 strategy: TurnStrategy = STANDARD_TURNS, on_closed: Callable[[Session], None] = lambda _: None,
                 ) -> None:  # fmt: skip
        self.services = services
        self.tenant = tenant
        self.transport = transport
        self.id = ids.new_id("sess")
        self.strategy = strategy
        self._on_closed = on_closed
        limits = services.limits
        self.limits = limits
        self.clock = services.clock
        self.outbox = Outbox(
            max_events=limits.outbound_buffer_events,
            window=services.coalesce,
            max_coalesced_bytes=limits.max_coalesced_bytes,
            clock=services.clock,
        )
        self.cache = ResponseCache(
            limits.cache_responses_per_connection, cache_budget, on_evict=services.telemetry.cache_eviction,
            tenant=tenant,
        )
        self.context = TurnContext.of(services, tenant, transport, self.id, self.outbox, self.cache, self._register)
        self._lanes: dict[str, Lane] = {}
        self._active = asyncio.Semaphore(limits.max_active_responses)
        self._turns: dict[str, Turn] = {}  # response id -> running turn
        self._steers: dict[str, list[tuple[str, list[items_pb2.Item]]]] = {}  # response id -> accepted steers
        # response id -> the injects answered when it ends, and their bytes (counted as queued)
        self._injects: dict[str, list[tuple[service_pb2.InjectRequest, int]]] = {}
        self._pending_injects = 0
        self.queued_bytes = 0  # of the creates in its lanes and running (tether.core.queued)
        self._created = self.clock.monotonic()
        self._last_activity = self._created
        self.state = SessionState.OPEN
        self._close_task: asyncio.Future | None = None
        self._detached = False  # the client is gone; stored responses in flight are finishing
        self._watchdog = asyncio.create_task(self._watch(), name=f"tether-watch-{self.id}")

    # -- transport-facing API (SessionHandle) -----------------------------------------------------

    async def send(self, request: service_pb2.SessionRequest, *, nbytes: int | None = None) -> None:
        """One client event. `nbytes`: its size as received, when the transport knows it (a
        create is charged that much of its connection's, key's and process's pending bytes;
        otherwise its protobuf size, which costs a serialisation, ~1 ms per MB)."""
        if self.state is SessionState.CLOSED:
            raise TetherError(errors.INVALID_REQUEST, "The session is closed.")
        self._last_activity = self.clock.monotonic()
        arm = request.WhichOneof("event")
        event_id = request.event_id  # echoed on the error events this client event causes
        if arm == "create":
            await self._enqueue(request.create, event_id, nbytes=nbytes)
        elif arm == "steer":
            await self._steer(request.steer, event_id)
        elif arm == "inject":
            await self._inject(request.inject, event_id)
        elif arm == "append":
            if self.strategy.deliver_append(self.id, request.append):  # a turn kind that waits for appends
                return
            await self._append(request.append, event_id)
        elif arm == "cancel":
            await self._cancel(request.cancel.response_id, event_id)
        elif arm == "processed":
            return
        else:
            await self.emit_error(
                TetherError(errors.UNKNOWN_EVENT_TYPE, "Empty or unknown client event.", param="type"), event_id=event_id
            )

    @overload
    def events(self, *, lazy_deltas: Literal[False] = False) -> AsyncIterator[Sequence[events_pb2.ServerEvent]]: ...

    @overload
    def events(self, *, lazy_deltas: bool) -> AsyncIterator[Sequence[Outgoing]]: ...

    async def events(self, *, lazy_deltas: bool = False) -> AsyncIterator[Sequence[Outgoing]]:
        while True:
            batch = await self.outbox.get_batch(lazy_deltas=lazy_deltas)
            if not batch:
                return
            yield batch

    def write_inline(self, writer: InlineWriter | None) -> bool:
        self.outbox.write_inline(writer)
        return True

    def responses_in_flight(self) -> int:
        """Responses of this session whose terminal event has not left its outbox yet (their runs
        are bound to it from just before `response.created`): what a draining transport waits for."""
        return self.outbox.runs_in_flight()

    async def close(self) -> None:
        """The client went away: cancel everything and free the connection's state, except the
        turns of stored responses in flight: those the session detaches (module docstring) and
        closes when they end, without the caller waiting.

        Idempotent, and shielded: a caller that is itself cancelled mid-close (a transport tearing
        down) does not leave the session half-closed."""
        self.outbox.write_inline(None)  # its transport writes nothing more
        if self._close_task is None:
            if self.state is SessionState.CLOSED:  # ended by the server (end()) already
                return
            if self.state is SessionState.OPEN and self._detach():
                self._close_task = asyncio.ensure_future(self._close_detached())
                return
            self._close_task = asyncio.ensure_future(self._close())
        if self._detached:
            return
        await asyncio.shield(self._close_task)

    def _detach(self) -> bool:
        """Keep the turns of stored responses in flight past the client (finishing, or
        cancelled per `on_client_gone`); cancel the rest. False: there are none."""
        kept = [t for t in self._turns.values()
                if t.response_run is not None and t.response_run.recorded and not t.response_run.state.final]  # fmt: skip
        if not kept:
            return False
        self._detached = True
        self.state = next_state(self.state, SessionState.DRAINING)
        self.outbox.discard()  # nobody reads it: the kept turns' events go to their runs only
        keep = {t.control.task for t in kept}
        for lane in self._lanes.values():
            self._drop_queued(lane)
            if lane.worker is not None and lane.worker not in keep:
                lane.worker.cancel()
        if self.limits.on_client_gone == "cancel":
            for turn in kept:
                turn.control.interrupt(Outcome.CANCELLED)
        for _ in kept:
            self.services.runs.count("detached")
        return True

    async def _close_detached(self) -> None:
        """Close once the kept turns have ended."""
        workers = [lane.worker for lane in self._lanes.values() if lane.worker]
        await asyncio.gather(*workers, return_exceptions=True)
        await self._close()

    async def _close(self) -> None:
        self.state = next_state(self.state, SessionState.CLOSED)
        self._watchdog.cancel()
        tasks = [lane.worker for lane in self._lanes.values() if lane.worker]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for lane in self._lanes.values():
            self._drop_queued(lane)
        self.context.mcp.close_soon()  # in the background: the MCP servers' goodbyes hold nothing up
        self.outbox.close()  # what it still held is in its runs' logs already
        self.cache.clear()
        self._on_closed(self)

    async def wait_idle(self) -> None:
        """Wait until every lane has finished its queued and running turns."""
        workers = [lane.worker for lane in self._lanes.values() if lane.worker and not lane.worker.done()]
        if workers:  # `wait`, not `gather`: a waiter that is cancelled must not cancel the lanes
            await asyncio.wait(workers)

    async def emit_error(self, exc: TetherError, *, stream_id: str = "", event_id: str = "") -> None:
        await send_error(self.outbox, self.services.telemetry, exc, stream_id=stream_id, event_id=event_id)

    # -- lanes ------------------------------------------------------------------------------------

    async def start(self, checked: CheckedCreate) -> None:
        """Queue a create its entry checked already (`Engine.start_run`: a stateless create)."""
        self._last_activity = self.clock.monotonic()
        await self._enqueue(checked, "", nbytes=checked.nbytes)

    async def _enqueue(self, create: request_pb2.ResponseCreateParams | CheckedCreate, event_id: str = "",
                       nbytes: int | None = None) -> None:  # fmt: skip
        params = create.params if isinstance(create, CheckedCreate) else create
        stream_id = params.stream_id
        try:
            check_stream_id(stream_id)
        except TetherError as exc:  # no valid lane to echo
            await self.emit_error(exc, event_id=event_id)
            return
        if self.state is not SessionState.OPEN:
            await self.emit_error(self._lifetime_error(), stream_id=stream_id, event_id=event_id)
            return
        lane = self._lanes.get(stream_id)
        if lane is None:
            named = sum(1 for name in self._lanes if name)
            if stream_id and named >= self.limits.max_lanes:
                await self.emit_error(
                    TetherError(
                        errors.STREAM_LIMIT_REACHED,
                        f"This WebSocket connection has reached its stream limit ({self.limits.max_lanes} stream ids).",
                        param="stream_id",
                    ),
                    stream_id=stream_id,
                    event_id=event_id,
                )
                return
            lane = self._lanes[stream_id] = Lane(stream_id)
        if len(lane.queue) >= self.limits.max_queued_responses:
            await self.emit_error(
                TetherError(
                    errors.QUEUE_FULL,
                    f"Too many queued responses on this stream (limit {self.limits.max_queued_responses}).",
                    param="stream_id" if stream_id else None,
                ),
                stream_id=stream_id,
                event_id=event_id,
            )
            return
        if nbytes is None:
            nbytes = params.ByteSize()
        try:
            self.services.queued.admit(self.tenant, self.queued_bytes, nbytes)
        except TetherError as exc:
            await self.emit_error(exc, stream_id=stream_id, event_id=event_id)
            return
        self.queued_bytes += nbytes
        lane.queue.append((create, event_id, nbytes))
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._lane_loop(lane), name=f"tether-lane-{stream_id or 'default'}")

    async def _lane_loop(self, lane: Lane) -> None:
        task = asyncio.current_task()
        assert task is not None  # the lane's worker task
        while lane.queue:
            create, event_id, nbytes = lane.queue.popleft()
            try:
                if not await self._run_one(lane, task, create, event_id, nbytes):
                    return
            finally:
                self._release(nbytes)
            self._last_activity = self.clock.monotonic()

    def _drop_queued(self, lane: Lane) -> None:
        """Forget the creates still waiting in `lane` (the connection ends), releasing their bytes."""
        while lane.queue:
            self._release(lane.queue.popleft()[2])

    def _release(self, nbytes: int) -> None:
        """A create's bytes go back to its connection, key and process (tether.core.queued)."""
        self.queued_bytes -= nbytes
        self.services.queued.release(self.tenant, nbytes)

    async def _run_one(self, lane: Lane, task: asyncio.Task, create: request_pb2.ResponseCreateParams | CheckedCreate,
                       event_id: str, nbytes: int) -> bool:  # fmt: skip
        """One create of `lane`: wait for an active slot, run its turn, then queue what its
        accepted steers continue with. False: the connection is gone, or its client is and the
        lane's later creates are not run."""
        async with self._active:
            checked, params = (create, create.params) if isinstance(create, CheckedCreate) else (None, create)
            turn = self.strategy.turn(self.context, params, lane, TurnControl(task), event_id)
            turn.size_hint = nbytes
            turn.checked = checked
            crash: TetherError | None = None
            try:
                with self.services.telemetry.turn_span(turn.facts):
                    await turn.run()
            except asyncio.CancelledError:
                # A cancel the turn did not claim: an interruption that came before it was
                # generating (the lane goes on), or the session going away.
                if turn.control.claim() is None or self.state is SessionState.CLOSED:
                    raise
                task.uncancel()
            except OutboxClosed:
                return False
            except Exception:  # noqa: BLE001 - a bug in one turn must not kill the session
                log.exception("turn crashed")
                crash = TetherError(errors.SERVER_ERROR, "The server had an error processing the request.")
                await self.emit_error(crash, stream_id=turn.stream_id)
            finally:
                self._turns.pop(turn.response_id, None)
                injects = self._take_injects(turn.response_id)
                if turn.response_run is not None:  # ended here when no terminal event did (cancelled, refused, crashed)
                    turn.response_run.close(turn.refusal or crash)
            if self._detached:
                return False
            for inject in injects:
                await self._inject_failed(inject, turn.stream_id, RESPONSE_ALREADY_COMPLETED)
            await self._after_turn(turn, self._steers.pop(turn.response_id, []))
        return True

    def _register(self, turn: Turn) -> None:
        self._turns[turn.response_id] = turn

    async def _after_turn(self, turn: Turn, steers: list[tuple[str, list[items_pb2.Item]]]) -> None:
        """Accepted steers, once their target response has ended: a successor continuing it with
        the steer input starts at once, or, when the response waits for tool output,
        `response.steer.pending` says so and the input joins the create that brings the output."""
        if not steers or not turn.response_id:
            return
        entry = self.cache.get(turn.response_id)
        if entry is None:
            return
        if entry.context_node is not None and entry.context_node.open_calls:
            turn.lane.pending_steers.setdefault(turn.response_id, []).extend(items for _, items in steers)
            required = [
                {"type": call.output_type, "call_id": call.call_id, "name": call.name}
                for call in map(call_of, (s.item for s in entry.context_node.all_segments()))
                if call is not None and call.call_id in entry.context_node.open_calls
            ]  # fmt: skip
            for steer_id, _ in steers:
                ev = events_pb2.ServerEvent(stream_id=turn.stream_id)
                pending = ev.steer_pending
                pending.steer.id, pending.steer.previous_response_id = steer_id, turn.response_id
                pending.reason = "waiting_for_required_input"
                pending.required_input_json = orjson.dumps(required).decode()
                await self.outbox.put(ev)
            return
        successor = request_pb2.ResponseCreateParams()
        successor.CopyFrom(turn.params)
        del successor.input[:]
        successor.ClearField("input_text")
        successor.ClearField("generate")
        successor.ClearField("prompt")  # expanded already: into instructions, and input now in the chain
        successor.previous_response_id = turn.response_id
        for _, items in steers:
            successor.input.extend(items)
        nbytes = successor.ByteSize()
        self.services.queued.charge(self.tenant, nbytes)  # the server's own create: not refused
        self.queued_bytes += nbytes
        turn.lane.queue.appendleft((successor, "", nbytes))

    # -- steer, append, cancel --------------------------------------------------------------------

    async def _steer(self, steer: service_pb2.SteerRequest, event_id: str = "") -> None:
        """`response.steer` (ws-mode contract 2.2): accepted for an active response of this
        connection. A response still generating is interrupted (it ends `incomplete`, reason
        `steered`) and its successor starts with the steer input; otherwise the successor starts
        when it ends, or the input waits for the tool output it stopped for. A refused steer
        returns its input in `response.steer.failed`."""
        unknown = next((i for i, item in enumerate(steer.input) if not _steer_input_item(item)), None)
        if unknown is not None:  # not what a steer may carry: the event is malformed, not refused
            await self.emit_error(
                TetherError(
                    errors.INVALID_ITEM,
                    "Steer input may hold only user messages (string, input_text, input_image or input_file "
                    "content) and function_call_output items.",
                    param=f"input[{unknown}]",
                ),
                event_id=event_id,
            )
            return
        target = steer.previous_response_id
        steer_id = ids.new_id("steer")
        turn = self._turns.get(target)
        items = list(steer.input)
        if not items and steer.HasField("input_text"):
            items = [user_message(steer.input_text)]
        problem = None
        if turn is None:
            problem = (
                (errors.RESPONSE_NOT_FOUND, f"No response with id '{target}' is active on this connection.")
                if target not in self.cache
                else (RESPONSE_ALREADY_COMPLETED, f"Response '{target}' has already completed.")
            )
        elif not items or any(i.WhichOneof("item") != "message" for i in items):  # the rest are user messages
            problem = ("invalid_input", "Steer input must be a non-empty list of user messages.")
        elif turn.params.context_management:
            problem = ("steering_not_supported", "Steering is not supported with automatic compaction.")
        elif turn.params.conversation:
            problem = ("steering_not_supported", "Steering is not supported for a response bound to a conversation.")
        ev = events_pb2.ServerEvent(stream_id=turn.stream_id if turn else "")
        if problem is not None:
            failed = ev.steer_failed
            failed.steer.id, failed.steer.previous_response_id = steer_id, target
            failed.error.type, failed.error.code, failed.error.message = "invalid_request_error", *problem
            failed.error.status = 400
            failed.input.extend(steer.input)  # the client still owns its input
            if steer.HasField("input_text"):
                failed.input_text = steer.input_text
            await self.outbox.put(ev)
            return
        self._steers.setdefault(target, []).append((steer_id, items))
        ev.steer_accepted.steer.id, ev.steer_accepted.steer.previous_response_id = steer_id, target
        await self.outbox.put(ev)
        assert turn is not None  # no problem: the turn was found
        turn.interrupt_for_steer()

    async def _inject(self, inject: service_pb2.InjectRequest, event_id: str = "") -> None:
        """`response.inject` (beta, ws-mode contract 2.3; docs/fields.md "Injecting items"): the one place an
        inject is answered. The items go into the response only while one of its agents waits for
        them, which its turn decides (`Turn.take_injected`: `response.inject.created`; a running
        multi-agent response, tether.core.multi_agent). Otherwise a response active on this
        connection answers `response.inject.failed` `response_already_completed` when it ends, a
        finished one of this connection at once, and any other id `response_not_found`; the
        failure carries the items back for a create continuing the response. An inject naming no
        response or carrying no items is malformed: `error` (400)."""
        missing = "response_id" if not inject.response_id else "input" if not inject.input else None
        if missing is not None:
            await self.emit_error(
                TetherError(errors.INVALID_REQUEST, f"response.inject needs a non-empty '{missing}'.", param=missing),
                event_id=event_id,
            )
            return
        target = inject.response_id
        turn = self._turns.get(target)
        if turn is None:
            entry = self.cache.get(target)
            if entry is None:
                await self._inject_failed(inject, "", errors.RESPONSE_NOT_FOUND)
            else:
                await self._inject_failed(inject, entry.lane, RESPONSE_ALREADY_COMPLETED)
        elif turn.take_injected(inject.input):
            ev = events_pb2.ServerEvent(stream_id=turn.stream_id)
            ev.inject_created.response_id = target
            await self.outbox.put(ev)
        else:  # answered when the response ends; held like a queued create until then
            nbytes = inject.ByteSize()
            try:
                if self._pending_injects >= self.limits.max_pending_injects:
                    raise TetherError(
                        errors.PENDING_INJECTS_FULL,
                        f"Too many injects waiting for their responses to end (limit {self.limits.max_pending_injects}).",
                        param="response_id",
                    )
                self.services.queued.admit(self.tenant, self.queued_bytes, nbytes)
            except TetherError as exc:
                await self.emit_error(exc, stream_id=turn.stream_id, event_id=event_id)
                return
            self.queued_bytes += nbytes
            self._pending_injects += 1
            self._injects.setdefault(target, []).append((inject, nbytes))

    def _take_injects(self, response_id: str) -> list[service_pb2.InjectRequest]:
        """The injects waiting for `response_id` to end, their bytes released."""
        waiting = self._injects.pop(response_id, ())
        for _, nbytes in waiting:
            self._release(nbytes)
        self._pending_injects -= len(waiting)
        return [inject for inject, _ in waiting]

    async def _inject_failed(self, inject: service_pb2.InjectRequest, stream_id: str, code: str) -> None:
        ev = events_pb2.ServerEvent(stream_id=stream_id)
        failed = ev.inject_failed
        failed.response_id = inject.response_id
        failed.error.code = code
        failed.error.message = (
            f"Response '{inject.response_id}' has already completed: send the input in a new "
            "response.create with it as previous_response_id."
            if code == RESPONSE_ALREADY_COMPLETED
            else f"No response with id '{inject.response_id}' on this connection."
        )
        failed.input.extend(inject.input)  # the client still owns its input
        await self.outbox.put(ev)

    async def _append(self, append: service_pb2.AppendRequest, event_id: str) -> None:
        """Legacy `response.append`: continue the default lane's last response with new input."""
        lane = self._lanes.get("")
        if lane is None or not lane.last_response_id:
            await self.emit_error(
                TetherError(errors.PREVIOUS_RESPONSE_NOT_FOUND, "response.append needs an earlier response on this connection.",
                            param="previous_response_id"),
                event_id=event_id,
            )
            return
        entry = self.cache.get(lane.last_response_id)
        params = request_pb2.ResponseCreateParams(model=entry.response.model if entry else "")
        if entry is not None:
            params.tools.extend(entry.response.tools)
            if entry.response.HasField("instructions"):
                params.instructions = entry.response.instructions
        params.previous_response_id = lane.last_response_id
        params.input.extend(append.input)
        params.store = entry.store if entry else False
        await self._enqueue(params, event_id)

    async def _cancel(self, response_id: str, event_id: str) -> None:
        turn = self._turns.get(response_id)
        if turn is None:
            await self.emit_error(
                TetherError(errors.RESPONSE_NOT_FOUND, f"No active response with id '{response_id}'.", param="response_id"),
                event_id=event_id,
            )
            return
        turn.control.interrupt(Outcome.CANCELLED)

    # -- lifetime ---------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not any(lane.busy for lane in self._lanes.values())

    def _lifetime_error(self) -> TetherError:
        minutes = self.limits.connection_lifetime_s / 60
        return TetherError(
            errors.CONNECTION_LIMIT_REACHED,
            LIFETIME_MESSAGE.format(minutes=f"{minutes:g}"),
        )

    async def _watch(self) -> None:
        limits = self.limits
        while True:
            check = lifetime.check(
                self.clock.monotonic(),
                opened_at=self._created,
                last_activity=self._last_activity,
                idle=self.idle,
                lifetime_s=limits.connection_lifetime_s,
                idle_timeout_s=limits.idle_timeout_s,
            )
            if check.ending is lifetime.Ending.LIFETIME:
                await self.end(self._lifetime_error(), grace=limits.lifetime_grace_s)
                return
            if check.ending is lifetime.Ending.IDLE:
                await self.end(
                    TetherError(errors.IDLE_TIMEOUT, f"Connection idle for {limits.idle_timeout_s:g} s; closing."),
                    grace=0,
                )
                return
            await self.clock.sleep(check.sleep_s)

    async def end(self, reason: TetherError, *, grace: float) -> None:
        """End the connection on the server's initiative (lifetime, idle, shutdown): stop taking
        creates, let active turns finish within `grace`, send `reason` as the last event. A
        detached session (its client gone) gives its turns `grace`, then cuts them."""
        if self._detached and self._close_task is not None:
            await finish_or_cut(self._running_turns(), reason, grace)
            await asyncio.wait({self._close_task}, timeout=1.0)  # it closes once its turns have ended
            return
        if self.state is not SessionState.OPEN:
            return
        self.state = next_state(self.state, SessionState.DRAINING)
        for lane in self._lanes.values():
            self._drop_queued(lane)
        # Past the grace the running turns are cut, so each still ends with a terminal event
        # (`response.failed` carrying `reason`'s code, which clients treat as "redo").
        pending = await finish_or_cut(self._running_turns(), reason, grace)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=1.0)
            if pending:  # a turn blocked on a full outbox: its client is not reading
                self.outbox.close()
            await asyncio.gather(*pending, return_exceptions=True)
        # Another replica may be asked to continue these responses as soon as the client sees
        # this last event: their store writes land first.
        await asyncio.gather(
            *(self.services.post.wait_durable(self.tenant, lane.last_response_id)
              for lane in self._lanes.values() if lane.last_response_id),
            return_exceptions=True,
        )
        ev = events_pb2.ServerEvent()
        ev.error.error.CopyFrom(reason.to_proto())
        self.outbox.put_nowait_final(ev)
        self.outbox.close()
        self.state = next_state(self.state, SessionState.CLOSED)
        if asyncio.current_task() is not self._watchdog:
            self._watchdog.cancel()
        self.cache.clear()
        self._on_closed(self)

    def _running_turns(self) -> dict[asyncio.Task, TurnControl | None]:
        """The lanes' running workers, each with the control of the turn it runs (None: none yet)."""
        controls = {turn.control.task: turn.control for turn in self._turns.values()}
        return {lane.worker: controls.get(lane.worker) for lane in self._lanes.values()
                if lane.worker is not None and not lane.worker.done()}  # fmt: skip


_STEER_PARTS = frozenset(("input_text", "input_image", "input_file"))


def _steer_input_item(item: items_pb2.Item) -> bool:
    """Whether a steer may carry `item` (the SDK's `ResponseSteerInput`: user messages whose content
    is a string or input_text/input_image/input_file parts, and function_call_output items). Any
    other item could not even be echoed back in `response.steer.failed`, whose `steer.input` has
    that type: such an event is malformed (an `error`), not a refused steer."""
    kind = item.WhichOneof("item")
    if kind == "function_call_output":
        return True
    if kind != "message" or item.message.role != "user":
        return False
    return all(part.WhichOneof("part") in _STEER_PARTS for part in item.message.content)
