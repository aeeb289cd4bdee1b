"""Hosted multi-agent responses (`multi_agent`, beta; docs/multi-agent.md): a turn kind whose
root agent may delegate to subagents that Tether runs concurrently within the one response.

`MultiAgentRollout` is a turn kind (tether.core.kinds) over the turn's `StepIO`. Every agent is a
sequence of model calls over its own context; the agents' calls run as concurrent tasks, each
streaming through `StepIO.stream` (so the output cap, the deadline and the cancel of the turn hold
over all of them) into an `_AgentOutput`: an `OutputBuilder` that gives the items the response's
output indices (`OutputBuilder.reserve` on the turn's builder, which owns the output) and tags every
item and event with `agent`. All agents' events go into the one outbox, so they share the
response's one `sequence_number` order.

The model delegates by calling the actions (`ACTIONS`), offered to it as function tools next to
the create's own tools. Tether runs them (`_act`): an action call becomes a `multi_agent_call`
item and its result a `multi_agent_call_output`; `send_message` / `followup_task` add an
`agent_message`. A call of one of the create's tools is an ordinary `function_call` tagged with its
agent; the agent pauses until the client answers it, by `call_id`: in the next create (HTTP), or
with a `response.inject` into the running response (WebSocket mode, a gRPC Session: `take_injected`).
The response ends when no agent is running: every agent has answered, or waits for client tool
outputs (on a transport that can inject, after `limits.multi_agent_inject_wait_s` without one),
or for agents that wait.

Agents outlive the response without any state beyond the chain: every item carries its agent,
so a continuation (`previous_response_id`, from the connection's cache or the store) rebuilds
each agent's context and state from the chain (`_rebuild`, reusing the token counts of the
chain's segments: no item is tokenised again), and resumes the agents that its new items answer,
and the root's pending `wait_agent`. With `context_management`, an agent whose call passed the
threshold has its own context compacted (`kinds.add_compaction`): a `compaction` item tagged
with it, which replaces only that agent's earlier context.
"""

from __future__ import annotations

import asyncio
import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from tether import errors, ids, render
from tether.backends.base import Finish, Usage
from tether.compaction_codec import effective_context
from tether.config import Limits
from tether.core.accounting import add_usage
from tether.core.builder import Emitted, OutputBuilder
from tether.core.chain import Segment
from tether.core.delta import Delta
from tether.core.items import user_message
from tether.core.kinds import Prepared, StepIO, add_compaction, compact_threshold
from tether.errors import TetherError
from tether.responses.v1 import items_pb2, request_pb2

ROOT = "/root"
BETA = "responses_multi_agent=v1"  # the `OpenAI-Beta` value a JSON client sends with `multi_agent`

# The actions, as the function tools the backend model sees (Codex's multi-agent tool shapes).
_TARGET = {"type": "string", "description": "The agent's path, e.g. /root/worker_1."}
_MESSAGE = {"type": "string"}
ACTION_SCHEMAS: dict[str, tuple[str, dict]] = {
    "spawn_agent": ("Start a subagent on a task; it works concurrently and answers when done.",
                    {"task_name": {"type": "string", "description": "A short name: letters, digits, _ and -."},
                     "message": {"type": "string", "description": "The task."}}),
    "wait_agent": ("Wait until the named subagents (default: all of yours) have answered; returns their answers.",
                   {"targets": {"type": "array", "items": _TARGET}}),
    "list_agents": ("List the agents of this response and their status.", {"path_prefix": _TARGET}),
    "send_message": ("Send a message to an agent (read at its next model call).", {"target": _TARGET, "message": _MESSAGE}),
    "followup_task": ("Give an agent a further task; it works on it at once.", {"target": _TARGET, "message": _MESSAGE}),
    "interrupt_agent": ("Stop an agent.", {"target": _TARGET}),
}  # fmt: skip
ACTIONS = frozenset(ACTION_SCHEMAS)
_REQUIRED = {"spawn_agent": ["task_name", "message"], "send_message": ["target", "message"],
             "followup_task": ["target", "message"], "interrupt_agent": ["target"]}  # fmt: skip


def enabled(params: request_pb2.ResponseCreateParams) -> bool:
    return params.HasField("multi_agent") and params.multi_agent.enabled


