"""The JSON front end: OpenAI-compatible HTTP endpoints and WebSocket mode under `/v1`.

A thin adapter over `tether.core.api.ResponsesAPI`: it authenticates, decodes JSON into protobuf
(`tether.protocol.json_codec`), forwards, and encodes the answers back. It implements no protocol
semantics of its own (lanes, caching, warm-up, limits live in the session core), so it runs the
same in-process next to the Engine or in a separate process over `RemoteResponsesAPI`.

Modules: `app` (the raw ASGI app and its router), `common` (what HTTP and WebSocket share: auth,
body decoding, error rendering), `http` (HTTP handlers), `ws` (one WebSocket connection),
`listener` (`start_bridge`: uvicorn on a bound socket, TLS, graceful stop), `ws_transport` (the
websockets-sansio protocol under uvicorn), `console` (the browser console at `/console` and its
WebSocket tokens). Its cost per frame is measured by `python -m tether_lab.bench_bridge`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.bridge.listener import BridgeServer, start_bridge

__all__ = ["BridgeServer", "start_bridge"]


def __getattr__(name: str) -> Any:  # lazy: importing one module of the bridge loads no uvicorn
    if name in __all__:
        from tether.bridge import listener

        return getattr(listener, name)
    raise AttributeError(name)
