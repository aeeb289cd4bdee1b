"""The hosted `mcp` tool end to end: a real MCP server (the `mcp` SDK over streamable HTTP on
127.0.0.1), a real Tether (bridge, memory store, the simulated model), and the official openai SDK
over HTTP and a raw WebSocket client. Items and events are parsed strictly with the SDK's types."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import openai
import orjson
import pytest
from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter

from tests.bridge.helpers import (
    KEY_A,
    KEY_B,
    check_sse_events,
    check_ws_events,
    recv_response,
    recv_until,
    send_json,
)
from tests.fakes.mcp_server import McpTestServer, roll_total
from tests.hosted_mcp.conftest import mcp_config, mcp_tool
from tests.support.metrics import http_get, samples, value
from tests.support.stacks import running_stack
from tether.auth import Authenticator

OUTPUT_ITEM = TypeAdapter(ResponseOutputItem)


def strict(items: list[Any]) -> list[dict]:
    """The output as JSON, each item validated strictly as the SDK's own output item type."""
    out = [item.model_dump(mode="json", exclude_unset=True) for item in items]
    for d in out:
        OUTPUT_ITEM.validate_python(d, strict=True)
    return out


def types(items: list[dict]) -> list[str]:
    return [i["type"] for i in items]


async def test_http_lists_calls_and_answers_in_one_response(stack, mcp_server: McpTestServer) -> None:
    calls_before = len(mcp_server.calls)
    r = await stack.client().responses.create(model="sim-model", input="please roll two dice",
                                              tools=[mcp_tool(mcp_server)])  # fmt: skip
    out = strict(r.output)
    assert r.status == "completed"
    assert types(out) == ["mcp_list_tools", "mcp_call", "message"]
    listed = {t["name"] for t in out[0]["tools"]}
    assert {"roll", "echo", "fail", "hang", "huge", "lookup"} <= listed
    call = out[1]
    assert call["server_label"] == "dice" and call["name"] == "roll" and call["status"] == "completed"
    assert call["output"] == f"total {roll_total(6, 1)}" and call.get("error") is None
    assert mcp_server.calls[calls_before:] == [("roll", {"sides": 6, "count": 1})]
    # Usage sums both model calls: more input than one call's context.
    single = await stack.client().responses.create(model="sim-model", input="please roll two dice")
    assert r.usage.input_tokens > 2 * single.usage.input_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


async def test_http_stream_events_parse_and_follow_the_api_order(stack, mcp_server: McpTestServer) -> None:
    client = stack.client()
    stream = await client.responses.create(model="sim-model", input="please roll", stream=True,
                                           tools=[mcp_tool(mcp_server)])  # fmt: skip
    events = [ev.model_dump(mode="json", exclude_unset=True) async for ev in stream]
    check_sse_events(events)
    kinds = [e["type"] for e in events]
    mcp = [k for k in kinds if "mcp" in k]
    assert mcp == [
        "response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
        *(["response.mcp_call_arguments.delta"] * kinds.count("response.mcp_call_arguments.delta")),
        "response.mcp_call_arguments.done", "response.mcp_call.in_progress", "response.mcp_call.completed",
    ]  # fmt: skip
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert types(done) == ["mcp_list_tools", "mcp_call", "message"]
    assert events[-1]["response"]["output"][1]["output"].startswith("total")


async def test_tool_choice_forces_a_named_tool_and_allowed_tools_narrow_the_list(stack, mcp_server) -> None:
    r = await stack.client().responses.create(
        model="sim-model", input="hello", tools=[mcp_tool(mcp_server, allowed_tools=["echo", "lookup"])],
        tool_choice={"type": "mcp", "server_label": "dice", "name": "lookup"},
    )
    out = strict(r.output)
    assert [t["name"] for t in out[0]["tools"]] == ["echo", "lookup"]
    assert out[1]["name"] == "lookup" and out[1]["output"] == "value of "
    # Without a name in the input and without tool_choice, the simulated model does not call it.
    plain = await stack.client().responses.create(model="sim-model", input="hello", tools=[mcp_tool(mcp_server)])
    assert types(strict(plain.output)) == ["mcp_list_tools", "message"]


