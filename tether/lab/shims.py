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


SHIMS = {"json_server_timing": json_server_timing, "prototype_append": prototype_append}


def apply(names: str | None = None) -> list[str]:
    """Apply the named shims ("auto" = all); returns those that were needed and applied."""
    names = names if names is not None else os.environ.get("TETHER_LAB_SHIMS", "")
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
    return out
