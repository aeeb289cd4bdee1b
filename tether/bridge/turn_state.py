"""Sticky routing for Codex: the `x-codex-turn-state` header (docs/deployment.md, "Sticky routing").

Codex echoes the value a server set on its WebSocket upgrade answer (or on an HTTP response) as a
request header on the follow-up requests of the same turn: a reconnect, the HTTP fallback. A load
balancer that routes on it keeps the turn on the replica whose connection cache holds its
responses (a `store: false` continuation works only there). Codex treats the value as opaque.

The value names the replica and nothing else: `<replica_id>.<mac>`, the MAC an HMAC-SHA256 of the
replica id under `server.turn_state_key` (the same key on every replica). It is the same on every
response of the replica, so it carries no tenant, connection or response, and Tether never reads
it: every lookup of state stays scoped by the API key. nginx (deploy/nginx/tether.conf) routes
only on the exact tokens it was configured with, so a made-up or altered value picks nothing and
the request takes the normal policy; the MAC makes a replica's token unguessable from its id.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from tether.config import ServerConfig

HEADER = "x-codex-turn-state"


def token(replica_id: str, key: str) -> str:
    """The `x-codex-turn-state` value of replica `replica_id` under `key`."""
    mac = hmac.new(key.encode(), f"{HEADER}:{replica_id}".encode(), hashlib.sha256).digest()
    return f"{replica_id}.{base64.urlsafe_b64encode(mac[:18]).decode()}"


def headers(server: ServerConfig) -> tuple[tuple[bytes, bytes], ...]:
    """The response header this replica sets (none without `server.replica_id`)."""
    if not server.replica_id:
        return ()
    assert server.turn_state_key, "config.validate requires turn_state_key with replica_id"
    return ((HEADER.encode(), token(server.replica_id, server.turn_state_key).encode()),)
