"""`encrypted_content` of reasoning items: a model's reasoning carried by a stateless client.

Codex sends `include: ["reasoning.encrypted_content"]` with `store: false` on every request and
resends earlier reasoning items with only `id` and `encrypted_content`. Tether then seals each
reasoning item it outputs: `encrypted_content` = "tether.r1." + base64url(JSON payload) + "." +
base64url(HMAC-SHA256(key, tenant NUL payload)). The payload holds the item's reasoning texts
(`content`) and summary texts. When such an item comes back, `open_item` checks the MAC (so the
blob is tamper-evident, and bound to the tenant that received it) and puts the texts back, so the
model sees its reasoning again on an HTTP full resend or a new connection, exactly as it would on
the connection that produced it.

The payload is signed, not encrypted: the operator can read it (Tether has no secret to keep from
its own operator), the client treats it as opaque. The key is `[server] reasoning_key` (shared by
replicas; hex or any string); without one each process makes a random key (the workers of
`tether serve --workers N` share one the supervisor makes for the run), so its blobs do not
survive a restart or move to another replica (such a blob is then refused with a clear 400).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

import orjson

from tether import errors
from tether.errors import TetherError
from tether.responses.v1 import items_pb2

PREFIX = "tether.r1."


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ReasoningSealer:
    def __init__(self, key: str | None) -> None:
        self._key = key.encode() if key else secrets.token_bytes(32)

    def _mac(self, tenant: str, payload: bytes) -> bytes:
        return hmac.new(self._key, tenant.encode() + b"\0" + payload, hashlib.sha256).digest()

    def mac(self, tenant: str, purpose: bytes, payload: bytes) -> bytes:
        """A MAC of `payload` for `tenant` under the replicas' shared key, for another `purpose`
        than reasoning blobs (whose payloads are JSON objects: a purpose never starts with `{`)."""
        return self._mac(tenant, purpose + b"\0" + payload)

    def seal(self, tenant: str, item: items_pb2.Item) -> None:
        """Set the reasoning item's `encrypted_content` from its texts."""
        r = item.reasoning
        payload = orjson.dumps({"c": list(r.content), "s": list(r.summary)})
        r.encrypted_content = PREFIX + _b64(payload) + "." + _b64(self._mac(tenant, payload))

    def open_item(self, tenant: str, item: items_pb2.Item, where: str) -> None:
        """Check a resent reasoning item's `encrypted_content` and restore its texts (content and
        summary each only where the client sent none). Raises 400 `invalid_item` for a blob this server (with
        this key) did not make for this tenant, or one that was altered."""
        r = item.reasoning
        content = r.encrypted_content
        try:
            if not content.startswith(PREFIX):
                raise ValueError("foreign")
            body, mac = content[len(PREFIX) :].split(".", 1)
            payload = _unb64(body)
            if not hmac.compare_digest(_unb64(mac), self._mac(tenant, payload)):
                raise ValueError("mac")
            texts = orjson.loads(payload)
        except (ValueError, binascii.Error, orjson.JSONDecodeError):
            raise TetherError(
                errors.INVALID_ITEM,
                f"{where}.encrypted_content was not made by this server for this API key, or was altered; "
                "send the reasoning item as this server returned it, or leave it out.",
                param=f"{where}.encrypted_content",
            ) from None
        if not r.content:
            r.content.extend(str(t) for t in texts.get("c", []))
        if not r.summary:
            r.summary.extend(str(t) for t in texts.get("s", []))
