"""Transport variants, one small module each, all behind `Transport.run_rollout` (see `base`)."""

from __future__ import annotations

from tether_lab.transports.base import RolloutResult, Target, Transport, TurnRecord
from tether_lab.transports.grpc import GrpcTransport
from tether_lab.transports.http import HttpFullKeepAlive, HttpFullNewConn, HttpPrev
from tether_lab.transports.ws import WsRemote, WsTransport
from tether_lab.transports.ws_proto import WsProto

VARIANTS: dict[str, type[Transport]] = {
    cls.name: cls
    for cls in (HttpFullNewConn, HttpFullKeepAlive, HttpPrev, WsTransport, WsRemote, WsProto, GrpcTransport)
}
# The HTTP baseline every ratio is taken against, and the full-resend variant on new connections.
BASELINE = "http-full-keepalive"

__all__ = ["BASELINE", "VARIANTS", "RolloutResult", "Target", "Transport", "TurnRecord"]
