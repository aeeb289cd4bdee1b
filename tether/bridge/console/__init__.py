"""The Tether console: a browser page served by the bridge at `/console`.

Plain HTML, CSS and ES modules shipped as package data (`static/`): no CDN, no build step, works
offline, under a strict Content-Security-Policy (scripts and styles from this origin only, no
inline code, no frames, connections only back to this origin). Three views:

- session: WebSocket mode from the browser (text turns, function tools answered by hand or with
  canned outputs), every event with its time since the turn started, the
  `previous_response_id` chain, lanes, `cached_tokens` and `tether:server_timing`;
- race: one lab workload (`tether.workloads`, served by `GET /console/api/workloads/{name}`)
  run over HTTP full resend and over WebSocket mode; the simulated model plays the workload as
  the model `tether-lab/<workload>@<speed>`, the same script `tether bench` generates;
- server (admin keys only): live figures from the engine's metrics (`server_view.snapshot`).

Auth for a browser (`tokens`): the API key is typed into the page and kept in memory only; it
authenticates the page's HTTP calls and is exchanged once per connection for a short-lived,
tenant-scoped token that the WebSocket handshake accepts as a subprotocol. Every call the page
makes is scoped to the key's tenant like any other client's; the server view (process-wide
figures) needs a key of a tenant in `server.console_admin_tenants`.

Hooks into the bridge: `ROUTES` (added to the app's table), `ConsoleHandlers` (the handlers those
routes name) and `ws_credentials` (the WebSocket handshake's tenant and subprotocol).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tether.bridge import common
from tether.bridge.common import BridgeContext
from tether.bridge.console import server_view, tokens
from tether.bridge.http import HttpRequest, send_json
from tether.errors import INVALID_REQUEST, NOT_FOUND, NOT_IMPLEMENTED, PERMISSION_DENIED, TetherError
from tether.protocol import json_codec

STATIC_DIR = Path(__file__).parent / "static"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_PAGE_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]
_NO_STORE = [(b"cache-control", b"no-store")]
_TYPES = {".html": b"text/html; charset=utf-8", ".css": b"text/css; charset=utf-8",
          ".js": b"text/javascript; charset=utf-8", ".svg": b"image/svg+xml"}  # fmt: skip

# (path template, {method: handler name}, needs auth), as in tether.bridge.app.
ROUTES: list[tuple[tuple[str, ...], dict[str, str], bool]] = [
    (("console",), {"GET": "console_page"}, False),
    (("console", "static", "{name}"), {"GET": "console_static"}, False),
    (("console", "token"), {"POST": "console_token"}, True),
    (("console", "api", "workloads"), {"GET": "console_workloads"}, True),
    (("console", "api", "workloads", "{name}"), {"GET": "console_workload"}, True),
    (("console", "api", "server"), {"GET": "console_server"}, True),
]


class ConsoleHandlers:
    def __init__(self, ctx: BridgeContext) -> None:
        self.ctx = ctx
        auth = ctx.authenticator
        secret = auth.token_secret()
        # An open server has no keys to derive a secret from, and needs no token (its handshakes
        # are not authenticated): the tokens it mints only keep the page's flow the same.
        self.mints = auth.open or secret is not None
        self.tokens = tokens.ConsoleTokens(secret or os.urandom(32), ctx.server.console_token_ttl_s)
        self.admins = frozenset(t.strip() for t in ctx.server.console_admin_tenants.split(",") if t.strip())
        # A few KiB in all: read once, so serving a file never blocks the event loop on disk.
        self.static = {p.name: (_TYPES[p.suffix], p.read_bytes()) for p in STATIC_DIR.iterdir() if p.suffix in _TYPES}

    def is_admin(self, tenant: str) -> bool:
        return self.ctx.authenticator.open or tenant in self.admins

    async def _file(self, req: HttpRequest, name: str, extra: list[tuple[bytes, bytes]]) -> None:
        found = self.static.get(name)
        if found is None:
            raise TetherError(NOT_FOUND, f"No console file {name!r}.")
        content_type, body = found
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra]
        await req.send({"type": "http.response.start", "status": 200, "headers": headers})
        await req.send({"type": "http.response.body", "body": body})

    # GET /console
    async def console_page(self, req: HttpRequest) -> None:
        await self._file(req, "index.html", [*_PAGE_HEADERS, *_NO_STORE])

    # GET /console/static/{name}
    async def console_static(self, req: HttpRequest) -> None:
        await self._file(req, req.path_params["name"], [*_PAGE_HEADERS, (b"cache-control", b"no-cache")])

    # POST /console/token (Authorization: Bearer <API key>)
    async def console_token(self, req: HttpRequest) -> None:
        if not self.mints:
            raise TetherError(
                NOT_IMPLEMENTED,
                "This bridge forwards callers' keys to its upstream and has no keys of its own, so it "
                "cannot issue console tokens; configure api_keys_file on the bridge.",
            )
        minted = self.tokens.mint(req.tenant, time.time())
        body = {
            "token": minted.token,
            "expires_at": minted.expires_at,
            "expires_in": self.tokens.ttl_s,
            "subprotocols": [tokens.SUBPROTOCOL, tokens.TOKEN_SUBPROTOCOL_PREFIX + minted.token],
            "admin": self.is_admin(req.tenant),
        }
        await send_json(req.send, 200, json_codec.dumps(body), _NO_STORE)

    # GET /console/api/workloads
    async def console_workloads(self, req: HttpRequest) -> None:
        from tether import workloads

        data = [_workload_summary(workloads.load(name)) for name in workloads.available()]
        await send_json(req.send, 200, json_codec.dumps({"object": "list", "data": data}))

    # GET /console/api/workloads/{name}?speed=1000
    async def console_workload(self, req: HttpRequest) -> None:
        from tether import workloads
        from tether.backends.simulated import LAB_MODEL_PREFIX

        name = req.path_params["name"]
        if name not in workloads.available():
            raise TetherError(NOT_FOUND, f"No workload {name!r}.")
        speed = req.query().get("speed", "1000")
        try:
            workloads.SpeedProfile.parse(speed)
        except ValueError:
            raise TetherError(
                INVALID_REQUEST, "Invalid 'speed': use tokens/s[@ttft_min:ttft_max ms], e.g. 1000.", param="speed"
            ) from None
        wl = workloads.load(name)
        body = {
            **_workload_summary(wl),
            "model": f"{LAB_MODEL_PREFIX}{name}@{speed}",
            "speed": speed,
            "instructions": wl.instructions,
            "tools": list(wl.tools),
            "user_message": wl.user_message(),
            "steps": [
                {
                    "calls": [c.name for c in step.calls],
                    "outputs": [wl.tool_output(i, j) for j in range(len(step.calls))],
                    "tool_ms": step.tool_ms,
                }
                for i, step in enumerate(wl.steps)
            ],
        }
        await send_json(req.send, 200, json_codec.dumps(body))

    # GET /console/api/server (admin)
    async def console_server(self, req: HttpRequest) -> None:
        if not self.is_admin(req.tenant):
            raise TetherError(
                PERMISSION_DENIED,
                "The server view needs an admin key (a tenant in server.console_admin_tenants).",
            )
        registry = getattr(getattr(self.ctx.api, "telemetry", None), "registry", None)
        if registry is None:
            raise TetherError(
                NOT_IMPLEMENTED, "This bridge runs apart from the engine: its metrics are upstream."
            )
        await send_json(req.send, 200, json_codec.dumps(server_view.snapshot(registry)), _NO_STORE)


def _workload_summary(wl: Any) -> dict[str, Any]:
    return {"name": wl.name, "description": wl.description, "turns": wl.turns, "tool_calls": wl.tool_calls}


def ws_credentials(
    console: ConsoleHandlers | None, ctx: BridgeContext, scope: dict[str, Any]
) -> tuple[str, str | None]:
    """(tenant, subprotocol to select) for a WebSocket handshake.

    `Authorization: Bearer <key>` wins when present. Otherwise a console token offered as the
    `tether-token.<token>` subprotocol authenticates (when the console is on), and the server
    selects `tether.console` (a browser fails a handshake whose offered subprotocols all go
    unanswered). Raises the 401 `TetherError` of a missing, bad or expired credential."""
    offered = list(scope.get("subprotocols") or ())
    selected = tokens.SUBPROTOCOL if tokens.SUBPROTOCOL in offered else None
    token = tokens.offered_token(offered)
    if console is None or token is None or common.header(scope["headers"], b"authorization") is not None:
        return common.authenticate(ctx, scope["headers"]), selected
    if ctx.authenticator.open:
        return "", selected
    return console.tokens.tenant_for(token, time.time()), selected
