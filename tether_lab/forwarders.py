"""The least a Python server pays to forward a paced upstream's tokens as Responses events, one
per transport: the floors Tether's own figures in `tether_lab.upstream` are read against.

    python -m tether_lab.forwarders http --to UPSTREAM_PORT   # READY {"port": ...}
    python -m tether_lab.forwarders grpc --to UPSTREAM_PORT

Why: the bare reader (`direct`) only reads; the byte relay (`relay`) reads and writes without
looking at the bytes. A server that speaks the Responses API must also parse each chunk and
write an event in the client's protocol, and on gRPC that write goes through grpcio. These
forwarders do exactly that and nothing else, on asyncio, with the same minimal SSE reader as
`direct`, so their CPU per token is what any Python implementation of the path pays:

- **`ws-floor`, `sse-floor`** (`HttpForwarder`): an HTTP server written by hand. A WebSocket
  (the upgrade, frames in and out; no extension is negotiated, so nothing is compressed) takes
  `response.create` messages; any other request is a streamed `POST /v1/responses` answered in
  chunked SSE. Either way it POSTs the chat request on the upstream connection it opened when
  the client connected (as Tether keeps a warm pool), and writes the events a Responses stream
  has: `response.created` and `response.in_progress` (a response object of the usual fields),
  the message and its text part added with the first token, each token as a
  `response.output_text.delta` event (one `orjson.dumps`, one frame or SSE chunk, one write),
  then the done events and `response.completed` with the output and the usage.
- **`grpc-floor`** (`GrpcForwarder`): the `ResponsesService/Session` method on `grpc.aio`
  (generic handler, the real messages): the same events as protobuf, one `SessionResponse` per
  token (the first also carries the item and part added); the client is the lab's gRPC client,
  unchanged.

Neither numbers, stores, validates, routes or keeps anything: no response object, no output
items, no log. What Tether pays above them is its own work.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from tether import eventloop
from tether_lab.processes import announce_and_wait
from tether_lab.upstream import _chat_body, _Dechunk, _http_chunk, _nodelay, _sse_texts

_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class _Upstream:
    """One kept-alive connection to the paced upstream: a streamed chat request, its tokens."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> _Upstream:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        _nodelay(self.writer)
        return self

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def stream(self, model: str) -> AsyncIterator[list[str]]:
        """Yield each read's token texts (a list), as the minimal reader takes them."""
        assert self.reader is not None and self.writer is not None
        body = _chat_body(model)
        self.writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: upstream\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(head.split(b"\r\n", 1)[0].decode())
        dechunk, sse, texts = _Dechunk(), bytearray(), list[str]()
        while not dechunk.ended:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("upstream closed")
            dechunk.feed(data, sse)
            _sse_texts(sse, texts)
            if texts:
                yield texts
                texts = []


# --- WebSocket ----------------------------------------------------------------------------------------


def _ws_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    n = len(payload)
    if n < 126:
        return bytes((0x80 | opcode, n)) + payload
    if n < 1 << 16:
        return struct.pack("!BBH", 0x80 | opcode, 126, n) + payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, n) + payload


