"""`ResponsesAPI`: the one interface every transport adapter talks to.

The in-process engine (`tether.core.engine.Engine`) implements it directly; the gRPC client
adapter (`tether.service.remote.RemoteResponsesAPI`) implements it over a channel, so the JSON
bridge runs unchanged in-process or as a separate process. Adapters authenticate first and pass
the resulting tenant; they never interpret protocol semantics themselves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Literal, Protocol, overload

from google.protobuf.message import Message

from tether.core.delta import Outgoing
from tether.core.outbox import InlineWriter
from tether.core.pump import ResponseEnd
from tether.responses.v1 import events_pb2, request_pb2, response_pb2, service_pb2


class SessionHandle(Protocol):
    """One open connection-scoped session (a WebSocket connection or a gRPC Session stream).

    `send` never raises for per-turn problems: those come back in-band as `error` events. It
    raises `TetherError` only when the session is closed. `events()` yields batches of server
    events (whatever is ready; deltas already coalesced) and ends when the session closes;
    after a connection-fatal error its last batch holds that `error` event. With `lazy_deltas`,
    text deltas may come as `delta.Delta` records instead of protobuf events (a JSON transport
    encodes them straight from the merged text); without it every event is a protobuf event (the
    overloads say so to the type checker).
    """

    async def send(self, request: service_pb2.SessionRequest, *, nbytes: int | None = None) -> None:
        """`nbytes`: the event's size as received, when the transport knows it (see
        `tether.core.queued`)."""
        ...

    @overload
    def events(self, *, lazy_deltas: Literal[False] = False) -> AsyncIterator[Sequence[events_pb2.ServerEvent]]: ...

    @overload
    def events(self, *, lazy_deltas: bool) -> AsyncIterator[Sequence[Outgoing]]: ...

    def write_inline(self, writer: InlineWriter | None) -> bool:
        """Offer `writer`, the transport that reads `events(lazy_deltas=True)`, for deltas written
        in their producer's step (`tether.core.outbox`: one pass per token); None withdraws it.
        False: this session cannot (one forwarded to a remote engine), and every event comes
        through `events()`."""
        ...

    def responses_in_flight(self) -> int | None:
        """Responses begun and not ended yet, from the session's runs; None when this side
        cannot tell (a session forwarded to a remote engine: the pump counts from its events,
        `tether.core.pump`)."""
        ...

    async def close(self) -> None:
        """Client went away: cancel active and queued responses, free the session's state."""
        ...


class ResponsesAPI(Protocol):
    """Everything a transport can ask for, tenant-scoped."""

    async def open_session(self, tenant: str, *, transport: str) -> SessionHandle: ...

    @overload
    def create(
        self, tenant: str, params: request_pb2.ResponseCreateParams, *, lazy_deltas: Literal[False] = False,
        nbytes: int | None = None, inline: InlineWriter | None = None,
    ) -> AsyncIterator[Sequence[events_pb2.ServerEvent] | ResponseEnd]: ...

    @overload
    def create(
        self, tenant: str, params: request_pb2.ResponseCreateParams, *, lazy_deltas: bool, nbytes: int | None = None,
        inline: InlineWriter | None = None,
    ) -> AsyncIterator[Sequence[Outgoing] | ResponseEnd]:
        """A stateless create (HTTP `POST /v1/responses`, gRPC `CreateResponse`): the events of
        one response in batches, the shape of every stream (`SessionHandle.events`,
        `follow_response`), the last one ending with the event that ended it, then one
        `ResponseEnd` record that says how it ended (`tether.core.pump`: pumped once, where the
        events are made; the transport writes the batches and reads the record as it is, e.g.
        with `pump.deliver`). A request error ends the stream at once: no batch, a REFUSED
        record carrying the error (nothing is created); a refusal at admission (too many
        connections for the key, the server shutting down) is raised as `TetherError` before
        anything. `lazy_deltas` as in `SessionHandle.events`; `nbytes` as in
        `SessionHandle.send`; `inline`, the transport that writes the events, offered for deltas
        written in their producer's step as in `SessionHandle.write_inline` (a remote engine's
        events come over gRPC: it is not used there)."""
        ...

    async def get_response(self, tenant: str, response_id: str) -> response_pb2.Response: ...

    async def delete_response(self, tenant: str, response_id: str) -> service_pb2.DeleteResponseResponse: ...

    async def create_background(
        self, tenant: str, params: request_pb2.ResponseCreateParams
    ) -> response_pb2.Response:
        """`background: true` (HTTP): check the request, answer its Response `queued` at once
        and run it (docs/background.md). 400 for `store: false`; 429 past the background bounds."""
        ...

    async def follow_response(self, tenant: str, response_id: str, after: int = -1) -> AsyncIterator[Sequence[Outgoing]]:
        """A stored response's events numbered above `after` (all for -1), then the live ones
        until its terminal event, in batches (each subscriber's own: what was logged since its
        last batch). Raises (before any event) `replay_unavailable` when they are
        not retained."""
        ...

    async def cancel_response(self, tenant: str, response_id: str) -> response_pb2.Response:
        """Cancel a queued or running response; answers it `cancelled` (again for a second
        cancel); 400 for one that ended otherwise, 404 for an unknown id."""
        ...

    async def list_input_items(
        self, tenant: str, request: service_pb2.ListInputItemsRequest
    ) -> service_pb2.ListInputItemsResponse: ...

    async def count_input_tokens(self, tenant: str, params: request_pb2.ResponseCreateParams) -> int: ...

    async def compact(
        self, tenant: str, params: request_pb2.ResponseCreateParams
    ) -> service_pb2.CompactResponseResponse: ...

    async def conversation_call(self, tenant: str, method: str, request: Message) -> Message:
        """One `/v1/conversations` call by its RPC name (`tether.core.conversations.RPCS`): the
        request and response are that RPC's messages."""
        ...

    async def list_models(self, tenant: str) -> service_pb2.ListModelsResponse:
        """The routable model names (tenant-scoped so a forwarding bridge can pass the caller's key)."""
        ...
