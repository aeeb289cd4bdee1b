"""API keys -> tenants. Shared by every transport (HTTP/WS `Authorization: Bearer`, gRPC
`authorization` metadata), so a key means the same tenant everywhere.

Keys come from a file (`key tenant` per line, `#` comments) and/or the TETHER_API_KEYS env var
(`key:tenant,key2:tenant2`; a key without `:tenant` is its own tenant name's hash). With no keys
configured the server is open and every caller is tenant "" (a loud warning is logged at start).
Comparison is constant-time over every configured key, so timing does not reveal a prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tether.errors import INVALID_API_KEY, TetherError


class Authenticator:
    def __init__(self, keys: Mapping[str, str]) -> None:
        # Keep digests only: equal-length comparison, and no raw key lingering in a dict lookup.
        self._entries = [(hashlib.sha256(k.encode()).digest(), tenant) for k, tenant in keys.items()]

    @property
    def open(self) -> bool:
        return not self._entries

    def tenants(self) -> frozenset[str]:
        """The distinct tenants the configured keys name (several keys may share one)."""
        return frozenset(tenant for _, tenant in self._entries)

    def tenant_of(self, authorizations: Sequence[str]) -> str:
        """The tenant of a request, from every `Authorization` value it carried (HTTP headers or
        gRPC metadata). More than one is refused (401): which one would win is transport trivia
        (HTTP stacks read the first, gRPC's metadata dict the last), never a choice to make."""
        if len(authorizations) > 1:
            raise TetherError(
                INVALID_API_KEY, "The request has more than one 'Authorization' header; send exactly one."
            )
        return self.tenant_for(authorizations[0] if authorizations else None)

    def tenant_for(self, authorization: str | None) -> str:
        """The tenant of an `Authorization` header value; raises 401 `invalid_api_key`."""
        if self.open:
            return ""
        token = _bearer(authorization)
        if token is None:
            raise TetherError(
                INVALID_API_KEY, "Missing bearer authentication in header 'Authorization'."
            )
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for key_digest, tenant in self._entries:  # no early exit: constant time in the key set
            if hmac.compare_digest(digest, key_digest):
                found = tenant
        if found is None:
            raise TetherError(INVALID_API_KEY, "Incorrect API key provided.")
        return found

    def token_secret(self) -> bytes | None:
        """The secret console tokens are signed with (`tether.bridge.console.tokens`): derived from
        every configured key's digest, so processes sharing a keys file agree on it and a caller
        holding one key cannot compute it. None when no keys are configured."""
        if not self._entries:
            return None
        digests = sorted(digest for digest, _ in self._entries)
        return hashlib.sha256(b"tether-console-token-v1\0" + b"".join(digests)).digest()

    @classmethod
    def from_sources(cls, *, file: str | None = None, env: str | None = None) -> Authenticator:
        keys: dict[str, str] = {}
        if file:
            keys.update(parse_lines(Path(file).read_text().splitlines()))
        env_value = env if env is not None else os.environ.get("TETHER_API_KEYS", "")
        keys.update(parse_lines(env_value.split(",")))
        return cls(keys)


def parse_lines(lines: Iterable[str]) -> dict[str, str]:
    keys: dict[str, str] = {}
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, tenant = line.replace(":", " ", 1).partition(" ")
        key, tenant = key.strip(), tenant.strip()
        keys[key] = tenant or "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return keys


def _bearer(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
