"""Reading Responses stream events into a `TurnOutcome`, shared by the HTTP and WebSocket
transports. Events are either the openai SDK's typed models (`--client sdk`, the default) or plain
JSON dicts (`--client raw`: httpx/websockets + orjson, no SDK), read through one accessor."""

from __future__ import annotations

import time
from typing import Any

from tether_lab.metrics import server_timing
from tether_lab.transports.base import AWAITING_EVENT, TERMINAL_TYPES, Call, RolloutError, TurnOutcome


def _g(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    value = getattr(obj, key, default)
    if value is default:  # an SDK model keeps unknown keys in model_extra
        value = (getattr(obj, "model_extra", None) or {}).get(key, default)
    return value


class EventCollector:
    """Feed events in order; `feed` returns True at the end of the turn (a terminal event, or the
    prototype's `response.awaiting_input`)."""

    def __init__(self, *, want_output: bool, started: float | None = None) -> None:
        self.started = time.perf_counter() if started is None else started
        self.want_output = want_output
        self.out = TurnOutcome()

    def feed(self, ev: Any) -> bool:
        out = self.out
        out.events += 1
        t = _g(ev, "type")
        if t.endswith(".delta"):
            if out.ttft_s is None:
                out.ttft_s = time.perf_counter() - self.started
            return False
        if t == "response.output_item.done":
            item = _g(ev, "item")
            kind = _g(item, "type")
            if kind == "function_call":
                out.calls.append(Call(_g(item, "name"), _g(item, "call_id"), _g(item, "arguments")))
            elif kind == "message":
                out.text += "".join(_g(c, "text", "") or "" for c in _g(item, "content", []))
            return False
        if t in TERMINAL_TYPES:
            self._final(_g(ev, "response"))
            return True
        if t == "response.created":
            out.response_id = _g(_g(ev, "response"), "id")
            return False
        if t == AWAITING_EVENT:
            out.awaiting = True
            out.response_id = _g(ev, "response_id", out.response_id)
            return True
        if t == "error":
            raise RolloutError(f"error event: {_error_text(ev)}")
        return False

    def _final(self, r: Any) -> None:
        out = self.out
        out.response_id = _g(r, "id")
        out.status = _g(r, "status") or ""
        out.server_timing = server_timing(r)
        usage = _g(r, "usage")
        if usage is not None:
            out.input_tokens = _g(usage, "input_tokens")
            out.cached_tokens = _g(_g(usage, "input_tokens_details"), "cached_tokens")
        if self.want_output:
            items = _g(r, "output") or []
            out.output = [i if isinstance(i, dict) else i.model_dump(mode="json", exclude_none=True) for i in items]
        if out.status == "failed":
            raise RolloutError(f"response failed: {_g(r, 'error')}")


def _error_text(ev: Any) -> str:
    err = _g(ev, "error")
    if err is not None and not isinstance(err, str):
        return f"{_g(err, 'code', '')}: {_g(err, 'message', err)}"
    return f"{_g(ev, 'code', '')}: {_g(ev, 'message', '')}"
