"""Why `tether serve` or `tether bridge` could not start, said in one line.

A failure the operator can fix is raised as `StartupError` where it happens, naming what failed
and the setting or flag that changes it: a port already in use (`listen_error`), a TLS
certificate or key that does not load (`check_tls`), a store that cannot be opened
(`open_configured_store`). The `tether` program prints `tether: <message>` on stderr and exits
with status 1, without a traceback (tether/cli.py); so does a missing extra
(`tether.extras.MissingExtra`) and a bad configuration key or value (`tether.config`).

Everything here runs before the server listens, and whatever was started before the failure is
stopped first (tether/server.py `start`), so nothing else reaches the terminal.
"""

from __future__ import annotations

import errno
import socket
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from tether.config import ServerConfig
from tether.extras import MissingExtra

if TYPE_CHECKING:
    from tether.store.base import Store

# What listens where, and what moves it: (what, its port setting, the port's flag, its host setting).
GRPC = ("gRPC", "server.grpc_port", "--grpc-port", "grpc_host")
BRIDGE = ("HTTP/WebSocket", "server.bridge_port", "--port", "bridge_host")
METRICS = ("metrics", "server.metrics_port", None, "bridge_host")
Listener = tuple[str, str, str | None, str]


class StartupError(Exception):
    """The server cannot start; the message is the whole explanation (one line)."""


def listen_error(listener: Listener, host: str, port: int, exc: OSError) -> StartupError:
    """The one-line explanation of `exc`, raised binding `listener` (GRPC, BRIDGE, METRICS) to
    `host:port`."""
    what, setting, flag, host_setting = listener
    change = f"[server] {setting.partition('.')[2]}" + (f" or {flag}" if flag else "")
    if exc.errno == errno.EADDRINUSE:
        return StartupError(
            f"the {what} port {host}:{port} is already in use (another tether serve?): "
            f"choose another with {change} (0 picks a free port)"
        )
    reason = exc.strerror or str(exc)
    return StartupError(
        f"cannot listen for {what} on {host}:{port}: {reason} "
        f"(the address: --host or [server] {host_setting}; the port: {change})"
    )


def probe_port(listener: Listener, host: str, port: int) -> None:
    """Raise `listen_error` when `host:port` cannot be bound right now (a plain bind, without
    SO_REUSEPORT: a port another server listens on is refused; with port 0, an address that is
    not this machine's). For listeners whose own library says less than the errno (gRPC's
    `add_insecure_port` answers only "Failed to bind", after logging its own error)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise listen_error(listener, host, port, exc) from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(addr)
        except OSError as exc:
            raise listen_error(listener, host, port, exc) from None


def check_tls(server: ServerConfig) -> None:
    """Load the configured certificate and key once, before anything listens: a file that is
    missing, unreadable or not PEM, or a key that does not match the certificate, is a
    `StartupError` naming the file and the settings."""
    cert, key = server.tls_cert, server.tls_key
    if bool(cert) != bool(key):
        raise StartupError(
            "TLS needs both a certificate and its key: set [server] tls_cert and tls_key (--tls-cert, --tls-key)"
        )
    if not cert or not key:  # neither (both or neither are set, above)
        return
    settings = "([server] tls_cert / tls_key, --tls-cert / --tls-key)"
    for what, path in (("certificate", cert), ("key", key)):
        if not Path(path).is_file():
            raise StartupError(f"the TLS {what} file {path} does not exist {settings}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise StartupError(
            f"TLS certificate {cert} with key {key} does not load: not a PEM certificate and its matching "
            f"private key ({exc.reason or exc}) {settings}"
        ) from None
    except OSError as exc:
        raise StartupError(f"TLS certificate {cert} with key {key} does not load: {exc.strerror or exc} {settings}") from None


async def open_configured_store(url: str) -> Store:
    """`tether.store.factory.open_store(url)` (opened, schema migrated), or a `StartupError`
    naming the store (credentials redacted) and why it cannot be opened. A missing extra stays a
    `MissingExtra` (its message names the `pip install`)."""
    from tether.logging_setup import redact_url
    from tether.store.factory import open_store

    try:
        return await open_store(url)
    except MissingExtra:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the driver raises, the operator reads one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = redact_url(url)
        if where not in reason:
            reason = f"{where}: {reason}"
        raise StartupError(f"the store cannot be opened: {reason} (set with store = ..., TETHER_STORE or --store)") from None
