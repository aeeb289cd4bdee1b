"""The async client: one bidi `Session` call per connection, lanes, retries and reconnects.

How events find their create. The server runs the creates of one lane (`stream_id`) in order
and stamps every event of a response with its `response_id` and lane. The client keeps at most
one create per lane *unacknowledged* on a connection (sent, no `response.created` and no error
yet); the next create of that lane is sent when the previous one is acknowledged. So the first
event of an unknown response id on lane L acknowledges L's unacknowledged create, and an `error`
event without a response id on lane L answers it too. Lanes run concurrently; this gating only
orders the sending within one lane, which the server serialises anyway.

Reconnects. A connection ends on the server's initiative (shutdown, `connection_lifetime_s`,
idle timeout), on a network failure (gRPC UNAVAILABLE), or on `Session.reconnect()`. Creates
the server never started (unacknowledged or not yet sent) are resent on a new connection with
backoff, at most `RetryPolicy.max_attempts` sends each; `server_shutting_down` and
`websocket_connection_limit_reached` answering a create also resend it. A response that was
being generated when its connection ended raises `ConnectionLost` (its partial events were
already delivered, so it is not silently redone); `run_tool_loop` redoes such a turn itself.
On the new connection a chain continues through `previous_response_id`: the server loads the
parent from its store (responses created with `store=true`, the default).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import orjson

from tether import errors
from tether.client._params import (
    InputLike,
    ToolLike,
    build_params,
    function_call_output,
    function_calls,
    output_text,
    to_tools,
)
from tether.errors import TetherError
from tether.protocol import wire
from tether.protocol.wire import TERMINAL_ARMS, error_from_rpc, open_channel
from tether.responses.v1 import (
    events_pb2,
    items_pb2,
    request_pb2,
    response_pb2,
    service_pb2,
    service_pb2_grpc,
)

log = logging.getLogger("tether.client")

DEFAULT_TARGET = "127.0.0.1:50051"
CONNECTION_LOST = "connection_lost"
MAX_TURNS_EXCEEDED = "max_turns_exceeded"
# In-band codes that mean "this connection is going away: continue on a new one".
RETRY_CODES = frozenset({errors.SERVER_SHUTTING_DOWN, errors.CONNECTION_LIMIT_REACHED})
_CONNECTION_CODES = RETRY_CODES | {errors.IDLE_TIMEOUT}
RETRYABLE_STATUS = frozenset({grpc.StatusCode.UNAVAILABLE})

CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    *wire.CHANNEL_OPTIONS,
    # Come back quickly after a server restart (the defaults wait up to 120 s between tries).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and jitter.

    `max_attempts` bounds the sends of one create, the tries of one connect and of one unary
    call, and `run_tool_loop`'s tries of one turn."""

    max_attempts: int = 6
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed try number `attempt` (1-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** max(0, attempt - 1))
        return base * (1.0 + random.uniform(-self.jitter, self.jitter))


