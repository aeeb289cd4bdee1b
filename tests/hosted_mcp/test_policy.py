"""`[mcp]` settings and the address policy (tether/mcp/policy.py): which server URLs a create may
name, which resolved addresses Tether connects to, and the HTTP transport that checks every request
the MCP SDK makes (redirects included) through a real httpx2 client."""

from __future__ import annotations

import ipaddress

import pytest

from tether.config import McpConfig, load_config
from tether.errors import TetherError
from tether.mcp.client import _guarded_transport
from tether.mcp.policy import AddressRefused, McpPolicy


def policy(*allowed: str, private: tuple[str, ...] = ()) -> McpPolicy:
    return McpPolicy(McpConfig(allowed_servers=list(allowed), allow_private_networks=list(private)))


def test_url_prefixes_match_at_a_boundary_and_hosts_by_name_and_port() -> None:
    p = policy("https://mcp.example.com/tools/", "https://api.example.org", "internal.example:8931", "10.0.0.7")
    assert p.url_allowed("https://mcp.example.com/tools/dice") is None
    assert p.url_allowed("https://api.example.org/mcp") is None
    assert p.url_allowed("https://api.example.org") is None
    assert p.url_allowed("http://internal.example:8931/mcp") is None
    assert p.url_allowed("http://10.0.0.7/mcp") is None
    for refused in ("https://mcp.example.com/toolsx", "https://api.example.org.evil.net/mcp",
                    "https://mcp.example.com/other", "http://internal.example/mcp", "http://internal.example:8932/",
                    "https://user:pw@api.example.org/mcp", "ftp://api.example.org/mcp", "not a url"):  # fmt: skip
        assert p.url_allowed(refused) is not None, refused
    with pytest.raises(TetherError) as info:
        p.check_url("https://evil.example/mcp", "tools[3].server_url")
    assert info.value.code == "mcp_server_not_allowed" and info.value.param == "tools[3].server_url"
    assert "MCP is off" in (policy().url_allowed("https://api.example.org/mcp") or "")


async def test_addresses_must_be_public_or_in_an_allowed_network() -> None:
    p = policy("10.0.0.7", "127.0.0.1", "localhost", private=("127.0.0.0/8",))
    await p.check_addresses("http://127.0.0.1:1/mcp")
    await p.check_addresses("http://localhost:1/mcp")  # resolves to loopback, which is allowed here
    with pytest.raises(AddressRefused, match="not a public address"):
        await p.check_addresses("http://10.0.0.7/mcp")  # allowed by name, not by address
    assert p.address_allowed(ipaddress.ip_address("8.8.8.8"))
    assert not p.address_allowed(ipaddress.ip_address("169.254.169.254"))  # cloud metadata
    assert not p.address_allowed(ipaddress.ip_address("::1")) and not p.address_allowed(ipaddress.ip_address("fd00::1"))


async def test_the_transport_refuses_before_sending_anything() -> None:
    """Every request the SDK's HTTP client makes (a redirect's too) goes through this check."""
    import httpx2

    async with httpx2.AsyncClient(transport=_guarded_transport(policy("127.0.0.1"))) as client:
        with pytest.raises(httpx2.ConnectError, match="refused by Tether's MCP policy"):
            await client.get("http://127.0.0.1:9/mcp")  # loopback is not in allow_private_networks
        with pytest.raises(httpx2.ConnectError, match="allowed_servers"):
            await client.get("http://169.254.169.254/latest/meta-data")  # a redirect target elsewhere


def test_mcp_settings_load_from_env_and_are_checked(tmp_path) -> None:
    cfg = load_config(env={"TETHER_MCP__ALLOWED_SERVERS": "https://a.example/, b.example:9",
                           "TETHER_MCP__CALL_TIMEOUT_S": "5"})  # fmt: skip
    assert cfg.mcp.allowed_servers == ["https://a.example/", "b.example:9"] and cfg.mcp.call_timeout_s == 5.0
    assert cfg.mcp.enabled and not load_config(env={}).mcp.enabled
    path = tmp_path / "t.toml"
    for bad in ('allow_private_networks = ["not-a-net"]', "call_timeout_s = 0", "max_result_bytes = 0"):
        path.write_text(f"[mcp]\n{bad}\n")
        with pytest.raises(ValueError, match="mcp"):
            load_config(path, env={})
