"""The WebSocket "prototype" shape: a whole tool loop as ONE long-running response.

In the launched WebSocket mode every model turn is its own response: the model stops with tool
calls, the response completes, and the client continues with a new `response.create`
(`previous_response_id` + the tool outputs). In the prototype shape the response stays open: after
the model's tool calls the server *blocks*, the client sends the tool outputs with
`response.append`, and the same response goes on streaming (output indices continue) until the
model answers without tool calls. This module implements that shape as a turn strategy
(`PrototypeTurns`, injected into the sessions through the composition root) and a per-create
opt-in, so the lab can measure how far the launched shape is from it (`tether bench`, transport
`ws-proto`). The runtime knows nothing of it: `python -m tether_lab.prototype serve ...` is
`tether serve` with this strategy (the bench's server), and `PrototypeKind` is a turn kind
(tether.core.kinds): the backend steps of a plain `Turn`, over the turn's `StepIO`; preparing,
ending, cancelling and finishing are the turn's.

Protocol (opt-in per create: `include: ["tether:prototype_append"]`, honoured by a server started
with this strategy):

1. `response.create` as usual. Events stream as usual.
2. When the model stops with tool calls, their items are closed (`output_item.done`) and the server
   sends one extra event, then waits::

       {"type": "response.awaiting_input", "response_id": "resp_...", "call_ids": ["call_..."],
        "sequence_number": N}

   (a `ServerEvent.other` on gRPC, so neither the schema nor the bridge needs to change).
3. The client sends `{"type": "response.append", "input": [function_call_output items...]}` (a
   gRPC `SessionRequest.append`). Outputs may come in several appends; generation resumes once
   every awaited call has an output. Extra items in an append (a user message) are added too. An
   append whose items fail validation gets an in-band `error` event and the response keeps
   waiting. An append that answers no waiting call falls through to the legacy `response.append`
   handling (a new response continuing the lane's last one).
4. The appended items are part of the response's `output` (in conversation order, without
   events echoing them back), so the cached state of the finished response, and any
   `previous_response_id` continuation of it, hold the whole loop.
5. The response ends as usual (`response.completed`) with the final answer. `server_timing` covers
   the whole response: the time spent waiting for the client's appends is reported as the stage
   `append_wait` and is not server overhead. If no append comes within `append_timeout_s` (default:
   the connection's `idle_timeout_s`) the response fails with `idle_timeout`; cancelling works as
   for any response.

The strategy's two hooks (`TurnStrategy`):

- `turn(...)`: the `Turn` to run for a create (of a new `PrototypeKind`, with a `PrototypeClock`,
  when the create asks for it, else of the standard kind);
- `deliver_append(session_id, append) -> bool`: offer a `response.append` to a waiting prototype
  kind of that session; False means "not for a prototype turn", and the session handles it as
  before.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence

import orjson

from tether import errors, render
from tether.backends.base import Finish, Usage
from tether.core.builder import OutputBuilder
from tether.core.context import TurnContext
from tether.core.kinds import Prepared, StepIO
from tether.core.lane import Lane
from tether.core.outcome import TurnControl
from tether.core.stages import validate
from tether.core.timing import StageClock
from tether.core.turn import Turn
from tether.errors import TetherError
from tether.protocol.calls import answered_call_id, call_of
from tether.protocol.wire import PROTOTYPE_APPEND_INCLUDE
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, service_pb2

AWAITING_EVENT = "response.awaiting_input"
APPEND_WAIT_STAGE = "append_wait"


def requested(params: request_pb2.ResponseCreateParams) -> bool:
    return PROTOTYPE_APPEND_INCLUDE in params.include


class PrototypeTurns:
    """The prototype shape as a turn strategy: a `Turn` of a new `PrototypeKind` for a create that
    asks for it, of the standard kind otherwise; appends go to the waiting prototype kind whose
    calls they answer."""

    def __init__(self, append_timeout_s: float | None = None) -> None:
        self.append_timeout_s = append_timeout_s  # None: the connection's idle_timeout_s
        self._waiting: dict[str, set[PrototypeKind]] = {}  # session id -> its waiting turns' kinds

    def turn(self, ctx: TurnContext, params: request_pb2.ResponseCreateParams, lane: Lane,
             control: TurnControl, event_id: str) -> Turn:  # fmt: skip
        if requested(params):
            timeout = ctx.services.limits.idle_timeout_s if self.append_timeout_s is None else self.append_timeout_s
            kind = PrototypeKind(ctx.session_id, self._waiting, timeout)
            return Turn(ctx, params, lane, control, event_id, kind=kind, clock=PrototypeClock())
        return Turn(ctx, params, lane, control, event_id)

    def deliver_append(self, session_id: str, append: service_pb2.AppendRequest) -> bool:
        """Give `append` to the waiting prototype kind whose calls it answers; False if none."""
        kinds = self._waiting.get(session_id)
        if not kinds:
            return False
        items = list(append.input)
        return any(kind.offer(items) for kind in list(kinds))

    def waiting_turns(self, session_id: str) -> int:
        return len(self._waiting.get(session_id) or ())


def deliver_append(session, append: service_pb2.AppendRequest) -> bool:  # noqa: ANN001
    """`session`'s strategy offered `append` (tests drive a session directly)."""
    return session.strategy.deliver_append(session.id, append)


