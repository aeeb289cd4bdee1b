"""Reading the openai SDK's typed stream events into a `TurnOutcome` (shared by the HTTP and
WebSocket transports, which both hand out the SDK's event models)."""

from __future__ import annotations

import time
from typing import Any

from tether.lab.metrics import server_timing
from tether.lab.transports.base import AWAITING_EVENT, TERMINAL_TYPES, Call, RolloutError, TurnOutcome


class SdkCollector:
    """Feed events in order; `feed` returns True at the end of the turn (a terminal event, or the
    prototype's `response.awaiting_input`)."""

    def __init__(self, *, want_output: bool, started: float | None = None) -> None:
        self.started = time.perf_counter() if started is None else started
        self.want_output = want_output
        self.out = TurnOutcome()

    def feed(self, ev: Any) -> bool:
        out = self.out
        out.events += 1
        t = ev.type
        if t.endswith(".delta"):
            if out.ttft_s is None:
                out.ttft_s = time.perf_counter() - self.started
            return False
        if t == "response.output_item.done":
            item = ev.item
            if item.type == "function_call":
                out.calls.append(Call(item.name, item.call_id, item.arguments))
            elif item.type == "message":
                out.text += "".join(getattr(c, "text", "") or "" for c in item.content)
            return False
        if t in TERMINAL_TYPES:
            self._final(ev.response)
            return True
        if t == "response.created":
            out.response_id = ev.response.id
            return False
        if t == AWAITING_EVENT:
            out.awaiting = True
            extra = getattr(ev, "model_extra", None) or {}
            out.response_id = extra.get("response_id", getattr(ev, "response_id", out.response_id))
            return True
        if t == "error":
            raise RolloutError(f"error event: {_error_text(ev)}")
        return False

    def _final(self, r: Any) -> None:
        out = self.out
        out.response_id = r.id
        out.status = r.status or ""
        out.server_timing = server_timing(r)
        if r.usage is not None:
            out.input_tokens = r.usage.input_tokens
            details = getattr(r.usage, "input_tokens_details", None)
            out.cached_tokens = getattr(details, "cached_tokens", None)
        if self.want_output:
            out.output = [item.model_dump(mode="json", exclude_none=True) for item in r.output]
        if out.status == "failed":
            raise RolloutError(f"response failed: {getattr(r, 'error', None)}")


def _error_text(ev: Any) -> str:
    err = getattr(ev, "error", None)
    if err is not None and not isinstance(err, str):
        return f"{getattr(err, 'code', '')}: {getattr(err, 'message', err)}"
    return f"{getattr(ev, 'code', '')}: {getattr(ev, 'message', '')}"
