"""The engine: process-wide parts (store, backends, router, classifier, post-inference worker,
cache budget, telemetry) and the in-process implementation of `ResponsesAPI`.

It depends on the store and backend interfaces only: the composition root (`tether.server`)
opens the store, builds the backends and hands them in, with the telemetry and the turn strategy.

Transports never reach past this class: the gRPC servicer and the JSON bridge both call the
same methods, and a stateless HTTP create is a one-turn session, so there is one meaning of
"a turn" for every transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Literal, overload

from tether import errors, ids, offload, render
from tether.backends.base import Backend, BackendRequest, Finish, TextDelta
from tether.compaction_codec import effective_context, encode_payload
from tether.config import TetherConfig
from tether.core import background, multi_agent
from tether.core.chain import CacheBudget, CachedResponse, Node, segments_of
from tether.core.checked import CheckedCreate, check_create
from tether.core.clock import SYSTEM_CLOCK, Clock
from tether.core.context import Summary, TurnServices
from tether.core.conversations import Conversations, list_args, output_item
from tether.core.deadlines import TurnDeadlines
from tether.core.delta import Outgoing
from tether.core.items import request_input
from tether.core.outbox import CoalesceWindow, InlineWriter
from tether.core.outcome import Outcome, finish_or_cut
from tether.core.postinference import PostInference, PostJob
from tether.core.pump import RESPONSE_ENDS, PumpEnd, ResponseEnd, one_response
from tether.core.queued import QueuedBytes
from tether.core.ratelimit import RateLimiter
from tether.core.run import ReplayGap, ResponseRun, Runs
from tether.core.session import Session
from tether.core.shared_runs import SharedRuns, not_retained
from tether.core.slots import BackgroundSlots, per_key_cap
from tether.core.stages import fields, validate
from tether.core.stages.route import Resolved, Router
from tether.core.stages.safety import Classifier, SecretDetector
from tether.core.telemetry import Telemetry
from tether.core.turn import STANDARD_TURNS, TurnStrategy, response_skeleton
from tether.errors import TetherError
from tether.params_seal import ParamsSealer, SealError
from tether.reasoning_codec import ReasoningSealer
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, response_pb2, service_pb2
from tether.store.base import Hydrated, Store, UsageRecord
from tether.store.runbus import FINAL_STATES, RunBus

log = logging.getLogger("tether.engine")

SUMMARY_INSTRUCTIONS = (
    "Summarize the conversation so far for your own later use: the task, decisions made, files and "
    "facts learned, tool results that still matter, and what remains to do. Be concise and complete."
)
_MAX_KEPT_ITEMS = 32
# A response another replica ran has ended: how long a continuation waits for its store write
# (written after its terminal event with store_durability = "overlap").
_STORE_WRITE_WAIT_S = 5.0


class Engine:
    def __init__(self, config: TetherConfig, store: Store, backends: dict[str, Backend], *, telemetry: Telemetry,
                 strategy: TurnStrategy = STANDARD_TURNS, clock: Clock = SYSTEM_CLOCK,
                 bus: RunBus | None = None) -> None:  # fmt: skip
        """`bus`: the store engine's shared side of runs (Redis, PostgreSQL), for replicas that
        answer for each other's runs (`tether.core.shared_runs`); None keeps runs in this process."""
        self.config = config
        self.store = store
        self.backends = backends
        self.telemetry = telemetry
        self.strategy = strategy  # the kind of turn every session runs
        self.router = Router(config.models, backends, config.limits.max_input_tokens)
        self.classifier: Classifier = SecretDetector()
        self.cache_budget = CacheBudget(config.limits.cache_bytes_per_process)
        self.post = PostInference(store, on_done=telemetry.post_inference, on_failure=telemetry.post_inference_failure)
        self.conversations = Conversations(store, config.limits)
        self.reasoning = ReasoningSealer(config.server.reasoning_key)
        self.params_sealer = ParamsSealer(config.server.reasoning_key)  # MCP credentials of takeable runs
        self.rate_limiter = RateLimiter(config.limits.requests_per_minute, config.limits.tokens_per_minute)
        self.token_cache = render.TokenCache(config.limits.token_cache_bytes)
        limits = config.limits
        self.runs = Runs(
            max_events=limits.replay_max_events,
            max_bytes=limits.replay_max_bytes,
            retention_s=limits.replay_retention_s,
            max_finished=limits.replay_max_finished_runs,
            finished_bytes=limits.replay_bytes_per_process,
            background_per_tenant=limits.max_background_per_key,
            background_per_process=limits.max_background_per_process,
            clock=clock.monotonic,
            on_event=telemetry.run_event,
        )
        self.shared: SharedRuns | None = None
        if bus is not None:
            self.shared = SharedRuns(bus, orphan_after_s=limits.run_orphan_after_s, on_event=self.runs.count,
                                     on_fenced=self._fenced)  # fmt: skip
            self.runs.attach = self.shared.attach
        self._background_slots = BackgroundSlots(
            limits.max_background_running, per_key_cap(limits.max_background_running, limits.background_key_share)
        )
        self._background_tasks: dict[asyncio.Task, ResponseRun] = {}  # background runs, queued or running
        self._takeover: asyncio.Task | None = None
        self.services = TurnServices(
            config=config,
            router=self.router,
            classify=self.classify,
            token_cache=self.token_cache,
            rate_limiter=self.rate_limiter,
            reasoning=self.reasoning,
            conversations=self.conversations,
            post=self.post,
            summarize=self.summarize,
            hydrate=self.hydrate,
            telemetry=telemetry,
            clock=clock,
            coalesce=CoalesceWindow.from_limits(config.limits),
            deadlines=TurnDeadlines(config.limits.max_turn_s),
            queued=QueuedBytes(config.limits),
            runs=self.runs,
        )
        self.sessions: set[Session] = set()
        self._per_tenant: Counter[str] = Counter()
        self.sessions_closed = 0  # ever; the memory reclaimer compares it with len(sessions)
        self._stopping = False

    async def start(self) -> None:
        """Start what runs beside the sessions: the shared runs' heartbeat, cancel listener and
        takeover of queued background runs whose replica died."""
        if self.shared is not None:
            await self.shared.bus.start(self._cancel_asked)
            self._takeover = asyncio.create_task(self._take_over(), name="tether-run-takeover")

    async def _take_over(self) -> None:
        """Every poll interval, while this replica has free background slots: take over queued
        background runs of replicas that stopped heartbeating, and run them here. After a stall
        of this process past `run_orphan_after_s` (it was paused: other replicas may have ended
        or taken its runs), first check its runs in flight against the shared side
        (`SharedRuns.recheck`), so that one producing no events meanwhile stops too."""
        assert self.shared is not None
        limits = self.config.limits
        loop = asyncio.get_running_loop()
        while not self._stopping:
            before = loop.time()
            await asyncio.sleep(self.shared.poll_s)
            if loop.time() - before > limits.run_orphan_after_s:
                await self.shared.recheck(self.runs.in_flight_runs())
            queued, running = self.runs.background_counts()
            free = min(limits.max_background_running - running - queued,
                       limits.max_background_per_process - self.runs.background_total)  # fmt: skip
            if free <= 0 or self._stopping:
                continue
            try:
                claimed = await self.shared.bus.claim(free)
            except Exception as exc:  # noqa: BLE001 - the store is away: try again next time
                log.warning("taking over queued runs failed: %s", exc)
                continue
            for c in claimed:
                response = response_pb2.Response.FromString(c.response)
                response.id, response.status = c.run_id, "queued"
                run = self.runs.reserve(c.tenant, response)
                run.epoch = c.epoch  # the claim's fencing token: the old owner's writes are refused
                self.runs.count("taken_over")
                try:
                    params = self.params_sealer.open(c.tenant, c.run_id, c.params)
                except SealError:
                    log.warning("queued response %s carries MCP credentials this replica cannot open "
                                "(server.reasoning_key differs): it fails", c.run_id)  # fmt: skip
                    run.close(TetherError(errors.MCP_CREDENTIALS_UNAVAILABLE, "The replica that took this response "
                                          "over cannot open its MCP credentials (server.reasoning_key must be the "
                                          "same on every replica); send the create again."))  # fmt: skip
                    continue
                try:  # checked here as every create is where it enters: this process's limits and MCP config
                    checked = await check_create(self.services, c.tenant, params)
                except TetherError as exc:
                    run.close(exc)
                    continue
                log.info("took over queued response %s", c.run_id)
                self._spawn_background(checked, run)

    async def ready(self) -> bool:
        return not self._stopping and await self.store.ping()

    async def shutdown(self, grace: float) -> None:
        """Stop taking work, let active turns finish within `grace`, flush post-inference work."""
        self._stopping = True
        reason = TetherError(errors.SERVER_SHUTTING_DOWN, "The server is shutting down; reconnect to continue.")
        if self._takeover is not None:
            self._takeover.cancel()
        # Queued background runs stop waiting (shared: another replica takes them over; else they
        # fail). Running ones end as every turn does: `grace` to finish, then cut.
        for task, run in list(self._background_tasks.items()):
            if run.control is None:
                task.cancel()
        await asyncio.gather(*(s.end(reason, grace=grace) for s in list(self.sessions)),
                             self._end_background(reason, grace), return_exceptions=True)  # fmt: skip
        await asyncio.gather(*self._background_tasks, return_exceptions=True)
        await self.post.flush()

    async def aclose(self) -> None:
        if not self._stopping:
            await self.shutdown(grace=0)
        await self.post.aclose()
        if self.shared is not None:
            await self.shared.drain()
            await self.shared.bus.close()
        for backend in self.backends.values():
            await backend.aclose()
        await self.store.close()

    # -- sessions ---------------------------------------------------------------------------------

    async def open_session(self, tenant: str, *, transport: str) -> Session:
        """A client's connection (WebSocket, gRPC Session, a stateless HTTP create): counted
        against `max_connections_per_key`."""
        if self._stopping:
            raise TetherError(errors.SERVER_SHUTTING_DOWN, "The server is shutting down.")
        if self._per_tenant[tenant] >= self.config.limits.max_connections_per_key:
            raise TetherError(
                errors.RATE_LIMIT_EXCEEDED,
                f"Too many open connections for this API key (limit {self.config.limits.max_connections_per_key}).",
            )
        session = self._new_session(tenant, transport)
        self._per_tenant[tenant] += 1
        self.telemetry.session_opened(transport)
        return session

    def _new_session(self, tenant: str, transport: str) -> Session:
        session = Session(self.services, tenant, transport, cache_budget=self.cache_budget, strategy=self.strategy,
                          on_closed=self._session_closed)  # fmt: skip
        self.sessions.add(session)
        return session

    def _session_closed(self, session: Session) -> None:
        if session in self.sessions:
            self.sessions.discard(session)
            self.sessions_closed += 1
            self._per_tenant[session.tenant] -= 1
            self.telemetry.session_closed(session.transport)

    # -- shared stage helpers ---------------------------------------------------------------------

    def classify(self, texts: Sequence[str]) -> int:
        """Safety stage: count findings in the new items' rendered text; raise in `block` mode."""
        mode = self.config.safety.mode
        if mode == "off" or not texts:
            return 0
        findings = self.classifier.classify(texts)
        for finding in findings:
            self.telemetry.safety_finding(finding.kind)
        if findings:
            kinds = sorted({f.kind for f in findings})
            if mode == "block":
                raise TetherError(
                    errors.CONTENT_BLOCKED,
                    f"The input contains what looks like a credential ({', '.join(kinds)}); remove it and retry.",
                    param=f"input[{findings[0].index}]",
                )
            log.warning("safety findings in input", extra={"kinds": kinds, "count": len(findings)})
        return len(findings)

    async def hydrate(self, tenant: str, response_id: str, lane: str = "") -> CachedResponse | None:
        """Load a stored response as connection state: one store read, then one tokenisation.
        A response still in flight (on another connection, or in the background) is waited for,
        at most `continuation_wait_s`."""
        run = self.runs.in_flight(tenant, response_id)
        if run is not None:
            wait_s = self.config.limits.continuation_wait_s
            try:
                async with asyncio.timeout(wait_s):
                    await run.wait_settled()
            except TimeoutError:
                raise _still_in_progress(response_id, wait_s) from None
        await self.post.wait_durable(tenant, response_id)
        hydrated = await self.store.load_context(tenant, response_id)
        if hydrated is None and self.shared is not None:  # in flight on another replica?
            hydrated = await self._hydrate_shared(tenant, response_id)
        self.telemetry.hydration(hydrated is not None)
        if hydrated is None:
            return None
        keyed = [*hydrated.inputs, *hydrated.outputs]
        input_node, context = await offload.run(sum(k.item.ByteSize() for k in keyed), _stored_chain, hydrated)
        return CachedResponse(
            response=hydrated.response,
            input_node=input_node,
            context_node=context,
            lane=lane,
            store=True,
            tenant=tenant,
            nbytes=input_node.nbytes + context.nbytes,
            replica=hydrated.replica,
        )

    async def _hydrate_shared(self, tenant: str, response_id: str) -> Hydrated | None:
        """A response another replica runs: wait for it to end (at most `continuation_wait_s`,
        else 400 `previous_response_in_progress`) and for its store write (at most
        `_STORE_WRITE_WAIT_S` more), then load it; None when the store has no such run."""
        assert self.shared is not None
        info = await self.shared.info(tenant, response_id)
        if info is None:
            return None
        wait_s = self.config.limits.continuation_wait_s
        loop = asyncio.get_running_loop()
        deadline, ended_by, delay = loop.time() + wait_s, None, 0.01
        while True:
            final = info is None or info.state in FINAL_STATES
            if final:
                hydrated = await self.store.load_context(tenant, response_id)
                if hydrated is not None:
                    return hydrated
                ended_by = ended_by or min(deadline, loop.time() + _STORE_WRITE_WAIT_S)
                if loop.time() >= ended_by:
                    return None
            elif loop.time() >= deadline:
                raise _still_in_progress(response_id, wait_s)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.shared.poll_s)
            if not final:
                info = await self.shared.info(tenant, response_id)

    async def summarize(
        self,
        tenant: str,
        route: Resolved,
        context: Sequence[items_pb2.Item],
        instructions: str | None,
        *,
        ledger_id: str,
        store: bool = True,
        admit: bool = False,
        affinity: str | None = None,
    ) -> Summary:
        """Compaction: ask the backend to summarise the older items; keep the recent turn verbatim.
        `affinity`: the pool replica that holds the conversation (chain-affine routing); `tenant`:
        whose call it is (it scopes prefix-cache keys, `BackendRequest.tenant`).

        The model call is the tenant's like any other: `admit` (`POST /v1/responses/compact`)
        checks the rate limits first (429 `rate_limit_exceeded`, no model call), otherwise (a
        compaction inside a turn that was admitted) its request and input tokens are charged
        without a check; its output tokens are charged after. Its tokens (the upstream's counts
        where it reports them, else Tether's) go to `tether_tokens_total`,
        `tether_compaction_tokens_total` and, when `store`, one usage-ledger line under
        `ledger_id` with status "compaction"."""
        keep = _kept_tail(context)
        older = list(context[: len(context) - keep])
        input_tokens = await count_tokens(older)
        if admit:
            self.rate_limiter.admit(tenant, input_tokens)
        else:
            self.rate_limiter.charge(tenant, input_tokens)
        request = BackendRequest(
            model=route.upstream_model,
            instructions=SUMMARY_INSTRUCTIONS,
            items=older,
            input_tokens=input_tokens,
            affinity=affinity,
            tenant=tenant,
        )
        generated: list[str] = []
        reported = None
        stream = route.backend.stream(request)
        try:
            async for chunk in stream:
                if isinstance(chunk, TextDelta):
                    generated.append(chunk.text)
                elif isinstance(chunk, Finish):
                    reported = chunk.usage
                    break
        finally:
            await stream.aclose()
        text = "".join(generated)
        if reported is not None and reported.input_tokens is not None:
            input_tokens = reported.input_tokens
        output_tokens = (reported.output_tokens if reported is not None else None) or len(render.encode(text))
        self.rate_limiter.charge_output(tenant, output_tokens)
        self.telemetry.compaction(input_tokens, output_tokens)
        if store:
            self.post.submit(PostJob(usage=UsageRecord(
                tenant=tenant, response_id=ledger_id, model=route.model, backend=route.backend.name,
                input_tokens=input_tokens, cached_tokens=0, output_tokens=output_tokens, reasoning_tokens=0,
                status="compaction", created_at=time.time(),
            ), record=None))  # fmt: skip
        if instructions:
            text = f"Earlier instructions: {instructions}" + text
        return Summary(text, keep, input_tokens, output_tokens)

    # -- ResponsesAPI -----------------------------------------------------------------------------

    @overload
    def create(
        self, tenant: str, params: request_pb2.ResponseCreateParams, *, lazy_deltas: Literal[False] = False,
        nbytes: int | None = None, inline: InlineWriter | None = None,
    ) -> AsyncIterator[Sequence[events_pb2.ServerEvent] | ResponseEnd]: ...

    @overload
    def create(
        self, tenant: str, params: request_pb2.ResponseCreateParams, *, lazy_deltas: bool, nbytes: int | None = None,
        inline: InlineWriter | None = None,
    ) -> AsyncIterator[Sequence[Outgoing] | ResponseEnd]: ...

    async def create(
        self, tenant: str, params: request_pb2.ResponseCreateParams, *, lazy_deltas: bool = False,
        nbytes: int | None = None, inline: InlineWriter | None = None,
    ) -> AsyncIterator[Sequence[Outgoing] | ResponseEnd]:
        """A stateless create: checked at its entry (`start_run`), then run by a one-turn session
        (a connection of its key while it runs; hydrating from the store when continuing), whose
        batches end where its one response ended, followed by the `ResponseEnd` that says how
        (`tether.core.pump.one_response`: the create's one pump)."""
        session = await self.open_session(tenant, transport="http")
        params.ClearField("stream_id")
        try:
            checked = await self.start_run(tenant, params, nbytes=nbytes)
        except TetherError as exc:
            await session.close()
            yield self._refused(exc)
            return
        if inline is not None and lazy_deltas:  # deltas are `Delta` records: a JSON writer's
            session.write_inline(inline)
        end: ResponseEnd | None = None
        try:
            await session.start(checked)
            async with contextlib.aclosing(one_response(session.events(lazy_deltas=lazy_deltas))) as stream:
                async for record in stream:
                    if isinstance(record, ResponseEnd):
                        end = record
                    yield record
        finally:
            if end is not None and end.end in RESPONSE_ENDS:  # the caller may stop at the end; the turn still files its state
                await session.wait_idle()
            await session.close()  # otherwise the caller went away: cancel the generation

    async def start_run(self, tenant: str, params: request_pb2.ResponseCreateParams, *,
                        nbytes: int | None = None) -> CheckedCreate:  # fmt: skip
        """The one entry of every create that no session of the client's carries: HTTP
        `POST /v1/responses`, gRPC `CreateResponse`, a background create. Refused while the server
        stops; its params checked once, here (`tether.core.checked`; `nbytes`: their size as
        received, when the transport knows it): the turn that runs it takes them as they are, and
        a background create's Response is made from them once, at its entry."""
        if self._stopping:
            raise TetherError(errors.SERVER_SHUTTING_DOWN, "The server is shutting down.")
        return await check_create(self.services, tenant, params, nbytes)

    def _refused(self, exc: TetherError) -> ResponseEnd:
        """A create refused at its entry: its end record, counted as a turn's refusal is."""
        self.telemetry.error(exc.code)
        self.telemetry.turn_refused(exc.code)
        ev = events_pb2.ServerEvent()
        ev.error.error.CopyFrom(exc.to_proto())
        return ResponseEnd(PumpEnd.REFUSED, ev)

    async def get_response(self, tenant: str, response_id: str) -> response_pb2.Response:
        """The stored response; one in flight (or whose store write has not landed yet, or a
        background one that failed before it started) as its run has it."""
        _check_id(response_id)
        run = self.runs.get(tenant, response_id)
        if run is not None and not run.state.final:
            return run.snapshot()
        await self.post.wait_durable(tenant, response_id)
        response = await self.store.get_response(tenant, response_id)
        if response is None:
            if run is not None:
                return run.snapshot()
            if self.shared is not None and (info := await self.shared.info(tenant, response_id)) is not None:
                return self.shared.snapshot(response_id, info)  # in flight on another replica
            raise _not_found(response_id)
        return response

    # -- runs: background mode, resume, cancel -------------------------------------------------

    async def create_background(
        self, tenant: str, params: request_pb2.ResponseCreateParams
    ) -> response_pb2.Response:
        """`background: true`: check the request (`start_run`), reserve its run with its Response
        and return it `queued`; a task runs it (at most `max_background_running` at once, fairly
        shared between keys: `tether.core.slots`) with no connection (`tether.core.background`)."""
        if params.HasField("store") and not params.store:
            raise TetherError(
                errors.INVALID_REQUEST,
                "Background mode requires store=true: a background response is kept to be polled.",
                param="store",
            )
        params.ClearField("background")
        params.ClearField("stream")
        params.ClearField("stream_id")
        # Another replica that takes the run over checks the params as sent (its prompt expanded there, once).
        sent = None
        if self.shared is not None:
            sent = request_pb2.ResponseCreateParams()
            sent.CopyFrom(params)
        checked = await self.start_run(tenant, params)
        self.router.resolve(params.model)
        self.runs.admit_background(tenant)
        response = response_skeleton(params, self.services.clock.wall())
        response.status, response.background = "queued", True
        run = self.runs.reserve(tenant, response)
        if run.mirror is not None and sent is not None:  # any replica knows it once this answers, and can take it over
            run.mirror.params = self.params_sealer.publishable(tenant, run.id, sent)  # MCP credentials sealed
            await run.mirror.publish_now()
        self.runs.count("background")
        self._spawn_background(checked, run)
        return run.snapshot()

    def _spawn_background(self, checked: CheckedCreate, run: ResponseRun) -> None:
        task = asyncio.create_task(self._run_background(checked, run), name=f"tether-bg-{run.id}")
        self._background_tasks[task] = run
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background_tasks.pop(task, None)

    async def _run_background(self, checked: CheckedCreate, run: ResponseRun) -> None:
        try:
            async with self._background_slots.hold(run.tenant):
                if run.state.final:  # cancelled while queued
                    return
                if self._stopping:
                    raise TetherError(errors.SERVER_SHUTTING_DOWN, "The server is shutting down.")
                await background.run_turn(self.services, self.strategy, self.cache_budget, checked, run)
        except asyncio.CancelledError:
            if run.control is None and run.mirror is not None and not run.state.final:
                raise  # still queued, shared: another replica takes it over once this one has stopped
            run.close(TetherError(errors.SERVER_SHUTTING_DOWN, "The server shut down before the response ran."))
            raise
        except TetherError as exc:
            run.close(exc)
        except Exception:
            log.exception("background response %s failed", run.id)
            run.close(TetherError(errors.SERVER_ERROR, "The server had an error processing the request."))

    async def _end_background(self, reason: TetherError, grace: float) -> None:
        """The server stops: running background runs end as a session's turns do (`Session.end`),
        `grace` to finish, then cut (each still ends with a terminal event carrying `reason`);
        one not generating then (preparing, finishing) is cancelled."""
        await finish_or_cut({task: run.control for task, run in self._background_tasks.items() if run.control is not None},
                            reason, grace)  # fmt: skip

    async def cancel_response(self, tenant: str, response_id: str) -> response_pb2.Response:
        """Cancel a response in flight (queued or in progress) and return it `cancelled`;
        again for a cancelled one (idempotent). A response that ended otherwise is a 400."""
        _check_id(response_id)
        run = self.runs.get(tenant, response_id)
        if run is None and self.shared is not None:  # another replica's run: its owner cancels it
            info = await self.shared.info(tenant, response_id)
            if info is not None:
                if info.state not in ("queued", "in_progress"):
                    return _cancelled_or_refused(self.shared.snapshot(response_id, info))
                self.runs.count("cancelled")
                info = await self.shared.cancel(tenant, response_id, self.config.limits.continuation_wait_s)
                if info is not None:
                    return self.shared.snapshot(response_id, info)
        if run is None:
            return _cancelled_or_refused(await self.get_response(tenant, response_id))
        if run.state.final:
            return _cancelled_or_refused(run.snapshot())
        self.runs.count("cancelled")
        if _interrupt(run):
            try:
                async with asyncio.timeout(self.config.limits.continuation_wait_s):
                    await run.wait_settled()
            except TimeoutError:
                pass
        return run.snapshot()

    def _fenced(self, run: ResponseRun) -> None:
        """Another replica ended this replica's run (it took this one for dead: a pause past
        `run_orphan_after_s`) or took it over: stop generating at once, and answer for the run
        from the shared side from now on."""
        self.runs.disown(run)
        if run.state.final:
            return
        reason = TetherError(
            errors.RUN_ORPHANED,
            "Another server replica ended this response while this one was not responding; it did not finish.",
        )
        if run.control is None:  # still queued here: it never starts
            run.close(reason)
        else:
            run.control.interrupt(Outcome.CUT, reason)

    def _cancel_asked(self, tenant: str, response_id: str) -> None:
        """Another replica asked to cancel a run: this one acts when it runs it."""
        run = self.runs.get(tenant, response_id)
        if run is not None and not run.state.final:
            _interrupt(run)

    async def follow_response(self, tenant: str, response_id: str, after: int = -1) -> AsyncIterator[Sequence[Outgoing]]:
        """The events of a stored response numbered above `after` (all of them for -1), then the
        live ones until its terminal event, in batches (this subscriber's view: everything
        logged since its last batch). 404 for an unknown id; 400 `replay_unavailable` when
        its events are no longer retained (the log's bounds, or `replay_retention_s`)."""
        _check_id(response_id)
        run = self.runs.get(tenant, response_id)
        if run is None and self.shared is not None:  # another replica's run, from the shared log
            try:
                events = await self.shared.follow(tenant, response_id, after)
            except ReplayGap as exc:
                raise _gap(response_id, after, exc) from None
            if events is not None:
                self.runs.count("resumed")
                return _follow(events, response_id)
        if run is None or run.log is None:
            raise not_retained(response_id)
        try:
            run.log.since(after)
        except ReplayGap as exc:
            raise _gap(response_id, after, exc) from None
        self.runs.count("resumed")
        return _follow(run.follow(after), response_id)

    async def delete_response(self, tenant: str, response_id: str) -> service_pb2.DeleteResponseResponse:
        _check_id(response_id)
        self.runs.forget(tenant, response_id)
        await self.post.wait_durable(tenant, response_id)
        if not await self.store.delete_response(tenant, response_id):
            raise _not_found(response_id)
        return service_pb2.DeleteResponseResponse(id=response_id, deleted=True)

    async def list_input_items(
        self, tenant: str, request: service_pb2.ListInputItemsRequest
    ) -> service_pb2.ListInputItemsResponse:
        limit, order = list_args(request.limit, request.order)
        _check_id(request.response_id)
        await self.post.wait_durable(tenant, request.response_id)
        page = await self.store.list_input_items(
            tenant, request.response_id, after=request.after or None, limit=limit, order=order
        )
        if page is None:
            raise _not_found(request.response_id)
        out = service_pb2.ListInputItemsResponse(has_more=page.has_more)
        out.data.extend(page.items)
        if page.items:
            out.first_id, out.last_id = _item_id(page.items[0]), _item_id(page.items[-1])
        return out

    async def _stateless_context(
        self, tenant: str, params: request_pb2.ResponseCreateParams
    ) -> list[items_pb2.Item]:
        """The whole context of a stateless request: the stored chain plus the new input."""
        items: list[items_pb2.Item] = []
        if params.previous_response_id:
            parent = await self.hydrate(tenant, params.previous_response_id)
            if parent is None:
                raise TetherError(
                    errors.PREVIOUS_RESPONSE_NOT_FOUND,
                    f"Previous response with id '{params.previous_response_id}' not found.",
                    param="previous_response_id",
                )
            items = parent.context_node.items() if parent.context_node else []
        elif params.conversation:
            items = await self.conversations.context(tenant, params.conversation, request_input(params))
        items.extend(request_input(params))
        return items

    async def count_input_tokens(self, tenant: str, params: request_pb2.ResponseCreateParams) -> int:
        fields.check_declared(params, self.config.server.accept_unknown_parameters)
        self.config.prompts.apply(params, tenant, self.config.limits.max_request_bytes, self.config.limits.max_item_bytes)  # counted as the create would
        if params.model:
            self.router.resolve(params.model)
        items = effective_context(await self._stateless_context(tenant, params))
        instructions = params.instructions if params.HasField("instructions") else None
        header = render.render_header(instructions, list(params.tools))
        return len(await offload.run(len(header), render.encode, header)) + await count_tokens(items)

    async def compact(
        self, tenant: str, params: request_pb2.ResponseCreateParams
    ) -> service_pb2.CompactResponseResponse:
        validate.validate_params(params, self.config.limits, self.config.server.accept_unknown_parameters)
        if multi_agent.enabled(params):  # as OpenAI: compaction of a multi-agent rollout is per agent, in it
            raise TetherError(errors.UNSUPPORTED_PARAMETER, "Unsupported parameter: 'multi_agent' on "
                              "/responses/compact.", param="multi_agent")  # fmt: skip
        self.config.prompts.apply(params, tenant, self.config.limits.max_request_bytes, self.config.limits.max_item_bytes)
        route = self.router.resolve(params.model)
        context = effective_context(await self._stateless_context(tenant, params))
        instructions = params.instructions if params.HasField("instructions") else None
        out = service_pb2.CompactResponseResponse(id=ids.response_id(), created_at=int(time.time()))
        summary = await self.summarize(
            tenant, route, context, instructions, ledger_id=out.id,
            store=params.store if params.HasField("store") else True, admit=True,
        )  # fmt: skip
        item = items_pb2.Item()
        item.compaction.id = ids.compaction_id()
        item.compaction.encrypted_content = encode_payload(summary.text, summary.keep)
        out.output.extend(output_item(kept) for kept in context[len(context) - summary.keep :])
        out.output.append(item)
        out.usage.input_tokens, out.usage.output_tokens = summary.input_tokens, summary.output_tokens
        out.usage.total_tokens = summary.input_tokens + summary.output_tokens
        return out

    async def conversation_call(self, tenant: str, method: str, request):  # noqa: ANN001, ANN201
        return await self.conversations.call(tenant, method, request)

    async def list_models(self, tenant: str) -> service_pb2.ListModelsResponse:
        out = service_pb2.ListModelsResponse()
        for listed in self.router.listing():
            out.data.add(id=listed.model, created=0, owned_by=listed.owned_by)
        return out


