"""WebSocket mode through the openai SDK: `client.responses.connect()`, one socket per rollout,
each turn a `response.create` with `previous_response_id` (state cached on the connection,
store=false).

- `ws-inproc`: the bridge running inside the Tether server process;
- `ws-remote`: the same against `tether bridge --upstream` (a separate process in front of the
  gRPC server): every event crosses one more hop (JSON -> proto -> gRPC -> proto -> JSON).

Bytes sent are counted by a `websockets` ClientConnection subclass (payload + frame header; the
SDK turns permessage-deflate off, so that is what goes on the wire). With `Target.client == "raw"`
the socket is a plain `websockets` connection with orjson (no SDK), same frames.
"""

from __future__ import annotations

import httpx
import orjson
from openai import AsyncOpenAI
from websockets.asyncio.client import ClientConnection, connect

from tether_lab.transports.base import RolloutError, Transport, TurnOutcome, ssl_context
from tether_lab.transports.sdk import EventCollector


def frame_bytes(payload: int) -> int:
    """A masked client frame: 2-byte head, 0/2/8 bytes of length, 4-byte mask, payload."""
    return payload + 6 + (0 if payload < 126 else 2 if payload < 65536 else 8)


def _counting_connection(owner: Transport) -> type[ClientConnection]:
    class CountingConnection(ClientConnection):
        async def send(self, message, text=None):  # type: ignore[override]
            n = len(message.encode()) if isinstance(message, str) else len(message)
            owner.bytes_sent += frame_bytes(n)
            return await super().send(message, text=text)

    return CountingConnection


class WsTransport(Transport):
    name = "ws-inproc"
    mode = "chained"

    def _url(self) -> str:
        return self.target.bridge_url

    async def open(self) -> None:
        self.raw = self.target.client == "raw"
        if self.raw:
            url = self._url().replace("http", "ws", 1) + "/responses"
            self.conn = await connect(url, additional_headers={"authorization": f"Bearer {self.target.api_key}"},
                                      compression=None, max_size=None, create_connection=_counting_connection(self))
        else:
            http = httpx.AsyncClient(verify=ssl_context())
            self.client = AsyncOpenAI(base_url=self._url(), api_key=self.target.api_key, max_retries=0, http_client=http)
            self._manager = self.client.responses.connect(
                websocket_connection_options={"create_connection": _counting_connection(self)}
            )
            self.conn = await self._manager.__aenter__()
        self.connections = 1

    async def close(self) -> None:
        if self.raw:
            await self.conn.close()
            return
        try:
            await self._manager.__aexit__(None, None, None)
        finally:
            await self.client.close()

    async def _send(self, event: dict) -> None:
        if self.raw:
            await self.conn.send(orjson.dumps(event).decode())
        elif event["type"] == "response.create":
            await self.conn.response.create(**{k: v for k, v in event.items() if k != "type"})
        else:
            await self.conn.send(event)

    async def _read_turn(self, collector: EventCollector) -> TurnOutcome:
        while True:
            ev = await self.conn.recv()
            if collector.feed(orjson.loads(ev) if self.raw else ev):
                return collector.out

    async def create(self, body: dict) -> TurnOutcome:
        collector = EventCollector(want_output=self.mode == "full")
        await self._send({"type": "response.create", **body})
        return await self._read_turn(collector)


class WsRemote(WsTransport):
    name = "ws-remote"

    def _url(self) -> str:
        if not self.target.remote_bridge_url:
            raise RolloutError("no remote bridge address (tether bridge --upstream) for ws-remote")
        return self.target.remote_bridge_url
