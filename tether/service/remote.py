"""`RemoteResponsesAPI`: the `ResponsesAPI` interface over a gRPC channel to a remote Tether.

With it the JSON bridge runs as its own process (`tether bridge --upstream host:port`) exactly as
it runs next to the in-process Engine. (The typed client, `tether.client`, is its own code over the
same contract: error mapping and channel construction come from `tether.protocol.wire`.)

Mapping:
- `open_session` -> one bidi `Session` call. `send` writes a `SessionRequest`; `events()` yields
  each `SessionResponse`'s batch; `close()` cancels the call (the server cancels the session's
  work). A session that ends with a non-OK gRPC status (upstream gone, auth refused) yields one
  `error` event with the mapped error as its last batch, like a connection-fatal error in-band.
- `create` -> the server-streaming `CreateResponse`, a batch per message, then the end record
  read from them (`pump.one_response`: the wire carries the upstream's events, not its record;
  a refusal is the upstream's in-band `error`, which goes into the record). A call that fails raises
  the `TetherError` rebuilt from its status, as the Engine's `create` raises a refusal at admission
  (too many connections for the key, shutting down): before any event it is the HTTP status of the
  answer, and the bridge counts it like any error it answers from an exception. The upstream's
  in-band `error` events (counted by its core) pass through as events. Closing the iterator
  cancels the call.
- Unary RPCs raise `TetherError` rebuilt from the status: trailing metadata `tether-error-code`,
  `tether-error-param` and `tether-error-status` when the server set them, otherwise the status
  code mapped to an HTTP-equivalent status (`tether.protocol.wire`) and the details as message.

Credentials, two modes (`call_metadata` builds the metadata; a subclass may override it):
- `api_key="..."`: every call carries `authorization: Bearer <api_key>`, so the upstream scopes
  everything to that key's tenant; the `tenant` argument (the caller's local identity) is not
  sent, since the upstream would have to trust it (`tether bridge --upstream-api-key`).
- `api_key=None`: credential forwarding. The `tenant` argument *is* the caller's own API key and
  is sent as the bearer token, so the upstream authenticates each caller and scopes its data.
  Pair it with `ForwardingAuthenticator`, which hands the bridge the raw bearer token as the
  "tenant" (`tether bridge --upstream` without `--upstream-api-key`). `open_session` then checks
  the key with one cheap unary call first, so a bad key is a 401 before the WebSocket upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import grpc

from tether.auth import Authenticator, _bearer
from tether.core.outbox import InlineWriter
from tether.core.pump import ResponseEnd, connection_error, one_response
from tether.errors import (
    INVALID_API_KEY,
    INVALID_REQUEST,
    SERVER_SHUTTING_DOWN,
    UPSTREAM_UNAVAILABLE,
    TetherError,
)
from tether.protocol.wire import CHANNEL_OPTIONS, bearer, error_from_rpc, open_channel
from tether.responses.v1 import events_pb2, request_pb2, response_pb2, service_pb2, service_pb2_grpc


def message_gone(exc: grpc.aio.AioRpcError) -> str:
    return f"The upstream Tether ended the session ({exc.code().name.lower()}); reconnect to continue."


def _error_event(err: TetherError) -> events_pb2.ServerEvent:
    return events_pb2.ServerEvent(error=events_pb2.ErrorEvent(error=err.to_proto()))


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _closed_error() -> TetherError:
    return TetherError(INVALID_REQUEST, "The session is closed.")


class ForwardingAuthenticator(Authenticator):
    """For a bridge whose upstream authenticates: the "tenant" is the caller's bearer token,
    which `RemoteResponsesAPI(api_key=None)` forwards. Only a missing token is refused here."""

    def __init__(self) -> None:
        super().__init__({})

    @property
    def open(self) -> bool:
        return False

    def tenant_for(self, authorization: str | None) -> str:
        token = _bearer(authorization)
        if token is None:
            raise TetherError(
                INVALID_API_KEY, "Missing bearer authentication in header 'Authorization'."
            )
        return token


class RemoteSession:
    """A `SessionHandle` over one bidi `Session` call."""

    def __init__(
        self, call: grpc.aio.StreamStreamCall[service_pb2.SessionRequest, service_pb2.SessionResponse]
    ) -> None:
        self._call = call
        self._closed = False

    async def send(self, request: service_pb2.SessionRequest, *, nbytes: int | None = None) -> None:
        # `nbytes` is the local transport's; the remote engine measures what it receives.
        if self._closed or self._call.done():
            raise _closed_error()
        try:
            await self._call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            raise _closed_error() from None
        except asyncio.CancelledError:
            if _cancelling():
                raise
            raise _closed_error() from None  # the call was cancelled under us (close())

    def write_inline(self, writer: InlineWriter | None) -> bool:
        return False  # the batches come over a gRPC stream: one read each, nothing to skip

    async def events(self, *, lazy_deltas: bool = False) -> AsyncIterator[Sequence[events_pb2.ServerEvent]]:
        """The upstream's batches as they arrive (its deltas are protobuf events already, so
        `lazy_deltas` changes nothing here)."""
        ended_with_error = False  # the server already said why in-band (e.g. server_shutting_down)
        while True:
            try:
                message = await self._call.read()
            except grpc.aio.AioRpcError as exc:
                if self._closed and exc.code() == grpc.StatusCode.CANCELLED:
                    return  # we cancelled it
                if not ended_with_error:
                    err = error_from_rpc(exc)
                    if exc.code() == grpc.StatusCode.CANCELLED:  # cancelled by the server going away
                        code = SERVER_SHUTTING_DOWN if err.code == SERVER_SHUTTING_DOWN else UPSTREAM_UNAVAILABLE
                        err = TetherError(code, message_gone(exc))
                    yield [_error_event(err)]
                return
            except asyncio.CancelledError:
                if self._closed and not _cancelling():
                    return
                raise
            if not isinstance(message, service_pb2.SessionResponse):  # grpc.aio.EOF
                return
            events = message.events
            if events:
                ended_with_error = connection_error(events[-1]) is not None
            yield events

    def responses_in_flight(self) -> None:
        """Not known on this side: the runs are the upstream's (the pump counts from the events)."""
        return None

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._call.cancel()


