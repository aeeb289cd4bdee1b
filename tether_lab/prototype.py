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
`tether serve` with this strategy (the bench's server), and `PrototypeTurn` replaces only the
backend steps of a `Turn` (`_steps`); preparing, ending, cancelling and finishing are the turn's.

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

- `turn(...)`: the `Turn` to run for a create (a `PrototypeTurn` when the create asks for it,
  else a plain `Turn`);
- `deliver_append(session_id, append) -> bool`: offer a `response.append` to a waiting prototype
  turn of that session; False means "not for a prototype turn", and the session handles it as
  before.
"""

from __future__ import annotations

import asyncio
import sys
import time

import orjson

from tether import errors, render
from tether.backends.base import Finish, Usage
from tether.core.builder import OutputBuilder
from tether.core.context import TurnContext
from tether.core.lane import Lane
from tether.core.outcome import TurnControl
from tether.core.stages import validate
from tether.core.timing import StageClock
from tether.core.turn import Prepared, Turn
from tether.errors import TetherError
from tether.protocol.calls import answered_call_id, call_of
from tether.protocol.wire import PROTOTYPE_APPEND_INCLUDE
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, service_pb2

AWAITING_EVENT = "response.awaiting_input"
APPEND_WAIT_STAGE = "append_wait"


def requested(params: request_pb2.ResponseCreateParams) -> bool:
    return PROTOTYPE_APPEND_INCLUDE in params.include


class PrototypeTurns:
    """The prototype shape as a turn strategy: a `PrototypeTurn` for a create that asks for it,
    a plain `Turn` otherwise; appends go to the waiting prototype turn whose calls they answer."""

    def __init__(self, append_timeout_s: float | None = None) -> None:
        self.append_timeout_s = append_timeout_s  # None: the connection's idle_timeout_s
        self._waiting: dict[str, set[PrototypeTurn]] = {}  # session id -> its waiting turns

    def turn(self, ctx: TurnContext, params: request_pb2.ResponseCreateParams, lane: Lane,
             control: TurnControl, event_id: str) -> Turn:  # fmt: skip
        if requested(params):
            return PrototypeTurn(ctx, params, lane, control, event_id, waiting=self._waiting,
                                 append_timeout_s=self.append_timeout_s)  # fmt: skip
        return Turn(ctx, params, lane, control, event_id)

    def deliver_append(self, session_id: str, append: service_pb2.AppendRequest) -> bool:
        """Give `append` to the waiting prototype turn whose calls it answers; False if none."""
        turns = self._waiting.get(session_id)
        if not turns:
            return False
        items = list(append.input)
        return any(turn.offer(items) for turn in list(turns))

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


class PrototypeTurn(Turn):
    """A turn that keeps its response open across tool calls (see the module docstring)."""

    def __init__(self, ctx: TurnContext, params: request_pb2.ResponseCreateParams, lane: Lane,
                 control: TurnControl, event_id: str = "", *, waiting: dict[str, set[PrototypeTurn]],
                 append_timeout_s: float | None = None) -> None:  # fmt: skip
        super().__init__(ctx, params, lane, control, event_id)
        self.clock = PrototypeClock()
        limits = ctx.services.limits
        self.append_timeout_s = limits.idle_timeout_s if append_timeout_s is None else append_timeout_s
        self.steps = 0  # backend calls made so far
        self._waiting = waiting  # the strategy's waiting turns by session id
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

    async def _steps(self, prepared: Prepared, builder: OutputBuilder) -> Finish:
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
                self.steps += 1
                request = self._backend_request(prepared.route, [*base_items, *builder.output], input_tokens)
                await self._stream_step(builder, prepared.route.backend, request)
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
                await self._emit_all(closing)
                if not open_calls:
                    return so_far()
                appended = await self._await_outputs(open_calls)
                if appended is None:
                    raise TetherError(
                        errors.IDLE_TIMEOUT,
                        f"No response.append with the tool outputs within {self.append_timeout_s:g} s.",
                    )
                for item in appended:
                    builder.add_finished_item(item)  # recorded in the output; no events echo it back
                with self.clock.stage("render"):
                    input_tokens += sum(len(render.encode(text)) for text in self._texts)
                self._texts = []
        finally:
            self._stop_waiting()
            prepared.input_tokens = input_tokens
            self._so_far = so_far()

    def _finish_so_far(self, builder: OutputBuilder) -> Finish | None:
        """A loop that failed or was cancelled reports the usage of the steps it finished."""
        return self._so_far

    def _begin_wait(self, open_calls: list[str]) -> None:
        self._pending = dict.fromkeys(open_calls)
        self._received = []
        self._texts = []
        self._waiting.setdefault(self.ctx.session_id, set()).add(self)

    async def _await_outputs(self, open_calls: list[str]) -> list[items_pb2.Item] | None:
        """Announce the wait, then collect appended items until every open call has an output.
        Returns the accepted items in arrival order, or None on timeout."""
        ev = self._event()
        ev.other.type = AWAITING_EVENT
        ev.other.json = orjson.dumps(
            {"type": AWAITING_EVENT, "response_id": self.response_id, "call_ids": open_calls}
        ).decode()
        await self.ctx.outbox.put(ev)
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
                self.clock.add(APPEND_WAIT_STAGE, time.perf_counter() - t_wait)
                batch, self._received = self._received, []
                try:
                    self._check(batch)
                except TetherError as exc:
                    await self.ctx.emit_error(exc, stream_id=self.stream_id, event_id=self.event_id)
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
                self.clock.add(APPEND_WAIT_STAGE, time.perf_counter() - t_wait)
            self._stop_waiting()

    def _check(self, items: list[items_pb2.Item]) -> None:
        """The stages a create runs on new input, for appended items: validate, render, classify."""
        with self.clock.stage("validate"):
            validate.validate_items(items, frozenset(self._pending), self.services.limits, param="input")
        with self.clock.stage("render"):
            texts = [render.render_item(item) for item in items]
        with self.clock.stage("classify"):
            self.services.classify(texts)
        self._texts.extend(texts)

    def _stop_waiting(self) -> None:
        self._pending = {}
        turns = self._waiting.get(self.ctx.session_id)
        if turns is not None:
            turns.discard(self)
            if not turns:
                self._waiting.pop(self.ctx.session_id, None)


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
