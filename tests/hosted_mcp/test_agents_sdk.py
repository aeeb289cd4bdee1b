"""The Agents SDK's `HostedMCPTool` against Tether and a real MCP server: Tether lists and calls
the tools; with an approval callback the SDK answers the approval request itself, without one the
run stops with an interruption that the caller approves before running again."""

from __future__ import annotations

from agents import Agent, HostedMCPTool, OpenAIResponsesModel, Runner, set_tracing_disabled

from tests.fakes.mcp_server import roll_total
from tests.hosted_mcp.conftest import mcp_tool

set_tracing_disabled(True)  # no trace export (no network)


def _agent(stack, tool: HostedMCPTool) -> Agent:
    model = OpenAIResponsesModel(model="sim-model", openai_client=stack.client())
    return Agent(name="dice", instructions="Use the dice server.", model=model, tools=[tool])


def _mcp_outputs(result) -> list[str]:
    return [getattr(item.raw_item, "output", None) for item in result.new_items
            if getattr(item.raw_item, "type", "") == "mcp_call"]  # fmt: skip


async def test_hosted_mcp_tool_without_approval(stack, mcp_server) -> None:
    tool = HostedMCPTool(tool_config=mcp_tool(mcp_server))
    result = await Runner.run(_agent(stack, tool), "please roll the dice")
    assert _mcp_outputs(result) == [f"total {roll_total(6, 1)}"]
    assert result.final_output


async def test_hosted_mcp_tool_with_an_approval_callback(stack, mcp_server) -> None:
    asked = []

    def approve(request):
        asked.append((request.data.name, request.data.server_label))
        return {"approve": True}

    tool = HostedMCPTool(tool_config=mcp_tool(mcp_server, require_approval="always"), on_approval_request=approve)
    calls = len(mcp_server.calls)
    result = await Runner.run(_agent(stack, tool), "please roll the dice")
    assert asked == [("roll", "dice")]
    assert _mcp_outputs(result) == [f"total {roll_total(6, 1)}"] and result.final_output
    assert mcp_server.calls[calls:] == [("roll", {"sides": 6, "count": 1})]


async def test_hosted_mcp_tool_approval_as_an_interruption(stack, mcp_server) -> None:
    tool = HostedMCPTool(tool_config=mcp_tool(mcp_server, require_approval="always"))
    agent = _agent(stack, tool)
    calls = len(mcp_server.calls)
    first = await Runner.run(agent, "please roll the dice")
    assert first.interruptions and len(mcp_server.calls) == calls
    state = first.to_state()
    for interruption in first.interruptions:
        state.approve(interruption)
    second = await Runner.run(agent, state)
    assert mcp_server.calls[calls:] == [("roll", {"sides": 6, "count": 1})]
    assert second.final_output
