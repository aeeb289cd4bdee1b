"""A hostile MCP server (tests/fakes/hostile_mcp.py) cannot stall or sink Tether: every listing
and every answer is bounded by an `[mcp]` setting, each tested at and past its edge, through the
real SDK client session (`McpServerSession`) and end to end through a running Tether."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.bridge.helpers import KEY_A
from tests.fakes.hostile_mcp import HostileMcpServer
from tests.hosted_mcp.conftest import mcp_config, mcp_tool
from tests.support.stacks import running_stack
from tether.auth import Authenticator
from tether.config import McpConfig
from tether.mcp.client import TIMEOUT, TOO_LARGE, McpFailure, McpServerSession
from tether.mcp.policy import McpPolicy

MIB = 1 << 20


@pytest.fixture
def bad() -> Iterator[HostileMcpServer]:
    with HostileMcpServer() as server:
        yield server


def config(**mcp: Any) -> McpConfig:
    return McpConfig(allowed_servers=["127.0.0.1"], allow_private_networks=["127.0.0.0/8"], **mcp)


async def listing(server: HostileMcpServer, **mcp: Any) -> Any:
    """The tools the session lists, or the McpFailure that ended the listing (within 15 s, so a
    listing that would never end fails the test instead of hanging it)."""
    cfg = config(**mcp)
    session = McpServerSession(server.url, {}, McpPolicy(cfg), cfg)
    await session.open()
    try:
        return await asyncio.wait_for(session.list_tools(), 15)
    except McpFailure as exc:
        return exc
    finally:
        await session.aclose()


async def calling(server: HostileMcpServer, **mcp: Any) -> Any:
    cfg = config(**mcp)
    session = McpServerSession(server.url, {}, McpPolicy(cfg), cfg)
    await session.open()
    try:
        return await asyncio.wait_for(session.call_tool("t0", {}), 15)
    except McpFailure as exc:
        return exc
    finally:
        await session.aclose()


def too_large(result: Any, setting: str) -> bool:
    return isinstance(result, McpFailure) and result.error["code"] == TOO_LARGE and setting in result.message


async def test_a_tool_description_at_and_past_its_bound(bad: HostileMcpServer) -> None:
    bad.description_bytes = 1000
    tools = await listing(bad, max_tool_description_bytes=1000)
    assert [t.name for t in tools] == ["big"] and len(tools[0].description) == 1000
    failed = await listing(bad, max_tool_description_bytes=999)
    assert too_large(failed, "mcp.max_tool_description_bytes") and "1000 bytes" in failed.message


async def test_a_tool_schema_at_and_past_its_bound(bad: HostileMcpServer) -> None:
    bad.schema_bytes = 1000
    size = len(orjson.dumps({"type": "object", "description": "x" * 1000}))
    assert [t.name for t in await listing(bad, max_tool_schema_bytes=size)] == ["big"]
    assert too_large(await listing(bad, max_tool_schema_bytes=size - 1), "mcp.max_tool_schema_bytes")


async def test_a_listing_at_and_past_its_byte_bound(bad: HostileMcpServer) -> None:
    bad.tools = 50  # t0..t49, each "A tool." with {"type": "object"}
    size = sum(len(f"t{i}") + len("A tool.") + len('{"type":"object"}') for i in range(50))
    assert len(await listing(bad, max_list_bytes=size)) == 50
    assert too_large(await listing(bad, max_list_bytes=size - 1), "mcp.max_list_bytes")


async def test_pages_at_and_past_their_bound(bad: HostileMcpServer) -> None:
    bad.pages = 3
    assert [t.name for t in await listing(bad, max_list_pages=3)] == ["t0"]
    assert bad.list_pages == 3
    bad.list_pages = 0
    assert too_large(await listing(bad, max_list_pages=2), "mcp.max_list_pages")
    assert bad.list_pages == 2  # the third page was never asked for


async def test_endless_pages_end_at_the_page_bound(bad: HostileMcpServer) -> None:
    bad.endless_pages = True
    assert too_large(await listing(bad, max_list_pages=16), "mcp.max_list_pages")
    assert bad.list_pages == 16


async def test_one_deadline_bounds_the_whole_listing(bad: HostileMcpServer) -> None:
    """Each page answers within the timeout; together they do not: the listing ends at the
    deadline, not a page's timeout later for every page."""
    bad.endless_pages, bad.page_delay_s = True, 0.25
    started = time.monotonic()
    failed = await listing(bad, list_timeout_s=1.0, max_list_pages=1000)
    took = time.monotonic() - started
    assert isinstance(failed, McpFailure) and failed.error["code"] == TIMEOUT
    assert "mcp.list_timeout_s" in failed.message and "1 s" in failed.message
    assert took < 3.0, took
    assert 3 <= bad.list_pages <= 5