async def _ws_read(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One client frame (masked, unfragmented): its opcode and unmasked payload."""
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    mask = await reader.readexactly(4) if b1 & 0x80 else b"\0\0\0\0"
    data = await reader.readexactly(n)
    key = (mask * (n // 4 + 1))[:n]
    return b0 & 0x0F, (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def _sse_event(obj: dict) -> bytes:
    return _http_chunk(b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), orjson.dumps(obj)))


def _ws_event(obj: dict) -> bytes:
    return _ws_frame(orjson.dumps(obj))


class HttpForwarder:
    """The floor of WebSocket mode and of a streamed `POST /v1/responses` (module docstring):
    a request with an `upgrade` header is a WebSocket, any other POST is answered in SSE."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self, port: int = 0) -> HttpForwarder:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _nodelay(writer)
        upstream = await _Upstream(self.upstream_port).open()
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head[1:] if ln)}
                if "sec-websocket-key" in headers:
                    await self._websocket(headers["sec-websocket-key"], reader, writer, upstream)
                    return
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                await self._create(orjson.loads(body), writer, upstream, _sse_event)
                writer.write(b"0\r\n\r\n")
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            upstream.close()
            writer.close()

    async def _websocket(self, key: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         upstream: _Upstream) -> None:  # fmt: skip
        accept = base64.b64encode(hashlib.sha1(key.encode() + _WS_GUID).digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
                     b"sec-websocket-accept: %s\r\n\r\n" % accept)
        while True:
            opcode, payload = await _ws_read(reader)
            if opcode == 0x8:  # close
                writer.write(_ws_frame(b"", 0x8))
                return
            if opcode == 0x1:
                await self._create(orjson.loads(payload), writer, upstream, _ws_event)

    async def _create(self, create: dict, writer: asyncio.StreamWriter, upstream: _Upstream,
                      event: Callable[[dict], bytes]) -> None:  # fmt: skip
        stream = _JsonStream(str(create.get("model") or "paced"))
        writer.write(event(stream.created()) + event(stream.in_progress()))
        async for texts in upstream.stream(stream.model):
            for text in texts:
                for obj in stream.delta(text):
                    writer.write(event(obj))
        writer.write(b"".join(event(obj) for obj in stream.done()))


class _JsonStream:
    """The events of one streamed response, as a Responses server words them: `created` and
    `in_progress` (a response object of the usual fields), the message and its text part added
    with the first token, a delta per token, the done events and `completed` with the output."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.seq = -1
        self.pieces: list[str] = []
        self.response = {
            "id": "resp_" + uuid.uuid4().hex, "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "background": False, "error": None, "incomplete_details": None,
            "instructions": None, "max_output_tokens": None, "max_tool_calls": None, "model": model,
            "output": [], "parallel_tool_calls": True, "previous_response_id": None,
            "prompt_cache_key": None, "reasoning": {"effort": None, "summary": None},
            "safety_identifier": None, "service_tier": "default", "store": False, "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto", "tools": [],
            "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled", "usage": None, "user": None, "metadata": {},
        }
        self.item_id = "msg_" + uuid.uuid4().hex

    def _next(self, obj: dict) -> dict:
        self.seq += 1
        obj["sequence_number"] = self.seq
        return obj

    def created(self) -> dict:
        return self._next({"type": "response.created", "response": self.response})

    def in_progress(self) -> dict:
        return self._next({"type": "response.in_progress", "response": self.response})

    def delta(self, text: str) -> list[dict]:
        out = []
        if not self.pieces:
            out.append(self._next({"type": "response.output_item.added", "output_index": 0, "item": {
                "id": self.item_id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}}))
            out.append(self._next({"type": "response.content_part.added", "item_id": self.item_id, "output_index": 0,
                                   "content_index": 0, "part": _text_part("")}))
        self.pieces.append(text)
        out.append(self._next({"type": "response.output_text.delta", "item_id": self.item_id, "output_index": 0,
                               "content_index": 0, "delta": text, "logprobs": []}))
        return out

    def done(self) -> list[dict]:
        text = "".join(self.pieces)
        item = {"id": self.item_id, "type": "message", "status": "completed", "content": [_text_part(text)],
                "role": "assistant"}
        response = {**self.response, "status": "completed", "output": [item],
                    "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens": len(self.pieces), "output_tokens_details": {"reasoning_tokens": 0},
                              "total_tokens": 10 + len(self.pieces)}}
        return [
            self._next({"type": "response.output_text.done", "item_id": self.item_id, "output_index": 0,
                        "content_index": 0, "text": text, "logprobs": []}),
            self._next({"type": "response.content_part.done", "item_id": self.item_id, "output_index": 0,
                        "content_index": 0, "part": _text_part(text)}),
            self._next({"type": "response.output_item.done", "output_index": 0, "item": item}),
            self._next({"type": "response.completed", "response": response}),
        ]


def _text_part(text: str) -> dict:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


# --- gRPC ---------------------------------------------------------------------------------------------


class GrpcForwarder:
    """The floor of a gRPC Session server (module docstring)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._server: Any = None

    async def start(self, port: int = 0) -> GrpcForwarder:
        import grpc

        from tether.responses.v1 import service_pb2

        handler = grpc.method_handlers_generic_handler("tether.responses.v1.ResponsesService", {
            "Session": grpc.stream_stream_rpc_method_handler(
                self._session, request_deserializer=service_pb2.SessionRequest.FromString,
                response_serializer=service_pb2.SessionResponse.SerializeToString)})
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        await self._server.start()
        return self

    async def stop(self) -> None:
        await self._server.stop(0)

    async def _session(self, requests: Any, context: Any) -> None:
        from tether.responses.v1 import service_pb2

        upstream = await _Upstream(self.upstream_port).open()
        try:
            async for request in requests:
                if not request.HasField("create"):
                    continue
                stream = _ProtoStream(request.create.model or "paced")
                await context.write(service_pb2.SessionResponse(events=[stream.event("created"), stream.event("in_progress")]))
                async for texts in upstream.stream(stream.model):
                    for text in texts:
                        await context.write(service_pb2.SessionResponse(events=stream.delta(text)))
                await context.write(service_pb2.SessionResponse(events=stream.done()))
        finally:
            upstream.close()


