"""Which browsers may use the bridge (tether/bridge/origin.py): `Host` checked against loopback names
when bound to loopback (DNS rebinding), `Origin` against the server's own, loopback and listed
origins (cross-site pages, WebSocket hijacking), and JSON POST bodies that say they are something
else refused with 415. The openai SDK (no `Origin`) and the same-origin console keep working."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from tests.support.configs import instant_config
from tests.support.stacks import Stack, running_stack
from tether.auth import Authenticator
from tether.bridge.origin import OriginPolicy, check_json_body
from tether.config import ServerConfig, TetherConfig, apply_env
from tether.errors import TetherError

from .helpers import KEY_A, KEY_B, recv_response, send_json

AUTH = {"Authorization": f"Bearer {KEY_A}"}
CREATE = {"model": "sim-model", "input": "hi", "store": False}


def raw_upgrade(port: int, host: str, origin: str | None = None) -> bytes:
    return (
        f"GET /v1/responses HTTP/1.1\r\nhost: {host}\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
        f"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n"
        f"authorization: Bearer {KEY_A}\r\n" + (f"origin: {origin}\r\n" if origin else "") + "\r\n"
    ).encode()


async def status_line(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


def code(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


async def test_host_is_checked_against_loopback_names_on_a_loopback_bridge(stack: Stack) -> None:
    port = stack.port
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=20) as h:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", "app.localhost"):
            assert (await h.get("/v1/models", headers={"Host": host})).status_code == 200, host
        for host in ("rebind.attacker.example", f"rebind.attacker.example:{port}", "10.1.2.3"):
            assert code(await h.get("/v1/models", headers={"Host": host})) == (403, "host_not_allowed"), host
            assert code(await h.get("/metrics", headers={"Host": host})) == (403, "host_not_allowed")
            r = await h.post("/v1/responses", json=CREATE, headers={"Host": host})
            assert code(r) == (403, "host_not_allowed")
        assert (await h.get("/healthz", headers={"Host": "probe.example"})).status_code == 200  # probes
    assert b" 101 " in await status_line(port, raw_upgrade(port, f"127.0.0.1:{port}"))
    assert b" 403 " in await status_line(port, raw_upgrade(port, "rebind.attacker.example"))


async def test_origin_is_checked_on_upgrades_and_requests(stack: Stack) -> None:
    port = stack.port
    # The SDK sends no Origin; a raw client neither: both work as before.
    async with stack.client() as client:
        assert (await client.responses.create(**CREATE)).status == "completed"
    async with stack.ws() as conn:
        await send_json(conn, {"type": "response.create", **CREATE})
        assert (await recv_response(conn))[-1]["type"] == "response.completed"
    # A page of another site: refused on the WebSocket upgrade and on HTTP.
    with pytest.raises(InvalidStatus) as info:
        async with stack.ws(origin="https://evil.example"):
            pass
    assert info.value.response.status_code == 403
    assert b'"code":"origin_not_allowed"' in info.value.response.body
    assert b" 403 " in await status_line(port, raw_upgrade(port, f"127.0.0.1:{port}", "null"))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=20) as h:
        r = await h.post("/v1/responses", json=CREATE, headers={"Origin": "https://evil.example"})
        assert code(r) == (403, "origin_not_allowed")
        assert code(await h.get("/metrics", headers={"Origin": "https://evil.example"})) == (403, "origin_not_allowed")
        # Its own origin (the console's pages), and loopback origins on a loopback bridge, pass.
        for origin in (f"http://127.0.0.1:{port}", "http://localhost:5173", "http://[::1]:3000"):
            r = await h.post("/v1/responses", json=CREATE, headers={"Origin": origin})
            assert r.status_code == 200, origin
        r = await h.post("/console/token", headers={"Origin": f"http://127.0.0.1:{port}", "Content-Type": "application/json"})
        assert r.status_code == 200 and r.json()["token"]
    async with stack.ws(origin=f"http://127.0.0.1:{port}") as conn:
        await send_json(conn, {"type": "response.create", **CREATE})
        assert (await recv_response(conn))[-1]["type"] == "response.completed"


async def test_allow_lists_from_config() -> None:
    config = instant_config()
    config.server.allowed_hosts = ["tether.test", "*.corp.test"]
    config.server.allowed_origins = ["https://app.corp.test"]
    async with running_stack(Authenticator({KEY_A: "a", KEY_B: "b"}), config=config) as stack:
        port = stack.port
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=20) as h:
            for host, status in (("tether.test", 200), ("eu.corp.test", 200), ("127.0.0.1", 200), ("corp.test", 403),
                                 ("evil.test", 403)):  # fmt: skip
                assert (await h.get("/v1/models", headers={"Host": host})).status_code == status, host
            for origin, status in (("https://app.corp.test", 200), ("https://APP.corp.test/", 200),
                                   ("https://other.corp.test", 403), ("http://tether.test", 200)):  # fmt: skip
                r = await h.get("/v1/models", headers={"Host": "tether.test", "Origin": origin})
                assert r.status_code == status, origin


def policy(**server: Any) -> OriginPolicy:
    return OriginPolicy.from_config(ServerConfig(**server))


def check(p: OriginPolicy, host: str, origin: str | None = None) -> str:
    headers = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin else [])
    try:
        p.check(headers)
    except TetherError as err:
        return err.code
    return "ok"


def test_policy_defaults_by_bind_address_and_wildcards() -> None:
    loopback = policy(bridge_host="127.0.0.1")
    assert check(loopback, "localhost:8000") == "ok" and check(loopback, "tether.example") == "host_not_allowed"
    assert check(loopback, "localhost", "http://localhost:3000") == "ok"
    assert check(loopback, "localhost", "https://evil.example") == "origin_not_allowed"
    # Bound to every interface with no list: any Host (the operator's names are unknown), but a
    # foreign Origin still is refused; a rebinding page on the same name must be stopped by a list.
    public = policy(bridge_host="0.0.0.0")
    assert check(public, "tether.example:8000") == "ok"
    assert check(public, "tether.example", "https://tether.example") == "ok"
    assert check(public, "tether.example", "http://localhost:3000") == "origin_not_allowed"
    listed = policy(bridge_host="0.0.0.0", allowed_hosts=["tether.example"])
    assert check(listed, "rebind.evil") == "host_not_allowed" and check(listed, "127.0.0.1") == "ok"
    anything = policy(bridge_host="127.0.0.1", allowed_hosts=["*"], allowed_origins=["*"])
    assert check(anything, "x.example", "https://evil.example") == "ok"
    # From the environment: comma-separated.
    cfg = TetherConfig()
    apply_env(cfg, {"TETHER_SERVER__ALLOWED_HOSTS": "a.test,*.b.test", "TETHER_SERVER__ALLOWED_ORIGINS": "https://a.test"})
    from_env = OriginPolicy.from_config(cfg.server)
    assert check(from_env, "x.b.test", "https://a.test") == "ok" and check(from_env, "c.test") == "host_not_allowed"


async def test_json_endpoints_refuse_other_content_types(stack: Stack) -> None:
    body = b'{"model": "sim-model", "input": "hi", "store": false}'
    async with httpx.AsyncClient(base_url=stack.base_url, headers=AUTH, timeout=20) as h:
        for ctype in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                      "multipart/form-data; boundary=x"):  # fmt: skip
            for path in ("/responses", "/responses/input_tokens", "/conversations"):
                r = await h.post(path, content=body, headers={"Content-Type": ctype})
                assert code(r) == (415, "unsupported_media_type"), (ctype, path)
        for ctype in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
            r = await h.post("/responses", content=body, headers={"Content-Type": ctype})
            assert r.status_code == 200, ctype
        assert (await h.post("/responses", content=body)).status_code == 200  # no Content-Type: raw JSON
    check_json_body([(b"content-type", b"application/merge-patch+json")], b"{}")
    check_json_body([(b"content-type", b"text/plain")], b"")  # no body, nothing to misread


async def test_the_dedicated_metrics_port_checks_host_and_origin_too() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    config = instant_config()
    config.server.metrics_port = free
    async with running_stack(Authenticator({KEY_A: "a"}), config=config):

        def get(path: str, host: str, origin: str = "") -> bytes:
            extra = f"origin: {origin}\r\n" if origin else ""
            return f"GET {path} HTTP/1.1\r\nhost: {host}\r\n{extra}\r\n".encode()

        assert b" 200 " in await status_line(free, get("/metrics", f"127.0.0.1:{free}"))
        assert b" 403 " in await status_line(free, get("/metrics", "rebind.attacker.example"))
        assert b" 403 " in await status_line(free, get("/metrics", "localhost", "https://evil.example"))
        assert b" 200 " in await status_line(free, get("/healthz", "probe.example"))
