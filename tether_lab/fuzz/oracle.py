"""What the fuzzer accepts as an answer: the official SDK's types (strict parsing of every reply),
the event-sequence rules of a stream (`StreamChecker`), and the outcome classes a campaign counts
(`SurfaceStats`, `Report`)."""

from __future__ import annotations

import copy
import statistics
import typing
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tether.protocol import json_codec
from tether.protocol.wire import TERMINAL_EVENT_TYPES

# -- the official SDK's types (strict parsing of every reply) ---------------------------------------


class Sdk:
    """Lazy TypeAdapters over the `openai` package's event and object types."""

    def __init__(self) -> None:
        from openai.types.responses import Response, ResponseStreamEvent
        from openai.types.responses.responses_server_event import ResponsesServerEvent
        from pydantic import TypeAdapter

        self.ws_event = _ByType(ResponsesServerEvent, TypeAdapter)
        self.sse_event = _ByType(ResponseStreamEvent, TypeAdapter)
        self.response = TypeAdapter(Response)
        from openai.types.responses import Tool

        self.tool = TypeAdapter(Tool)
        self.notes: Counter[str] = Counter()

    def lenient(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The object with one known deviation neutralised, so the strict parse checks the rest:
        hosted tools echoed as the client sent them, valid or not (dropped, counted in `notes`)."""
        if "response" in obj:
            holder = obj["response"]
        elif obj.get("object") == "response":
            holder = obj
        else:
            return obj
        if not isinstance(holder, dict):
            return obj
        tools = holder.get("tools")
        if isinstance(tools, list) and any(
            isinstance(t, dict) and t.get("type") != "function" for t in tools
        ):
            keep = []
            for t in tools:
                if isinstance(t, dict) and t.get("type") != "function":
                    try:
                        self.tool.validate_python(t)
                    except Exception:  # noqa: BLE001
                        self.notes["hosted tool echoed unvalidated (not an SDK Tool)"] += 1
                        continue
                keep.append(t)
            if len(keep) != len(tools):
                obj = copy.deepcopy(obj)
                holder = obj["response"] if "response" in obj else obj
                holder["tools"] = keep
        return obj


def failed_with_server_error(response: dict[str, Any]) -> bool:
    """A failed Response whose precise code is `server_error` (a bug). Its JSON `error.code` is
    within the API's closed list, so a backend failure or a shutdown reads `server_error` there
    too; Tether's own code is `error.tether_code`."""
    err = response.get("error")
    return (
        response.get("status") == "failed"
        and isinstance(err, dict)
        and err.get("tether_code", err.get("code")) == "server_error"
    )


class _ByType:
    """Validate an event against the one SDK model its `type` names (a discriminated union), so a
    failure says which field of which event is wrong; an unknown `type` is a failure too."""

    def __init__(self, union: Any, adapter: Any) -> None:
        if typing.get_origin(union) is typing.Annotated:
            union = typing.get_args(union)[0]
        self._models: dict[str, Any] = {}
        for cls in typing.get_args(union):
            for t in typing.get_args(cls.model_fields["type"].annotation):
                self._models[t] = adapter(cls)

    def validate_python(self, obj: Any) -> None:
        t = obj.get("type") if isinstance(obj, dict) else None
        model = self._models.get(t)  # type: ignore[arg-type]
        if model is None:
            raise ValueError(f"no SDK event type {t!r}")
        model.validate_python(obj)


def sdk_signature(exc: Exception) -> str:
    """`sdk:<path>` of the first problem a pydantic ValidationError reports (indices as `*`)."""
    try:
        loc = exc.errors()[0]["loc"]  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        return "sdk:" + type(exc).__name__
    parts = ["*" if isinstance(x, int) else str(x) for x in loc]
    parts = [x for x in parts if not x[:1].isupper()]  # drop union member names
    return "sdk:" + ".".join(parts[:3])


# -- outcomes ---------------------------------------------------------------------------------------

FINDING_PREFIXES = (
    "hang",
    "malformed",
    "http_5xx",
    "server_error",
    "closed",
    "crash",
    "unanswered",
    "sequence",
)


@dataclass
class SurfaceStats:
    name: str
    inputs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    findings: Counter[str] = field(default_factory=Counter)
    deviations: Counter[str] = field(default_factory=Counter)
    signatures: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    warmup_inputs: int = 0

    def outcome(self, cls: str) -> None:
        self.outcomes[cls] += 1

    def finding(self, cls: str, example: Any, sig: str = "") -> None:
        """Count a finding; `sig` names its root cause as precisely as the fuzzer can tell."""
        self.findings[cls] += 1
        self.signatures[f"{cls}|{sig}"] += 1
        if cls not in self.examples:
            text = example if isinstance(example, str) else repr(example)
            self.examples[cls] = text[:3000]

    def deviation(self, cls: str) -> None:
        self.deviations[cls] += 1

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "inputs": self.inputs,
            "warmup_inputs": self.warmup_inputs,
            "seconds": round(self.seconds, 1),
            "outcomes": dict(self.outcomes.most_common()),
            "findings": dict(self.findings),
            "signatures": dict(self.signatures),
            "deviations": dict(self.deviations),
            "examples": self.examples,
            "latency_ms": {
                "p50": round(1000 * statistics.median(lat), 2) if lat else None,
                "p99": round(1000 * lat[int(0.99 * (len(lat) - 1))], 2) if lat else None,
                "max": round(1000 * lat[-1], 2) if lat else None,
            },
        }


