"""HTTP endpoints of the bridge (raw ASGI, no framework).

Each handler takes an `HttpRequest` and either sends its response or raises `TetherError`; the
app renders every error the same way (`common.http_error_body`). Create streams SSE frames
(`event: <type>\\ndata: <json>\\n\\n`, the flat SSE `error` shape; `data: [DONE]` after the event that
ended the stream) or collects the final Response
(HTTP 200 also for a failed response: the failure is in the body, with `Retry-After` when the
upstream rate-limited it). The API's `create` streams the create's batches and then its end
record (`tether.core.pump.ResponseEnd`, pumped in the core), which says how the one response
ended and whether it was refused: this module only writes and reads it. A request error of a
create is that record (`REFUSED`, no batch before it), or is raised by the API's `create` (a
refusal at admission: too many connections for the key, shutting down; over gRPC, the call's
status), before anything is sent, so it still becomes a proper HTTP status. Errors answered here are counted once
(`BridgeContext.count_error`). A client that disconnects cancels its create (the generator is closed, which cancels the
generation in the core).

Background mode and runs (docs/background.md): a create with `background: true` returns its
Response `queued` at once (or, with `stream: true`, streams its events as they come);
`GET /v1/responses/{id}?stream=true&starting_after=N` streams a stored response's events numbered
above N (all of them without N) and then the live ones until its terminal event;
`POST /v1/responses/{id}/cancel` cancels one in flight. A bridge forwarding to a remote engine
passes all three on over gRPC.

Query parameters OpenAI defines but Tether does not implement are accepted and ignored:
`GET /v1/responses/{id}` ignores `include`/`include[]` and `include_obfuscation`; `input_items`
and `conversations/{id}/items` ignore `include` (items are always returned whole).

`/v1/conversations` handlers only translate: the conversation RPCs (`ResponsesAPI.conversation_call`,
by RPC name) do the work, so the gRPC service answers the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from tether import offload
from tether.bridge import common
from tether.bridge.common import BridgeContext, Receive, Send
from tether.bridge.origin import check_json_body
from tether.config import Limits
from tether.core.delta import Delta, Outgoing
from tether.core.pump import PumpEnd, ResponseEnd, deliver
from tether.core.run import LogBatch
from tether.errors import (
    INVALID_REQUEST,
    INVALID_TYPE,
    REQUEST_TIMEOUT,
    SERVER_ERROR,
    UPGRADE_REQUIRED,
    TetherError,
)
from tether.observability import tracing
from tether.observability.metrics_http import metrics_response
from tether.protocol import json_codec
from tether.protocol.wire import SSE_DONE, TERMINAL_ARMS
from tether.responses.v1 import service_pb2

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class ClientGone(Exception):
    """The client closed the connection before we answered."""


@dataclass
class HttpRequest:
    scope: dict[str, Any]
    receive: Receive
    send: Send
    path_params: dict[str, str]
    tenant: str = ""
    # A body chunk of a started response written at once (`h11_transport.body_writer`), or None.
    body_now: Callable[[bytes], bool] | None = None

    @property
    def headers(self) -> Iterable[tuple[bytes, bytes]]:
        return self.scope["headers"]

    def query(self) -> dict[str, str]:
        """Last value of each query parameter."""
        raw = self.scope.get("query_string", b"").decode("latin-1")
        return {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}

    async def body(self, limit: int, within_s: float | None = None) -> bytes:
        """The whole body, at most `limit` bytes, received within `within_s` seconds (a client
        trickling its body is a slow-loris: 408 `request_timeout`)."""
        length = common.header(self.headers, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise common.too_large(limit)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(within_s):
                while True:
                    message = await self.receive()
                    if message["type"] == "http.disconnect":
                        raise ClientGone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise common.too_large(limit)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            raise TetherError(
                REQUEST_TIMEOUT,
                f"The request body was not received within {within_s:g} s.",
            ) from None


async def send_json(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, err: TetherError, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    extra = list(headers)
    extra.extend(common.retry_after_headers(err.retry_after))
    if err.status == 401:
        extra.append((b"www-authenticate", b"Bearer"))
    await send_json(send, err.status, common.http_error_body(err), extra)


class HttpHandlers:
    """The `/v1` endpoints plus health. Handlers raise `TetherError`; the app renders it."""

    def __init__(self, ctx: BridgeContext) -> None:
        self.ctx = ctx

    async def _json_body(self, req: HttpRequest) -> bytes:
        """The body of a JSON POST: bounded in size and time, and refused (415) unless it says
        it is JSON (a browser's `text/plain` "simple request" never reaches the API)."""
        body = await req.body(self.ctx.limits.max_request_bytes, self.ctx.server.http_body_timeout_s)
        check_json_body(req.headers, body)
        return body

    async def _params(self, req: HttpRequest) -> tuple[Any, int]:
        """The create's params and the size of its body."""
        body = await self._json_body(req)
        return await offload.run(len(body), _decode_params, body, self.ctx.limits), len(body)  # a large body off the loop

    # POST /v1/responses
    async def create(self, req: HttpRequest) -> None:
        params, nbytes = await self._params(req)
        common.check_multi_agent_beta(params, common.has_multi_agent_beta(req.headers))
        stream = params.HasField("stream") and params.stream
        tracing.adopt_parent(req.headers)
        if params.HasField("background") and params.background:
            response = await self.ctx.api.create_background(req.tenant, params)
            if stream:
                await self._follow(req, response.id, -1)
            else:
                await send_json(req.send, 200, json_codec.dumps(json_codec.response_to_json(response)))
            return
        # A streamed create's deltas may be written by their producer (`_SseWriter.write_now`).
        sse = _SseWriter(req.send, req.body_now) if stream else None
        # Its batches, then the record of how its one response ended (refused, terminal...): pumped in the core.
        source = self.ctx.api.create(req.tenant, params, lazy_deltas=stream, nbytes=nbytes, inline=sse)
        async with _cancel_on_disconnect(req.receive) as watch:
            try:
                if sse is not None:
                    await self._stream_sse(req, source, watch, writer=sse)
                else:
                    body, retry_after = _final_response(await deliver(source, _DISCARD))
                    watch.finishing()
                    await send_json(req.send, 200, body, common.retry_after_headers(retry_after or None))
            finally:
                await _aclose(source)

    async def _stream_sse(
        self,
        req: HttpRequest,
        source: AsyncIterator[Sequence[Outgoing] | ResponseEnd],
        watch: _DisconnectWatch,
        *,
        started: bool = False,
        writer: _SseWriter | None = None,
    ) -> None:
        """`source` as SSE (with `writer`, the one its producer may write to as well): a
        create's batches up to its end record, or a followed run's. The headers go out with the
        first event (a refused create is answered with its error's HTTP status instead), or at
        once with `started` (a run followed by id)."""
        writer = writer or _SseWriter(req.send)
        if started:
            await writer.start()
        try:
            end = await deliver(source, writer)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not writer.started:  # nothing is out yet: the error is the answer's status
                raise
            err = common.as_tether_error(exc)  # the headers are out: report in-band, as the core would
            self.ctx.count_error(err)
            await writer.write((common.error_event(err),))
        else:
            if end.end is PumpEnd.REFUSED:
                assert end.error is not None
                raise common.InBandError.from_proto(end.error)
            await writer.start()  # a stream that ended without any event
        watch.finishing()
        await req.send({"type": "http.response.body", "body": writer.closing(), "more_body": False})

    # GET /v1/responses (without an upgrade)
    async def upgrade_required(self, req: HttpRequest) -> None:
        err = TetherError(
            UPGRADE_REQUIRED,
            "GET /v1/responses is the WebSocket endpoint: send an `Upgrade: websocket` request, "
            "or POST /v1/responses for HTTP.",
        )
        self.ctx.count_error(err)
        await send_error(req.send, err, [(b"upgrade", b"websocket"), (b"connection", b"Upgrade")])

    # GET /v1/responses/{id}[?stream=true&starting_after=N]
    async def retrieve(self, req: HttpRequest) -> None:
        q = req.query()
        if q.get("stream", "").lower() == "true":
            after = _int_param(q, "starting_after") if q.get("starting_after", "") != "" else -1
            await self._follow(req, req.path_params["id"], after)
            return
        resp = await self.ctx.api.get_response(req.tenant, req.path_params["id"])
        await send_json(req.send, 200, json_codec.dumps(json_codec.response_to_json(resp)))

    async def _follow(self, req: HttpRequest, response_id: str, after: int) -> None:
        """SSE: a run's events numbered above `after`, then the live ones until its end."""
        source = await self.ctx.api.follow_response(req.tenant, response_id, after)  # batches
        async with _cancel_on_disconnect(req.receive) as watch:
            try:
                await self._stream_sse(req, source, watch, started=True, writer=_SseWriter(req.send, req.body_now))
            finally:
                await _aclose(source)

    # POST /v1/responses/{id}/cancel
    async def cancel(self, req: HttpRequest) -> None:
        resp = await self.ctx.api.cancel_response(req.tenant, req.path_params["id"])
        await send_json(req.send, 200, json_codec.dumps(json_codec.response_to_json(resp)))

    # DELETE /v1/responses/{id}
    async def delete(self, req: HttpRequest) -> None:
        response_id = req.path_params["id"]
        result = await self.ctx.api.delete_response(req.tenant, response_id)
        body = {"id": result.id or response_id, "object": "response", "deleted": result.deleted}
        await send_json(req.send, 200, json_codec.dumps(body))

    # GET /v1/responses/{id}/input_items
    async def input_items(self, req: HttpRequest) -> None:
        q = req.query()
        request = service_pb2.ListInputItemsRequest(
            response_id=req.path_params["id"],
            after=q.get("after", ""),
            limit=_int_param(q, "limit"),
            order=q.get("order", ""),
        )
        result = await self.ctx.api.list_input_items(req.tenant, request)
        await send_json(req.send, 200, json_codec.dumps(json_codec.input_items_to_json(result)))

    # POST /v1/responses/input_tokens
    async def input_tokens(self, req: HttpRequest) -> None:
        count = await self.ctx.api.count_input_tokens(req.tenant, (await self._params(req))[0])
        body = {"object": "response.input_tokens", "input_tokens": count}
        await send_json(req.send, 200, json_codec.dumps(body))

    # POST /v1/responses/compact
    async def compact(self, req: HttpRequest) -> None:
        result = await self.ctx.api.compact(req.tenant, (await self._params(req))[0])
        await send_json(req.send, 200, json_codec.dumps(json_codec.compact_response_to_json(result)))

    # -- /v1/conversations ------------------------------------------------------------------------

    async def _conversation_call(self, req: HttpRequest, method: str, request: Any) -> Any:
        return await self.ctx.api.conversation_call(req.tenant, method, request)

    async def _conversation_body(self, req: HttpRequest, cls: Any) -> Any:
        body = await self._json_body(req)
        return await offload.run(len(body), _decode_conversation_body, cls, body or b"{}", self.ctx.limits)

    async def _send_conversation(self, req: HttpRequest, conversation: Any) -> None:
        await send_json(req.send, 200, json_codec.dumps(json_codec.conversation_to_json(conversation)))

    # POST /v1/conversations
    async def create_conversation(self, req: HttpRequest) -> None:
        request = await self._conversation_body(req, service_pb2.CreateConversationRequest)
        result = await self._conversation_call(req, "CreateConversation", request)
        await self._send_conversation(req, result.conversation)

    # GET /v1/conversations/{id}
    async def get_conversation(self, req: HttpRequest) -> None:
        request = service_pb2.GetConversationRequest(conversation_id=req.path_params["id"])
        result = await self._conversation_call(req, "GetConversation", request)
        await self._send_conversation(req, result.conversation)

    # POST /v1/conversations/{id}
    async def update_conversation(self, req: HttpRequest) -> None:
        request = await self._conversation_body(req, service_pb2.UpdateConversationRequest)
        request.conversation_id = req.path_params["id"]
        result = await self._conversation_call(req, "UpdateConversation", request)
        await self._send_conversation(req, result.conversation)

    # DELETE /v1/conversations/{id}
    async def delete_conversation(self, req: HttpRequest) -> None:
        request = service_pb2.DeleteConversationRequest(conversation_id=req.path_params["id"])
        result = await self._conversation_call(req, "DeleteConversation", request)
        body = {"id": result.id, "object": "conversation.deleted", "deleted": result.deleted}
        await send_json(req.send, 200, json_codec.dumps(body))

    # GET /v1/conversations/{id}/items
    async def conversation_items(self, req: HttpRequest) -> None:
        q = req.query()
        request = service_pb2.ListConversationItemsRequest(
            conversation_id=req.path_params["id"], after=q.get("after", ""), limit=_int_param(q, "limit"),
            order=q.get("order", ""),
        )
        result = await self._conversation_call(req, "ListConversationItems", request)
        # A page can hold megabytes of items: encoded off the loop (next to a store read anyway).
        await send_json(req.send, 200, await offload.in_thread(_encode_items_page, result))

    # POST /v1/conversations/{id}/items
    async def add_conversation_items(self, req: HttpRequest) -> None:
        request = await self._conversation_body(req, service_pb2.CreateConversationItemsRequest)
        request.conversation_id = req.path_params["id"]
        result = await self._conversation_call(req, "CreateConversationItems", request)
        await send_json(req.send, 200, await offload.in_thread(_encode_items_page, result.page))

    # GET /v1/conversations/{id}/items/{item_id}
    async def conversation_item(self, req: HttpRequest) -> None:
        request = service_pb2.GetConversationItemRequest(
            conversation_id=req.path_params["id"], item_id=req.path_params["item_id"]
        )
        result = await self._conversation_call(req, "GetConversationItem", request)
        await send_json(req.send, 200, json_codec.dumps(json_codec.item_to_json(result.item)))

    # DELETE /v1/conversations/{id}/items/{item_id}
    async def delete_conversation_item(self, req: HttpRequest) -> None:
        request = service_pb2.DeleteConversationItemRequest(
            conversation_id=req.path_params["id"], item_id=req.path_params["item_id"]
        )
        result = await self._conversation_call(req, "DeleteConversationItem", request)
        await self._send_conversation(req, result.conversation)

    # GET /v1/models
    async def models(self, req: HttpRequest) -> None:
        result = await self.ctx.api.list_models(req.tenant)
        data = [
            {"id": m.id, "object": "model", "created": m.created, "owned_by": m.owned_by} for m in result.data
        ]
        await send_json(req.send, 200, json_codec.dumps({"object": "list", "data": data}))

    # GET /healthz: the process is serving.
    async def healthz(self, req: HttpRequest) -> None:
        await send_json(req.send, 200, b'{"status":"ok"}')

    # GET /readyz: the API says it can take work (an optional `ready()` on the API object).
    async def readyz(self, req: HttpRequest) -> None:
        ready = getattr(self.ctx.api, "ready", None)
        ok = True
        if ready is not None:
            try:
                result = ready()
                if inspect.isawaitable(result):
                    result = await result
                ok = result is None or bool(result)
            except Exception:
                common.log.warning("readiness check failed", exc_info=True)
                ok = False
        if ok:
            await send_json(req.send, 200, b'{"status":"ready"}')
        else:
            await send_json(req.send, 503, b'{"status":"not_ready"}')

    # GET /metrics (ServerConfig.metrics_port == 0): the registry of the bridge's metrics (the
    # engine's in-process; `BridgeMetrics` in a bridge of its own).
    async def metrics(self, req: HttpRequest) -> None:
        accept = dict(req.headers).get(b"accept", b"").decode("latin-1")
        status, headers, body = metrics_response(getattr(self.ctx.metrics, "registry", None), accept)
        await req.send({"type": "http.response.start", "status": status, "headers": headers})
        await req.send({"type": "http.response.body", "body": body})


def _decode_params(body: bytes, limits: Limits) -> Any:
    return json_codec.params_from_json(common.decode_object(body, limits))


def _decode_conversation_body(cls: Any, body: bytes, limits: Limits) -> Any:
    return json_codec.conversation_body_from_json(cls, common.decode_object(body, limits))


def _encode_items_page(page: Any) -> bytes:
    return json_codec.dumps(json_codec.conversation_items_to_json(page))


def sse_frame(ev: Outgoing) -> bytes:
    obj = common.event_json(ev, ws=False)
    return b"event: " + obj["type"].encode() + b"\ndata: " + json_codec.dumps(obj) + b"\n\n"


def _final_response(end: ResponseEnd) -> tuple[bytes, float]:
    """The terminal Response of a non-streamed create, as JSON, and its retry hint in seconds
    (`error.retry_after_s` of a rate-limited failure, 0 without one)."""
    response = end.response
    if response is not None:
        return json_codec.dumps(json_codec.response_to_json(response)), response.error.retry_after_s
    if end.error is not None:  # refused, or ended by an error on the way
        raise common.InBandError.from_proto(end.error)
    raise TetherError(SERVER_ERROR, "The response ended without a terminal event.")


class _SseWriter:
    """The writer of an SSE stream: the headers once (`start`), then a frame per event, and
    `data: [DONE]` after the last one when it ended the stream (`wire.SSE_DONE`: never before
    the terminal event, nothing after it; a stream cut short has none). `write_now`: a delta in
    its producer's step (`tether.core.outbox.InlineWriter`), once the headers are out.

    A batch of a run's log (`LogBatch`, a follower's) takes its frames from the log, which
    encodes each once for all the run's followers. With `body_now` a batch is written at once
    as well, without the ASGI `send`'s await chain (it declines when `send` would wait); that
    chain was a follower's largest cost per batch."""

    __slots__ = ("_send", "_body_now", "started", "_last")

    def __init__(self, send: Send, body_now: Callable[[bytes], bool] | None = None) -> None:
        self._send = send
        self._body_now = body_now
        self.started = False
        self._last: Outgoing | None = None

    def write_now(self, delta: Delta) -> bool:
        body_now = self._body_now
        if body_now is None or not self.started or not body_now(sse_frame(delta)):
            return False
        self._last = delta
        return True

    async def start(self) -> None:
        if not self.started:
            self.started = True
            await self._send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})

    async def write(self, batch: Sequence[Outgoing]) -> bool:
        if not self.started:
            await self.start()
        if type(batch) is LogBatch:  # a run's log: each frame is encoded once for all its followers
            frame = batch.log.frame
            body = b"".join([frame(ev, sse_frame) for ev in batch])
        else:
            body = b"".join([sse_frame(ev) for ev in batch])
        body_now = self._body_now
        if body_now is None or not body_now(body):
            await self._send({"type": "http.response.body", "body": body, "more_body": True})
        if batch:
            self._last = batch[-1]
        return True

    def closing(self) -> bytes:
        """The stream's last bytes: `data: [DONE]` when its last event ended it."""
        last = self._last
        if last is None or type(last) is Delta:
            return b""
        arm = last.WhichOneof("event")
        return SSE_DONE if arm == "error" or arm in TERMINAL_ARMS else b""


