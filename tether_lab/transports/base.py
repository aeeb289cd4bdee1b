"""One interface for every transport: `await transport.run_rollout(workload) -> RolloutResult`.

The agent loop lives here, once: send the user prompt, stream the model's turn, answer each tool
call with the workload's deterministic output, repeat until the model answers without tool calls.
A transport supplies only how one model turn travels:

- `open()` / `close()`: per-rollout connection setup and teardown (timed inside the rollout);
- `create(body)`: send one create (a JSON-shaped Responses body) and stream it to its end;
- `append(items)`: only for the `append` state mode (the prototype shape).

and declares its state mode:

- `full`: stateless; the client resends the whole history every turn (store=false);
- `chained`: `previous_response_id` + only the new items (store as the transport says);
- `append`: one response for the whole rollout; tool outputs go in with `response.append`.

Client-side measurements are taken here or by the transport's counters: end-to-end time, per-turn
latency and client-observed TTFT (request sent -> first delta event), bytes sent client->server
(application level: HTTP request line + headers + body, WebSocket frame incl. header, gRPC message
+ 5-byte prefix + 9-byte DATA frame header), and the server's own `server_timing` per turn.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from tether.protocol.wire import SERVER_TIMING_INCLUDE
from tether.workloads import Workload
from tether_lab.prototype import AWAITING_EVENT

TERMINAL_TYPES = frozenset({"response.completed", "response.failed", "response.incomplete"})


class RolloutError(Exception):
    """The rollout could not go on (an error event, a failed response, an unexpected model turn)."""


@dataclass
class Target:
    """Where a transport connects (addresses may point at a delay proxy)."""

    model: str
    bridge_url: str  # http://host:port/v1 of the in-process bridge
    grpc_addr: str  # host:port
    remote_bridge_url: str | None = None  # http://host:port/v1 of `tether bridge --upstream`
    api_key: str = "sk-bench"
    # HTTP/WebSocket client: "sdk" (the openai SDK, as agents use it) or "raw" (httpx/websockets +
    # orjson: what the transport costs without the SDK's per-request transform and model parsing).
    client: str = "sdk"


@dataclass
class Call:
    name: str
    call_id: str
    arguments: str


@dataclass
class TurnOutcome:
    """What one model turn produced, as the client saw it."""

    response_id: str = ""
    status: str = ""
    calls: list[Call] = field(default_factory=list)
    text: str = ""
    output: list[dict] | None = None  # the response's output items as JSON (full mode only)
    server_timing: dict | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    events: int = 0
    awaiting: bool = False  # the prototype shape: the response waits for tool output


@dataclass
class TurnRecord:
    index: int
    latency_s: float
    ttft_s: float | None
    bytes_sent: int
    events: int
    calls: list[tuple[str, str, str]]
    text: str
    overhead_ms: float | None
    stages_ms: dict[str, float]
    input_tokens: int | None
    cached_tokens: int | None
    response_id: str


@dataclass
class RolloutResult:
    variant: str
    workload: str
    speed: str = ""
    phase: str = ""
    rep: int = 0
    delay_ms: float = 0.0
    ok: bool = False
    error: str | None = None
    e2e_s: float = 0.0
    connect_s: float = 0.0
    turns: list[TurnRecord] = field(default_factory=list)
    final_text: str = ""
    connections: int = 0
    bytes_sent: int = 0
    # Filled by the orchestrator (server-side and network figures for this rollout).
    client_cpu_s: float | None = None  # this (client) process, all threads
    server_cpu_s: float | None = None
    bridge_cpu_s: float | None = None
    wire_c2s: int | None = None
    wire_s2c: int | None = None
    stage_sums: dict[str, dict[str, float]] = field(default_factory=dict)
    whole_rollout_timing: dict | None = None  # append mode: the one response's server_timing

    @property
    def tool_calls(self) -> list[tuple[str, str, str]]:
        return [c for t in self.turns for c in t.calls]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RolloutResult:
        d = dict(d)
        turns = [TurnRecord(**{**t, "calls": [tuple(c) for c in t["calls"]]}) for t in d.pop("turns", [])]
        return cls(**d, turns=turns)


def request_body(
    workload: Workload,
    model: str,
    input_items: list[dict],
    *,
    previous_response_id: str | None = None,
    store: bool = False,
    include: tuple[str, ...] = (),
) -> dict:
    """The Responses create body every transport sends (the header travels every turn, as
    Codex does over both HTTP and WebSocket)."""
    body: dict[str, Any] = {
        "model": model,
        "instructions": workload.instructions,
        "tools": list(workload.tools),
        "input": input_items,
        "store": store,
        "include": [SERVER_TIMING_INCLUDE, *include],
    }
    if previous_response_id:
        body["previous_response_id"] = previous_response_id
    return body


_SSL_CONTEXT = None


def ssl_context():
    """One SSL context for every HTTP client the lab creates. `httpx.AsyncClient()` builds a fresh
    one, loading the CA bundle (~110 ms of CPU here) even for http:// URLs; a client that makes a
    new connection per request should not pay that per request, so the lab shares one."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        import ssl

        _SSL_CONTEXT = ssl.create_default_context()
    return _SSL_CONTEXT