async def test_a_failing_tool_fails_its_call_only(stack, mcp_server) -> None:
    r = await stack.client().responses.create(
        model="sim-model", input="x", tools=[mcp_tool(mcp_server)],
        tool_choice={"type": "mcp", "server_label": "dice", "name": "fail"},
    )
    out = strict(r.output)
    assert r.status == "completed" and types(out) == ["mcp_list_tools", "mcp_call", "message"]
    assert out[1]["status"] == "failed" and out[1].get("output") is None
    assert out[1]["error"]["type"] == "mcp_tool_execution_error"
    assert "Error executing tool fail" in orjson.dumps(out[1]["error"]["content"]).decode()


async def test_a_hanging_tool_times_out_and_a_huge_result_is_refused() -> None:
    config = mcp_config(call_timeout_s=0.5, max_result_bytes=1000)
    with McpTestServer() as server:
        async with running_stack(Authenticator({KEY_A: "a"}), config=config) as st:
            client = st.client()
            hung = await client.responses.create(
                model="sim-model", input="x", tools=[mcp_tool(server)],
                tool_choice={"type": "mcp", "server_label": "dice", "name": "hang"},
            )
            call = strict(hung.output)[1]
            assert call["status"] == "failed" and call["error"]["type"] == "mcp_protocol_error"
            assert "mcp.call_timeout_s" in call["error"]["message"]
            huge = await client.responses.create(
                model="sim-model", input="x", tools=[mcp_tool(server)],
                tool_choice={"type": "mcp", "server_label": "dice", "name": "huge"},
            )
            call = strict(huge.output)[1]
            assert call["status"] == "failed" and "mcp.max_result_bytes" in call["error"]["message"]
            assert hung.status == huge.status == "completed"


async def test_an_unreachable_server_fails_the_listing_not_the_response(stack) -> None:
    tool = {"type": "mcp", "server_label": "gone", "server_url": "http://127.0.0.1:9/mcp", "require_approval": "never"}
    r = await stack.client().responses.create(model="sim-model", input="x", tools=[tool])
    out = strict(r.output)
    assert r.status == "completed" and types(out) == ["mcp_list_tools", "message"]
    assert out[0]["tools"] == [] and "cannot reach" in out[0]["error"]


async def test_server_url_outside_the_allow_list_is_a_400_naming_it(stack, mcp_server) -> None:
    bad = {"type": "mcp", "server_label": "x", "server_url": "http://10.1.2.3/mcp"}
    with pytest.raises(openai.BadRequestError) as info:
        await stack.client().responses.create(model="sim-model", input="x", tools=[mcp_tool(mcp_server), bad])
    body = info.value.body
    assert body["code"] == "mcp_server_not_allowed" and body["param"] == "tools[1].server_url"
    for bad_url in ("ftp://127.0.0.1/mcp", "http://user:pw@127.0.0.1/mcp"):
        with pytest.raises(openai.BadRequestError) as info:
            await stack.client().responses.create(model="sim-model", input="x",
                                                  tools=[{**bad, "server_url": bad_url}])  # fmt: skip
        assert info.value.body["param"] == "tools[0].server_url"
    with pytest.raises(openai.BadRequestError) as info:
        await stack.client().responses.create(model="sim-model", input="x",
                                              tools=[{**mcp_tool(mcp_server), "connector_id": "connector_gmail"}])  # fmt: skip
    assert info.value.body["param"] == "tools[0].connector_id"


async def test_mcp_is_off_until_configured(mcp_server) -> None:
    config = mcp_config(allowed_servers=[])
    async with running_stack(Authenticator({KEY_A: "a"}), config=config) as st:
        with pytest.raises(openai.BadRequestError) as info:
            await st.client().responses.create(model="sim-model", input="x", tools=[mcp_tool(mcp_server)])
    assert info.value.body["param"] == "tools[0].server_url"
    assert "MCP is off" in info.value.body["message"]


