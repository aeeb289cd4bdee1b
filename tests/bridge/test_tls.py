"""https:// and wss:// with a self-signed certificate made for the test (openssl; the venv has no
`cryptography`)."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import connect

from tests.support.configs import instant_config
from tests.support.tls import self_signed
from tether.auth import Authenticator
from tether.bridge import start_bridge
from tether.server import start as start_server
from tether.startup import StartupError

from .helpers import KEY_A, recv_response, send_json

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


async def test_https_and_wss(tmp_path: Path, authenticator: Authenticator) -> None:
    cert, key = self_signed(tmp_path)
    config = instant_config()
    config.server.tls_cert, config.server.tls_key = str(cert), str(key)
    running = await start_server(config, authenticator=authenticator)
    bridge = running.bridge
    try:
        assert bridge.tls and bridge.base_url.startswith("https://")
        trust = ssl.create_default_context(cafile=str(cert))
        http_client = httpx.AsyncClient(verify=trust)
        async with AsyncOpenAI(
            base_url=bridge.base_url, api_key=KEY_A, http_client=http_client, max_retries=0
        ) as c:
            assert (await c.responses.create(model="sim-model", input="over TLS")).status == "completed"

        url = f"wss://127.0.0.1:{bridge.port}/v1/responses"
        async with connect(url, ssl=trust, additional_headers={"Authorization": f"Bearer {KEY_A}"}) as conn:
            await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "hi"})
            assert (await recv_response(conn))[-1]["type"] == "response.completed"

        # Plain HTTP on the TLS port is not served.
        async with httpx.AsyncClient() as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get(f"http://127.0.0.1:{bridge.port}/healthz")
    finally:
        await running.stop(0.5)


async def test_half_configured_tls_is_refused(authenticator: Authenticator) -> None:
    config = instant_config()
    config.server.tls_cert = "/nonexistent/cert.pem"
    with pytest.raises(StartupError, match="set \\[server\\] tls_cert and tls_key"):
        await start_bridge(None, authenticator, config)  # type: ignore[arg-type]


async def test_the_banner_shows_https_and_wss_when_tls_is_on(tmp_path: Path, authenticator: Authenticator) -> None:
    from tether.server import banner

    cert, key = self_signed(tmp_path)
    config = instant_config()
    config.server.tls_cert, config.server.tls_key = str(cert), str(key)
    running = await start_server(config, authenticator=authenticator)
    try:
        lines = banner(config, running)
    finally:
        await running.stop(0.5)
    port = running.bridge_port
    urls = {line.split()[0]: line.split()[1] for line in lines[1:5]}
    assert urls == {
        "HTTP": f"https://127.0.0.1:{port}/v1",
        "WebSocket": f"wss://127.0.0.1:{port}/v1/responses",
        "gRPC": f"127.0.0.1:{running.grpc_port}",
        "console": f"https://127.0.0.1:{port}/console",
    }
