"""Short-lived console tokens: what a browser page holds instead of the API key.

A browser cannot set `Authorization` on a WebSocket handshake, and the page must not keep the
long-lived API key in a URL or in page storage. So the page sends the key once, over an
authenticated `POST /console/token`, and gets a token that names the key's tenant and expires
after `server.console_token_ttl_s`. The WebSocket handshake accepts it as a subprotocol
(`Sec-WebSocket-Protocol: tether.console, tether-token.<token>`, the way OpenAI's realtime
clients pass ephemeral keys); the server answers with the `tether.console` subprotocol.

The token is only a WebSocket credential: it is never an API key, so HTTP endpoints and gRPC
refuse it (they compare against the configured keys), and it cannot open a socket through
`Authorization: Bearer`.

Format: `tct1.<payload>.<mac>`, both base64url without padding; payload is the JSON
`{"t": tenant, "exp": unix seconds}` and mac is HMAC-SHA256 over `tct1.<payload>` with a secret
derived from the configured keys' digests (`Authenticator.token_secret`). Deriving it from the
keys, not from process randomness, means every worker of `tether serve --workers N` and every
replica with the same keys file accepts the token; a holder of one key does not know the others,
so cannot forge another tenant's token, and rotating the keys revokes every token.

Sans-I/O: `ConsoleTokens` mints and checks; `now` is passed in.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
from dataclasses import dataclass

from tether.errors import INVALID_API_KEY, TetherError

PREFIX = "tct1"
SUBPROTOCOL = "tether.console"  # the subprotocol the server selects
TOKEN_SUBPROTOCOL_PREFIX = "tether-token."  # the one that carries the token


class TokenCheck(enum.Enum):
    VALID = "valid"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Minted:
    token: str
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ConsoleTokens:
    """Mint and check tenant-scoped tokens signed with `secret`, valid for `ttl_s` seconds."""

    def __init__(self, secret: bytes, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError("server.console_token_ttl_s must be > 0")
        self._secret = secret
        self.ttl_s = ttl_s

    def _mac(self, signed: str) -> str:
        return _b64(hmac.new(self._secret, signed.encode(), hashlib.sha256).digest())

    def mint(self, tenant: str, now: float) -> Minted:
        expires_at = round(now + self.ttl_s, 3)
        payload = _b64(json.dumps({"t": tenant, "exp": expires_at}, separators=(",", ":")).encode())
        signed = f"{PREFIX}.{payload}"
        return Minted(f"{signed}.{self._mac(signed)}", expires_at)

    def check(self, token: str, now: float) -> tuple[TokenCheck, str]:
        """(outcome, tenant); the tenant is "" unless the outcome is VALID."""
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != PREFIX:
            return TokenCheck.MALFORMED, ""
        if not hmac.compare_digest(self._mac(f"{parts[0]}.{parts[1]}"), parts[2]):
            return TokenCheck.BAD_SIGNATURE, ""
        try:
            claims = json.loads(_unb64(parts[1]))
            tenant, expires_at = claims["t"], float(claims["exp"])
        except (ValueError, KeyError, TypeError):
            return TokenCheck.MALFORMED, ""
        if not isinstance(tenant, str):
            return TokenCheck.MALFORMED, ""
        if now >= expires_at:
            return TokenCheck.EXPIRED, ""
        return TokenCheck.VALID, tenant

    def tenant_for(self, token: str, now: float) -> str:
        """The token's tenant; 401 `invalid_api_key` saying why when it is not valid."""
        outcome, tenant = self.check(token, now)
        if outcome is TokenCheck.VALID:
            return tenant
        why = "has expired" if outcome is TokenCheck.EXPIRED else "is not valid"
        raise TetherError(
            INVALID_API_KEY, f"The console token {why}: get a new one from POST /console/token."
        )


def offered_token(subprotocols: list[str]) -> str | None:
    """The token among a handshake's offered subprotocols, if any."""
    for proto in subprotocols:
        if proto.startswith(TOKEN_SUBPROTOCOL_PREFIX):
            return proto[len(TOKEN_SUBPROTOCOL_PREFIX) :]
    return None
