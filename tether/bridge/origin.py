"""Which browsers may talk to the bridge: the `Host` and `Origin` checks, and JSON-only bodies.

A server on a developer's machine is reachable by every web page that developer opens: a page can
open a WebSocket to `ws://127.0.0.1:8000` (browsers apply no same-origin rule to WebSockets), POST
a `text/plain` body (a "simple" request, sent without a CORS preflight), and, through DNS
rebinding, make its own host name resolve to 127.0.0.1 and then read the answers. Local model
servers learned this the hard way; the bridge refuses all three by default:

- `Host` (`server.allowed_hosts`): with the list empty and the bridge bound to a loopback address,
  only loopback names (`localhost`, `*.localhost`, `127.0.0.0/8`, `::1`) are answered, which is what
  defeats DNS rebinding (the page's own host name arrives as `Host`). Bound elsewhere, any `Host`
  is answered unless the list names some. Listed names (`tether.example.com`, `*.example.com` for
  subdomains) are added to the loopback names; `"*"` answers any. 403 `host_not_allowed`.
- `Origin` (`server.allowed_origins`), on every HTTP request and WebSocket upgrade that carries
  one (browsers send it; the openai SDK, curl and gRPC do not): allowed when its host is the
  request's `Host` (same origin, so the console works), when it is a loopback origin and the
  bridge is bound to loopback (local development tools), or when it is listed exactly
  (`https://app.example.com`; `"*"` allows any). 403 `origin_not_allowed`.
- JSON bodies (`check_json_body`): a POST endpoint that reads JSON refuses a body whose
  `Content-Type` is anything but `application/json` (or `application/*+json`): 415
  `unsupported_media_type`. So an HTML form (`text/plain`, `application/x-www-form-urlencoded`,
  `multipart/form-data`) never reaches the API. A body with no `Content-Type` is read as JSON (what
  a non-browser client sending raw bytes means); a browser sends one without a `Content-Type`
  only from script, and always with an `Origin`, which the check above answers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from tether.config import ServerConfig
from tether.errors import HOST_NOT_ALLOWED, ORIGIN_NOT_ALLOWED, UNSUPPORTED_MEDIA_TYPE, TetherError


def is_loopback(host: str) -> bool:
    """`host` (a name or an address, without port; IPv6 with or without brackets) is this machine."""
    host = host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The host of a `Host` header value (`name:port`, `[::1]:8000`), lower-case, without the port."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


@dataclass(frozen=True)
class OriginPolicy:
    loopback_only: bool  # bound to loopback with no allowed_hosts: loopback names only
    any_host: bool
    hosts: frozenset[str]  # exact names
    host_suffixes: tuple[str, ...]  # ".example.com" from "*.example.com"
    any_origin: bool
    loopback_origins: bool
    origins: frozenset[str]  # "scheme://host[:port]", lower-case

    @classmethod
    def from_config(cls, server: ServerConfig) -> OriginPolicy:
        bound_loopback = is_loopback(server.bridge_host)
        listed = [h.strip().lower() for h in server.allowed_hosts if h.strip()]
        origins = [o.strip().lower().rstrip("/") for o in server.allowed_origins if o.strip()]
        return cls(
            loopback_only=bound_loopback and not listed,
            any_host="*" in listed or (not listed and not bound_loopback),
            hosts=frozenset(h for h in listed if not h.startswith("*.")),
            host_suffixes=tuple(h[1:] for h in listed if h.startswith("*.")),
            any_origin="*" in origins,
            loopback_origins=bound_loopback,
            origins=frozenset(origins),
        )

    def host_allowed(self, host: str) -> bool:
        if self.any_host or is_loopback(host):
            return True
        if self.loopback_only:
            return False
        return host in self.hosts or host.endswith(self.host_suffixes)

    def check(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Raise 403 for a `Host` or an `Origin` this bridge does not answer (see above)."""
        headers = list(headers)
        raw_host = _header(headers, b"host")
        host = host_name(raw_host) if raw_host else ""
        if not self.host_allowed(host):
            raise TetherError(
                HOST_NOT_ALLOWED,
                f"Host {raw_host or '(none)'!r} is not served here; list it in server.allowed_hosts.",
            )
        origin = _header(headers, b"origin")
        if origin is None or self.any_origin:
            return
        normalised = origin.strip().lower().rstrip("/")
        try:
            origin_host = urlsplit(normalised).hostname or ""
        except ValueError:
            origin_host = ""
        if (origin_host and origin_host == host) or normalised in self.origins:
            return
        if self.loopback_origins and origin_host and is_loopback(origin_host):
            return
        raise TetherError(
            ORIGIN_NOT_ALLOWED,
            f"Origin {origin!r} may not use this server; list it in server.allowed_origins.",
        )


def check_json_body(headers: Iterable[tuple[bytes, bytes]], body: bytes) -> None:
    """Refuse (415) a non-empty body whose `Content-Type` says it is something other than JSON."""
    value = _header(headers, b"content-type")
    if not body or value is None:
        return
    media = value.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return
    raise TetherError(
        UNSUPPORTED_MEDIA_TYPE,
        f"Content-Type {value!r} is not supported; send the body as 'application/json'.",
    )