class ConnectionLost(TetherError):
    """The connection ended while the response was being generated. The response did not finish
    and was not stored; `reason` is the server's code when it gave one (`server_shutting_down`,
    ...). Sending the same create again (on the session, which reconnects) redoes it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(CONNECTION_LOST, message, status=503)
        self.reason = reason


class ToolLoopError(TetherError):
    """`run_tool_loop` stopped: the model still wanted tools after `max_turns` turns, or a turn
    failed. `response` is the last Response."""

    def __init__(self, code: str, message: str, response: response_pb2.Response, status: int = 500) -> None:
        super().__init__(code, message, status=status)
        self.response = response


# -- one response ---------------------------------------------------------------------------------

_END = object()


class ResponseStream:
    """The events of one create, as typed `ServerEvent` protos (`async for ev in stream`).

    Iteration ends after the terminal event (`completed`, `failed`, `incomplete`) or the `error`
    event that answered the create; it raises `ConnectionLost` (or another `TetherError`) when
    the create could not be answered at all. Events are buffered, so a stream may be read late,
    or only through `final_response()` / `text()`. One reader at a time.
    """

    def __init__(self, session: Session, stream_id: str, params: request_pb2.ResponseCreateParams) -> None:
        self._session = session
        self.stream_id = stream_id
        self.params = params
        self.id: str | None = None
        self.response: response_pb2.Response | None = None  # the terminal event's Response
        self.error: TetherError | None = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._created = asyncio.Event()
        self._ended = False
        self._error_was_event = False
        self._exhausted = False
        self._pending: _Pending | None = None
        self._conn: _Conn | None = None

    def __repr__(self) -> str:
        state = "ended" if self._ended else ("generating" if self.id else "pending")
        return f"<ResponseStream id={self.id!r} stream_id={self.stream_id!r} {state}>"

    # -- fed by the connection ------------------------------------------------------------------

    def _ack(self, response_id: str, conn: _Conn) -> None:
        self.id = response_id
        self._conn = conn
        self._created.set()

    def _feed(self, ev: events_pb2.ServerEvent) -> None:
        self._queue.put_nowait(ev)

    def _end(self, *, response: response_pb2.Response | None = None, error: TetherError | None = None,
             error_event: bool = False) -> None:
        if self._ended:
            return
        self._ended = True
        self.response, self.error, self._error_was_event = response, error, error_event
        self._created.set()
        self._queue.put_nowait(_END)

    @property
    def done(self) -> bool:
        return self._ended

    # -- reading ----------------------------------------------------------------------------------

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> events_pb2.ServerEvent:
        if self._exhausted:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _END:
            self._exhausted = True
            if self.error is not None and not self._error_was_event:
                raise self.error
            raise StopAsyncIteration
        return item

    async def wait_created(self) -> str:
        """The response id, once `response.created` arrived; raises if the create was refused."""
        await self._created.wait()
        if self.id is None:
            assert self.error is not None
            raise self.error
        return self.id

    async def final_response(self) -> response_pb2.Response:
        """Read to the end; the terminal Response (status completed, failed, incomplete or cancelled).
        Raises `TetherError` when the create was answered with an `error` event, `ConnectionLost`
        when its connection ended mid-generation."""
        async for _ in self:
            pass
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response

    async def text(self) -> str:
        """The final response's output text."""
        return output_text(await self.final_response())

    async def text_deltas(self) -> AsyncIterator[str]:
        """The output text as it streams; raises at the end if the create failed."""
        async for ev in self:
            if ev.WhichOneof("event") == "output_text_delta":
                yield ev.output_text_delta.delta
        if self.error is not None:
            raise self.error

    async def cancel(self) -> None:
        """Cancel this response (its `response.incomplete` event carries status `cancelled`); a create
        not yet sent is dropped."""
        await self._session._cancel(self)


@dataclass(eq=False)
class _Pending:
    params: request_pb2.ResponseCreateParams
    stream: ResponseStream
    attempts: int = 0  # sends so far
    cancel_requested: bool = False

    @property
    def lane(self) -> str:
        return self.params.stream_id


# -- one connection (one bidi Session call) -------------------------------------------------------