@dataclass
class Report:
    surfaces: dict[str, SurfaceStats]
    rss: dict[str, int] = field(default_factory=dict)
    health: dict[str, Any] = field(default_factory=dict)
    server_log_errors: int = 0
    server_log_examples: list[str] = field(default_factory=list)
    server_log_signatures: Counter[str] = field(default_factory=Counter)
    seed: int = 0

    @property
    def findings(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for s in self.surfaces.values():
            total.update({f"{s.name}:{k}": v for k, v in s.findings.items()})
        if not self.health.get("ok", True):
            total["server:unhealthy_after"] += 1
        if self.rss.get("growth_exceeded"):
            total["server:rss_growth"] += 1
        if self.server_log_errors:
            total["server:log_errors"] += self.server_log_errors
        return total

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "surfaces": {k: v.summary() for k, v in self.surfaces.items()},
            "rss": self.rss,
            "health": self.health,
            "server_log_errors": self.server_log_errors,
            "server_log_signatures": dict(self.server_log_signatures),
            "server_log_examples": self.server_log_examples,
            "findings": dict(self.findings),
        }


# -- the event oracle (shared by WebSocket and gRPC sessions) ---------------------------------------


class StreamChecker:
    """Checks server events of one connection: strict SDK parse, error shapes, per-response order."""

    def __init__(self, sdk: Sdk, stats: SurfaceStats) -> None:
        self.sdk = sdk
        self.stats = stats
        self.seq: dict[str, int] = {}  # response id -> next sequence number
        self.lane_current: dict[str, str] = {}  # lane -> in-flight response id
        self.in_flight: set[str] = set()

    def check(self, ev: Any, raw: Any) -> str:
        """Validate one event; returns its type ("" when malformed)."""
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
            self.stats.finding("malformed", raw)
            return ""
        try:
            self.sdk.ws_event.validate_python(self.sdk.lenient(ev))
        except Exception as exc:  # noqa: BLE001 - any validation failure is a finding
            self.stats.finding("malformed", f"{exc!s:.1500} :: {raw!s:.200}", sdk_signature(exc))
            if not isinstance(ev.get("response", {}), dict) or not isinstance(ev.get("error", {}), dict):
                return ""  # too broken to follow; otherwise keep the bookkeeping going
        t = ev["type"]
        lane = ev.get("stream_id", "")
        if t == "error":
            err = ev.get("error") or {}
            if not isinstance(ev.get("status"), int) or not isinstance(err.get("code"), str):
                self.stats.finding("malformed", raw)
            elif ev["status"] >= 500 or err["code"] == "server_error":
                self.stats.finding("server_error", raw, "error-event")
                stuck = self.lane_current.get(lane)
                if stuck in self.in_flight:  # the server gave up on it without a terminal event
                    self.stats.finding(
                        "sequence",
                        f"{stuck}: server_error, no terminal event",
                        "no-terminal-after-server-error",
                    )
                    self.in_flight.discard(stuck)
            return t
        if t.startswith("response.steer."):
            return t
        rid = ev["response"]["id"] if "response" in ev else self.lane_current.get(lane)
        if rid is None:
            self.stats.finding("sequence", f"{t} with no response in flight on lane {lane!r}")
            return t
        if t == "response.created":
            if rid in self.seq:
                self.stats.finding("sequence", f"{rid} created twice")
            self.seq[rid] = 0
            self.lane_current[lane] = rid
            self.in_flight.add(rid)
        expected = self.seq.get(rid)
        if expected is None or ev.get("sequence_number") != expected:
            self.stats.finding("sequence", f"{rid}: {t} seq {ev.get('sequence_number')} != {expected}")
        else:
            self.seq[rid] = expected + 1
        if t in TERMINAL_EVENT_TYPES:
            self.in_flight.discard(rid)
            self.seq.pop(rid, None)
            if failed_with_server_error(ev["response"]):
                self.stats.finding("server_error", raw, "response.failed")
        return t