class _Discard:
    """The writer of a non-streamed create's batches: nothing goes out before the final Response."""

    async def write(self, batch: Sequence[Outgoing]) -> bool:
        return True


_DISCARD = _Discard()


def _int_param(q: dict[str, str], name: str) -> int:
    raw = q.get(name, "")
    if raw == "":
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise TetherError(INVALID_TYPE, f"Invalid '{name}': expected an integer.", param=name) from None
    if not -(2**31) <= value < 2**31:  # the proto field is an int32: out of range is a 400, not a 500
        raise TetherError(INVALID_REQUEST, f"Invalid '{name}': {raw} is out of range.", param=name)
    return value


async def _aclose(it: object) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


class _DisconnectWatch:
    """Cancels the handling task when the client disconnects before the answer is complete."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task = asyncio.current_task()
        self._done = False
        self._watcher: asyncio.Task[None] | None = None
        self.disconnected = False

    def finishing(self) -> None:
        """The last bytes are going out: a disconnect from now on is the normal end."""
        self._done = True

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                if not self._done and self._task is not None:
                    self.disconnected = True
                    self._task.cancel()
                return

    async def __aenter__(self) -> _DisconnectWatch:
        self._watcher = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._done = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
        if self.disconnected and self._task is not None:
            self._task.uncancel()  # the cancel was ours: the request simply ends
            raise ClientGone


def _cancel_on_disconnect(receive: Receive) -> _DisconnectWatch:
    return _DisconnectWatch(receive)
