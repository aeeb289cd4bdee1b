"""The real model (SmolLM2 on llama-cpp-python) calling a real MCP server's tool through Tether:
`tool_choice` forces the tool (the schema constrains the arguments), Tether runs the call and
calls the model again within the same response; past `[mcp] max_calls_per_response` (1 here) the
MCP tools are withdrawn and the model answers with what it has."""

from __future__ import annotations

from tests.fakes.mcp_server import McpTestServer

from .conftest import ALIAS, RealStack


async def test_the_real_model_calls_an_mcp_tool_once(real: RealStack) -> None:
    with McpTestServer() as server:
        tool = {"type": "mcp", "server_label": "dice", "server_url": server.url, "require_approval": "never",
                "allowed_tools": ["roll"]}  # fmt: skip
        async with real.client() as client:
            r = await client.responses.create(
                model=ALIAS, input="Roll two dice.", tools=[tool], temperature=0, max_output_tokens=48,
                tool_choice={"type": "mcp", "server_label": "dice", "name": "roll"},
            )
    kinds = [item.type for item in r.output]
    assert kinds[:2] == ["mcp_list_tools", "mcp_call"], kinds
    call = r.output[1]
    assert call.name == "roll" and call.status == "completed" and call.output.startswith("total")
    assert [name for name, _ in server.calls] == ["roll"]
    assert r.status in ("completed", "incomplete") and r.output[-1].type == "message"  # called again
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