def validate(params: request_pb2.ResponseCreateParams, limits: Limits) -> None:
    """What a multi-agent create may not carry: a 400 naming the parameter."""
    if not enabled(params):
        return
    cfg = params.multi_agent
    if cfg.HasField("max_concurrent_subagents") and not 1 <= cfg.max_concurrent_subagents <= limits.max_concurrent_subagents:
        raise TetherError(errors.INVALID_REQUEST, "'multi_agent.max_concurrent_subagents' must be between 1 and "
                          f"{limits.max_concurrent_subagents} (limits.max_concurrent_subagents).",
                          param="multi_agent.max_concurrent_subagents")  # fmt: skip
    refused = [
        ("max_tool_calls", params.HasField("max_tool_calls"), "it bounds one agent's calls, not a rollout's"),
        ("reasoning.summary", params.reasoning.HasField("summary"), "agents' reasoning is not summarised"),
        ("background", params.HasField("background") and params.background, "background multi-agent runs are not supported"),
    ]  # fmt: skip
    for param, present, why in refused:
        if present:
            raise TetherError(errors.UNSUPPORTED_PARAMETER, f"Unsupported parameter: '{param}' with multi_agent: "
                              f"{why}.", param=param)  # fmt: skip
    for i, tool in enumerate(params.tools):
        arm = tool.WhichOneof("tool")
        if arm == "mcp":
            raise TetherError(errors.UNSUPPORTED_PARAMETER, "mcp tools are not supported with multi_agent.",
                              param=f"tools[{i}]")  # fmt: skip
        if arm == "function" and tool.function.name in ACTIONS:
            raise TetherError(errors.INVALID_REQUEST, f"The tool name {tool.function.name!r} is a multi-agent "
                              "action's.", param=f"tools[{i}].name")  # fmt: skip


# The items only a multi-agent turn reads (it gives them to the model as calls and messages).
ITEM_ARMS = frozenset(("multi_agent_call", "multi_agent_call_output", "agent_message"))


def check_input(params: request_pb2.ResponseCreateParams, items: Sequence[items_pb2.Item],
                continues_agents: bool) -> None:
    """A create without `multi_agent` may neither carry a multi-agent response's items nor
    continue one (only the multi-agent turn reads its agents' items): a 400 naming what is wrong."""
    if enabled(params):
        return
    for i, item in enumerate(items):
        if item.WhichOneof("item") in ITEM_ARMS:
            raise TetherError(errors.INVALID_ITEM, f"input[{i}] is a {item.WhichOneof('item')} item: send it with "
                              "multi_agent enabled.", param=f"input[{i}]")  # fmt: skip
    if continues_agents:
        raise TetherError(errors.INVALID_REQUEST, "This continues a multi-agent response: send multi_agent "
                          "enabled (its agents' items are read by the multi-agent turn only).",
                          param="multi_agent")  # fmt: skip


def _action_tools() -> list[request_pb2.Tool]:
    out = []
    for name, (description, properties) in ACTION_SCHEMAS.items():
        tool = request_pb2.Tool()
        tool.function.name, tool.function.description = name, description
        schema = {"type": "object", "properties": properties, "required": _REQUIRED.get(name, [])}
        tool.function.parameters_json = orjson.dumps(schema).decode()
        out.append(tool)
    return out


_ACTION_TOOLS = _action_tools()


class Status(enum.Enum):
    """Where an agent is. RUNNING makes model calls or runs actions; the rollout ends when no
    agent is RUNNING."""

    RUNNING = "running"
    WAITING_CLIENT = "waiting_for_client"  # paused on calls of the create's tools
    WAITING_AGENTS = "waiting_for_agents"  # in `wait_agent`
    DONE = "completed"
    INTERRUPTED = "interrupted"


_ENDED = (Status.DONE, Status.INTERRUPTED)


def _tokens(item: items_pb2.Item) -> int:
    return len(render.encode(render.render_item(item)))