def _stored_chain(hydrated: Hydrated) -> tuple[Node, Node]:
    """A stored response's input chain and the context after its output (tokenised)."""
    inputs, outputs = hydrated.inputs, hydrated.outputs
    input_node = Node.continue_with(None, segments_of([k.item for k in inputs], [k.key for k in inputs]))
    return input_node, Node.continue_with(input_node, segments_of([k.item for k in outputs], [k.key for k in outputs]))


async def count_tokens(items: Sequence[items_pb2.Item]) -> int:
    """Tokens of `items` rendered, counted off the event loop when they are large (tether.offload)."""
    return await offload.run(sum(i.ByteSize() for i in items), _count_tokens, items)


def _count_tokens(items: Sequence[items_pb2.Item]) -> int:
    return sum(len(render.encode(render.render_item(i))) for i in items)


def _kept_tail(context: Sequence[items_pb2.Item]) -> int:
    """How many trailing items stay verbatim: back to (and including) the last user message."""
    keep = 0
    for item in reversed(context):
        keep += 1
        if keep >= _MAX_KEPT_ITEMS:
            break
        if item.WhichOneof("item") == "message" and item.message.role == "user":
            break
    return min(keep, max(0, len(context) - 1)) if len(context) > 1 else 0


def _item_id(item: items_pb2.Item) -> str:
    arm = item.WhichOneof("item")
    return getattr(getattr(item, arm), "id", "") if arm else ""


