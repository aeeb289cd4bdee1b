"""What the core reports, as a port: the session, the turn, the engine and the post-inference
worker call these methods and know nothing of how they are recorded. Prometheus metrics and
OpenTelemetry spans implement it (`tether.observability.telemetry.Observability`); the core never
imports them, and they never import the core.

A turn span reads only `TurnFacts`, a small value the turn builds once (never the turn itself):
what identifies the turn, its stage clock, and its response id once it is known."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol


class TurnFacts:
    """What telemetry may read of a turn: its connection's transport and session id, the
    create's stream id, model, `store` and previous_response_id, the turn's stage clock (a
    `tether.core.timing.StageClock`: `stages`, `elapsed()`), and the response id, set by the turn
    once the response is created ("" for a create refused before it)."""

    __slots__ = ("transport", "session_id", "stream_id", "model", "store", "previous_response_id", "clock",
                 "response_id")  # fmt: skip

    def __init__(self, transport: str, session_id: str, stream_id: str, model: str, store: bool,
                 previous_response_id: str, clock: Any) -> None:  # fmt: skip
        self.transport = transport
        self.session_id = session_id
        self.stream_id = stream_id
        self.model = model
        self.store = store
        self.previous_response_id = previous_response_id
        self.clock = clock
        self.response_id = ""


class Telemetry(Protocol):
    # -- connections
    def session_opened(self, transport: str) -> None: ...
    def session_closed(self, transport: str) -> None: ...

    # -- turns
    def turn_span(self, facts: TurnFacts) -> AbstractContextManager[Any]:
        """Around a turn: reads only `facts` (the response id and the clock's stages when the
        block ends)."""
        ...

    def active_turn(self) -> AbstractContextManager[None]:
        """Counts a turn as generating while the block runs (however it ends)."""
        ...

    def turn_refused(self, code: str) -> None:
        """A create answered with an in-band `error` before `response.created`."""
        ...

    def turn_finished(self, transport: str, outcome: str, stages: Mapping[str, float], overhead_s: float,
                      elapsed_s: float, usage: Any, sources: Mapping[str, str] | None = None) -> None:  # fmt: skip
        """A turn sent its terminal event (`outcome`: completed | incomplete | failed)."""
        ...

    def turn_abandoned(self, transport: str) -> None:
        """A turn cut short because its client went away (no terminal event)."""
        ...

    def response_finished(self, response: Any) -> None:
        """The finished Response (status, usage), just before its terminal event."""
        ...

    def error(self, code: str) -> None: ...
    def compaction(self, input_tokens: int, output_tokens: int) -> None:
        """A compaction's model call (in a turn or `POST /v1/responses/compact`) and its tokens."""
        ...

    def safety_finding(self, kind: str) -> None: ...

    # -- remote MCP servers (labels are the create's server_label: the client's name for it)
    def mcp_call(self, server_label: str, outcome: str, seconds: float) -> None:
        """One MCP tools/call (`outcome`: ok | tool_error | timeout | failed | refused | too_large)."""
        ...

    def mcp_listing(self, server_label: str, outcome: str, seconds: float) -> None:
        """One tool listing (`outcome`: listed | reused (the connection's session had the list) | failed)."""
        ...

    def mcp_sessions(self, delta: int) -> None:
        """MCP sessions opened (+1) or closed (-1): the gauge of sessions open."""
        ...

    def mcp_approval(self, event: str) -> None:
        """An approval `requested`, `approved` or `denied`."""
        ...

    # -- runs (tether.core.run)
    def run_event(self, kind: str) -> None:
        """background (a background response created), resumed (a stream retrieve), cancelled (a
        cancel of a run in flight), detached (a client went away; its stored response ran on),
        orphaned (a run whose replica stopped heartbeating, ended failed), taken_over (a queued
        background run of such a replica, run here)."""
        ...

    # -- state
    def cache_lookup(self, *, hit: bool) -> None: ...
    def cache_eviction(self, reason: str) -> None: ...
    def hydration(self, found: bool) -> None: ...
    def post_inference(self, seconds: float) -> None: ...
    def post_inference_failure(self, reason: str) -> None: ...

