"""`grpc`: the gRPC bidi `Session` directly, through the raw generated stub: one stream per
rollout, each turn a `SessionRequest.create` with `previous_response_id` (store=false).

The request header (model, instructions, tools, include, store) is converted to a proto once per
rollout and copied per turn, as a native gRPC client would hold it; only the new items are
converted each turn. Bytes sent: the serialized `SessionRequest` + 5-byte gRPC prefix + 9-byte
HTTP/2 DATA frame header (HEADERS frames of the one stream are not counted).
"""

from __future__ import annotations

import time

import grpc

from tether.protocol import json_codec
from tether.protocol.wire import DELTA_ARMS, TERMINAL_ARMS
from tether.responses.v1 import service_pb2, service_pb2_grpc
from tether_lab.metrics import server_timing
from tether_lab.transports.base import Call, RolloutError, Transport, TurnOutcome

_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class GrpcTransport(Transport):
    name = "grpc"
    mode = "chained"

    async def open(self) -> None:
        self.channel = grpc.aio.insecure_channel(self.target.grpc_addr, options=_OPTIONS)
        stub = service_pb2_grpc.ResponsesServiceStub(self.channel)
        self.call = stub.Session(metadata=(("authorization", f"Bearer {self.target.api_key}"),))
        self._header: service_pb2.SessionRequest | None = None
        self.connections = 1

    async def close(self) -> None:
        # The server keeps a half-closed Session open (its events may still come), so the client
        # ends the call itself once its last turn is done, as an agent closing its connection does.
        try:
            await self.call.done_writing()
        except grpc.aio.AioRpcError:
            pass
        finally:
            self.call.cancel()
            await self.channel.close()

    def _request(self, body: dict) -> service_pb2.SessionRequest:
        if self._header is None:
            header = {k: v for k, v in body.items() if k not in ("input", "previous_response_id")}
            self._header = service_pb2.SessionRequest(create=json_codec.params_from_json(header))
        req = service_pb2.SessionRequest()
        req.CopyFrom(self._header)
        req.create.input.extend(json_codec.item_from_json(item, f"input[{i}]") for i, item in enumerate(body["input"]))
        if body.get("previous_response_id"):
            req.create.previous_response_id = body["previous_response_id"]
        return req

    async def create(self, body: dict) -> TurnOutcome:
        req = self._request(body)
        started = time.perf_counter()
        self.bytes_sent += req.ByteSize() + 5 + 9
        await self.call.write(req)
        out = TurnOutcome()
        while True:
            msg = await self.call.read()
            if msg is grpc.aio.EOF:
                raise RolloutError("the gRPC session ended mid-turn")
            for ev in msg.events:
                out.events += 1
                arm = ev.WhichOneof("event")
                if arm in DELTA_ARMS:
                    if out.ttft_s is None:
                        out.ttft_s = time.perf_counter() - started
                elif arm == "output_item_done":
                    item = ev.output_item_done.item
                    kind = item.WhichOneof("item")
                    if kind == "function_call":
                        fc = item.function_call
                        out.calls.append(Call(fc.name, fc.call_id, fc.arguments))
                    elif kind == "message":
                        out.text += "".join(p.output_text.text for p in item.message.content)
                elif arm in TERMINAL_ARMS:
                    r = getattr(ev, arm).response
                    out.response_id, out.status = r.id, r.status
                    out.server_timing = server_timing(r)
                    out.input_tokens, out.cached_tokens = r.usage.input_tokens, r.usage.cached_tokens
                    if arm == "failed":
                        raise RolloutError(f"response failed: {r.error.code}: {r.error.message}")
                    return out
                elif arm == "error":
                    raise RolloutError(f"error event: {ev.error.error.code}: {ev.error.error.message}")