async def test_a_huge_description_is_not_read_past_the_listing_bound(bad: HostileMcpServer) -> None:
    bad.description_bytes = 200_000_000
    started = time.monotonic()
    failed = await listing(bad)  # the defaults: 2 MiB a listing
    assert too_large(failed, "mcp.max_list_bytes"), failed
    assert time.monotonic() - started < 5.0
    assert bad.sent < 32 * MIB, bad.sent  # it stopped reading: the rest was never sent


async def test_a_json_result_at_and_past_its_bound(bad: HostileMcpServer) -> None:
    bad.result_bytes = 1000
    result = await calling(bad, max_result_bytes=1000)
    assert result.output == "x" * 1000 and result.error is None
    assert too_large(await calling(bad, max_result_bytes=999), "mcp.max_result_bytes")


async def test_a_huge_json_result_is_read_only_up_to_its_bound(bad: HostileMcpServer) -> None:
    bad.result_bytes = 500_000_000
    started = time.monotonic()
    failed = await calling(bad, max_result_bytes=MIB)
    assert too_large(failed, "mcp.max_result_bytes"), failed
    assert time.monotonic() - started < 5.0
    assert bad.sent < 32 * MIB, bad.sent


async def test_an_error_message_is_cut_at_its_bound(bad: HostileMcpServer) -> None:
    bad.error_bytes = 5000
    failed = await calling(bad, max_error_bytes=4096)
    assert isinstance(failed, McpFailure) and failed.error["code"] == -32000
    assert failed.message.startswith("x" * 4096) and "x" * 4097 not in failed.message
    assert failed.message.endswith("[cut at 4096 bytes: mcp.max_error_bytes]")
    bad.error_bytes = 4096
    assert (await calling(bad, max_error_bytes=4096)).message == "x" * 4096
    bad.error_bytes = 8_000_000  # past the answer's own bound: not read at all
    assert too_large(await calling(bad, max_result_bytes=MIB), "mcp.max_result_bytes")


async def test_a_compressed_answer_is_refused(bad: HostileMcpServer) -> None:
    bad.gzip = True
    cfg = config()
    session = McpServerSession(bad.url, {}, McpPolicy(cfg), cfg)
    with pytest.raises(McpFailure):
        await asyncio.wait_for(session.open(), 15)
    await session.aclose()


async def test_a_hostile_server_fails_its_listing_and_call_only() -> None:
    """End to end: a 200 MB description and a 500 MB result each fail their item within
    seconds; the response completes and echoes neither."""
    with HostileMcpServer() as bad:
        async with running_stack(Authenticator({KEY_A: "a"}), config=mcp_config()) as st:
            client = st.client()
            bad.description_bytes = 200_000_000
            started = time.monotonic()
            r = await client.responses.create(model="sim-model", input="x", tools=[mcp_tool(bad, "bad")])
            assert time.monotonic() - started < 10
            listed = r.output[0]
            assert r.status == "completed" and listed.type == "mcp_list_tools" and listed.tools == []
            assert "mcp.max_list_bytes" in (listed.error or "")
            assert len(r.model_dump_json()) < 64 * 1024
            bad.description_bytes, bad.result_bytes = 0, 500_000_000
            r = await client.responses.create(model="sim-model", input="x", tools=[mcp_tool(bad, "bad")],
                                              tool_choice={"type": "mcp", "server_label": "bad", "name": "t0"})  # fmt: skip
            call = r.output[1]
            assert r.status == "completed" and call.type == "mcp_call" and call.status == "failed"
            assert call.error is not None and "mcp.max_result_bytes" in str(call.error)
            assert bad.sent < 64 * MIB, bad.sent