class RemoteResponsesAPI:
    """`ResponsesAPI` over `grpc.aio` to a Tether gRPC server at `target` (`host:port`)."""

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None,
        tls_ca: str | None = None,
        tls: bool = False,
        options: Sequence[tuple[str, Any]] = CHANNEL_OPTIONS,
    ) -> None:
        """`tls_ca`: a PEM file of the roots to trust (implies TLS); `tls=True` without it uses
        the system roots."""
        self.target = target
        self.forwarding = api_key is None
        self._auth: tuple[tuple[str, str], ...] = bearer(api_key) if api_key else ()
        self._channel = open_channel(target, tls_ca=tls_ca, tls=tls, options=options)
        self._stub = service_pb2_grpc.ResponsesServiceStub(self._channel)

    def call_metadata(self, tenant: str | None) -> tuple[tuple[str, str], ...]:
        """Metadata of a call made for `tenant` (see "Credentials" in the module notes)."""
        if self.forwarding:
            return bearer(tenant) if tenant else ()
        return self._auth

    async def aclose(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> RemoteResponsesAPI:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def ready(self) -> bool:
        """True when the upstream answers its health service (or, without one, answers at all)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            reply = await health_pb2_grpc.HealthStub(self._channel).Check(  # type: ignore[attr-defined]  # the stubs' HealthStub declares no methods
                health_pb2.HealthCheckRequest(service=""), timeout=2.0
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.UNIMPLEMENTED
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    # -- ResponsesAPI -------------------------------------------------------------------------

    async def open_session(self, tenant: str, *, transport: str) -> RemoteSession:
        if self.forwarding:  # refuse a bad key now (a 401 before the upgrade), not in-band later
            await self._unary(self._stub.ListModels, service_pb2.ListModelsRequest(), tenant)
        call = self._stub.Session(metadata=self.call_metadata(tenant))
        try:
            await call.wait_for_connection()
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        return RemoteSession(call)

    async def create(
        self, tenant: str, params: request_pb2.ResponseCreateParams, *, lazy_deltas: bool = False,
        nbytes: int | None = None,  # the local transport's; the remote engine measures what it receives
        inline: InlineWriter | None = None,  # every event comes over the call: nothing to write inline
    ) -> AsyncIterator[Sequence[events_pb2.ServerEvent] | ResponseEnd]:
        call = self._stub.CreateResponse(
            service_pb2.CreateResponseRequest(params=params), metadata=self.call_metadata(tenant)
        )

        async def batches() -> AsyncIterator[Sequence[events_pb2.ServerEvent]]:
            async for message in call:
                yield message.events

        try:  # the end record is not on the wire: read from the events, as the upstream's pump did
            async with contextlib.aclosing(one_response(batches())) as stream:
                async for record in stream:
                    yield record
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        finally:
            call.cancel()

    async def _unary(self, method: Any, request: Any, tenant: str | None) -> Any:
        try:
            return await method(request, metadata=self.call_metadata(tenant))
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None

    async def get_response(self, tenant: str, response_id: str) -> response_pb2.Response:
        request = service_pb2.GetResponseRequest(response_id=response_id)
        return (await self._unary(self._stub.GetResponse, request, tenant)).response

    async def create_background(self, tenant: str, params: request_pb2.ResponseCreateParams) -> response_pb2.Response:
        request = service_pb2.CreateBackgroundResponseRequest(params=params)
        return (await self._unary(self._stub.CreateBackgroundResponse, request, tenant)).response

    async def cancel_response(self, tenant: str, response_id: str) -> response_pb2.Response:
        request = service_pb2.CancelResponseRequest(response_id=response_id)
        return (await self._unary(self._stub.CancelResponse, request, tenant)).response

    async def follow_response(self, tenant: str, response_id: str, after: int = -1) -> AsyncIterator[Any]:
        """The remote run's events, a batch per message; a refusal (unknown id, events not retained) is raised here,
        with the first message, before the caller answers anything."""
        request = service_pb2.StreamResponseRequest(response_id=response_id)
        if after >= 0:
            request.starting_after = after
        call = self._stub.StreamResponse(request, metadata=self.call_metadata(tenant))
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            raise error_from_rpc(exc) from None

        async def events() -> AsyncIterator[list[events_pb2.ServerEvent]]:
            message = first
            try:
                while message is not grpc.aio.EOF:
                    got = cast(service_pb2.StreamResponseResponse, message).events  # grpc's stubs type a read as object
                    if got:
                        yield list(got)
                    message = await call.read()
            except grpc.aio.AioRpcError as exc:
                raise error_from_rpc(exc) from None
            finally:
                call.cancel()

        return events()

    async def delete_response(self, tenant: str, response_id: str) -> service_pb2.DeleteResponseResponse:
        request = service_pb2.DeleteResponseRequest(response_id=response_id)
        return await self._unary(self._stub.DeleteResponse, request, tenant)

    async def list_input_items(
        self, tenant: str, request: service_pb2.ListInputItemsRequest
    ) -> service_pb2.ListInputItemsResponse:
        return await self._unary(self._stub.ListInputItems, request, tenant)

    async def count_input_tokens(self, tenant: str, params: request_pb2.ResponseCreateParams) -> int:
        request = service_pb2.CountInputTokensRequest(params=params)
        return (await self._unary(self._stub.CountInputTokens, request, tenant)).input_tokens

    async def compact(
        self, tenant: str, params: request_pb2.ResponseCreateParams
    ) -> service_pb2.CompactResponseResponse:
        request = service_pb2.CompactResponseRequest(params=params)
        return await self._unary(self._stub.CompactResponse, request, tenant)

    async def conversation_call(self, tenant: str, method: str, request: Any) -> Any:
        return await self._unary(getattr(self._stub, method), request, tenant)

    async def list_models(self, tenant: str) -> service_pb2.ListModelsResponse:
        return await self._unary(self._stub.ListModels, service_pb2.ListModelsRequest(), tenant)