def is_sentinel(ev: Any, sentinel: str) -> bool:
    return (
        isinstance(ev, dict)
        and ev.get("type") == "error"
        and isinstance(ev.get("error"), dict)
        and sentinel in str(ev["error"].get("message", ""))
    )


def client_kind(frame: str | bytes, max_bytes: int, max_depth: int) -> str:
    """What the bridge will make of a frame: its client event arm, or "undecodable"."""
    if isinstance(frame, bytes):
        return "undecodable"
    try:
        if len(frame.encode()) > max_bytes:
            return "undecodable"
        obj = json_codec.loads(frame, max_depth=max_depth)
        if not isinstance(obj, dict):
            return "undecodable"
        return json_codec.client_event_from_json(obj).WhichOneof("event") or "undecodable"
    except Exception:  # noqa: BLE001 - any decode failure
        return "undecodable"


def outcome_of(events: list[dict[str, Any]]) -> str:
    for ev in events:
        t = ev.get("type") if isinstance(ev, dict) else None
        if t == "error":
            return f"error:{(ev.get('error') or {}).get('code')}"
        if t in TERMINAL_EVENT_TYPES:
            return f"{t}:{ev['response'].get('status')}"
        if t and t.startswith("response.steer."):
            return f"{t}:{(ev.get('error') or {}).get('code', 'ok')}"
    return "silent"


async def answer_of(next_event: Callable[[], Awaitable[dict[str, Any]]], checker: StreamChecker, sentinel: str,
                    kind: str, sent: object) -> str:  # fmt: skip
    """Read a session's answer to one input (`kind`, shown as `sent` in a finding), the same way on
    WebSocket and gRPC: every event before the sentinel's answer; then, for a create or append the
    lane worker has not answered yet, up to its `error` or `response.created`; then every
    response still in flight to its terminal event. Returns the outcome."""
    replies: list[dict[str, Any]] = []
    while True:  # everything before the sentinel's answer
        ev = await next_event()
        if is_sentinel(ev, sentinel):
            break
        checker.check(ev, ev)
        replies.append(ev)
    answered = any(e.get("type") in ("error", "response.created") for e in replies)
    if kind in ("create", "append") and not answered:
        while True:  # the lane worker answers: an error, or a response
            ev = await next_event()
            t = checker.check(ev, ev)
            replies.append(ev)
            if t in ("error", "response.created"):
                break
    elif kind not in ("processed",) and not replies:
        checker.stats.finding("unanswered", f"{kind}: {sent!s:.300}")
    while checker.in_flight:  # every response runs to its terminal event
        ev = await next_event()
        checker.check(ev, ev)
        replies.append(ev)
    return outcome_of(replies)