class _Conn:
    def __init__(self, session: Session, call: grpc.aio.StreamStreamCall, number: int) -> None:
        self.session = session
        self.call = call
        self.number = number
        self.unacked: dict[str, _Pending] = {}
        self.waiting: defaultdict[str, deque[_Pending]] = defaultdict(deque)
        self.active: dict[str, _Pending] = {}  # response id -> pending
        self.lane_active: defaultdict[str, deque[_Pending]] = defaultdict(deque)
        self.draining = False  # takes no new creates; closes once idle
        self.closed = False
        self.end_error: TetherError | None = None  # the server's connection-level error, if any
        self._cancelled_by_us = False
        self._outq: asyncio.Queue[service_pb2.SessionRequest] = asyncio.Queue()
        self._writer = asyncio.create_task(self._write_loop(), name=f"tether-client-write-{number}")
        self.reader = asyncio.create_task(self._read_loop(), name=f"tether-client-read-{number}")

    @property
    def usable(self) -> bool:
        return not (self.draining or self.closed)

    @property
    def idle(self) -> bool:
        return not (self.unacked or self.active or any(self.waiting.values()))

    def submit(self, p: _Pending) -> None:
        self.waiting[p.lane].append(p)
        self._pump(p.lane)

    def send(self, request: service_pb2.SessionRequest) -> None:
        if not self.closed:
            self._outq.put_nowait(request)

    def _pump(self, lane: str) -> None:
        if not self.usable or lane in self.unacked:
            return
        queue = self.waiting.get(lane)
        if not queue:
            return
        p = queue.popleft()
        self.unacked[lane] = p
        p.attempts += 1
        p.stream._conn = self
        self._outq.put_nowait(service_pb2.SessionRequest(create=p.params))

    def retire(self) -> None:
        """Take no more creates: hand the unsent ones back to the session, close once idle."""
        if self.draining:
            return
        self.draining = True
        for queue in self.waiting.values():
            while queue:
                self.session._resubmit(queue.popleft(), delay=0.0)
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self.draining and self.idle and not self.closed:
            self.cancel()

    def cancel(self) -> None:
        self._cancelled_by_us = True
        self.call.cancel()

    async def _write_loop(self) -> None:
        try:
            while True:
                request = await self._outq.get()
                await self.call.write(request)
        except asyncio.CancelledError:
            return
        except Exception:  # noqa: BLE001 - the call ended (AioRpcError, UsageError, ...): the reader reports why
            return

    async def _read_loop(self) -> None:
        error: TetherError | None = None
        retryable = True
        try:
            while True:
                message = await self.call.read()
                if message is grpc.aio.EOF:
                    break
                for ev in message.events:
                    self._dispatch(ev)
        except grpc.aio.AioRpcError as exc:
            if not (self._cancelled_by_us and exc.code() == grpc.StatusCode.CANCELLED):
                error = error_from_rpc(exc)
                retryable = exc.code() in RETRYABLE_STATUS
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - a dispatch bug must not leave streams hanging
            log.exception("tether client: reading the session failed")
            error = TetherError(errors.SERVER_ERROR, "The client failed to read the session.", status=500)
            retryable = False
        finally:
            self._ended(error, retryable)

    # -- routing ----------------------------------------------------------------------------------

    def _dispatch(self, ev: events_pb2.ServerEvent) -> None:
        arm = ev.WhichOneof("event")
        lane = ev.stream_id
        rid = ev.response_id
        if rid:
            p = self.active.get(rid)
            if p is None:
                p = self.unacked.pop(lane, None)
                if p is None:
                    self.session._unrouted(ev)
                    return
                self.active[rid] = p
                self.lane_active[lane].append(p)
                p.stream._ack(rid, self)
                if p.cancel_requested:
                    self.send(service_pb2.SessionRequest(cancel=service_pb2.CancelRequest(response_id=rid)))
                self._pump(lane)
            p.stream._feed(ev)
            if arm in TERMINAL_ARMS:
                response = getattr(ev, arm).response
                del self.active[rid]
                with contextlib.suppress(ValueError):
                    self.lane_active[lane].remove(p)
                if response.status in ("completed", "incomplete"):
                    self.session.lane(lane).last_response_id = rid
                if arm == "failed" and response.error.code in RETRY_CODES:
                    # The server ended the connection mid-generation: the turn is to be redone.
                    p.stream._end(error=ConnectionLost(response.error.code, response.error.message))
                else:
                    p.stream._end(response=response)
                self._close_if_idle()
            return
        if arm != "error":
            self.session._unrouted(ev)  # steer events and future connection-scoped events
            return
        err = TetherError.from_proto(ev.error.error)
        p = self.unacked.get(lane)
        if err.code in _CONNECTION_CODES:
            self.end_error = err
            if p is not None and err.code in RETRY_CODES:
                del self.unacked[lane]
                self.session._resubmit(p, delay=None)  # never started here: send it elsewhere
            self.retire()
            self.session._connection_notice(self, err)
            return
        if p is None and self.lane_active.get(lane):
            p = self.lane_active[lane][0]  # an error after `created` (a crashed turn)
            self.lane_active[lane].popleft()
            self.active.pop(p.stream.id or "", None)
        elif p is not None:
            del self.unacked[lane]
        if p is None:
            self.session._unrouted(ev)
            return
        p.stream._feed(ev)
        p.stream._end(error=err, error_event=True)
        self._pump(lane)
        self._close_if_idle()

    def _ended(self, error: TetherError | None, retryable: bool) -> None:
        self.closed = True
        self._writer.cancel()
        session = self.session
        reason = self.end_error or error
        unsent = [*self.unacked.values(), *(p for q in self.waiting.values() for p in q)]
        self.unacked.clear()
        self.waiting.clear()
        for p in unsent:
            if session.closed:
                p.stream._end(error=ConnectionLost(CONNECTION_LOST, "The client session was closed."))
            elif retryable:
                session._resubmit(p, delay=None, cause=reason)
            else:
                p.stream._end(error=error or ConnectionLost(CONNECTION_LOST, "The connection ended."))
        if self.active:
            code = reason.code if reason else CONNECTION_LOST
            message = (
                "The client session was closed." if session.closed
                else f"The connection ended while the response was generating ({reason.message if reason else 'no reason given'})."
            )
            for p in list(self.active.values()):
                p.stream._end(error=ConnectionLost(code, message))
            self.active.clear()
            self.lane_active.clear()
        session._conn_ended(self)


