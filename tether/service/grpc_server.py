"""The gRPC adapter: `ResponsesService` over a `ResponsesAPI`, plus health and reflection.

Nothing here interprets the protocol. The Session RPC feeds client events into the session; the
core's pump (`tether.core.pump`) moves its batches out (one SessionResponse per batch) and says
whether the session ended with the server shutting down (then the call's status says so too).
`CreateResponse` writes its create's batches, one message per batch, and a refused create's
error as one more message (its end record says so: `pump.deliver`); `StreamResponse` goes
through the pump, a message per batch. Unary RPCs call the API and map a `TetherError` to a
gRPC status with `tether-error-code`, `tether-error-param` and
`tether-error-status` trailing metadata. The API key travels as `authorization: Bearer <key>`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tether import errors
from tether.auth import Authenticator
from tether.config import TetherConfig
from tether.core.api import ResponsesAPI
from tether.core.conversations import RPCS as CONVERSATION_RPCS
from tether.core.delta import Delta, Outgoing
from tether.core.pump import Pump, PumpEnd, deliver
from tether.errors import TetherError
from tether.observability import tracing
from tether.protocol import wire
from tether.responses.v1 import events_pb2, service_pb2, service_pb2_grpc
from tether.startup import GRPC, StartupError, probe_port

log = logging.getLogger("tether.grpc")

SERVICE_NAME = service_pb2.DESCRIPTOR.services_by_name["ResponsesService"].full_name

class _Undecodable:
    """A request message that did not parse; its handler answers INVALID_ARGUMENT."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _lenient(parse):
    def deserialize(data: bytes):
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - google.protobuf.message.DecodeError
            return _Undecodable(exc)

    return deserialize


