"""What a turn may use, and nothing more: `TurnContext` (its connection's parts) and `TurnServices`
(the process-wide parts, built once by the engine). A turn holds no reference to its session or
the engine; the session builds the context, so the turn cannot reach past it.

The connection's parts that the turn shares with the session live here as small classes:
`Parents` (previous_response_id -> the connection cache, else one store read) and `Memo` (the
header tokens and model routes a connection resolves once).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tether import errors, offload, render
from tether.config import Limits, TetherConfig
from tether.core.chain import CachedResponse, ResponseCache
from tether.core.clock import Clock
from tether.core.conversations import Conversations
from tether.core.deadlines import TurnDeadlines
from tether.core.delta import Outgoing
from tether.core.outbox import CoalesceWindow, OutboxClosed
from tether.core.postinference import PostInference
from tether.core.queued import QueuedBytes
from tether.core.ratelimit import RateLimiter
from tether.core.run import ResponseRun, Runs
from tether.core.stages.route import Resolved, Router
from tether.core.telemetry import Telemetry
from tether.errors import TetherError
from tether.mcp.sessions import McpSessions
from tether.reasoning_codec import ReasoningSealer
from tether.responses.v1 import events_pb2, request_pb2, response_pb2

Hydrate = Callable[[str, str, str], Awaitable[CachedResponse | None]]  # (tenant, response id, lane)


@dataclass(frozen=True, slots=True)
class Summary:
    """A compaction's summary: its text, how many trailing items stay verbatim, and the model
    call's tokens (billed, rate-limited and counted like any other call's)."""

    text: str
    keep: int
    input_tokens: int
    output_tokens: int


# (tenant, route, context, instructions, *, ledger_id, store=, admit=, affinity=)
Summarize = Callable[..., Awaitable[Summary]]


@dataclass(frozen=True, slots=True)
class TurnServices:
    """The process-wide parts a turn uses. `config` is read as each turn runs (limits, the
    server's `accept_unknown_parameters`, prompt templates, `store_durability`)."""

    config: TetherConfig
    router: Router
    classify: Callable[[Sequence[str]], int]  # the safety stage: findings, or TetherError in block mode
    token_cache: render.TokenCache
    rate_limiter: RateLimiter
    reasoning: ReasoningSealer
    conversations: Conversations
    post: PostInference
    summarize: Summarize
    hydrate: Hydrate
    telemetry: Telemetry
    clock: Clock
    coalesce: CoalesceWindow  # the outboxes' window, widened by the streams generating now
    deadlines: TurnDeadlines  # `limits.max_turn_s` of every generating turn, on one timer
    queued: QueuedBytes  # bytes of creates pending per key and per process
    runs: Runs  # the process's response runs (tether.core.run)

    @property
    def limits(self) -> Limits:
        return self.config.limits


class Parents:
    """previous_response_id -> its state, for one connection: the connection cache first, then
    the store; a response whose terminal event is out but whose state is not cached yet is
    waited for (`finishing`)."""

    __slots__ = ("_cache", "_tenant", "_services", "_finishing")

    def __init__(self, cache: ResponseCache, tenant: str, services: TurnServices) -> None:
        self._cache = cache
        self._tenant = tenant
        self._services = services
        self._finishing: dict[str, asyncio.Future] = {}

    async def resolve(self, response_id: str, *, lane: str) -> tuple[CachedResponse | None, bool]:
        """(state, from_cache) for previous_response_id: connection cache first, then the store."""
        if not response_id:
            return None, False
        finishing = self._finishing.get(response_id)
        if finishing is not None:
            await finishing  # its terminal event is out; its state lands in the cache right after
        telemetry = self._services.telemetry
        entry = self._cache.get(response_id)
        if entry is not None:
            telemetry.cache_lookup(hit=True)
            return entry, True
        telemetry.cache_lookup(hit=False)
        entry = await self._services.hydrate(self._tenant, response_id, lane)
        if entry is None:
            raise TetherError(
                errors.PREVIOUS_RESPONSE_NOT_FOUND,
                f"Previous response with id '{response_id}' not found.",
                param="previous_response_id",
            )
        self._cache.put(entry)
        return entry, False

    def begin_finishing(self, response_id: str) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._finishing[response_id] = fut
        return fut

    def end_finishing(self, response_id: str) -> None:
        self._finishing.pop(response_id, None)


@dataclass(slots=True)
class LastHeader:
    """The instructions+tools header a connection's last create sent, kept (when it is at most
    `Memo.RETAIN_BYTES`) so that the next create, which sends the same header, neither hashes it
    nor re-adds its tools to a new Response: `source` holds it as received (to compare with),
    `key` is its memo key, `echo` the part of a Response that echoes it (instructions and tools,
    MCP credentials removed; filled by the first turn that needs it, then only copied from:
    copying one message is a single C call, re-adding ten tools one by one cost ~6 us a turn)."""

    source: request_pb2.ResponseCreateParams
    key: bytes
    echo: response_pb2.Response | None = None


class Memo:
    """Per-connection memos of the render and route stages: the instructions+tools header's token
    count (the last 8 headers), the last header itself (`LastHeader`), and each model name's route.

    Memory: digests and counts, plus the last header twice at most (as received, and its echo):
    at most 2 x `RETAIN_BYTES` per connection; a larger header is hashed again each turn instead."""

    __slots__ = ("_tenant", "_services", "_headers", "_last", "_routes")

    HEADERS = 8
    RETAIN_BYTES = 32 * 1024

    def __init__(self, tenant: str, services: TurnServices) -> None:
        self._tenant = tenant
        self._services = services
        self._headers: OrderedDict[bytes, int] = OrderedDict()
        self._last: LastHeader | None = None
        self._routes: dict[str, Resolved] = {}

    async def header(self, instructions: str | None, tools: Sequence) -> tuple[int, bool, LastHeader | None]:
        """The instructions+tools header: (its token count, was_cached, the connection's
        `LastHeader` when this header is kept as such, else None). A large header is hashed and
        tokenised off the event loop (`tether.offload`); the memo itself is only touched here.
        Each tool is serialised once: its bytes are both its share of the size and what is hashed."""
        last = self._last
        if (last is not None and last.source.HasField("instructions") is (instructions is not None)
                and last.source.instructions == (instructions or "") and last.source.tools == tools):  # fmt: skip
            count = self._headers.get(last.key)
            if count is not None:
                self._headers.move_to_end(last.key)
                return count, True, last
        blobs = [tool.SerializeToString() for tool in tools]
        size = len(instructions or "") + sum(map(len, blobs))
        key = await offload.run(size, _header_key, instructions, blobs)
        self._last = None
        if size <= self.RETAIN_BYTES:
            source = request_pb2.ResponseCreateParams()
            if instructions is not None:
                source.instructions = instructions
            source.tools.extend(tools)
            self._last = LastHeader(source, key)
        count = self._headers.get(key)
        if count is not None:
            self._headers.move_to_end(key)
            return count, True, self._last
        count = await offload.run(size, self._count_header, instructions, tools)
        self._headers[key] = count
        if len(self._headers) > self.HEADERS:
            self._headers.popitem(last=False)
        return count, False, self._last

    def _count_header(self, instructions: str | None, tools: Sequence) -> int:
        return len(self._services.token_cache.encode(self._tenant, render.render_header(instructions, list(tools))))

    def route(self, model: str) -> Resolved:
        resolved = self._routes.get(model)
        if resolved is None:
            resolved = self._services.router.resolve(model)
            self._routes[model] = resolved
        return resolved


def _header_key(instructions: str | None, blobs: list[bytes]) -> bytes:
    """The memo's key of a header: a digest of the instructions and the serialised tools, in one
    pass (SHA-256 has hardware support where blake2b has none: about half the time per byte)."""
    return hashlib.sha256(b"".join([(instructions or "").encode(), *blobs])).digest()


class EventSink(Protocol):
    """Where a turn's events go: its connection's `Outbox` (drained by the transport), or, for a
    run that is no connection's, straight into the run (`tether.core.background.RunLog`). Either
    numbers a response's events through its run (`bind`)."""

    async def put(self, event: Outgoing) -> None:
        """Raises OutboxClosed once the sink is closed."""
        ...

    def put_now(self, event: Outgoing) -> bool:
        """`put` without waiting: False, and nothing committed, when `put` would have to wait
        (a full queue). Raises OutboxClosed once the sink is closed."""
        ...

    def bind(self, run: ResponseRun) -> None: ...


@dataclass(frozen=True, slots=True)
class TurnContext:
    """A turn's view of its connection: who it serves, where its events go, the connection's
    state, and the process-wide services. `register` makes a created response reachable for
    steer and cancel."""

    tenant: str
    transport: str
    session_id: str
    outbox: EventSink
    cache: ResponseCache
    parents: Parents
    memo: Memo
    services: TurnServices
    register: Callable[[Any], None]  # (the Turn)
    mcp: McpSessions  # the connection's MCP sessions (tether.mcp.sessions), kept for its life

    @classmethod
    def of(cls, services: TurnServices, tenant: str, transport: str, session_id: str, outbox: EventSink,
           cache: ResponseCache, register: Callable[[Any], None]) -> TurnContext:  # fmt: skip
        """The context of a session's turns (or of a run that is no connection's): the parts
        that live as long as it does, made here."""
        return cls(
            tenant=tenant,
            transport=transport,
            session_id=session_id,
            outbox=outbox,
            cache=cache,
            parents=Parents(cache, tenant, services),
            memo=Memo(tenant, services),
            services=services,
            register=register,
            mcp=McpSessions(services.config.mcp, on_count=services.telemetry.mcp_sessions),
        )

    async def emit_error(self, exc: TetherError, *, stream_id: str = "", event_id: str = "") -> None:
        """An in-band `error` event (counted); dropped when the connection is gone."""
        await send_error(self.outbox, self.services.telemetry, exc, stream_id=stream_id, event_id=event_id)


async def send_error(outbox: EventSink, telemetry: Telemetry, exc: TetherError, *, stream_id: str = "",
                     event_id: str = "") -> None:  # fmt: skip
    """The one way an in-band `error` event is sent: counted, then queued (dropped once closed)."""
    telemetry.error(exc.code)
    ev = events_pb2.ServerEvent(stream_id=stream_id)
    ev.error.error.CopyFrom(exc.to_proto())
    ev.error.event_id = event_id
    try:
        await outbox.put(ev)
    except OutboxClosed:
        pass