async def test_dns_answers_into_private_networks_are_refused(mcp_server) -> None:
    """`localhost` is allowed by name, but it resolves to loopback, which is not in
    allow_private_networks: the connection is refused before any request reaches the server."""
    config = mcp_config(allowed_servers=["localhost"], allow_private_networks=[])
    seen = len(mcp_server.headers)
    async with running_stack(Authenticator({KEY_A: "a"}), config=config) as st:
        tool = mcp_tool(mcp_server, server_url=mcp_server.url.replace("127.0.0.1", "localhost"))
        r = await st.client().responses.create(model="sim-model", input="x", tools=[tool])
    out = strict(r.output)
    assert "not a public address" in out[0]["error"] and "allow_private_networks" in out[0]["error"]
    assert len(mcp_server.headers) == seen  # nothing was sent


async def test_credentials_reach_the_server_and_nothing_else(stack, mcp_server, caplog) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, Tether's and the SDK's, at its most verbose
    tool = mcp_tool(mcp_server, headers={"X-Api-Key": "hdr-s3cret"}, authorization="tok-s3cret")
    r = await stack.client().responses.create(model="sim-model", input="roll", tools=[tool])
    assert not [rec for rec in caplog.records if "s3cret" in rec.getMessage()]
    sent = mcp_server.headers[-1]
    assert sent["x-api-key"] == "hdr-s3cret" and sent["authorization"] == "Bearer tok-s3cret"
    stored = await stack.client().responses.retrieve(r.id)
    for text in (r.model_dump_json(), stored.model_dump_json()):
        assert "s3cret" not in text
    assert r.tools[0].server_url == mcp_server.url and r.tools[0].headers is None


