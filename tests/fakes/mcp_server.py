"""A real MCP server (the `mcp` SDK's `MCPServer`, streamable HTTP) on 127.0.0.1, for tests.

    with McpTestServer() as mcp:              # uvicorn on a daemon thread, port 0
        mcp.url                               # http://127.0.0.1:PORT/mcp
        mcp.initializations, mcp.list_calls   # what clients did, counted
        mcp.calls                             # [(tool name, arguments)] in call order

Tools: `roll(sides, count)` (deterministic: the sum is `count * sides // 2 + count`), `echo(text)`,
`fail(reason)` (the tool raises: an `isError` result), `hang(seconds)` (sleeps), `huge(n)` (a result
of `n` bytes) and `lookup(key)` (read-only: annotated `readOnlyHint`). Every request's headers are
recorded (`headers`), so a test can see what Tether sent.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations


def roll_total(sides: int, count: int) -> int:
    return count * sides // 2 + count


class McpTestServer:
    def __init__(self, *, stateless: bool = False, port: int = 0, sse: bool = False) -> None:
        self.stateless = stateless
        self.sse = sse  # the older HTTP+SSE transport only (GET /sse, POST /messages/)
        self.initializations = 0
        self.list_calls = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/sse" if self.sse else f"http://127.0.0.1:{self.port}/mcp"

    def _app(self) -> Any:
        mcp = MCPServer("tether-test")

        @mcp.tool(description="Roll `count` dice with `sides` sides and return the total.")
        def roll(sides: int = 6, count: int = 1) -> str:
            self.calls.append(("roll", {"sides": sides, "count": count}))
            return f"total {roll_total(sides, count)}"

        @mcp.tool(description="Return the text unchanged.")
        def echo(text: str = "") -> str:
            self.calls.append(("echo", {"text": text}))
            return text

        @mcp.tool(description="Always fails.")
        def fail(reason: str = "broken") -> str:
            self.calls.append(("fail", {"reason": reason}))
            raise RuntimeError(f"the tool failed: {reason}")

        @mcp.tool(description="Sleep, then answer.")
        async def hang(seconds: float = 30.0) -> str:
            self.calls.append(("hang", {"seconds": seconds}))
            await asyncio.sleep(seconds)
            return "woke"

        @mcp.tool(description="Return n bytes.")
        def huge(n: int = 2_000_000) -> str:
            self.calls.append(("huge", {"n": n}))
            return "x" * n

        @mcp.tool(description="Look a key up.", annotations=ToolAnnotations(readOnlyHint=True))
        def lookup(key: str = "") -> str:
            self.calls.append(("lookup", {"key": key}))
            return f"value of {key}"

        app = mcp.sse_app() if self.sse else mcp.streamable_http_app(stateless_http=self.stateless)
        outer = self

        async def counting(scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
                outer.headers.append(headers)
                if scope["method"] == "POST":
                    body = []
                    more = True
                    messages = []
                    while more:
                        message = await receive()
                        messages.append(message)
                        body.append(message.get("body", b""))
                        more = message.get("more_body", False)
                    text = b"".join(body)
                    if b'"initialize"' in text:
                        outer.initializations += 1
                    if b'"tools/list"' in text:
                        outer.list_calls += 1
                    replay = iter(messages)

                    async def receive_again() -> dict:
                        try:
                            return next(replay)
                        except StopIteration:
                            return await receive()

                    await app(scope, receive_again, send)
                    return
            await app(scope, receive, send)

        return counting

    def __enter__(self) -> McpTestServer:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the MCP test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True  # open SSE streams get timeout_graceful_shutdown to end
        self._thread.join(5)
