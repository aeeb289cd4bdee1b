"""A small MCP server for the docs' worked example and the lab (`tether_lab.mcp_overhead`): the
`mcp` SDK's `MCPServer` over streamable HTTP with two tools, `roll` (dice) and `lookup`
(read-only, annotated `readOnlyHint`).

    python -m tether_lab.mcp_demo --port 8931      # serves http://127.0.0.1:8931/mcp
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from typing import Any

from tether.extras import require


def app() -> Any:
    """The ASGI app: `/mcp` answers MCP over streamable HTTP."""
    server_mod = require("mcp.server.mcpserver", "mcp")
    types = require("mcp.types", "mcp")
    mcp = server_mod.MCPServer("tether-demo")

    @mcp.tool(description="Roll `count` dice with `sides` sides and return the total.")
    def roll(sides: int = 6, count: int = 1) -> str:
        return f"total {count * sides // 2 + count}"  # deterministic: a demo, not a casino

    @mcp.tool(description="Look a key up in a tiny table.", annotations=types.ToolAnnotations(readOnlyHint=True))
    def lookup(key: str = "") -> str:
        return {"tether": "a Responses API server"}.get(key, f"no entry for {key!r}")

    return mcp.streamable_http_app()


class DemoServer:
    """`app()` served by uvicorn on a daemon thread (127.0.0.1, port 0 unless given)."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def __enter__(self) -> DemoServer:
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app(), log_level="warning", timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the demo MCP server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True  # open SSE streams get timeout_graceful_shutdown to end
        if self._thread is not None:
            self._thread.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8931)
    args = parser.parse_args()
    with DemoServer(args.port) as server:
        print(f"MCP demo server on {server.url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
