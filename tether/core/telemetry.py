"""What the core reports, as a port: the session, the turn, the engine and the post-inference
worker call these methods and know nothing of how they are recorded. Prometheus metrics and
OpenTelemetry spans implement it (`tether.observability.telemetry.Observability`); the core never
imports them, and they never import the core."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Telemetry(Protocol):
    # -- connections
    def session_opened(self, transport: str) -> None: ...
    def session_closed(self, transport: str) -> None: ...

    # -- turns
    def turn_span(self, turn: Any) -> AbstractContextManager[Any]:
        """Around a turn: reads `turn.clock`, `.ctx` (transport, session id), `.params`,
        `.stream_id` and `.response_id`."""
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

