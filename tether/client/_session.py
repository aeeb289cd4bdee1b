"""The async client session: one per Tether server, over one connection at a time; lanes, the
tool loop and the unary RPCs.

Reconnects. A connection ends on the server's initiative (shutdown, `connection_lifetime_s`,
idle timeout), on a network failure (gRPC UNAVAILABLE), or on `ClientSession.reconnect()`.
Creates the server never started (unacknowledged or not yet sent) are resent on a new connection
with backoff, at most `RetryPolicy.max_attempts` sends each; `server_shutting_down` and
`websocket_connection_limit_reached` answering a create also resend it. A response that was
being generated when its connection ended raises `ConnectionLost` (its partial events were
already delivered, so it is not silently redone); `run_tool_loop` redoes such a turn itself.
On the new connection a chain continues through `previous_response_id`: the server loads the
parent from its store (responses created with `store=true`, the default).

How one connection routes events to creates is `tether.client._connection`; a create's stream
is `tether.client._streams`; the tool loop is `tether.client._toolloop`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc

from tether import errors
from tether.client import _toolloop
from tether.client._connection import (
    CHANNEL_OPTIONS,
    RETRYABLE_STATUS,
    Connection,
    ConnectionLost,
    RetryPolicy,
)
from tether.client._params import InputLike, ToolLike, build_params
from tether.client._streams import Pending, ResponseStream
from tether.errors import CONNECTION_LOST, TetherError
from tether.protocol.wire import TERMINAL_ARMS, bearer, error_from_rpc, open_channel
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


class ClientLane:
    """A named `stream_id` of a client session: its creates run in order, lanes run
    concurrently, all over the session's one connection. `last_response_id` is the lane's latest
    completed response (what a chained create continues)."""

    def __init__(self, session: ClientSession, name: str) -> None:
        self.session = session
        self.name = name
        self.last_response_id = ""

    def __repr__(self) -> str:
        return f"<ClientLane {self.name!r}>"

    async def create(self, model: str, input: InputLike = None, **kwargs: Any) -> ResponseStream:
        return await self.session.create(model, input, stream_id=self.name, **kwargs)

    async def warmup(self, model: str, **kwargs: Any) -> str:
        return await self.session.warmup(model, stream_id=self.name, **kwargs)

    async def run_tool_loop(self, model: str, input: InputLike = None, **kwargs: Any) -> response_pb2.Response:
        return await self.session.run_tool_loop(model, input, stream_id=self.name, **kwargs)


class ClientSession:
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
        auth = bearer(api_key) if api_key else ()
        self._metadata: tuple[tuple[str, str], ...] = (*auth, *metadata)
        self._channel = open_channel(target, tls_ca=tls_ca, tls=tls, options=channel_options)
        self.stub = service_pb2_grpc.ResponsesServiceStub(self._channel)
        self._conn: Connection | None = None
        self._conns: set[Connection] = set()
        self._connect_lock = asyncio.Lock()
        self._lanes: dict[str, ClientLane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.connections_opened = 0
        self.resent_creates = 0
        self.last_connection_error: TetherError | None = None
        self.unrouted_events: deque[events_pb2.ServerEvent] = deque(maxlen=64)

    def __repr__(self) -> str:
        return f"<tether.client.ClientSession {self.target} connections={self.connections_opened}>"

    @property
    def reconnects(self) -> int:
        """Connections opened after the first."""
        return max(0, self.connections_opened - 1)

    async def __aenter__(self) -> ClientSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- connections ------------------------------------------------------------------------------

    async def open(self, *, verify: bool = True) -> ClientSession:
        """Open the session stream now (otherwise the first create does). With `verify`, one
        cheap unary call first checks that the server answers and accepts the API key."""
        if verify:
            await self.list_models()
        await self._ensure_conn()
        return self

    async def reconnect(self) -> None:
        """Continue on a new `Session` call: responses generating on the old one finish there; new
        creates go to the new one (a chain continues from the store with store=true)."""
        async with self._connect_lock:
            if self._conn is not None:
                self._conn.retire()
            self._conn = await self._open_conn()

    async def _ensure_conn(self) -> Connection:
        if self.closed:
            raise TetherError(errors.INVALID_REQUEST, "The client session is closed.")
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        async with self._connect_lock:
            conn = self._conn
            if conn is None or not conn.usable:
                conn = self._conn = await self._open_conn()
            return conn

    async def _open_conn(self) -> Connection:
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
            conn = Connection(self, call, self.connections_opened)
            self._conns.add(conn)
            return conn

    # What a `Connection` asks of its owner (`tether.client._connection.Owner`).

    def connection_ended(self, conn: Connection) -> None:
        self._conns.discard(conn)
        if self._conn is conn:
            self._conn = None

    def connection_ending(self, conn: Connection, err: TetherError) -> None:
        self.last_connection_error = err
        log.info("tether client: connection %d ending (%s); continuing on a new one", conn.number, err.code)

    def unrouted(self, ev: events_pb2.ServerEvent) -> None:
        self.unrouted_events.append(ev)
        if ev.WhichOneof("event") == "error":
            self.last_connection_error = TetherError.from_proto(ev.error.error)

    def lane_completed(self, lane: str, response_id: str) -> None:
        self.lane(lane).last_response_id = response_id

    def resume(self, p: Pending, *, cause: TetherError) -> None:
        task = asyncio.create_task(self._resume(p, cause), name="tether-client-resume")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resume(self, p: Pending, cause: TetherError) -> None:
        """`StreamResponse` from the last sequence number the stream saw, retried (with the
        policy's backoff) while the server is unavailable; each event is fed once."""
        stream = p.stream
        for attempt in range(1, self.retry.max_attempts + 1):
            request = service_pb2.StreamResponseRequest(response_id=stream.id or "")
            if stream.last_seq >= 0:
                request.starting_after = stream.last_seq
            try:
                async for batch in self.stub.StreamResponse(request, metadata=self._metadata):
                    for ev in batch.events:
                        if ev.sequence_number <= stream.last_seq:
                            continue
                        stream._feed(ev)
                        arm = ev.WhichOneof("event")
                        if arm in TERMINAL_ARMS:
                            response = getattr(ev, arm).response
                            if response.status in ("completed", "incomplete"):
                                self.lane_completed(stream.stream_id, response.id)
                            stream.resumed += 1
                            stream._end(response=response)
                            return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE_STATUS or self.closed:
                    break
            if stream.done:
                return
            await asyncio.sleep(self.retry.delay(attempt))
        stream._end(error=cause)

    def resubmit(self, p: Pending, *, delay: float | None, cause: TetherError | None = None) -> None:
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

    async def _submit_later(self, p: Pending, delay: float) -> None:
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

    def lane(self, name: str) -> ClientLane:
        """The lane `name` ("" is the default lane)."""
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = ClientLane(self, name)
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
        stream = ResponseStream(params.stream_id, params, self._cancel)
        conn = await self._ensure_conn()
        conn.submit(stream.pending)
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

    async def _cancel(self, p: Pending) -> None:
        stream, conn = p.stream, p.carrier
        if stream.id and conn is not None and not conn.closed:
            conn.send(service_pb2.SessionRequest(cancel=service_pb2.CancelRequest(response_id=stream.id)))
            return
        if any(c.withdraw(p) for c in list(self._conns)):
            stream._end(error=TetherError(errors.CANCELLED, "The create was cancelled before it was sent."))
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
        for a function call or `tools[name](input)` for a custom (freeform) tool call (sync or
        async) and sends the outputs (`function_call_output` / `custom_tool_call_output`) with
        `previous_response_id`, until the model answers without calling a tool. Returns that
        final Response.

        `tool_specs` declares the tools to the model (default: each function in `tools` as a
        function tool, its schema derived from its signature); declare a custom tool there
        (`custom_tool(fn, format=...)` or a `{"type": "custom", ...}` dict), next to functions
        and other specs. A tool's return value is sent as text (JSON for non-strings); an exception
        is sent to the model as `"Error: ..."` unless `raise_tool_errors`. Each turn is retried
        (up to `retry.max_attempts`) when its connection is lost. Raises `ToolLoopError` after
        `max_turns` model calls or when a turn fails. Other kwargs go to every create."""
        return await _toolloop.run_tool_loop(
            self, model, input, tools=tools, tool_specs=tool_specs, max_turns=max_turns,
            previous_response_id=previous_response_id, on_event=on_event, raise_tool_errors=raise_tool_errors,
            run_sync_tools_in_thread=run_sync_tools_in_thread, create_fields=kwargs,
        )

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


class Connector:
    """`connect()`'s result: `async with connect(...) as s` or `s = await connect(...)`. The
    session (and its channel) is made when awaited, on the loop that awaits it; `open()` is
    what `connect_sync` runs on its own loop."""

    def __init__(self, make: Callable[[], ClientSession], verify: bool) -> None:
        self._make = make
        self._verify = verify
        self._session: ClientSession | None = None

    def __await__(self) -> Any:
        return self.open().__await__()

    async def open(self) -> ClientSession:
        session = self._session = self._make()
        if not self._verify:
            # Nothing on the wire yet: the first create opens the stream and meets any refusal.
            # (Opening it here would race the server's refusal of a bad key, which may end the
            # call before or after `wait_for_connection` returns: the refusal would surface
            # from connect() some runs and from the first create in others.)
            return session
        try:
            return await session.open()
        except BaseException:
            await session.aclose()
            raise

    async def __aenter__(self) -> ClientSession:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
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
) -> Connector:
    """Connect to a Tether gRPC server (`host:port`).

    >>> async with connect("127.0.0.1:50051", api_key="sk-...") as s:
    ...     stream = await s.create(model="tether-sim", input="hello")
    ...     print(await stream.text())

    With `verify` (default) the server's reachability and the API key are checked at once
    (retrying UNAVAILABLE with backoff) and the session stream is opened, so a wrong address or
    key fails here. With `verify=False` nothing is sent until the first create, which then
    reports a wrong address or key."""
    def make() -> ClientSession:
        return ClientSession(
            target, api_key=api_key, tls_ca=tls_ca, tls=tls, retry=retry, metadata=metadata, timeout_s=timeout_s
        )

    return Connector(make, verify)
