"""A minimal raw-stub client for core tests: one bidi Session call, events as protos and JSON."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from tether.protocol.json_codec import event_to_json
from tether.protocol.wire import TERMINAL_ARMS
from tether.responses.v1 import events_pb2, service_pb2, service_pb2_grpc


class RawSession:
    def __init__(self, channel: grpc.aio.Channel, api_key: str | None = None) -> None:
        metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
        self.stub = service_pb2_grpc.ResponsesServiceStub(channel)
        self.call = self.stub.Session(metadata=metadata)
        self.events: list[events_pb2.ServerEvent] = []
        self._queue: asyncio.Queue = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for batch in self.call:
                for ev in batch.events:
                    self.events.append(ev)
                    await self._queue.put(ev)
        finally:
            await self._queue.put(None)

    async def create(self, **fields) -> None:
        req = service_pb2.SessionRequest()
        for key, value in fields.items():
            if key == "input" and isinstance(value, str):
                req.create.input_text = value
            elif key in ("input", "tools", "include", "context_management"):
                getattr(req.create, key).extend(value)
            elif key == "metadata":
                req.create.metadata.update(value)
            else:
                setattr(req.create, key, value)
        await self.call.write(req)

    async def send(self, req: service_pb2.SessionRequest) -> None:
        await self.call.write(req)

    async def next_event(self, timeout: float = 30) -> events_pb2.ServerEvent | None:
        return await asyncio.wait_for(self._queue.get(), timeout)

    async def until_terminal(self, timeout: float = 30) -> events_pb2.ServerEvent:
        """Events up to the next terminal event or error; returns that event."""
        while True:
            ev = await self.next_event(timeout)
            if ev is None:
                raise EOFError("session ended")
            arm = ev.WhichOneof("event")
            if arm in TERMINAL_ARMS or arm == "error":
                return ev

    def json_events(self) -> list[dict]:
        return [event_to_json(ev, ws=True) for ev in self.events]

    async def close(self) -> None:
        await self.call.done_writing()
        try:
            await asyncio.wait_for(self._reader, 10)
        except (TimeoutError, grpc.aio.AioRpcError):
            self._reader.cancel()


@asynccontextmanager
async def raw_session_on(engine: Any, config: Any, authenticator: Any, api_key: str) -> AsyncIterator[RawSession]:
    """A gRPC service on `engine` (port 0) and one raw Session stream on it, keyed `api_key`."""
    from tether.service.grpc_server import start_grpc_server

    server = await start_grpc_server(engine, config, authenticator)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            session = RawSession(channel, api_key)
            try:
                yield session
            finally:
                session.call.cancel()
    finally:
        await server.stop(0)