async def _follow(batches: AsyncIterator[Sequence[Outgoing]], response_id: str) -> AsyncIterator[Sequence[Outgoing]]:
    try:
        async for batch in batches:
            yield batch
    except ReplayGap as exc:  # a reader that fell behind the log's bound
        message = f"Stream of response '{response_id}' fell behind: {exc}."
        raise TetherError(errors.REPLAY_UNAVAILABLE, message) from None


def _interrupt(run: ResponseRun) -> bool:
    """Cancel a run in flight: a queued one ends at once (False), a running one's turn is
    interrupted (True: it ends as its turn does)."""
    if run.control is None:  # queued: it never starts
        run.close(None)
        return False
    run.control.interrupt(Outcome.CANCELLED)
    return True


def _gap(response_id: str, after: int, exc: ReplayGap) -> TetherError:
    return TetherError(
        errors.REPLAY_UNAVAILABLE, f"Cannot stream response '{response_id}' from {after}: {exc}.",
        param="starting_after",
    )


def _cancelled_or_refused(response: response_pb2.Response) -> response_pb2.Response:
    """A cancel of a response that has ended: answered again when it was cancelled, else 400."""
    if response.status != "cancelled":
        raise _not_cancellable(response)
    return response


def _not_cancellable(response: response_pb2.Response) -> TetherError:
    return TetherError(
        errors.INVALID_REQUEST,
        f"Cannot cancel response '{response.id}': it has already ended (status '{response.status}').",
        param="response_id",
    )


def _still_in_progress(response_id: str, wait_s: float) -> TetherError:
    return TetherError(
        errors.PREVIOUS_RESPONSE_IN_PROGRESS,
        f"Previous response '{response_id}' is still in progress after {wait_s:g} s; continue it once it has ended.",
        param="previous_response_id",
    )


def _check_id(response_id: str) -> None:
    """404 at once for an id no response can have (`ids.well_formed`): it reaches no store key."""
    if not ids.well_formed(response_id):
        raise _not_found(response_id[:64])


def _not_found(response_id: str) -> TetherError:
    return TetherError(
        errors.RESPONSE_NOT_FOUND, f"No response found with id '{response_id}'.", param="response_id"
    )