@dataclass(eq=False)
class Agent:
    """One agent: its path, its context in the backend's terms (action calls as function calls)
    with each item's token count (an item is tokenised once: when it joins, or taken from the
    chain's segment, which a continuation tokenised once already), the client calls it waits
    for, its action calls not run yet, and its last answer."""

    name: str
    parent: str
    context: list[items_pb2.Item] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # tokens of each `context` item, rendered
    open_calls: set[str] = field(default_factory=set)
    pending: list[items_pb2.Item] = field(default_factory=list)  # multi_agent_call items
    status: Status = Status.DONE
    answer: str = ""
    task: asyncio.Task | None = None
    output: _AgentOutput | None = None  # its model call in progress
    injected: list[items_pb2.Item] = field(default_factory=list)  # committed by an inject, not yet emitted
    streamed_calls: set[str] = field(default_factory=set)  # client calls its model call in progress made
    early: list[items_pb2.Item] = field(default_factory=list)  # injected outputs of those, taken when it ends
    waiting_for: list[Agent] = field(default_factory=list)  # its `wait_agent`'s targets
    woken: asyncio.Event = field(default_factory=asyncio.Event)  # set when they have all ended

    def __post_init__(self) -> None:
        self.sizes = [_tokens(i) for i in self.context]

    def _push(self, item: items_pb2.Item, size: int | None = None) -> None:
        self.context.append(item)
        self.sizes.append(_tokens(item) if size is None else size)

    def prepend(self, item: items_pb2.Item) -> None:
        self.context.insert(0, item)
        self.sizes.insert(0, _tokens(item))

    @property
    def context_tokens(self) -> int:
        return sum(self.sizes)

    def add(self, item: items_pb2.Item, size: int | None = None) -> None:
        """An item of its own (or addressed to it) joins its context; its state follows. `size`:
        its token count, when known (a chain segment's; the agent's form of an item renders as
        the item does, except the multi-agent items, which it converts)."""
        arm = item.WhichOneof("item")
        if arm == "multi_agent_call":
            mac = item.multi_agent_call
            self.pending.append(item)
            fc = items_pb2.Item()
            fc.function_call.call_id, fc.function_call.name, fc.function_call.arguments = mac.call_id, mac.action, mac.arguments
            self._push(fc)
            return
        if arm == "multi_agent_call_output":
            maco = item.multi_agent_call_output
            self.pending = [p for p in self.pending if p.multi_agent_call.call_id != maco.call_id]
            out = items_pb2.Item()
            out.function_call_output.call_id = maco.call_id
            out.function_call_output.output_text = "".join(p.output_text.text for p in maco.output)
            self._push(out)
            return
        if arm == "agent_message":
            am = item.agent_message
            text = " ".join(p.input_text.text for p in am.content)
            self._push(user_message(f"Message from {am.author}: {text}"))
            return
        plain = items_pb2.Item()
        plain.CopyFrom(item)
        plain.ClearField("agent")
        self._push(plain, size)
        if arm == "compaction":  # its own compaction: its context is the summary and the kept tail
            kept = effective_context(list(zip(self.context, self.sizes, strict=True)), lambda e: e[0])
            self.context, self.sizes = [i for i, _ in kept], [n for _, n in kept]
        if arm == "function_call":
            self.open_calls.add(item.function_call.call_id)
        elif arm == "function_call_output":
            self.open_calls.discard(item.function_call_output.call_id)
        elif arm == "message" and item.message.role == "assistant":
            self.answer = "".join(p.output_text.text for p in item.message.content)

    def settle(self) -> None:
        """Its status from its context, between model calls."""
        if self.status is Status.INTERRUPTED:
            return
        last = self.context[-1].WhichOneof("item") if self.context else None
        if self.open_calls:
            self.status = Status.WAITING_CLIENT
        elif self.pending or last in ("function_call_output",) or (
                last == "message" and self.context[-1].message.role != "assistant"):  # fmt: skip
            self.status = Status.RUNNING
        else:
            self.status = Status.DONE


def agent_of(item: items_pb2.Item) -> str:
    return item.agent.agent_name if item.HasField("agent") else ROOT