# -- lanes ----------------------------------------------------------------------------------------


class Lane:
    """A named `stream_id` of the session: its creates run in order, lanes run concurrently,
    all over the session's one connection. `last_response_id` is the lane's latest completed
    response (what a chained create continues)."""

    def __init__(self, session: Session, name: str) -> None:
        self.session = session
        self.name = name
        self.last_response_id = ""

    def __repr__(self) -> str:
        return f"<Lane {self.name!r}>"

    async def create(self, model: str, input: InputLike = None, **kwargs: Any) -> ResponseStream:
        return await self.session.create(model, input, stream_id=self.name, **kwargs)

    async def warmup(self, model: str, **kwargs: Any) -> str:
        return await self.session.warmup(model, stream_id=self.name, **kwargs)

    async def run_tool_loop(self, model: str, input: InputLike = None, **kwargs: Any) -> response_pb2.Response:
        return await self.session.run_tool_loop(model, input, stream_id=self.name, **kwargs)


# -- the session ----------------------------------------------------------------------------------


class Session:
    """A client of one Tether gRPC server: the persistent session (creates, lanes, tool loops)
    plus the unary RPCs. Use `connect()`; close with `aclose()` or `async with`."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        api_key: str | None = None,
        tls_ca: str | None = None,
        tls: bool = False,
        retry: RetryPolicy | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        timeout_s: float | None = 60.0,
        channel_options: Sequence[tuple[str, Any]] = CHANNEL_OPTIONS,
    ) -> None:
        """`tls_ca`: PEM file of the roots to trust (implies TLS); `tls=True` alone uses the
        system roots. `metadata`: extra call metadata (e.g. `traceparent`). `timeout_s`: the
        deadline of unary calls."""
        self.target = target
        self.retry = retry or RetryPolicy()
        self.timeout_s = timeout_s
        auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._metadata: tuple[tuple[str, str], ...] = (*auth, *metadata)
        self._channel = open_channel(target, tls_ca=tls_ca, tls=tls, options=channel_options)
        self.stub = service_pb2_grpc.ResponsesServiceStub(self._channel)
        self._conn: _Conn | None = None
        self._conns: set[_Conn] = set()
        self._connect_lock = asyncio.Lock()
        self._lanes: dict[str, Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.connections_opened = 0
        self.resent_creates = 0
        self.last_connection_error: TetherError | None = None
        self.unrouted: deque[events_pb2.ServerEvent] = deque(maxlen=64)

    def __repr__(self) -> str:
        return f"<tether.client.Session {self.target} connections={self.connections_opened}>"

    @property
    def reconnects(self) -> int:
        """Connections opened after the first."""
        return max(0, self.connections_opened - 1)

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- connections ------------------------------------------------------------------------------

    async def open(self, *, verify: bool = True) -> Session:
        """Open the session stream now (otherwise the first create does). With `verify`, one
        cheap unary call first checks that the server answers and accepts the API key."""
        if verify:
            await self.list_models()
        await self._ensure_conn()
        return self

    async def reconnect(self) -> None:
        """Continue on a new Session call: responses generating on the old one finish there; new
        creates go to the new one (a chain continues from the store with store=true)."""
        async with self._connect_lock:
            if self._conn is not None:
                self._conn.retire()
            self._conn = await self._open_conn()

    async def _ensure_conn(self) -> _Conn:
        if self.closed:
            raise TetherError(errors.INVALID_REQUEST, "The client session is closed.", status=400)
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        async with self._connect_lock:
            conn = self._conn
            if conn is None or not conn.usable:
                conn = self._conn = await self._open_conn()
            return conn

    async def _open_conn(self) -> _Conn:
        attempt = 0
        while True:
            attempt += 1
            call = self.stub.Session(metadata=self._metadata)
            try:
                await call.wait_for_connection()
            except grpc.aio.AioRpcError as exc:
                if exc.code() in RETRYABLE_STATUS and attempt < self.retry.max_attempts and not self.closed:
                    await asyncio.sleep(self.retry.delay(attempt))
                    continue
                raise error_from_rpc(exc) from None
            self.connections_opened += 1
            conn = _Conn(self, call, self.connections_opened)
            self._conns.add(conn)
            return conn

    def _conn_ended(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        if self._conn is conn:
            self._conn = None

    def _connection_notice(self, conn: _Conn, err: TetherError) -> None:
        self.last_connection_error = err
        log.info("tether client: connection %d ending (%s); continuing on a new one", conn.number, err.code)

    def _unrouted(self, ev: events_pb2.ServerEvent) -> None:
        self.unrouted.append(ev)
        if ev.WhichOneof("event") == "error":
            self.last_connection_error = TetherError.from_proto(ev.error.error)

    def _resubmit(self, p: _Pending, *, delay: float | None, cause: TetherError | None = None) -> None:
        """Send `p` on a (new) connection, after `delay` (None: the backoff for its attempts)."""
        if p.stream.done:
            return
        if p.attempts >= self.retry.max_attempts:
            p.stream._end(error=cause or ConnectionLost(CONNECTION_LOST, "Too many attempts to send the create."))
            return
        if p.attempts:
            self.resent_creates += 1
        wait = self.retry.delay(p.attempts) if delay is None else delay
        task = asyncio.create_task(self._submit_later(p, wait), name="tether-client-resend")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit_later(self, p: _Pending, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        if p.stream.done:
            return
        try:
            conn = await self._ensure_conn()
        except TetherError as exc:
            p.stream._end(error=exc)
            return
        conn.submit(p)

    # -- creates ----------------------------------------------------------------------------------

    def lane(self, name: str) -> Lane:
        """The lane `name` ("" is the default lane)."""
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = Lane(self, name)
        return lane

    async def create(
        self,
        model: str,
        input: InputLike = None,
        *,
        previous_response_id: str | None = None,
        tools: Iterable[ToolLike] | Mapping[str, Callable[..., Any]] | None = None,
        store: bool | None = None,
        stream_id: str | None = None,
        instructions: str | None = None,
        params: request_pb2.ResponseCreateParams | None = None,
        **fields: Any,
    ) -> ResponseStream:
        """Send a `response.create`; returns its event stream at once (events are buffered).

        `input`: a string, `Item` protos and/or JSON item dicts. `tools`: `Tool` protos, JSON
        dicts, functions, or `{name: function}`. Other create fields by their JSON names
        (`tool_choice`, `reasoning={"effort": "low"}`, `max_output_tokens`, `metadata`, `include`,
        `generate`, ...). `params`: a ready `ResponseCreateParams` instead of all of that."""
        if params is None:
            params = build_params(
                model, input, tools=tools, previous_response_id=previous_response_id, store=store,
                stream_id=stream_id, instructions=instructions, **fields,
            )
        stream = ResponseStream(self, params.stream_id, params)
        p = _Pending(params, stream)
        stream._pending = p
        conn = await self._ensure_conn()
        conn.submit(p)
        return stream

    async def warmup(
        self,
        model: str,
        *,
        tools: Iterable[ToolLike] | Mapping[str, Callable[..., Any]] | None = None,
        instructions: str | None = None,
        input: InputLike = None,
        **kwargs: Any,
    ) -> str:
        """WebSocket-mode warm-up (`generate: false`): the server prepares the instructions,
        tools and input (rendered, tokenised, cached on this connection) without calling the
        model. Returns the response id to continue from with `previous_response_id`."""
        stream = await self.create(model, input, tools=tools, instructions=instructions, generate=False, **kwargs)
        return (await stream.final_response()).id

    async def _cancel(self, stream: ResponseStream) -> None:
        p = stream._pending
        if stream.done or p is None:
            return
        conn = stream._conn
        if stream.id and conn is not None and not conn.closed:
            conn.send(service_pb2.SessionRequest(cancel=service_pb2.CancelRequest(response_id=stream.id)))
            return
        for c in list(self._conns):
            queue = c.waiting.get(p.lane)
            if queue and p in queue:
                queue.remove(p)
                stream._end(error=TetherError(errors.CANCELLED, "The create was cancelled before it was sent.", status=499))
                return
        p.cancel_requested = True  # sent, not acknowledged yet: cancel when `created` arrives

    async def run_tool_loop(
        self,
        model: str,
        input: InputLike = None,
        *,
        tools: Mapping[str, Callable[..., Any]],
        tool_specs: Iterable[ToolLike] | None = None,
        max_turns: int = 16,
        previous_response_id: str | None = None,
        on_event: Callable[[events_pb2.ServerEvent], Any] | None = None,
        raise_tool_errors: bool = False,
        run_sync_tools_in_thread: bool = True,
        **kwargs: Any,
    ) -> response_pb2.Response:
        """Run an agent loop: the model calls tools, this client runs `tools[name](**arguments)`
        (sync or async) and sends the outputs with `previous_response_id`, until the model answers
        without calling a tool. Returns that final Response.

        `tool_specs` declares the tools to the model (default: derived from the functions'
        signatures). A tool's return value is sent as text (JSON for non-strings); an exception
        is sent to the model as `"Error: ..."` unless `raise_tool_errors`. Each turn is retried
        (up to `retry.max_attempts`) when its connection is lost. Raises `ToolLoopError` after
        `max_turns` model calls or when a turn fails. Other kwargs go to every create."""
        specs = to_tools(tool_specs if tool_specs is not None else tools)
        next_input: InputLike = input
        previous = previous_response_id
        response: response_pb2.Response | None = None
        for _turn in range(max_turns):
            response = await self._turn(model, next_input, previous, specs, on_event, kwargs)
            if response.status == "failed":
                raise ToolLoopError(
                    response.error.code or errors.SERVER_ERROR,
                    response.error.message or "The response failed.",
                    response,
                )
            calls = function_calls(response)
            if not calls:
                return response
            outputs = await asyncio.gather(
                *(self._run_tool(tools, call, raise_tool_errors, run_sync_tools_in_thread) for call in calls)
            )
            next_input = [function_call_output(call.call_id, out) for call, out in zip(calls, outputs, strict=True)]
            previous = response.id
        assert response is not None
        raise ToolLoopError(
            MAX_TURNS_EXCEEDED, f"The model still called tools after {max_turns} turns.", response, status=400
        )

    async def _turn(
        self,
        model: str,
        input: InputLike,
        previous: str | None,
        specs: list[request_pb2.Tool],
        on_event: Callable[[events_pb2.ServerEvent], Any] | None,
        kwargs: dict[str, Any],
    ) -> response_pb2.Response:
        attempt = 0
        while True:
            attempt += 1
            stream = await self.create(model, input, previous_response_id=previous, tools=specs, **kwargs)
            try:
                if on_event is None:
                    return await stream.final_response()
                async for ev in stream:
                    result = on_event(ev)
                    if inspect.isawaitable(result):
                        await result
                return await stream.final_response()
            except ConnectionLost:
                if attempt >= self.retry.max_attempts or self.closed:
                    raise
                await asyncio.sleep(self.retry.delay(attempt))

    @staticmethod
    async def _run_tool(
        tools: Mapping[str, Callable[..., Any]],
        call: items_pb2.FunctionCall,
        raise_errors: bool,
        in_thread: bool,
    ) -> str:
        fn = tools.get(call.name)
        if fn is None:
            if raise_errors:
                raise KeyError(f"the model called an unknown tool {call.name!r}")
            return f"Error: no tool named {call.name!r}."
        try:
            args: Any = orjson.loads(call.arguments) if call.arguments.strip() else {}
        except orjson.JSONDecodeError:
            args = call.arguments

        def invoke() -> Any:
            return fn(**args) if isinstance(args, dict) else fn(args)

        try:
            if inspect.iscoroutinefunction(fn) or not in_thread:
                result = invoke()
            else:
                result = await asyncio.to_thread(invoke)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            if raise_errors:
                raise
            return f"Error: {type(exc).__name__}: {exc}"
        if isinstance(result, str):
            return result
        return orjson.dumps(result, default=str).decode()

    # -- unary RPCs -------------------------------------------------------------------------------

    async def _unary(self, method: Any, request: Any) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                return await method(request, metadata=self._metadata, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in RETRYABLE_STATUS and attempt < self.retry.max_attempts and not self.closed:
                    await asyncio.sleep(self.retry.delay(attempt))
                    continue
                raise error_from_rpc(exc) from None

    async def get(self, response_id: str) -> response_pb2.Response:
        """A stored response (`GET /v1/responses/{id}`)."""
        reply = await self._unary(self.stub.GetResponse, service_pb2.GetResponseRequest(response_id=response_id))
        return reply.response

    async def delete(self, response_id: str) -> bool:
        """Delete a stored response; True when it was deleted (a missing id raises 404)."""
        request = service_pb2.DeleteResponseRequest(response_id=response_id)
        return (await self._unary(self.stub.DeleteResponse, request)).deleted

    async def list_input_items(
        self, response_id: str, *, after: str | None = None, limit: int | None = None, order: str | None = None
    ) -> service_pb2.ListInputItemsResponse:
        """One page of a stored response's input items (`data`, `has_more`, `last_id`)."""
        request = service_pb2.ListInputItemsRequest(
            response_id=response_id, after=after or "", limit=limit or 0, order=order or ""
        )
        return await self._unary(self.stub.ListInputItems, request)

    async def iter_input_items(self, response_id: str, *, order: str = "asc", page_size: int = 100) -> AsyncIterator[items_pb2.Item]:
        """Every input item of a stored response, page by page."""
        after: str | None = None
        while True:
            page = await self.list_input_items(response_id, after=after, limit=page_size, order=order)
            for item in page.data:
                yield item
            if not page.has_more or not page.last_id:
                return
            after = page.last_id

    async def count_input_tokens(self, model: str = "", input: InputLike = None, **fields: Any) -> int:
        """Tokens the input would take (instructions, tools, the stored chain and new input)."""
        params = build_params(model, input, **fields) if model else _params_without_model(input, fields)
        request = service_pb2.CountInputTokensRequest(params=params)
        return (await self._unary(self.stub.CountInputTokens, request)).input_tokens

    async def compact(self, model: str, input: InputLike = None, **fields: Any) -> service_pb2.CompactResponseResponse:
        """A compacted window of the conversation (`previous_response_id` and/or `input`), to
        send as the input of a new chain."""
        request = service_pb2.CompactResponseRequest(params=build_params(model, input, **fields))
        return await self._unary(self.stub.CompactResponse, request)

    async def list_models(self) -> list[service_pb2.Model]:
        """The routable model names."""
        return list((await self._unary(self.stub.ListModels, service_pb2.ListModelsRequest())).data)

    # -- closing ----------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Cancel what is still generating and close the channel."""
        if self.closed:
            return
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        readers = []
        for conn in list(self._conns):
            conn.cancel()
            readers.append(conn.reader)
        await asyncio.gather(*self._tasks, *readers, return_exceptions=True)
        await self._channel.close()