def waiting_turns(session) -> int:  # noqa: ANN001
    """How many prototype turns of `session` wait for tool output (for tests and metrics)."""
    return session.strategy.waiting_turns(session.id)


class PrototypeClock(StageClock):
    """A StageClock whose overhead also excludes the time spent waiting for the client."""

    __slots__ = ()

    def overhead(self) -> float:
        return super().overhead() - self.stages.get(APPEND_WAIT_STAGE, 0.0)


class PrototypeKind:
    """The prototype turn kind: one response's backend calls across tool calls, waiting for the
    client's appends between them (see the module docstring). One per turn: it holds the wait."""

    def __init__(self, session_id: str, waiting: dict[str, set[PrototypeKind]], append_timeout_s: float) -> None:
        self.session_id = session_id
        self.append_timeout_s = append_timeout_s
        self._waiting = waiting  # the strategy's waiting kinds by session id
        self._pending: dict[str, None] = {}  # call ids waiting for output, in call order
        self._received: list[items_pb2.Item] = []
        self._texts: list[str] = []  # rendered text of the accepted appended items
        self._wake = asyncio.Event()
        self._so_far: Finish | None = None  # how the steps so far stopped, with their usage

    # -- the append side (called by PrototypeTurns.deliver_append, in the session's send path) --

    @property
    def awaiting(self) -> tuple[str, ...]:
        return tuple(self._pending)

    def offer(self, items: list[items_pb2.Item]) -> bool:
        """Take `items` if they answer at least one awaited call; wake the turn when all are in."""
        if not self._pending:
            return False
        answers = {a for a in map(answered_call_id, items) if a is not None}
        if not answers & self._pending.keys():
            return False
        self._received.extend(items)
        self._wake.set()
        return True

    # -- generation -----------------------------------------------------------------------------

    async def steps(self, io: StepIO, prepared: Prepared, builder: OutputBuilder) -> Finish:
        """Backend calls until the model answers without tool calls, each continuing the output
        so far with the appended tool outputs. Raises TetherError (`idle_timeout`) when no append
        comes within `append_timeout_s`."""
        base_items = prepared.node.items()
        input_tokens = prepared.input_tokens
        output_tokens = reasoning_tokens = 0
        finish: Finish | None = None

        def so_far() -> Finish:
            return Finish(
                reason=finish.reason if finish else "stop",
                usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens, reasoning_tokens=reasoning_tokens),
                timing=finish.timing if finish else None,
            )

        try:
            while True:
                request = io.backend_request(prepared.route, [*base_items, *builder.output], input_tokens)
                await io.stream(builder, prepared.route.backend, request)
                closing = builder.close_all("completed")
                finish = builder.finish or Finish()
                if finish.usage:
                    output_tokens += finish.usage.output_tokens or 0
                    reasoning_tokens += finish.usage.reasoning_tokens or 0
                    input_tokens += finish.usage.output_tokens or 0
                open_calls = _open_calls(builder.output) if finish.reason == "tool_calls" else []
                if open_calls:
                    # Waiting starts before the calls' done events go out, so an append sent as
                    # soon as the client sees them already finds this turn.
                    self._begin_wait(open_calls)
                await io.emit_all(closing)
                if not open_calls:
                    return so_far()
                appended = await self._await_outputs(io, open_calls)
                if appended is None:
                    raise TetherError(
                        errors.IDLE_TIMEOUT,
                        f"No response.append with the tool outputs within {self.append_timeout_s:g} s.",
                    )
                for item in appended:
                    builder.add_finished_item(item)  # recorded in the output; no events echo it back
                with io.clock.stage("render"):
                    input_tokens += sum(len(render.encode(text)) for text in self._texts)
                self._texts = []
        finally:
            self._stop_waiting()
            prepared.input_tokens = input_tokens
            self._so_far = so_far()

    def finish_so_far(self) -> Finish | None:
        """A loop that failed or was cancelled reports the usage of the steps it finished."""
        return self._so_far

    def take_injected(self, items: Sequence[items_pb2.Item]) -> bool:
        """False: the prototype takes its tool outputs as `response.append`s, not injects."""
        return False

    def _begin_wait(self, open_calls: list[str]) -> None:
        self._pending = dict.fromkeys(open_calls)
        self._received = []
        self._texts = []
        self._waiting.setdefault(self.session_id, set()).add(self)

    async def _await_outputs(self, io: StepIO, open_calls: list[str]) -> list[items_pb2.Item] | None:
        """Announce the wait, then collect appended items until every open call has an output.
        Returns the accepted items in arrival order, or None on timeout."""
        ev = io.event()
        ev.other.type = AWAITING_EVENT
        ev.other.json = orjson.dumps(
            {"type": AWAITING_EVENT, "response_id": io.response_id, "call_ids": open_calls}
        ).decode()
        await io.emit_all((ev,))
        clock = io.clock
        accepted: list[items_pb2.Item] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.append_timeout_s
        t_wait = time.perf_counter()
        done = False
        try:
            while self._pending:
                if not self._received:
                    self._wake.clear()
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        return None
                    try:
                        await asyncio.wait_for(self._wake.wait(), remaining)
                    except TimeoutError:
                        return None
                    continue
                clock.add(APPEND_WAIT_STAGE, time.perf_counter() - t_wait)
                batch, self._received = self._received, []
                try:
                    self._check(io, batch)
                except TetherError as exc:
                    await io.emit_error(exc)
                else:
                    accepted.extend(batch)
                    for item in batch:
                        answered = answered_call_id(item)
                        if answered is not None:
                            self._pending.pop(answered, None)
                t_wait = time.perf_counter()
            done = True
            return accepted
        finally:
            if not done:
                clock.add(APPEND_WAIT_STAGE, time.perf_counter() - t_wait)
            self._stop_waiting()

    def _check(self, io: StepIO, items: list[items_pb2.Item]) -> None:
        """The stages a create runs on new input, for appended items: validate, render, classify."""
        clock = io.clock
        with clock.stage("validate"):
            validate.validate_items(items, frozenset(self._pending), io.services.limits, param="input")
        with clock.stage("render"):
            texts = [render.render_item(item) for item in items]
        with clock.stage("classify"):
            io.services.classify(texts)
        self._texts.extend(texts)

    def _stop_waiting(self) -> None:
        self._pending = {}
        kinds = self._waiting.get(self.session_id)
        if kinds is not None:
            kinds.discard(self)
            if not kinds:
                self._waiting.pop(self.session_id, None)


def _open_calls(output: list[items_pb2.Item]) -> list[str]:
    """Call ids of the tool calls (function, custom) in `output` that have no output after them."""
    answered = {a for a in map(answered_call_id, output) if a is not None}
    return [call.call_id for call in map(call_of, output) if call is not None and call.call_id not in answered]


def awaiting_event_json(ev: events_pb2.ServerEvent) -> dict | None:
    """The payload of a `response.awaiting_input` event, or None for any other event."""
    if ev.WhichOneof("event") == "other" and ev.other.type == AWAITING_EVENT:
        return orjson.loads(ev.other.json)
    return None


def main(argv: list[str] | None = None) -> int:
    """`python -m tether_lab.prototype serve [tether serve's flags]`: `tether serve` whose sessions
    run `PrototypeTurns` (with `--workers`, every worker does)."""
    from tether import cli
    from tether_lab import prototype  # by its name, not as __main__: the workers unpickle the class

    return cli.main(argv, strategy=prototype.PrototypeTurns())


if __name__ == "__main__":
    sys.exit(main())