def _rebuild(segments: Sequence[Segment]) -> dict[str, Agent]:
    """The agents of a chain, each with its context and status; a client's tool output without
    `agent` is tagged with the agent whose call it answers. The segments' token counts are
    reused: a continuation tokenises no item of the chain again."""
    agents = {ROOT: Agent(ROOT, "")}
    owners: dict[str, str] = {}  # call_id -> agent
    spawns: dict[str, items_pb2.MultiAgentCall] = {}
    for seg in segments:
        item = seg.item
        arm = item.WhichOneof("item")
        if arm == "function_call_output" and not item.HasField("agent") and item.function_call_output.call_id in owners:
            item.agent.agent_name = owners[item.function_call_output.call_id]
        name = agent_of(item)
        agent = agents.get(name)
        if agent is None:
            agent = agents[name] = Agent(name, name.rsplit("/", 1)[0])
        if arm == "function_call":
            owners[item.function_call.call_id] = name
        elif arm == "multi_agent_call" and item.multi_agent_call.action == "spawn_agent":
            spawns[item.multi_agent_call.call_id] = item.multi_agent_call
        elif arm == "multi_agent_call_output" and item.multi_agent_call_output.call_id in spawns:
            result = _json_object("".join(p.output_text.text for p in item.multi_agent_call_output.output))
            spawned = result.get("task_name")
            if isinstance(spawned, str):
                task = user_message(str(_json_object(spawns[item.multi_agent_call_output.call_id].arguments)
                                        .get("message", "")))  # fmt: skip
                if spawned in agents:  # its first items came before the spawn's result
                    agents[spawned].prepend(task)
                else:
                    agents[spawned] = Agent(spawned, name, [task])
        if arm == "agent_message":
            recipient = agents.get(item.agent_message.recipient)
            if recipient is not None:
                recipient.add(item)
            continue
        agent.add(item, len(seg.tokens))
    for agent in agents.values():
        agent.settle()
    return agents


def _json_object(text: str) -> dict:
    try:
        value = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class _AgentOutput(OutputBuilder):
    """One agent's model call: the events of its items at the response's output indices, tagged
    with the agent; its calls of actions are held back (Tether runs them: `multi_agent_call`)."""

    def __init__(self, response: OutputBuilder, agent: Agent) -> None:
        super().__init__(seal_reasoning=response.seal_reasoning, max_logprobs=response.logprobs_left)
        self._response = response
        self._agent = agent
        self._index: dict[int, int] = {}  # this call's index -> the response's
        self._held: set[int] = set()  # indices of action calls

    def feed(self, chunks: list) -> list[Emitted]:
        return self._translate(super().feed(chunks))

    def close_all(self, status: str = "completed") -> list:
        return self._translate(super().close_all(status))

    def _translate(self, events: Sequence[Emitted]) -> list[Emitted]:
        out: list[Emitted] = []
        name = self._agent.name
        for ev in events:
            if type(ev) is Delta:
                if ev.output_index not in self._held:
                    ev.output_index, ev.agent = self._index[ev.output_index], name
                    out.append(ev)
                continue
            arm = ev.WhichOneof("event") or ""
            payload = getattr(ev, arm)  # every event of a model call's items has an output index
            local = payload.output_index
            if arm == "output_item_added":
                item = payload.item
                if item.WhichOneof("item") == "function_call" and item.function_call.name in ACTIONS:
                    self._held.add(local)
                else:
                    self._index[local] = self._response.reserve()
            if local in self._held:
                continue
            payload.output_index = self._index[local]
            if arm in ("output_item_added", "output_item_done"):
                item = payload.item
                item.agent.agent_name = name
                if item.WhichOneof("item") == "message" and name == ROOT:
                    item.message.phase = "final_answer"
                if arm == "output_item_done":
                    self._response.add_done(payload.output_index, item)
                    if item.WhichOneof("item") == "function_call":  # the client may answer it from now on
                        self._agent.streamed_calls.add(item.function_call.call_id)
            ev.agent.agent_name = name
            out.append(ev)
        return out


