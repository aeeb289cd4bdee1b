"""The JSON front end: OpenAI-compatible HTTP endpoints and WebSocket mode under `/v1`.

A thin adapter over `tether.core.api.ResponsesAPI`: it authenticates, decodes JSON into protobuf
(`tether.protocol.json_codec`), forwards, and encodes the answers back. It implements no protocol
semantics of its own (lanes, caching, warm-up, limits live in the session core), so it runs the
same in-process next to the Engine or in a separate process over `RemoteResponsesAPI`.

Modules: `app` (the raw ASGI app and its router), `common` (what HTTP and WebSocket share: auth,
body decoding, error rendering), `http` (HTTP handlers), `ws` (one WebSocket connection),
`server` (`start_bridge`: uvicorn on a bound socket, TLS, graceful stop), `console` (the browser
console at `/console` and its WebSocket tokens), `bench_overhead`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.bridge.server import BridgeServer, start_bridge

__all__ = ["BridgeServer", "start_bridge"]


def __getattr__(name: str) -> Any:  # lazy: `python -m tether.bridge.bench_overhead` stays light
    if name in __all__:
        from tether.bridge import server

        return getattr(server, name)
    raise AttributeError(name)