async def test_approval_round_trip(stack, mcp_server) -> None:
    client = stack.client()
    tools = [mcp_tool(mcp_server, require_approval={"never": {"read_only": True}})]
    calls = len(mcp_server.calls)
    first = await client.responses.create(model="sim-model", input="please roll", tools=tools)
    out = strict(first.output)
    assert types(out) == ["mcp_list_tools", "mcp_approval_request"] and first.status == "completed"
    request = out[1]
    assert request["name"] == "roll" and request["server_label"] == "dice"
    assert len(mcp_server.calls) == calls  # nothing ran yet
    second = await client.responses.create(
        model="sim-model", previous_response_id=first.id, tools=tools,
        input=[{"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}],
    )
    out = strict(second.output)
    assert types(out) == ["mcp_call", "message"]  # the history's listing stands: no second one
    assert out[0]["approval_request_id"] == request["id"] and out[0]["output"].startswith("total")
    assert mcp_server.calls[calls:] == [("roll", {"sides": 6, "count": 1})]
    # A denial runs nothing; the read-only tool needs no approval at all.
    third = await client.responses.create(model="sim-model", input="please roll", tools=tools)
    denied = await client.responses.create(
        model="sim-model", previous_response_id=third.id, tools=tools,
        input=[{"type": "mcp_approval_response", "approval_request_id": third.output[1].id, "approve": False}],
    )
    assert types(strict(denied.output)) == ["message"]
    assert len(mcp_server.calls) == calls + 1
    # A forced tool_choice is honoured by the approved call: the model is not forced to ask again.
    forced = {"type": "mcp", "server_label": "dice", "name": "roll"}
    asked = await client.responses.create(model="sim-model", input="x", tools=tools, tool_choice=forced)
    assert types(strict(asked.output)) == ["mcp_list_tools", "mcp_approval_request"]
    ran = await client.responses.create(
        model="sim-model", previous_response_id=asked.id, tools=tools, tool_choice=forced,
        input=[{"type": "mcp_approval_response", "approval_request_id": asked.output[1].id, "approve": True}],
    )
    assert types(strict(ran.output)) == ["mcp_call", "message"]
    calls += 1
    lookup = await client.responses.create(model="sim-model", input="please lookup", tools=tools)
    assert types(strict(lookup.output)) == ["mcp_list_tools", "mcp_call", "message"]
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(
            model="sim-model", previous_response_id=first.id, tools=tools,
            input=[{"type": "mcp_approval_response", "approval_request_id": "mcpr_nope", "approve": True}],
        )
    assert info.value.body["param"] == "input[0].approval_request_id"


async def test_two_turns_on_one_websocket_open_one_mcp_session(stack) -> None:
    with McpTestServer() as server:
        tools = [mcp_tool(server)]
        async with stack.ws() as ws:
            await send_json(ws, {"type": "response.create", "model": "sim-model", "input": "please roll",
                                 "tools": tools})  # fmt: skip
            first = await recv_response(ws)
            out1 = first[-1]["response"]["output"]
            assert types(out1) == ["mcp_list_tools", "mcp_call", "message"]
            await send_json(ws, {"type": "response.create", "model": "sim-model", "input": "please echo",
                                 "tools": tools, "previous_response_id": first[-1]["response"]["id"]})  # fmt: skip
            second = await recv_response(ws)
            out2 = second[-1]["response"]["output"]
            # A new conversation on the same connection: listed from the session, not the server.
            await send_json(ws, {"type": "response.create", "model": "sim-model", "input": "please echo",
                                 "tools": tools})  # fmt: skip
            third = await recv_response(ws)
        assert types(out2) == ["mcp_call", "message"] and out2[0]["name"] == "echo"
        assert types(third[-1]["response"]["output"]) == ["mcp_list_tools", "mcp_call", "message"]
        assert server.initializations == 1 and server.list_calls == 1
        assert [name for name, _ in server.calls] == ["roll", "echo", "echo"]


async def test_http_turns_open_and_close_their_own_session(stack) -> None:
    with McpTestServer() as server:
        client = stack.client()
        tools = [mcp_tool(server)]
        first = await client.responses.create(model="sim-model", input="please roll", tools=tools)
        second = await client.responses.create(model="sim-model", input="please echo", tools=tools,
                                               previous_response_id=first.id)  # fmt: skip
        assert types(strict(second.output)) == ["mcp_call", "message"]  # no mcp_list_tools: the history has it
        # Each turn initialises a session of its own; the SDK lists once per session before the
        # first call (to check the tool's output schema), so a stateless turn pays both.
        assert server.initializations == 2 and server.list_calls == 2
        await asyncio.sleep(0.2)
        deletes = [h for h in server.headers if h.get("mcp-session-id")]
        assert deletes  # the SDK sent its session id (and closed the session at the end of the turn)


async def test_metrics_count_calls_listings_sessions_and_approvals() -> None:
    with McpTestServer() as server:
        async with running_stack(Authenticator({KEY_A: "a"}), config=mcp_config()) as st:

            async def scrape() -> dict:
                _, _, body = await http_get(st.port, "/metrics", headers="connection: close\r\n")
                return samples(body.decode())

            before = await scrape()
            client = st.client()
            await client.responses.create(model="sim-model", input="please roll", tools=[mcp_tool(server)])
            await client.responses.create(model="sim-model", input="x", tools=[mcp_tool(server)],
                                          tool_choice={"type": "mcp", "server_label": "dice", "name": "fail"})  # fmt: skip
            asked = await client.responses.create(model="sim-model", input="please roll",
                                                  tools=[mcp_tool(server, require_approval="always")])  # fmt: skip
            async with st.ws() as ws:
                await send_json(ws, {"type": "response.create", "model": "sim-model", "input": "please echo",
                                     "tools": [mcp_tool(server)]})  # fmt: skip
                await recv_response(ws)
                during = await scrape()
            await asyncio.sleep(0.2)
            after = await scrape()

    def delta(name: str, scrape: dict = after, **labels: str) -> float:
        return value(scrape, name, **labels) - value(before, name, **labels)

    assert delta("tether_mcp_calls_total", server="dice", outcome="ok") == 2
    assert delta("tether_mcp_calls_total", server="dice", outcome="tool_error") == 1
    assert delta("tether_mcp_call_seconds_count", server="dice") == 3
    assert delta("tether_mcp_listings_total", server="dice", outcome="listed") == 4
    assert delta("tether_mcp_approvals_total", event="requested") == 1 and asked.output[-1].type == "mcp_approval_request"
    assert value(during, "tether_mcp_sessions_open") == 1  # the WebSocket keeps its session open
    assert value(after, "tether_mcp_sessions_open") == 0  # HTTP turns closed theirs; the WebSocket closed


async def test_grpc_session_runs_mcp_with_modelled_items(stack, mcp_server) -> None:
    """The gRPC session stream carries the same loop, with the MCP tool and items as their own
    protobuf messages (not JSON blobs)."""
    from tests.support.grpc_client import raw_session_on
    from tether.protocol import json_codec

    async with raw_session_on(stack.engine, stack.config, Authenticator({KEY_A: "a"}), KEY_A) as session:
        req = json_codec.client_event_from_json({"type": "response.create", "model": "sim-model",
                                                 "input": "please roll", "tools": [mcp_tool(mcp_server)]})  # fmt: skip
        assert req.create.tools[0].WhichOneof("tool") == "mcp"
        await session.send(req)
        done = await session.until_terminal()
        arms = [ev.WhichOneof("event") for ev in session.events]
    assert done.WhichOneof("event") == "completed"
    output = done.completed.response.output
    assert [item.WhichOneof("item") for item in output] == ["mcp_list_tools", "mcp_call", "message"]
    assert output[1].mcp_call.output.startswith("total") and output[1].mcp_call.server_label == "dice"
    assert {"mcp_list_tools_completed", "mcp_call_arguments_done", "mcp_call_completed"} <= set(arms)


async def test_cancel_during_a_hanging_call_ends_it_incomplete(stack, mcp_server) -> None:
    """A client cancel while Tether waits on the MCP server: the call item ends `incomplete` with
    its `output_item.done` (every added item is done once), the response ends, the connection
    goes on."""
    async with stack.ws() as ws:
        await send_json(ws, {"type": "response.create", "model": "sim-model", "input": "x",
                             "tools": [mcp_tool(mcp_server)],
                             "tool_choice": {"type": "mcp", "server_label": "dice", "name": "hang"}})  # fmt: skip
        events = await recv_until(ws, lambda e: e["type"] == "response.mcp_call.in_progress")
        await send_json(ws, {"type": "response.cancel", "response_id": events[0]["response"]["id"]})
        events += await recv_until(ws, lambda e: e["type"].startswith("response.") and "response" in e
                                   and e["type"] != "response.created")  # fmt: skip
        check_ws_events(events)
        await send_json(ws, {"type": "response.create", "model": "sim-model", "input": "hi"})
        after = await recv_response(ws)
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["status"] == "cancelled"
    call = events[-1]["response"]["output"][1]
    assert call["type"] == "mcp_call" and call["status"] == "incomplete"
    assert "response.mcp_call.failed" in [e["type"] for e in events]
    assert after[-1]["type"] == "response.completed"


async def test_sessions_are_never_shared_across_connections_or_tenants(stack) -> None:
    with McpTestServer() as server:
        body = {"type": "response.create", "model": "sim-model", "input": "please roll", "tools": [mcp_tool(server)]}
        async with stack.ws(KEY_A) as a, stack.ws(KEY_B) as b, stack.ws(KEY_A) as a2:
            for ws in (a, b, a2, a):
                await send_json(ws, body)
                assert (await recv_response(ws))[-1]["type"] == "response.completed"
        assert server.initializations == 3 and len(server.calls) == 4  # a's second turn reused a's session


async def test_a_function_tool_of_the_create_wins_over_an_mcp_tool_of_the_same_name(stack, mcp_server) -> None:
    """The client's own `echo` function is the client's to run: the model's call of it is a
    function_call the response ends with, never an MCP call. Explicit nulls in the mcp tool are
    "not set"; an unknown non-null key is a 400 naming it."""
    echo = {"type": "function", "name": "echo", "parameters": {"type": "object", "properties": {}}}
    r = await stack.client().responses.create(
        model="sim-model", input="please echo", tools=[echo, mcp_tool(mcp_server, server_description=None)],
    )
    assert types(strict(r.output)) == ["mcp_list_tools", "function_call"] and r.output[1].name == "echo"
    with pytest.raises(openai.BadRequestError) as info:
        await stack.client().responses.create(model="sim-model", input="x",
                                              tools=[mcp_tool(mcp_server, defer_loading=True)])  # fmt: skip
    assert info.value.body["param"] == "tools[0].defer_loading"


async def test_a_restarted_server_costs_one_new_session_not_a_failed_call(stack) -> None:
    """The connection's kept session dies with its server; the next call finds the session gone
    (HTTP 404 "Session not found", or a broken transport), opens a new one and runs once more."""
    async with stack.ws() as ws:
        with McpTestServer() as first:
            port = first.port
            await send_json(ws, {"type": "response.create", "model": "sim-model", "input": "please roll",
                                 "tools": [mcp_tool(first)]})  # fmt: skip
            assert (await recv_response(ws))[-1]["response"]["output"][1]["status"] == "completed"
        with McpTestServer(port=port) as second:
            await send_json(ws, {"type": "response.create", "model": "sim-model", "input": "please roll",
                                 "tools": [mcp_tool(second)]})  # fmt: skip
            call = (await recv_response(ws))[-1]["response"]["output"][1]
            assert call["status"] == "completed" and call["output"].startswith("total")
            assert second.initializations == 1 and [name for name, _ in second.calls] == ["roll"]


async def test_a_redirect_elsewhere_is_not_followed(stack) -> None:
    """An allowed server that redirects to another origin (here the cloud metadata address): the
    SDK follows redirects within the server's origin only, and Tether's transport checks each
    request it makes, so the listing fails and nothing reaches the target."""

    async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://169.254.169.254/latest/meta-data\r\n"
                     b"Content-Length: 0\r\nConnection: close\r\n\r\n")  # fmt: skip
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(redirect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        tool = {"type": "mcp", "server_label": "r", "server_url": f"http://127.0.0.1:{port}/mcp",
                "require_approval": "never"}  # fmt: skip
        r = await stack.client().responses.create(model="sim-model", input="x", tools=[tool])
    finally:
        server.close()
    listing = strict(r.output)[0]
    assert r.status == "completed" and listing["tools"] == []
    assert "not followed" in listing["error"] and "169.254.169.254" in listing["error"]


async def test_a_server_that_only_speaks_sse_is_reached_over_sse(stack) -> None:
    """The older HTTP+SSE transport: the streamable HTTP initialize is refused, Tether tries SSE
    once (the specification's backwards compatibility) and the loop runs as usual."""
    with McpTestServer(sse=True) as server:
        r = await stack.client().responses.create(model="sim-model", input="please roll",
                                                  tools=[mcp_tool(server)])  # fmt: skip
    out = strict(r.output)
    assert types(out) == ["mcp_list_tools", "mcp_call", "message"] and out[1]["output"].startswith("total")


async def test_credentials_are_in_no_trace(stack, mcp_server) -> None:
    """With tracing on (the OpenTelemetry SDK, in memory), no span or event attribute of an MCP
    turn carries the tool's headers or token."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tether.observability import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(True, tracer_provider=provider)
    try:
        tool = mcp_tool(mcp_server, headers={"X-Api-Key": "hdr-s3cret"}, authorization="tok-s3cret")
        await stack.client().responses.create(model="sim-model", input="please roll", tools=[tool])
    finally:
        tracing.configure(False)
        provider.shutdown()
    spans = exporter.get_finished_spans()
    assert any(sp.name == tracing.TURN_SPAN for sp in spans)
    dumped = " ".join(sp.to_json() for sp in spans)
    assert "s3cret" not in dumped and "mcp" in dumped  # the MCP stage is traced, its credentials not


async def test_an_mcp_tool_choice_without_that_server_is_a_400(stack, mcp_server) -> None:
    choice = {"type": "mcp", "server_label": "other", "name": "roll"}
    for tools in ([], [mcp_tool(mcp_server)]):
        with pytest.raises(openai.BadRequestError) as info:
            await stack.client().responses.create(model="sim-model", input="x", tools=tools, tool_choice=choice)
        assert info.value.body["param"] == "tool_choice" and "MCP server" in info.value.body["message"]
