"""Which MCP servers a create may name, and which addresses Tether may connect to for them.

Two checks, both from `[mcp]` (`McpConfig`):

- `check_url` (at validation, before `response.created`): the tool's `server_url` is an http(s)
  URL without userinfo, its path in RFC 3986 normal form (`not_normal`), that `allowed_servers` names (a URL prefix up to a path boundary, or a host
  with an optional port). Anything else is a 400 `mcp_server_not_allowed` naming
  `tools[i].server_url`.
- `check_addresses` (at connect time, for every HTTP request the MCP SDK makes, so redirects are
  checked too): every address the host resolves to must be public, or lie in
  `allow_private_networks`. A name that resolves into a private network that is not allowed is
  refused (`AddressRefused`) before any byte is sent to it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import string
from urllib.parse import urlsplit

from tether import errors
from tether.config import McpConfig
from tether.errors import TetherError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressRefused(Exception):
    """A request to an MCP server whose URL or address the policy does not allow."""


_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")


def not_normal(path: str) -> str | None:
    """What keeps a URL path from its RFC 3986 normal form (None when it is in it): a
    percent-encoded unreserved character, a dot segment, or an encoded or back slash (which
    servers may decode into a path separator). Such a URL is refused, not rewritten: what the
    allow-list checks is then exactly what Tether sends, and no server can read it otherwise."""
    for m in _PERCENT.finditer(path):
        char = chr(int(m.group(1), 16))
        if char in _UNRESERVED:
            return f"a percent-encoded unreserved character ({m.group(0)})"
        if char in "/\\":
            return f"an encoded slash ({m.group(0)})"
    if "\\" in path:
        return "a backslash"
    if any(seg in (".", "..") for seg in path.split("/")):
        return "a dot segment"
    if "%" in _PERCENT.sub("", path):
        return "a '%' that is not a percent-encoding"
    return None


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


class McpPolicy:
    def __init__(self, config: McpConfig) -> None:
        self.config = config
        self._prefixes: list[str] = []
        self._hosts: list[tuple[str, int | None]] = []
        for entry in config.allowed_servers:
            entry = entry.strip()
            if "://" in entry:
                self._prefixes.append(entry)
            else:
                host, _, port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
                self._hosts.append((host.lower().strip("[]"), int(port) if port else None))
        self._networks = [ipaddress.ip_network(n, strict=False) for n in config.allow_private_networks]

    # -- the URL (validation) ----------------------------------------------------------------------

    def url_allowed(self, url: str) -> str | None:
        """None when `url` may be used, else why not (one sentence)."""
        if not self.config.enabled:
            return "MCP is off on this server ([mcp] allowed_servers is empty)"
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return "server_url is not a valid URL"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return "server_url must be an http or https URL"
        if parts.username is not None or parts.password is not None:
            return "server_url must not carry credentials (send them in headers or authorization)"
        odd = not_normal(parts.path)
        if odd is not None:
            return f"server_url must be in its normal form (RFC 3986): its path has {odd}"
        host = parts.hostname.lower()
        for allowed_host, allowed_port in self._hosts:
            if host == allowed_host and (allowed_port is None or (port or _default_port(parts.scheme)) == allowed_port):
                return None
        for prefix in self._prefixes:
            if url == prefix or (url.startswith(prefix) and (prefix[-1] in "/?#" or url[len(prefix)] in "/?#")):
                return None
        return "server_url is not in this server's [mcp] allowed_servers"

    def check_url(self, url: str, param: str) -> None:
        """Raise the 400 naming `param` when `url` may not be used."""
        why = self.url_allowed(url)
        if why is not None:
            raise TetherError(errors.MCP_SERVER_NOT_ALLOWED, why + ".", param=param)

    # -- the addresses (connect time) ----------------------------------------------------------------

    def address_allowed(self, address: IPAddress) -> bool:
        if address.is_global:
            return True
        return any(address in net for net in self._networks)

    async def check_addresses(self, url: str) -> None:
        """Raise AddressRefused unless `url` is allowed and every address of its host is."""
        why = self.url_allowed(url)
        if why is not None:
            raise AddressRefused(why)
        parts = urlsplit(url)
        host = parts.hostname or ""
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(host, parts.port or _default_port(parts.scheme), type=socket.SOCK_STREAM)
            except OSError as exc:
                raise AddressRefused(f"cannot resolve {host!r}: {exc}") from None
            addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]  # str: an IP sockaddr's host
        for address in addresses:
            if not self.address_allowed(address):
                raise AddressRefused(
                    f"{host!r} resolves to {address}, which is not a public address and not in "
                    "[mcp] allow_private_networks"
                )
