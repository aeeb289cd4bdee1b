"""Lab-only compatibility shims, applied ONLY inside the server/bridge processes the bench starts.

Each shim supplies something the bench needs that the core does not provide yet, is applied only
when the running code lacks the feature (feature detection, so it retires itself once the core
has it), and is recorded in the results (`shims` in results.json) so no figure silently depends on
one. Production code paths never import this module.

- `json_server_timing`: `Response.server_timing` exists in the proto and the turn fills it, but
  the JSON codec (`tether.protocol.json_codec._RESPONSE`) has no field for it, so HTTP and
  WebSocket clients never see it. The shim wraps `json_codec.event_to_json` and
  `response_to_json` to add `{"stages_ms": {...}, "overhead_ms": x}` when the proto has it.
- `prototype_append`: the session does not call `tether.core.prototype` yet. Until `[server]
  prototype_append` exists, the shim installs the module's two hooks the way the session will:
  the turn factory used by `Session._lane_loop` and the `append` arm of `Session.send`.

- `bridge_nodelay`: the bridge's listening socket (`tether.bridge.server._bind`, via
  `socket.create_server`) has proto 0, so asyncio does not set TCP_NODELAY on accepted
  connections; Nagle then holds every frame after the first of a response until the client's
  delayed ACK (~40 ms on Linux loopback). The shim sets TCP_NODELAY on the listening socket.

- `metrics_registry`: the bridge's `/metrics` renders prometheus_client's global registry while
  the engine's metrics live in a private one, so `tether_stage_seconds` is never exposed. The shim
  appends the engine's registry when the bridge runs in-process.

Select with the env var `TETHER_LAB_SHIMS` (comma-separated names, or "auto" for every needed one).
"""

from __future__ import annotations

import os
from typing import Any

APPLIED: list[str] = []


def _json_has_server_timing() -> bool:
    from tether.protocol import json_codec
    from tether.responses.v1 import response_pb2

    r = response_pb2.Response(id="resp_x")
    r.server_timing.overhead_ms = 1.0
    return "server_timing" in json_codec.response_to_json(r)


def json_server_timing() -> bool:
    """Wrap the codec's two Response writers (the bridge looks them up on the module at call
    time) to add `server_timing`; independent of the codec's internals."""
    if _json_has_server_timing():
        return False
    from tether.protocol import json_codec

    response_arms = ("created", "in_progress", "completed", "failed", "incomplete", "queued")
    event_to_json, response_to_json = json_codec.event_to_json, json_codec.response_to_json

    def timing(r: Any) -> dict:
        st = r.server_timing
        return {"stages_ms": dict(st.stages_ms), "overhead_ms": st.overhead_ms}

    def response_with_timing(r: Any) -> dict:
        out = response_to_json(r)
        if r.HasField("server_timing"):
            out["server_timing"] = timing(r)
        return out

    def event_with_timing(ev: Any, *, ws: bool) -> dict:
        out = event_to_json(ev, ws=ws)
        arm = ev.WhichOneof("event")
        if arm in response_arms:
            r = getattr(ev, arm).response
            if r.HasField("server_timing") and isinstance(out.get("response"), dict):
                out["response"]["server_timing"] = timing(r)
        return out

    json_codec.event_to_json = event_with_timing  # type: ignore[assignment]
    json_codec.response_to_json = response_with_timing  # type: ignore[assignment]
    return True


def prototype_wired() -> bool:
    """True when the core has the `[server] prototype_append` switch (the lead wired the hooks)."""
    from tether.config import ServerConfig

    return "prototype_append" in ServerConfig.__dataclass_fields__


def prototype_append() -> bool:
    if prototype_wired():
        return False
    import time

    from tether.core import prototype
    from tether.core import session as session_module

    session_module.Turn = prototype.turn_for  # type: ignore[assignment,misc]
    original = session_module.Session.send

    async def send(self, request):  # type: ignore[no-untyped-def]
        if not self._closed and request.WhichOneof("event") == "append" and prototype.deliver_append(self, request.append):
            self._last_activity = time.monotonic()
            return
        await original(self, request)

    session_module.Session.send = send  # type: ignore[method-assign]
    return True


def _bridge_sockets_nodelay() -> bool:
    """Do connections accepted on the bridge's listening socket get TCP_NODELAY?"""
    import socket

    from tether.bridge import server

    sock = server._bind("127.0.0.1", 0)
    try:
        if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY):
            return True  # inherited by accepted sockets on Linux
        # asyncio sets TCP_NODELAY on accepted sockets only when their proto is IPPROTO_TCP.
        return sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def bridge_nodelay() -> bool:
    """The bridge binds with `socket.create_server`, whose socket has proto 0, so asyncio's
    `_set_nodelay` skips the accepted connections and Nagle stays on: every streamed response
    stalls ~40 ms on the client's delayed ACK after its first frame. The shim sets TCP_NODELAY on
    the listening socket (Linux copies it to accepted sockets)."""
    if _bridge_sockets_nodelay():
        return False
    import socket

    from tether.bridge import server

    original = server._bind

    def bind(host: str, port: int) -> socket.socket:
        sock = original(host, port)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    server._bind = bind  # type: ignore[assignment]
    return True


def _metrics_endpoint_has_engine() -> bool:
    import inspect

    from tether.bridge.http import HttpHandlers

    src = inspect.getsource(HttpHandlers.metrics)
    return "generate_latest()" not in src


def metrics_registry() -> bool:
    """The bridge's `/metrics` renders prometheus_client's global registry, but the engine keeps
    its metrics (`tether_stage_seconds`, ...) in a private registry (`tether.metrics.Metrics`), so
    none of them is exposed. The shim makes the handler render the engine's registry too when
    the bridge runs in-process (its API is the Engine)."""
    if _metrics_endpoint_has_engine():
        return False
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from tether.bridge.http import HttpHandlers

    async def metrics(self, req):  # type: ignore[no-untyped-def]
        body = generate_latest()
        engine_metrics = getattr(self.ctx.api, "metrics", None)
        if engine_metrics is not None and hasattr(engine_metrics, "render"):
            body += engine_metrics.render()
        await req.send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode()),
                                    (b"content-length", str(len(body)).encode())]})
        await req.send({"type": "http.response.body", "body": body})

    HttpHandlers.metrics = metrics  # type: ignore[method-assign]
    return True


SHIMS = {
    "json_server_timing": json_server_timing,
    "prototype_append": prototype_append,
    "bridge_nodelay": bridge_nodelay,
    "metrics_registry": metrics_registry,
}


def apply(names: str | None = None) -> list[str]:
    """Apply the named shims ("auto" = all); returns those that were needed and applied."""
    names = names if names is not None else os.environ.get("TETHER_LAB_SHIMS", "")
    if names.strip() == "none":
        return list(APPLIED)
    wanted = list(SHIMS) if names.strip() == "auto" else [n.strip() for n in names.split(",") if n.strip()]
    for name in wanted:
        if name not in SHIMS:
            raise ValueError(f"unknown lab shim {name!r}; known: {', '.join(SHIMS)}")
        if name not in APPLIED and SHIMS[name]():
            APPLIED.append(name)
    return list(APPLIED)


def needed() -> list[str]:
    """Which shims the current code base would need (without applying any)."""
    out = []
    if not _json_has_server_timing():
        out.append("json_server_timing")
    if not prototype_wired():
        out.append("prototype_append")
    if not _bridge_sockets_nodelay():
        out.append("bridge_nodelay")
    if not _metrics_endpoint_has_engine():
        out.append("metrics_registry")
    return out