class MultiAgentRollout:
    """The multi-agent turn kind (module docstring). One per turn: it holds the rollout's agents."""

    def __init__(self, params: request_pb2.ResponseCreateParams, limits: Limits, inject_wait_s: float) -> None:
        cfg = params.multi_agent
        self.max_concurrent = cfg.max_concurrent_subagents if cfg.HasField("max_concurrent_subagents") else 3
        self.max_total = limits.max_subagents_per_response
        self.inject_wait_s = inject_wait_s
        self.agents: dict[str, Agent] = {}
        self.sums = [0, 0, 0]  # input, output, reasoning tokens of every model call
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._io: StepIO | None = None
        self._prepared: Prepared | None = None
        self._builder: OutputBuilder | None = None
        self._last = Finish()
        self._accepting = False
        self._capped = False  # an agent's call stopped at the output cap: the rollout ends
        self._calls = 0

    # -- the kind -----------------------------------------------------------------------------------

    async def steps(self, io: StepIO, prepared: Prepared, builder: OutputBuilder) -> Finish:
        self._io, self._prepared, self._builder = io, prepared, builder
        self.agents = _rebuild(prepared.node.all_segments())
        for agent in list(self.agents.values()):
            if agent.status is Status.RUNNING:
                self._start(agent)
        try:
            self._accepting = True
            await self._until_quiet()
        except BaseException:
            await self._stop("incomplete")
            raise
        finally:
            self._accepting = False
        await self._stop("completed")
        if self._last.reason == "length":
            return self._finish("length")
        return self._finish("tool_calls" if any(a.open_calls for a in self.agents.values()) else "stop")

    def finish_so_far(self) -> Finish | None:
        return self._finish(self._last.reason)

    def take_injected(self, items: Sequence[items_pb2.Item]) -> bool:
        """Client tool outputs for calls that agents of this running response wait for: committed
        (all or none) and the agents resumed. False: not all are such outputs."""
        if not self._accepting:
            return False
        taken = {e.function_call_output.call_id for agent in self.agents.values() for e in agent.early}
        owners = {call_id: agent for agent in self.agents.values()
                  for call_id in (*agent.open_calls, *agent.streamed_calls) if call_id not in taken}  # fmt: skip
        if len({item.function_call_output.call_id for item in items}) != len(items):
            return False  # one output per call
        for item in items:
            if item.WhichOneof("item") != "function_call_output" or item.function_call_output.call_id not in owners:
                return False
            tagged = item.HasField("agent") and item.agent.agent_name
            if tagged and tagged != owners[item.function_call_output.call_id].name:
                return False
        for item in items:
            agent = owners[item.function_call_output.call_id]
            committed = items_pb2.Item()
            committed.CopyFrom(item)
            committed.agent.agent_name = agent.name
            if not committed.function_call_output.id:
                committed.function_call_output.id = ids.new_id("fco")
            committed.function_call_output.status = "completed"  # an output item has one
            if committed.function_call_output.call_id in agent.open_calls:
                agent.add(committed)
                agent.injected.append(committed)  # into the output when the agent resumes (after the ack)
            else:  # its model call is still streaming: taken when the call ends (`_take_early`)
                agent.early.append(committed)
            if not agent.open_calls and agent.status is Status.WAITING_CLIENT:
                self._start(agent)
        self._notify()
        return True

    # -- the rollout -------------------------------------------------------------------------------

    async def _until_quiet(self) -> None:
        """Until no agent runs: then, on a transport that can inject, up to `inject_wait_s` more
        while agents wait for client tool outputs."""
        while True:
            self._changed.clear()
            if self._error is not None:
                raise self._error
            if self._capped:
                return
            statuses = [a.status for a in self.agents.values()]
            if Status.RUNNING in statuses:
                await self._changed.wait()
                continue
            if Status.WAITING_CLIENT in statuses and self.inject_wait_s > 0:
                try:
                    await asyncio.wait_for(self._changed.wait(), self.inject_wait_s)
                except TimeoutError:
                    return
                continue
            return

    async def _stop(self, status: str) -> None:
        """End every agent's task (a `wait_agent` still waiting stays pending in the chain) and
        close what its model call left open."""
        tasks = [a.task for a in self.agents.values() if a.task is not None and not a.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for agent in self.agents.values():
            if agent.output is not None:
                await self._emit(agent.output.close_all(status))
                agent.output = None
            await self._flush(agent)

    async def _flush(self, agent: Agent) -> None:
        """The items injects committed for `agent`, into the output."""
        assert self._builder is not None
        while agent.injected:
            await self._emit(self._tag(self._builder.add_finished_item(agent.injected.pop(0))[1], agent.name))

    def _notify(self) -> None:
        """An agent's status changed: wake the `wait_agent`s it satisfies (RUNNING at once, so the
        rollout never sees a moment with nothing running between the two), then the rollout."""
        for agent in self.agents.values():
            if agent.status is Status.WAITING_AGENTS and all(t.status in _ENDED for t in agent.waiting_for):
                agent.status = Status.RUNNING
                agent.woken.set()
        self._changed.set()

    def _start(self, agent: Agent) -> None:
        agent.status = Status.RUNNING
        agent.task = asyncio.get_running_loop().create_task(self._run(agent), name=f"tether-agent-{agent.name}")

    async def _run(self, agent: Agent) -> None:
        """An agent's loop: run its pending actions, call its model, until it answers or waits
        for the client."""
        try:
            await self._flush(agent)
            while agent.status is Status.RUNNING:
                if agent.pending:
                    await self._act(agent, agent.pending[0])
                    continue
                await self._call(agent)
                agent.settle()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the rollout fails with it (`_until_quiet`)
            if self._error is None:
                self._error = exc
        finally:
            self._notify()

    async def _call(self, agent: Agent) -> None:
        io, prepared, builder = self._io, self._prepared, self._builder
        assert io is not None and prepared is not None and builder is not None
        estimate = agent.context_tokens
        self._calls += 1
        if self._calls > 1:  # the turn admitted the first; every further call counts like any model call
            io.services.rate_limiter.admit(io.tenant, estimate)
        request = io.backend_request(prepared.route, list(agent.context), estimate)
        request.tools = [*request.tools, *_ACTION_TOOLS]
        choice = request.tool_choice
        if self._calls > 1 and choice is not None and not (choice.WhichOneof("choice") == "mode" and choice.mode == "none"):
            # A forced choice holds for the rollout's first call only (else every agent would call
            # tools for ever), as in the MCP loop; `none` holds throughout.
            request.tool_choice = request_pb2.ToolChoice(mode="auto")
        request.agent, request.agent_actions = agent.name, ACTIONS
        request.instructions = _instructions(io.params, agent)
        output = agent.output = _AgentOutput(builder, agent)
        await io.stream(output, prepared.route.backend, request)
        await self._emit(output.close_all("completed"))
        agent.output = None
        finish = output.finish or Finish()
        self._last = finish
        produced = output.output
        add_usage(self.sums, finish.usage, estimate, produced)
        for item in produced:
            kind = item.WhichOneof("item")
            if kind == "function_call" and item.function_call.name in ACTIONS:
                call = items_pb2.Item()
                mac = call.multi_agent_call
                fc = item.function_call
                mac.id, mac.action, mac.arguments, mac.call_id = ids.new_id("mac"), fc.name, fc.arguments, fc.call_id
                call.agent.agent_name = agent.name
                await self._emit(self._tag(builder.add_finished_item(call)[1], agent.name))
                agent.add(call)
            else:
                agent.add(item)
        agent.streamed_calls.clear()
        threshold = compact_threshold(io.params)
        if threshold is not None and estimate + ((finish.usage.output_tokens or 0) if finish.usage else 0) > threshold:
            # Its context passed the threshold: compacted as a single-agent turn's, for itself.
            agent.add(await add_compaction(io, prepared, builder, list(agent.context), finish.replica or None, agent.name))
        for committed in agent.early:  # outputs injected while the call was still streaming
            agent.add(committed)
            agent.injected.append(committed)
        agent.early.clear()
        if finish.reason == "length":  # the response's output cap: every agent stops
            agent.status = Status.INTERRUPTED
            self._capped = True

    async def _act(self, agent: Agent, call: items_pb2.Item) -> None:
        """Run one action and add its `multi_agent_call_output`."""
        mac = call.multi_agent_call
        args = _json_object(mac.arguments)
        result = await getattr(self, f"_{mac.action}")(agent, args)
        item = items_pb2.Item()
        out = item.multi_agent_call_output
        out.id, out.action, out.call_id = ids.new_id("maco"), mac.action, mac.call_id
        out.output.add().output_text.text = orjson.dumps(result).decode()
        item.agent.agent_name = agent.name
        assert self._builder is not None
        await self._emit(self._tag(self._builder.add_finished_item(item)[1], agent.name))
        agent.add(item)

    def _active_subagents(self) -> int:
        return sum(1 for a in self.agents.values() if a.name != ROOT and a.status not in _ENDED)

    async def _spawn_agent(self, agent: Agent, args: dict) -> dict:
        task_name = re.sub(r"[^A-Za-z0-9_-]", "_", str(args.get("task_name") or "agent"))[:48]
        if self._active_subagents() >= self.max_concurrent:
            return {"error": f"{self._active_subagents()} subagents are active, the most this response allows "
                    "(multi_agent.max_concurrent_subagents): wait for one first."}  # fmt: skip
        if len(self.agents) - 1 >= self.max_total:
            return {"error": f"This response has spawned {self.max_total} subagents, the most it may "
                    "(limits.max_subagents_per_response)."}  # fmt: skip
        path, n = f"{agent.name}/{task_name}", 2
        while path in self.agents:
            path, n = f"{agent.name}/{task_name}_{n}", n + 1
        child = self.agents[path] = Agent(path, agent.name, [user_message(str(args.get("message", "")))])
        self._start(child)
        return {"task_name": path}

    def _targets(self, agent: Agent, args: dict, key: str = "targets") -> list[Agent]:
        names = args.get(key)
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names:
            return [a for a in self.agents.values() if a.parent == agent.name]
        return [self.agents[n] for n in names if isinstance(n, str) and n in self.agents]

    async def _wait_agent(self, agent: Agent, args: dict) -> dict:
        targets = agent.waiting_for = self._targets(agent, args)
        if not all(t.status in _ENDED for t in targets):
            agent.woken.clear()
            agent.status = Status.WAITING_AGENTS
            self._notify()
            await agent.woken.wait()  # `_notify` makes it RUNNING again
        return {"status": {t.name: {t.status.value: t.answer} for t in targets}}

    async def _list_agents(self, agent: Agent, args: dict) -> dict:
        prefix = str(args.get("path_prefix") or "")
        return {"agents": [{"agent_name": a.name, "status": a.status.value}
                           for a in self.agents.values() if a.name.startswith(prefix)]}  # fmt: skip

    async def _send_message(self, agent: Agent, args: dict, followup: bool = False) -> dict:
        target = self.agents.get(str(args.get("target")))
        if target is None:
            return {"error": f"No agent {args.get('target')!r} in this response."}
        item = items_pb2.Item()
        am = item.agent_message
        am.id, am.author, am.recipient = ids.new_id("amsg"), agent.name, target.name
        am.content.add().input_text.text = str(args.get("message", ""))
        item.agent.agent_name = agent.name
        assert self._builder is not None
        await self._emit(self._tag(self._builder.add_finished_item(item)[1], agent.name))
        target.add(item)
        if followup and target.status in _ENDED:
            target.status = Status.RUNNING
            self._start(target)
        return {"delivered": True}

    async def _followup_task(self, agent: Agent, args: dict) -> dict:
        return await self._send_message(agent, args, followup=True)

    async def _interrupt_agent(self, agent: Agent, args: dict) -> dict:
        target = self.agents.get(str(args.get("target")))
        if target is None or target.name == ROOT:
            return {"error": f"No subagent {args.get('target')!r} in this response."}
        if target.task is not None and target.task is not asyncio.current_task():
            target.task.cancel()
            await asyncio.gather(target.task, return_exceptions=True)
        if target.output is not None:
            await self._emit(target.output.close_all("incomplete"))
            target.output = None
        target.status = Status.INTERRUPTED
        target.open_calls.clear()
        self._notify()
        return {"interrupted": True}

    # -- output ------------------------------------------------------------------------------------

    @staticmethod
    def _tag(events: list, agent: str) -> list:
        for ev in events:
            ev.agent.agent_name = agent
            if ev.WhichOneof("event") in ("output_item_added", "output_item_done"):
                getattr(ev, ev.WhichOneof("event")).item.agent.agent_name = agent
        return events

    async def _emit(self, events: Sequence[Emitted]) -> None:
        if events:
            assert self._io is not None
            await self._io.emit_all(events)  # type: ignore[arg-type]  # Delta records pass through the outbox too

    def _finish(self, reason: str) -> Finish:
        usage = Usage(input_tokens=self.sums[0], output_tokens=self.sums[1], reasoning_tokens=self.sums[2])
        return Finish(reason=reason, usage=usage, timing=self._last.timing, replica=self._last.replica)


def _instructions(params: request_pb2.ResponseCreateParams, agent: Agent) -> str | None:
    base = params.instructions if params.HasField("instructions") else ""
    if agent.name == ROOT:
        note = ("You may delegate: spawn_agent starts a subagent on a task, wait_agent collects the answers. "
                "Answer the user yourself once you have what you need.")  # fmt: skip
    else:
        note = (f"You are the subagent {agent.name}; your task is the first user message. Answer it: your "
                f"answer goes to {agent.parent}.")  # fmt: skip
    return f"{base}\n\n{note}" if base else note