def _params_without_model(input: InputLike, fields: dict[str, Any]) -> request_pb2.ResponseCreateParams:
    params = build_params("-", input, **fields)
    params.model = ""
    return params


class _Connector:
    """`connect()`'s result: `async with connect(...) as s` or `s = await connect(...)`."""

    def __init__(self, session: Session, verify: bool) -> None:
        self._session = session
        self._verify = verify

    def __await__(self) -> Any:
        return self._open().__await__()

    async def _open(self) -> Session:
        try:
            return await self._session.open(verify=self._verify)
        except BaseException:
            await self._session.aclose()
            raise

    async def __aenter__(self) -> Session:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        await self._session.aclose()


def connect(
    target: str = DEFAULT_TARGET,
    *,
    api_key: str | None = None,
    tls_ca: str | None = None,
    tls: bool = False,
    retry: RetryPolicy | None = None,
    metadata: Sequence[tuple[str, str]] = (),
    timeout_s: float | None = 60.0,
    verify: bool = True,
) -> _Connector:
    """Connect to a Tether gRPC server (`host:port`).

    >>> async with connect("127.0.0.1:50051", api_key="sk-...") as s:
    ...     stream = await s.create(model="tether-sim", input="hello")
    ...     print(await stream.text())

    With `verify` (default) the server's reachability and the API key are checked at once
    (retrying UNAVAILABLE with backoff), so a wrong address or key fails here."""
    session = Session(
        target, api_key=api_key, tls_ca=tls_ca, tls=tls, retry=retry, metadata=metadata, timeout_s=timeout_s
    )
    return _Connector(session, verify)
