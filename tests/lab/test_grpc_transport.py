"""The lab's gRPC transport against a real server: a turn whose only streamed output is a custom
tool call's input still has a client-observed TTFT (its input deltas are deltas); `DELTA_ARMS` is
every delta event the proto has."""

from __future__ import annotations

from tests.support.configs import server_config
from tests.support.stacks import Server
from tether.protocol.wire import DELTA_ARMS
from tether.responses.v1 import events_pb2
from tether_lab.transports.base import Target
from tether_lab.transports.grpc import GrpcTransport

APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch.", "format": {"type": "text"}}


async def test_a_custom_tool_call_turn_has_a_ttft(tmp_path):
    srv = await Server(server_config(tmp_path)).start()
    transport = GrpcTransport(Target("tether-sim", "http://127.0.0.1:9/v1", srv.target))
    try:
        await transport.open()
        body = {"model": "tether-sim", "input": [{"type": "message", "role": "user", "content": "patch it"}],
                "tools": [APPLY_PATCH], "store": False}  # fmt: skip
        out = await transport.create(body)
        await transport.close()
    finally:
        await srv.stop()
    assert out.status == "completed" and out.text == ""
    assert out.ttft_s is not None


def test_delta_arms_are_every_delta_event():
    """A new `*_delta` event arm in events.proto is a delta for the outbox and the lab alike."""
    arms = {f.name for f in events_pb2.ServerEvent.DESCRIPTOR.oneofs_by_name["event"].fields}
    assert DELTA_ARMS == {arm for arm in arms if arm.endswith("_delta")}