def function_call_output(call_id: str, output: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


class Transport(ABC):
    """Base of every transport variant. Subclasses set `name`, `mode` (and `store`)."""

    name: ClassVar[str] = ""
    mode: ClassVar[str] = "chained"  # full | chained | append
    store: ClassVar[bool] = False
    extra_include: ClassVar[tuple[str, ...]] = ()

    def __init__(self, target: Target) -> None:
        self.target = target
        self.bytes_sent = 0
        self.connections = 0

    # -- what a transport implements --------------------------------------------------------------

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Per-rollout connection setup (timed as part of the rollout)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Per-rollout teardown."""

    @abstractmethod
    async def create(self, body: dict) -> TurnOutcome: ...

    async def append(self, items: list[dict]) -> TurnOutcome:
        raise NotImplementedError(f"{self.name} has no append")

    # -- the agent loop ---------------------------------------------------------------------------

    async def run_rollout(self, workload: Workload, **labels: Any) -> RolloutResult:
        result = RolloutResult(variant=self.name, workload=workload.name, **labels)
        self.bytes_sent = 0
        self.connections = 0
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        opened = False
        try:
            await self.open()
            opened = True
            result.connect_s = time.perf_counter() - t0
            await self._loop(workload, result)
            result.ok = True
        except Exception as exc:  # noqa: BLE001 - a failed rollout is a result, not a crash
            result.error = f"{type(exc).__name__}: {exc}"[:2000]
        finally:
            if opened:
                try:
                    await self.close()
                except Exception as exc:  # noqa: BLE001
                    if result.error is None:
                        result.error = f"close: {type(exc).__name__}: {exc}"
                        result.ok = False
        result.e2e_s = time.perf_counter() - t0
        result.client_cpu_s = time.process_time() - cpu0
        result.connections = self.connections
        result.bytes_sent = self.bytes_sent
        return result

    async def _loop(self, workload: Workload, result: RolloutResult) -> None:
        model = self.target.model
        history: list[dict] = []
        new_input: list[dict] = [workload.user_message()]
        previous: str | None = None
        for index in range(workload.turns):
            sent_before = self.bytes_sent
            t0 = time.perf_counter()
            if self.mode == "append" and index > 0:
                out = await self.append(new_input)
            else:
                items = history + new_input if self.mode == "full" else new_input
                body = request_body(
                    workload, model, items,
                    previous_response_id=previous if self.mode == "chained" else None,
                    store=self.store, include=self.extra_include,
                )  # fmt: skip
                out = await self.create(body)
            latency = time.perf_counter() - t0
            timing = out.server_timing
            result.turns.append(TurnRecord(
                index=index,
                latency_s=latency,
                ttft_s=out.ttft_s,
                bytes_sent=self.bytes_sent - sent_before,
                events=out.events,
                calls=[(c.name, c.call_id, c.arguments) for c in out.calls],
                text=out.text,
                overhead_ms=timing["overhead_ms"] if timing and not out.awaiting else None,
                stages_ms=timing["stages_ms"] if timing and not out.awaiting else {},
                input_tokens=out.input_tokens,
                cached_tokens=out.cached_tokens,
                response_id=out.response_id,
            ))  # fmt: skip
            if not out.awaiting and out.status != "completed":
                raise RolloutError(f"turn {index}: response {out.response_id} ended {out.status!r}")
            if not out.calls:
                if self.mode == "append" and timing:
                    result.whole_rollout_timing = timing
                result.final_text = out.text
                if index != workload.turns - 1:
                    raise RolloutError(f"the model answered at turn {index}; the workload has {workload.turns} turns")
                return
            if self.mode == "append" and not out.awaiting:
                raise RolloutError(f"turn {index}: tool calls but no {AWAITING_EVENT} (does the server run tether_lab.prototype?)")
            if index >= len(workload.steps):
                raise RolloutError(f"turn {index}: the model called tools past the workload's last step")
            step = workload.steps[index]
            expected = [c.name for c in step.calls]
            got = [c.name for c in out.calls]
            if got != expected:
                raise RolloutError(f"turn {index}: the model called {got}, the workload says {expected}")
            outputs = [function_call_output(c.call_id, workload.tool_output(index, j)) for j, c in enumerate(out.calls)]
            if step.tool_ms:  # the workload's simulated tool execution time
                await asyncio.sleep(step.tool_ms / 1000)
            if self.mode == "full":
                if out.output is None:
                    raise RolloutError("full mode needs the response output items")
                history += new_input + out.output
            previous = out.response_id
            new_input = outputs
        raise RolloutError(f"no final answer after {workload.turns} turns")
