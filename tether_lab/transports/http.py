"""HTTP transports through the openai SDK: `AsyncOpenAI(...).responses.create(stream=True)` (or,
with `Target.client == "raw"`, the same request with httpx + orjson and a minimal SSE reader).

- `http-full-newconn`: stateless, the whole history resent every turn (store=false, no
  previous_response_id), a fresh HTTP client (so a fresh TCP connection) per request (sharing one
  SSL context: see `base.ssl_context`);
- `http-full-keepalive`: the same over one keep-alive client per rollout;
- `http-prev`: `previous_response_id` + store=true over keep-alive: the server hydrates the
  previous response from the store every turn (a stateless create is a one-turn session).

Bytes sent are counted by an httpx request hook: request line + headers + body, as written.
"""

from __future__ import annotations

import httpx
import orjson
from openai import AsyncOpenAI

from tether.protocol.wire import SSE_DONE
from tether_lab.transports.base import Transport, TurnOutcome, ssl_context
from tether_lab.transports.sdk import EventCollector

_DONE_LINE = SSE_DONE.decode().strip()  # the stream's last line (after its terminal event)


def request_bytes(request: httpx.Request) -> int:
    line = len(request.method) + 1 + len(request.url.raw_path) + len(" HTTP/1.1\r\n")
    headers = sum(len(k) + len(v) + 4 for k, v in request.headers.raw)
    return line + headers + 2 + len(request.content)


class SdkHttpTransport(Transport):
    """Base of the HTTP variants: one SDK client per rollout, or one per request."""

    client_per_request = False

    async def _count(self, request: httpx.Request) -> None:
        self.bytes_sent += request_bytes(request)

    def _client(self) -> AsyncOpenAI | httpx.AsyncClient:
        http = httpx.AsyncClient(event_hooks={"request": [self._count]}, timeout=httpx.Timeout(600.0, connect=30.0),
                                 verify=ssl_context())
        if self.target.client == "raw":
            return http
        return AsyncOpenAI(base_url=self.target.bridge_url, api_key=self.target.api_key, http_client=http, max_retries=0)

    async def open(self) -> None:
        self._shared = None if self.client_per_request else self._client()
        if self._shared is not None:
            self.connections = 1  # keep-alive: one connection (the delay proxy counts the real number)

    async def close(self) -> None:
        if self._shared is not None:
            await _aclose(self._shared)

    async def create(self, body: dict) -> TurnOutcome:
        client = self._shared or self._client()
        if self.client_per_request:
            self.connections += 1
        try:
            collector = EventCollector(want_output=self.mode == "full")
            if isinstance(client, httpx.AsyncClient):
                await self._raw(client, body, collector)
            else:
                stream = await client.responses.create(**body, stream=True)
                async for ev in stream:
                    collector.feed(ev)
            return collector.out
        finally:
            if self.client_per_request:
                await _aclose(client)

    async def _raw(self, client: httpx.AsyncClient, body: dict, collector: EventCollector) -> None:
        headers = {"authorization": f"Bearer {self.target.api_key}", "content-type": "application/json"}
        url = self.target.bridge_url + "/responses"
        async with client.stream("POST", url, content=orjson.dumps({**body, "stream": True}), headers=headers) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise httpx.HTTPStatusError(f"{resp.status_code}: {resp.text[:500]}", request=resp.request, response=resp)
            async for line in resp.aiter_lines():
                if line.startswith("data: ") and line != _DONE_LINE:
                    collector.feed(orjson.loads(line[6:]))


async def _aclose(client: AsyncOpenAI | httpx.AsyncClient) -> None:
    await (client.aclose() if isinstance(client, httpx.AsyncClient) else client.close())


class HttpFullNewConn(SdkHttpTransport):
    name = "http-full-newconn"
    mode = "full"
    client_per_request = True


class HttpFullKeepAlive(SdkHttpTransport):
    name = "http-full-keepalive"
    mode = "full"


class HttpPrev(SdkHttpTransport):
    name = "http-prev"
    mode = "chained"
    store = True
