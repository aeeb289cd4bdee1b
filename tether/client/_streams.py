"""One create as the client holds it: its event stream (`ResponseStream`, what the caller reads)
and its sending state (`Pending`, what the connections and the session work on).

A stream is fed by the connection that carries its create (`_ack`, `_feed`, `_end`) and read by
the caller; events are buffered, so a stream may be read late. Nothing here knows about
connections or the session: a stream cancels through the callback it was made with.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tether import errors
from tether.client._params import InputLike, output_text, to_items
from tether.errors import TetherError
from tether.responses.v1 import events_pb2, request_pb2, response_pb2, service_pb2

_END = object()


class Carrier(Protocol):
    """The connection a create was sent on, as a stream's pending create sees it."""

    closed: bool

    def send(self, request: service_pb2.SessionRequest) -> None: ...


class ResponseStream:
    """The events of one create, as typed `ServerEvent` protos (`async for ev in stream`).

    Iteration ends after the terminal event (`completed`, `failed`, `incomplete`) or the `error`
    event that answered the create; it raises `ConnectionLost` (or another `TetherError`) when
    the create could not be answered at all. Events are buffered, so a stream may be read late,
    or only through `final_response()` / `text()`. One reader at a time.
    """

    def __init__(
        self,
        stream_id: str,
        params: request_pb2.ResponseCreateParams,
        cancel: Callable[[Pending], Awaitable[None]],
    ) -> None:
        self.stream_id = stream_id
        self.params = params
        self.id: str | None = None
        self.last_seq = -1  # the sequence number of the last event of the response fed to it
        self.resumed = 0  # times it was resumed on a new call after its connection was lost
        self.response: response_pb2.Response | None = None  # the terminal event's Response
        self.error: TetherError | None = None
        self._cancel = cancel
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._created = asyncio.Event()
        self._ended = False
        self._error_was_event = False
        self._exhausted = False
        self.pending = Pending(params, self)

    def __repr__(self) -> str:
        state = "ended" if self._ended else ("generating" if self.id else "pending")
        return f"<ResponseStream id={self.id!r} stream_id={self.stream_id!r} {state}>"

    # -- fed by the connection ------------------------------------------------------------------

    def _ack(self, response_id: str) -> None:
        self.id = response_id
        self._created.set()

    def _feed(self, ev: events_pb2.ServerEvent) -> None:
        if ev.response_id:
            self.last_seq = ev.sequence_number
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

    def inject(self, input: InputLike) -> None:
        """`response.inject` (beta): client tool outputs for agents of this running multi-agent
        response. Its answer, `inject_created` or `inject_failed` (which carries the items back,
        for a create continuing the response), comes in this stream while the response runs, and
        in the session's `unrouted_events` after it ended."""
        carrier = self.pending.carrier
        if self.id is None or carrier is None:
            raise TetherError(errors.INVALID_REQUEST, "inject needs a response that has been created.")
        carrier.send(service_pb2.SessionRequest(
            inject=service_pb2.InjectRequest(response_id=self.id, input=to_items(input))))  # fmt: skip

    async def cancel(self) -> None:
        """Cancel this response (its `response.incomplete` event carries status `cancelled`); a create
        not yet sent is dropped."""
        if not self._ended:
            await self._cancel(self.pending)


@dataclass(eq=False)
class Pending:
    """A create on its way: what it sends, the stream it feeds, and where it was sent."""

    params: request_pb2.ResponseCreateParams
    stream: ResponseStream
    attempts: int = 0  # sends so far
    cancel_requested: bool = False  # sent, not acknowledged yet: cancel once `created` arrives
    carrier: Carrier | None = None  # the connection it was last sent on

    @property
    def lane(self) -> str:
        return self.params.stream_id
