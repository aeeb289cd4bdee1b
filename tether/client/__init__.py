"""`tether.client`: a typed Python client for Tether's gRPC service, async and sync.

    import tether.client

    async with tether.client.connect("127.0.0.1:50051", api_key="sk-...") as s:
        stream = await s.create(model="tether-sim", input="hello")
        async for ev in stream:                      # typed ServerEvent protos
            ...
        response = await stream.final_response()     # the Response proto

        answer = await s.run_tool_loop("tether-sim", "fix the bug", tools={"read_file": read_file})
        answer = await s.run_tool_loop(                # a custom (freeform) tool: fn(input_text)
            "tether-sim", "fix it", tools={"read_file": read_file, "apply_patch": apply_patch},
            tool_specs=[read_file, tether.client.custom_tool(apply_patch)])
        warm_id = await s.warmup("tether-sim", tools=[...], instructions="...")
        a, b = s.lane("a"), s.lane("b")              # concurrent lanes over the one stream

    with tether.client.connect_sync("127.0.0.1:50051") as s:   # blocking scripts
        print(s.create(model="tether-sim", input="hello").text())

Messages are the generated protos (`tether.responses.v1.*_pb2`); inputs may also be JSON-shaped
dicts. Errors are `tether.errors.TetherError` (stable `code`, HTTP-equivalent `status`).

Modules: `_session` (`ClientSession`: connections over time, lanes, unary RPCs, `connect`),
`_connection` (one bidi `Session` call and how its events find their creates; retries),
`_streams` (one create's event stream), `_toolloop` (the agent loop), `_params` (building
requests), `_sync` (the blocking facade over the same objects).
"""

from tether.client._connection import ConnectionLost, RetryPolicy
from tether.client._params import (
    build_params,
    custom_tool,
    custom_tool_call_output,
    function_call_output,
    function_calls,
    function_tool,
    output_text,
    to_items,
    to_tools,
    tool_call_output,
    tool_calls,
    user_message,
)
from tether.client._session import DEFAULT_TARGET, ClientLane, ClientSession, connect
from tether.client._streams import ResponseStream
from tether.client._sync import SyncClientLane, SyncClientSession, SyncResponseStream, connect_sync
from tether.client._toolloop import ToolLoopError
from tether.errors import CONNECTION_LOST, MAX_TURNS_EXCEEDED, TetherError
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, response_pb2, service_pb2

__all__ = [
    "CONNECTION_LOST",
    "DEFAULT_TARGET",
    "MAX_TURNS_EXCEEDED",
    "ClientLane",
    "ClientSession",
    "ConnectionLost",
    "ResponseStream",
    "RetryPolicy",
    "SyncClientLane",
    "SyncClientSession",
    "SyncResponseStream",
    "TetherError",
    "ToolLoopError",
    "build_params",
    "connect",
    "connect_sync",
    "custom_tool",
    "custom_tool_call_output",
    "events_pb2",
    "function_call_output",
    "function_calls",
    "function_tool",
    "items_pb2",
    "output_text",
    "request_pb2",
    "response_pb2",
    "service_pb2",
    "to_items",
    "to_tools",
    "tool_call_output",
    "tool_calls",
    "user_message",
]
