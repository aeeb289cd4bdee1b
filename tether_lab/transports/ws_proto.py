"""`ws-proto`: the WebSocket prototype shape (see `tether_lab.prototype`): the whole rollout is
ONE response; after each tool call the server waits (`response.awaiting_input`) and the client
sends the outputs with `response.append` on the same socket. Needs the server's
the prototype turns (the bench's server, `python -m tether_lab.prototype serve`, runs them)."""

from __future__ import annotations

from tether.protocol.wire import PROTOTYPE_APPEND_INCLUDE
from tether_lab.transports.base import TurnOutcome
from tether_lab.transports.sdk import EventCollector
from tether_lab.transports.ws import WsTransport


class WsProto(WsTransport):
    name = "ws-proto"
    mode = "append"
    extra_include = (PROTOTYPE_APPEND_INCLUDE,)

    async def append(self, items: list[dict]) -> TurnOutcome:
        collector = EventCollector(want_output=False)
        await self._send({"type": "response.append", "input": items})
        return await self._read_turn(collector)