class _LenientRegistrar:
    """Registers the generated handlers with deserializers that never raise. Otherwise grpc
    answers an undecodable unary request UNKNOWN and logs it at ERROR with a traceback, and an
    undecodable Session message kills the request pump silently, leaving the stream open."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass  # the registered handlers below serve every method

    def add_registered_method_handlers(self, service: str, handlers) -> None:
        fixed = {name: h._replace(request_deserializer=_lenient(h.request_deserializer)) for name, h in handlers.items()}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, fixed),))
        self._server.add_registered_method_handlers(service, fixed)


def _malformed(request: _Undecodable) -> TetherError:
    return TetherError(errors.INVALID_REQUEST, f"The request message could not be decoded: {request.error}")


async def _end_call(context: grpc.aio.ServicerContext, exc: TetherError) -> None:
    context.set_trailing_metadata(wire.error_metadata(exc))
    await context.abort(wire.grpc_status_for(exc), exc.message)


class _MessageWriter:
    """The pump's writer for a streaming RPC: one `message_type` (its repeated `events`) per
    batch of protobuf events (a session's or a create's batches)."""

    __slots__ = ("_context", "_message_type")

    def __init__(self, context: grpc.aio.ServicerContext, message_type: type) -> None:
        self._context = context
        self._message_type = message_type

    async def write(self, batch: Sequence[events_pb2.ServerEvent]) -> bool:
        message = self._message_type()
        message.events.extend(batch)
        await self._context.write(message)
        return True


class _RecordWriter(_MessageWriter):
    """A `_MessageWriter` for batches that may hold `Delta` records (a run followed from its
    log, which keeps merged deltas so): they are sent as events."""

    __slots__ = ()

    async def write(self, batch: Sequence[Outgoing]) -> bool:
        return await super().write([ev.to_event() if type(ev) is Delta else ev for ev in batch])


def _uncounted(code: str) -> None:
    return None


class ResponsesServicer(service_pb2_grpc.ResponsesServiceServicer):
    """`count_error` is where the errors this service ends calls with are counted
    (`tether_errors_total{code}`): refusals the API raised (auth, admission, not found...) and
    undecodable requests, which no core code counted. An error the session core already sent
    in-band (and counted) is not counted again when the call's status repeats it."""

    def __init__(self, api: ResponsesAPI, authenticator: Authenticator,
                 count_error: Callable[[str], None] = _uncounted) -> None:  # fmt: skip
        self._api = api
        self._auth = authenticator
        self._count_error = count_error

    async def _abort(self, context: grpc.aio.ServicerContext, exc: TetherError) -> None:
        self._count_error(exc.code)
        await _end_call(context, exc)

    def _tenant(self, context: grpc.aio.ServicerContext) -> str:
        metadata = context.invocation_metadata() or ()
        return self._auth.tenant_of([cast(str, value) for key, value in metadata if key == "authorization"])  # not -bin: text

    async def _unary(self, context, call, request=None):
        if isinstance(request, _Undecodable):
            await self._abort(context, _malformed(request))
        try:
            return await call(self._tenant(context))
        except TetherError as exc:
            await self._abort(context, exc)

    async def Session(self, request_iterator, context):  # type: ignore[override]  # writes with context.write: grpc.aio allows a coroutine where the stub knows only a generator
        try:
            tenant = self._tenant(context)
            session = await self._api.open_session(tenant, transport="grpc")
        except TetherError as exc:
            await self._abort(context, exc)
            return

        malformed: list[_Undecodable] = []

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    if isinstance(request, _Undecodable):
                        malformed.append(request)
                        await session.close()  # ends events(); the stream ends INVALID_ARGUMENT
                        return
                    await session.send(request)
            except TetherError:
                return  # the session closed under us; the writer ends the stream
            # The client half-closed: it will ask for nothing more. Finish what it asked for,
            # then end the stream (OK) once the last events are out.
            await session.wait_idle()  # type: ignore[attr-defined]  # not in `SessionHandle`: this service fronts the in-process engine, whose sessions have it
            await session.close()

        tracing.adopt_parent(context.invocation_metadata())
        reader = asyncio.create_task(read_requests())
        try:
            end = await Pump().run(session.events(), _MessageWriter(context, service_pb2.SessionResponse))
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await session.close()
        if malformed:
            await self._abort(context, _malformed(malformed[0]))
        if end is PumpEnd.SHUTTING_DOWN:
            # The reason went in-band; the status (with its metadata) says the same to the channel.
            await _end_call(context, TetherError(errors.SERVER_SHUTTING_DOWN, "server shutting down; reconnect"))

    async def CreateResponse(self, request, context):  # type: ignore[override]  # as Session: writes with context.write
        if isinstance(request, _Undecodable):
            await self._abort(context, _malformed(request))
        try:
            tenant = self._tenant(context)
        except TetherError as exc:
            await self._abort(context, exc)
            return
        tracing.adopt_parent(context.invocation_metadata())
        writer = _MessageWriter(context, service_pb2.CreateResponseResponse)
        try:  # one message per batch, as the Session RPC
            end = await deliver(self._api.create(tenant, request.params), writer)
        except TetherError as exc:  # refused at admission (connections per key, shutting down)
            await self._abort(context, exc)
            return
        if end.end is PumpEnd.REFUSED and end.event is not None:  # the request error goes in-band, as on a Session
            await writer.write((end.event,))

    async def GetResponse(self, request, context):
        async def call(tenant):
            return service_pb2.GetResponseResponse(response=await self._api.get_response(tenant, request.response_id))

        return await self._unary(context, call, request)

    async def CreateBackgroundResponse(self, request, context):
        async def call(tenant):
            response = await self._api.create_background(tenant, request.params)
            return service_pb2.CreateBackgroundResponseResponse(response=response)

        return await self._unary(context, call, request)

    async def StreamResponse(self, request, context):  # type: ignore[override]  # as Session: writes with context.write
        if isinstance(request, _Undecodable):
            await self._abort(context, _malformed(request))
        try:
            tenant = self._tenant(context)
            after = request.starting_after if request.HasField("starting_after") else -1
            events = await self._api.follow_response(tenant, request.response_id, after)
            await Pump().run(events, _RecordWriter(context, service_pb2.StreamResponseResponse))
        except TetherError as exc:
            await self._abort(context, exc)

    async def CancelResponse(self, request, context):
        async def call(tenant):
            response = await self._api.cancel_response(tenant, request.response_id)
            return service_pb2.CancelResponseResponse(response=response)

        return await self._unary(context, call, request)

    async def DeleteResponse(self, request, context):
        return await self._unary(context, lambda tenant: self._api.delete_response(tenant, request.response_id), request)

    async def ListInputItems(self, request, context):
        return await self._unary(context, lambda tenant: self._api.list_input_items(tenant, request), request)

    async def CountInputTokens(self, request, context):
        async def call(tenant):
            count = await self._api.count_input_tokens(tenant, request.params)
            return service_pb2.CountInputTokensResponse(input_tokens=count)

        return await self._unary(context, call, request)

    async def CompactResponse(self, request, context):
        return await self._unary(context, lambda tenant: self._api.compact(tenant, request.params), request)

    async def ListModels(self, request, context):
        return await self._unary(context, lambda tenant: self._api.list_models(tenant), request)


