"""A hostile MCP server on 127.0.0.1: it speaks just enough streamable HTTP (JSON answers, no
session id) for the SDK's client to initialise, then answers what a test sets, streamed in chunks
so that the server itself never holds a huge answer:

    with HostileMcpServer() as bad:
        bad.description_bytes = 200_000_000   # tools/list: one tool with a description this long
        bad.schema_bytes = N                  # ... or an input schema this long
        bad.tools = N                         # ... or this many small tools on one page
        bad.pages = 3                         # ... after this many pages (empty ones first)
        bad.endless_pages = True              # ... or empty pages with a nextCursor, for ever
        bad.page_delay_s = 0.2                # each tools/list page waits this long first
        bad.result_bytes = 500_000_000        # tools/call: a text result this long, as plain JSON
        bad.error_bytes = 8_000_000           # tools/call: a JSON-RPC error message this long
        bad.gzip = True                       # answers say `Content-Encoding: gzip`
        bad.sent                              # bytes written before the client stopped reading
        bad.list_pages, bad.calls             # what clients asked

`python -m tests.fakes.hostile_mcp --port 8932 --description-bytes 200000000` runs one in a
process of its own (the lab's measurements: tether_lab/mcp_hostile.py).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
from collections.abc import Iterator
from typing import Any

import orjson
import uvicorn

from tests.fakes.mcp_server import McpTestServer

CHUNK = 1 << 20


class HostileMcpServer(McpTestServer):
    def __init__(self, *, port: int = 0) -> None:
        super().__init__(port=port)
        self.description_bytes = 0
        self.schema_bytes = 0
        self.tools = 1
        self.pages = 1
        self.endless_pages = False
        self.page_delay_s = 0.0
        self.result_bytes = 0
        self.error_bytes = 0
        self.gzip = False
        self.sent = 0
        self.list_pages = 0

    def _app(self) -> Any:
        async def app(scope: dict, receive: Any, send: Any) -> None:
            await self._asgi(scope, receive, send)

        return app

    async def _asgi(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": kind + ".complete"})
                if kind == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 405, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = orjson.loads(body)
        method, rid = request.get("method"), request.get("id")
        if rid is None:  # a notification
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if method == "initialize":
            version = request["params"].get("protocolVersion", "2025-06-18")
            await self._whole(send, {"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": version, "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"}}})  # fmt: skip
        elif method == "tools/list":
            self.list_pages += 1
            await asyncio.sleep(self.page_delay_s)
            await self._listing(send, receive, rid, (request.get("params") or {}).get("cursor"))
        elif method == "tools/call":
            self.calls.append((request["params"]["name"], request["params"].get("arguments") or {}))
            await self._call(send, receive, rid)
        else:
            await self._whole(send, {"jsonrpc": "2.0", "id": rid, "result": {}})

    async def _start(self, send: Any) -> None:
        headers = [(b"content-type", b"application/json")]
        if self.gzip:
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})

    async def _whole(self, send: Any, message: dict) -> None:
        await self._start(send)
        raw = orjson.dumps(message)
        await send({"type": "http.response.body", "body": gzip.compress(raw) if self.gzip else raw})

    async def _streamed(self, send: Any, receive: Any, head: bytes, filler: int, tail: bytes) -> None:
        """`head`, `filler` bytes of `x`, `tail`, in chunks, until done or the client goes away."""
        await self._start(send)
        block = b"x" * min(CHUNK, filler)

        def pieces() -> Iterator[bytes]:  # made as they are sent: the server holds one block
            yield head
            left = filler
            while left > 0:
                yield block if left >= len(block) else block[:left]
                left -= len(block)
            yield tail

        gone = asyncio.ensure_future(receive())  # http.disconnect: the client stopped reading
        try:
            for piece in pieces():
                if gone.done():
                    return
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                self.sent += len(piece)
                await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            pass
        finally:
            gone.cancel()

    async def _listing(self, send: Any, receive: Any, rid: Any, cursor: str | None) -> None:
        page = int(cursor[1:]) if cursor else 0
        if self.endless_pages or page + 1 < self.pages:
            await self._whole(send, {"jsonrpc": "2.0", "id": rid,
                                     "result": {"tools": [], "nextCursor": f"p{page + 1}"}})  # fmt: skip
            return
        if self.description_bytes or self.schema_bytes:
            ident = orjson.dumps(rid).decode()
            if self.description_bytes:
                head = ('{"jsonrpc":"2.0","id":' + ident + ',"result":{"tools":[{"name":"big",'
                        '"inputSchema":{"type":"object"},"description":"').encode()  # fmt: skip
                await self._streamed(send, receive, head, self.description_bytes, b'"}]}}')
            else:
                head = ('{"jsonrpc":"2.0","id":' + ident + ',"result":{"tools":[{"name":"big",'
                        '"inputSchema":{"type":"object","description":"').encode()  # fmt: skip
                await self._streamed(send, receive, head, self.schema_bytes, b'"}}]}}')
            return
        tools = [{"name": f"t{i}", "description": "A tool.", "inputSchema": {"type": "object"}}
                 for i in range(self.tools)]  # fmt: skip
        await self._whole(send, {"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}})

    async def _call(self, send: Any, receive: Any, rid: Any) -> None:
        ident = orjson.dumps(rid).decode()
        if self.error_bytes:
            head = ('{"jsonrpc":"2.0","id":' + ident + ',"error":{"code":-32000,"message":"').encode()
            await self._streamed(send, receive, head, self.error_bytes, b'"}}')
        else:
            head = ('{"jsonrpc":"2.0","id":' + ident + ',"result":{"isError":false,"content":[{"type":"text",'
                    '"text":"').encode()  # fmt: skip
            await self._streamed(send, receive, head, self.result_bytes, b'"}]}}')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8932)
    for name in ("description_bytes", "schema_bytes", "result_bytes", "error_bytes"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=0)
    ap.add_argument("--endless-pages", action="store_true")
    args = ap.parse_args()
    server = HostileMcpServer(port=args.port)
    for name in ("description_bytes", "schema_bytes", "result_bytes", "error_bytes", "endless_pages"):
        setattr(server, name, getattr(args, name))
    uvicorn.run(server._app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