class _ProtoStream:
    """`_JsonStream`'s events as the gRPC Session's protobuf events."""

    def __init__(self, model: str) -> None:
        from tether.responses.v1 import response_pb2

        self.model = model
        self.seq = -1
        self.pieces: list[str] = []
        self.response = response_pb2.Response(id="resp_" + uuid.uuid4().hex, created_at=int(time.time()),
                                              status="in_progress", model=model, temperature=1.0, top_p=1.0)
        self.response.text.format.type = "text"
        self.item_id = "msg_" + uuid.uuid4().hex

    def event(self, arm: str) -> Any:
        from tether.responses.v1 import events_pb2

        self.seq += 1
        ev = events_pb2.ServerEvent(sequence_number=self.seq, response_id=self.response.id)
        if arm in ("created", "in_progress", "completed"):
            getattr(ev, arm).response.CopyFrom(self.response)
        return ev

    def _message(self, status: str) -> Any:
        from tether.responses.v1 import items_pb2

        item = items_pb2.Item()
        item.message.id, item.message.role, item.message.status = self.item_id, "assistant", status
        return item

    def delta(self, text: str) -> list[Any]:
        out = []
        if not self.pieces:
            added = self.event("output_item_added")
            added.output_item_added.item.CopyFrom(self._message("in_progress"))
            part = self.event("content_part_added")
            part.content_part_added.item_id = self.item_id
            part.content_part_added.part.output_text.SetInParent()
            out += [added, part]
        self.pieces.append(text)
        ev = self.event("output_text_delta")
        ev.output_text_delta.item_id, ev.output_text_delta.delta = self.item_id, text
        out.append(ev)
        return out

    def done(self) -> list[Any]:
        text = "".join(self.pieces)
        item = self._message("completed")
        item.message.content.add().output_text.text = text
        text_done = self.event("output_text_done")
        text_done.output_text_done.item_id, text_done.output_text_done.text = self.item_id, text
        part_done = self.event("content_part_done")
        part_done.content_part_done.item_id = self.item_id
        part_done.content_part_done.part.output_text.text = text
        item_done = self.event("output_item_done")
        item_done.output_item_done.item.CopyFrom(item)
        self.response.status = "completed"
        self.response.output.append(item)
        self.response.usage.input_tokens, self.response.usage.output_tokens = 10, len(self.pieces)
        return [text_done, part_done, item_done, self.event("completed")]


# --- CLI ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tether_lab.forwarders", description=__doc__.split("\n\n")[0])
    p.add_argument("transport", choices=("http", "grpc"), help="http: WebSocket mode and SSE; grpc: the Session")
    p.add_argument("--to", type=int, required=True, help="the paced upstream's port (127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="this server's port (0: any free one)")
    args = p.parse_args(argv)

    async def serve() -> None:
        cls = HttpForwarder if args.transport == "http" else GrpcForwarder
        server = await cls(args.to).start(args.port)
        await announce_and_wait({"port": server.port})
        await server.stop()

    eventloop.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