def _conversation_rpc(name: str):
    async def handler(self: ResponsesServicer, request, context):
        return await self._unary(context, lambda tenant: self._api.conversation_call(tenant, name, request), request)

    handler.__name__ = name
    return handler


for _name in CONVERSATION_RPCS:  # one handler per conversation RPC, all answered by the API by name
    setattr(ResponsesServicer, _name, _conversation_rpc(_name))


class GrpcServer:
    def __init__(self, server: grpc.aio.Server, port: int, health_servicer: health.aio.HealthServicer) -> None:
        self.server = server
        self.port = port
        self.health = health_servicer

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


def _options(config: TetherConfig) -> list[tuple[str, int]]:
    limit = config.limits.max_request_bytes
    return [
        ("grpc.so_reuseport", 1 if config.server.workers > 1 else 0),
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", -1),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def _server_credentials(config: TetherConfig) -> grpc.ServerCredentials:
    assert config.server.tls_key and config.server.tls_cert  # the caller's condition
    key, cert = Path(config.server.tls_key).read_bytes(), Path(config.server.tls_cert).read_bytes()
    return grpc.ssl_server_credentials([(key, cert)])


async def start_grpc_server(api: ResponsesAPI, config: TetherConfig, authenticator: Authenticator,
                            count_error: Callable[[str], None] = _uncounted) -> GrpcServer:  # fmt: skip
    """`count_error`: where the errors the service ends calls with are counted (the composition
    root passes the engine's telemetry)."""
    server = grpc.aio.server(options=_options(config))
    servicer = ResponsesServicer(api, authenticator, count_error)  # type: ignore[abstract]  # the conversation RPCs are set on the class after its body
    service_pb2_grpc.add_ResponsesServiceServicer_to_server(servicer, _LenientRegistrar(server))  # type: ignore[arg-type]  # it has the two registration methods the generated code calls
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    host, wanted = config.server.grpc_host, config.server.grpc_port
    if config.server.workers == 1:  # workers share the port the supervisor reserved (SO_REUSEPORT)
        probe_port(GRPC, host, wanted)  # gRPC itself would say only "Failed to bind"
    address = f"{host}:{wanted}"
    try:
        if config.server.tls_cert and config.server.tls_key:
            port = server.add_secure_port(address, _server_credentials(config))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise StartupError(f"cannot listen for gRPC on {address}: {exc} ([server] grpc_port or --grpc-port)") from None
    await server.start()
    ready = getattr(api, "ready", None)
    status: int = health_pb2.HealthCheckResponse.SERVING
    if ready is not None and not await ready():
        status = health_pb2.HealthCheckResponse.NOT_SERVING
    await health_servicer.set(SERVICE_NAME, status)
    await health_servicer.set("", status)
    return GrpcServer(server, port, health_servicer)
