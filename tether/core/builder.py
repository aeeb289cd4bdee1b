"""From backend chunks to Responses events: a pure state machine, no I/O.

`OutputBuilder.feed(chunks)` returns the events a backend wake-up's chunks cause (item added /
part added / delta ...), `close_all()` closes every open item in output order. Text deltas are
`Delta` records, not protobuf messages, and consecutive deltas of one content part are merged
into one record: a wake-up that delivers 16 one-token chunks costs one delta event, not 16. It owns output indices and item
ids, so every added item is done exactly once, indices are consistent, and the final output list
equals what the stream said. The session core stamps response ids and sequence numbers.

Two request options shape the output here, so every transport gets them alike:
- `max_tool_calls`: tool calls (function and custom) past the cap are not started; `capped` turns true, and the
  turn stops the backend stream (the response completes with the calls it has);
- `max_logprobs` (`limits.max_logprobs` when log probabilities are asked for): a text chunk whose
  log probabilities (a token and each alternative count one) would pass it is not taken; `capped`
  turns true with finish reason "length" (the response ends incomplete, `max_output_tokens`);
- `reasoning_summary` (`reasoning.summary` was set): the backend's reasoning text streams as the
  reasoning item's summary (`response.reasoning_summary_*` events, `summary` parts) instead of
  its `content`; Tether does not summarise separately;
- `seal_reasoning` (`include` has `reasoning.encrypted_content`): called on each finished
  reasoning item before it is emitted, to set its `encrypted_content`.
Text chunks that carry log probabilities (the request asked for them) put them on their delta
(merged deltas concatenate their lists, in order) and on the message's `output_text.done` and
`output_text` part.
A tool call of a name in `mcp_routes` (an MCP server's tool, set by the MCP loop before each
backend call) opens an `mcp_call` item whose arguments stream as `response.mcp_call_arguments.*`;
closing it does not finish it: it waits in `waiting_mcp_calls()` until the loop has called the server
and `settle_mcp_call` finishes it. A call of a tool that needs approval becomes an
`mcp_approval_request` item, sent whole when the call closes.
A tool call chunk marked `custom` opens a `custom_tool_call` item (an `OtherItem`, see
`tether.protocol.calls`) whose fragments stream as `response.custom_tool_call_input.delta` and
end with `.done`, instead of a `function_call`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from tether import ids
from tether.backends.base import Chunk, Finish, ReasoningDelta, RefusalDelta, TextDelta, ToolCallDelta
from tether.core.delta import Delta
from tether.protocol.calls import custom_call_item
from tether.responses.v1 import events_pb2, items_pb2

Event = events_pb2.ServerEvent
Emitted = Event | Delta


@dataclass(frozen=True, slots=True)
class McpRoute:
    """Where the model's call of an MCP tool goes: the server's label, and whether the client must
    approve it first."""

    server_label: str
    needs_approval: bool


@dataclass
class _OpenItem:
    index: int
    # message | refusal (a message whose part is a refusal) | reasoning | function_call | custom_tool_call |
    # mcp_call | mcp_approval_request
    kind: str
    item_id: str
    pieces: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    server_label: str = ""  # mcp_call / mcp_approval_request
    logprobs: list[dict] | None = None  # output text's token log probabilities, when asked for


class OutputBuilder:
    def __init__(
        self,
        *,
        max_tool_calls: int | None = None,
        reasoning_summary: bool = False,
        seal_reasoning: Callable[[items_pb2.Item], None] | None = None,
        max_logprobs: int | None = None,
    ) -> None:
        self.max_tool_calls = max_tool_calls
        # Log probabilities the output may carry (a token and each of its alternatives count one);
        # the text chunk that would pass it is not taken: `capped`, finish reason "length".
        self.logprobs_left = max_logprobs
        self.reasoning_summary = reasoning_summary
        self.seal_reasoning = seal_reasoning
        self.capped = False  # a tool call past `max_tool_calls` was refused
        self._done: list[tuple[int, items_pb2.Item]] = []  # finished items with their index
        self._open: dict[int, _OpenItem] = {}  # by output index
        self._text: _OpenItem | None = None
        self._reasoning: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}  # by backend tool-call index
        self._next_index = 0
        self._calls_started = 0
        self.finish: Finish | None = None
        self.mcp_routes: dict[str, McpRoute] = {}  # tool name -> its MCP server (the MCP loop sets it)
        # The id of an approval request, from what it asks (the MCP loop sets it: a signed id).
        self.approval_id: Callable[[items_pb2.McpApprovalRequest], str] | None = None
        # Items the MCP loop finishes (mcp_calls to run, a listing in progress) by output index, until done.
        self._external: dict[int, items_pb2.Item] = {}
        self.approvals_requested = 0

    @property
    def output(self) -> list[items_pb2.Item]:
        """Finished items in output order."""
        return [item for _, item in sorted(self._done, key=lambda pair: pair[0])]

    @property
    def tool_calls_started(self) -> int:
        return self._calls_started

    @property
    def next_index(self) -> int:
        return self._next_index

    def feed(self, chunks: list[Chunk]) -> list[Emitted]:
        """The events of a run of chunks (what one backend wake-up delivered), in order.

        The common case is a run of chunks that all continue one item: text, reasoning, or one
        tool call's arguments. Once a chunk has made (or extended) that item's delta event, the
        chunks after it of the same kind, for the same item and changing nothing else, are
        appended to it directly (`tail`: the delta, `tail_item`: its open item), without the
        item-lifecycle checks; anything else goes the full way and ends the run."""
        events: list[Emitted] = []
        tail: Delta | None = None  # the delta this run is appending to
        tail_item: _OpenItem | None = None
        tail_kind: type | None = None  # TextDelta, ReasoningDelta or ToolCallDelta
        tail_call = -1  # ToolCallDelta: the call's index
        kind: type  # the chunk's class, for `tail_kind`
        for chunk in chunks:
            # `type(chunk) is X` narrows `chunk` for the type checker; a text chunk (the common
            # case) still costs one type() call.
            if type(chunk) is TextDelta:
                kind, logprobs = TextDelta, chunk.logprobs
                if logprobs and self.logprobs_left is not None and not self._pay_logprobs(logprobs):
                    break
                piece, continues = chunk.text, tail_kind is TextDelta
            elif type(chunk) is ToolCallDelta:
                kind, logprobs = ToolCallDelta, None
                piece = chunk.arguments
                continues = tail_kind is ToolCallDelta and chunk.index == tail_call and bool(piece) and not chunk.name
            elif type(chunk) is ReasoningDelta:
                kind, logprobs = ReasoningDelta, None
                piece, continues = chunk.text, tail_kind is ReasoningDelta
            else:
                tail_kind = None
                if type(chunk) is RefusalDelta:
                    self._text_delta(chunk.text, events, refusal=True)
                elif type(chunk) is Finish:
                    self.finish = chunk
                else:
                    raise TypeError(f"unknown chunk {chunk!r}")
                continue
            if continues:
                assert tail is not None and tail_item is not None  # set with `tail_kind`, which continues
                tail_item.pieces.append(piece)
                tail.pieces.append(piece)
                tail.size += len(piece)
                if logprobs:
                    _add_logprobs(tail_item, tail, logprobs)
                continue
            if kind is TextDelta:
                self._text_delta(piece, events, logprobs=logprobs)
                tail_item = self._text
            elif type(chunk) is ToolCallDelta:
                self._tool_delta(chunk, events)
                tail_item, tail_call = self._calls.get(chunk.index), chunk.index
            else:
                self._reasoning_delta(piece, events)
                tail_item = self._reasoning
            # The chunk went the full way: the run may go on appending to its item's delta when
            # that delta is the last event (a text delta only once no reasoning is open).
            last = events[-1] if events else None
            if (type(last) is Delta and tail_item is not None and last.item_id == tail_item.item_id
                    and (kind is not TextDelta or self._reasoning is None)):  # fmt: skip
                tail, tail_kind = last, kind
            else:
                tail = tail_kind = None
        return events

    def _pay_logprobs(self, logprobs: list[dict]) -> bool:
        """Charge a chunk's log probabilities to `logprobs_left`; False (and the stream capped,
        finishing as by the output cap) when they do not fit."""
        cost = sum(1 + len(lp.get("top_logprobs") or ()) for lp in logprobs)
        if cost > self.logprobs_left:  # type: ignore[operator]  # not None: the caller checked
            self.capped = True
            self.finish = Finish(reason="length")
            return False
        self.logprobs_left -= cost  # type: ignore[operator]  # as above
        return True

    def close_all(self, status: str = "completed") -> list[Event]:
        """Close every open item (in output order) and return their closing events."""
        events: list[Event] = []
        for index in sorted(self._open):
            events.extend(self._close(self._open[index], status))
        self._open.clear()
        self._text = self._reasoning = None
        self._calls.clear()
        if status != "completed":  # the response ends: MCP items still being worked on end with it
            for index, item in sorted(self._external.items()):
                if item.WhichOneof("item") == "mcp_call":
                    item.mcp_call.status = "incomplete"
                    events.extend(self.settle_mcp_call(index, item))
                else:
                    item.mcp_list_tools.error = "the response ended before the listing did"
                    events.append(self.add_done(index, item))
        return events

    # -- MCP calls (run by the MCP loop between backend calls) ----------------------------------

    def waiting_mcp_calls(self) -> list[tuple[int, items_pb2.Item]]:
        """The `mcp_call` items closed and not yet finished, in output order (the loop runs them
        and finishes each with `settle_mcp_call`; any left when the response ends end with it)."""
        return [(i, item) for i, item in sorted(self._external.items()) if item.WhichOneof("item") == "mcp_call"]

    def open_mcp_item(self, item: items_pb2.Item) -> tuple[int, list[Event]]:
        """Start an item the MCP loop makes itself (an approved call, a tool listing) at the next
        index: its `output_item.added`; `settle_mcp_call` / `add_done` finish it."""
        index = self._next_index
        self._next_index += 1
        added = Event()
        added.output_item_added.output_index = index
        added.output_item_added.item.CopyFrom(item)
        self._external[index] = item
        return index, [added]

    def settle_mcp_call(self, index: int, item: items_pb2.Item) -> list[Event]:
        """Finish an `mcp_call` the loop has run (`status` completed or failed, `output` or
        `error` set): `response.mcp_call.completed|failed`, then `output_item.done`."""
        call = item.mcp_call
        progress = Event()
        arm = progress.mcp_call_completed if call.status == "completed" else progress.mcp_call_failed
        arm.item_id, arm.output_index = call.id, index
        return [progress, self.add_done(index, item)]

    def reserve(self) -> int:
        """The next output index, for an item another builder streams (an agent of a multi-agent
        response, `tether.core.multi_agent`); `add_done` records it when it is finished."""
        index = self._next_index
        self._next_index += 1
        return index

    def add_done(self, index: int, item: items_pb2.Item) -> Event:
        """Record a finished item at `index` (opened with `open_mcp_item`); its `output_item.done`."""
        self._external.pop(index, None)
        done = Event()
        done.output_item_done.output_index = index
        done.output_item_done.item.CopyFrom(item)
        self._record(item, index)
        return done

    # -- item lifecycles ------------------------------------------------------------------------

    def _add(self, kind: str, item_id: str, item: items_pb2.Item) -> tuple[_OpenItem, Event]:
        open_item = _OpenItem(self._next_index, kind, item_id)
        self._open[open_item.index] = open_item
        self._next_index += 1
        ev = Event()
        ev.output_item_added.output_index = open_item.index
        ev.output_item_added.item.CopyFrom(item)
        return open_item, ev

    def _text_delta(
        self, text: str, events: list[Emitted], *, refusal: bool = False, logprobs: list[dict] | None = None
    ) -> None:
        """Output text, or a refusal: each in an assistant message of its own kind (a switch
        between the two closes the open message and starts another)."""
        kind = "refusal" if refusal else "message"
        if self._reasoning is not None:
            events.extend(self._close_one(self._reasoning))
        if self._text is not None and self._text.kind != kind:
            events.extend(self._close_one(self._text))
        if self._text is None:
            item_id = ids.message_id()
            item = items_pb2.Item()
            item.message.id = item_id
            item.message.role = "assistant"
            item.message.status = "in_progress"
            self._text, added = self._add(kind, item_id, item)
            part = Event()
            part.content_part_added.item_id = item_id
            part.content_part_added.output_index = self._text.index
            part.content_part_added.content_index = 0
            (part.content_part_added.part.refusal if refusal else part.content_part_added.part.output_text).SetInParent()
            events += [added, part]
        self._text.pieces.append(text)
        delta = _delta(events, "refusal_delta" if refusal else "output_text_delta", self._text, text)
        if logprobs:
            _add_logprobs(self._text, delta, logprobs)

    def _reasoning_delta(self, text: str, events: list[Emitted]) -> None:
        if self._reasoning is None:
            item_id = ids.reasoning_id()
            item = items_pb2.Item()
            item.reasoning.id = item_id
            item.reasoning.status = "in_progress"
            self._reasoning, added = self._add("reasoning", item_id, item)
            events.append(added)
            if self.reasoning_summary:
                part = Event()
                p = part.reasoning_summary_part_added
                p.item_id, p.output_index, p.summary_index = item_id, self._reasoning.index, 0
                events.append(part)
        self._reasoning.pieces.append(text)
        arm = "reasoning_summary_text_delta" if self.reasoning_summary else "reasoning_text_delta"
        _delta(events, arm, self._reasoning, text)

    def _tool_delta(self, chunk: ToolCallDelta, events: list[Emitted]) -> None:
        call = self._calls.get(chunk.index)
        if call is None and self.max_tool_calls is not None and self._calls_started >= self.max_tool_calls:
            self.capped = True
            return
        if call is None:
            self._calls_started += 1
            for other in (self._reasoning, self._text):
                if other is not None:
                    events.extend(self._close_one(other))
            route = None if chunk.custom else self.mcp_routes.get(chunk.name or "")
            if route is not None:
                self._mcp_open(chunk, route, events)
                return
            item_id = ids.custom_tool_call_id() if chunk.custom else ids.function_call_id()
            call_id, name = chunk.call_id or ids.call_id(), chunk.name or ""
            if chunk.custom:
                item = custom_call_item(item_id, call_id, name, "", "in_progress")
            else:
                item = items_pb2.Item()
                fc = item.function_call
                fc.id, fc.call_id, fc.name, fc.status = item_id, call_id, name, "in_progress"
            call, added = self._add("custom_tool_call" if chunk.custom else "function_call", item_id, item)
            call.call_id, call.name = call_id, name
            self._calls[chunk.index] = call
            events.append(added)
        elif chunk.name and not call.name:
            call.name = chunk.name
        if chunk.arguments:
            call.pieces.append(chunk.arguments)
            kind = call.kind
            if kind == "function_call":
                arm = "function_call_arguments_delta"
            elif kind == "mcp_approval_request":
                return  # sent whole when it closes
            else:
                arm = _ARGUMENT_DELTAS[kind]
            _delta(events, arm, call, chunk.arguments)

    def _mcp_open(self, chunk: ToolCallDelta, route: McpRoute, events: list[Emitted]) -> None:
        """The model called an MCP tool: an `mcp_call` item (streamed), or an approval request."""
        name = chunk.name or ""
        if route.needs_approval:
            call = _OpenItem(self._next_index, "mcp_approval_request", ids.new_id("mcpr"), name=name,
                             server_label=route.server_label)  # fmt: skip
            self._open[call.index] = call
            self._next_index += 1
        else:
            item = items_pb2.Item()
            mc = item.mcp_call
            mc.id, mc.server_label, mc.name, mc.status = ids.new_id("mcp"), route.server_label, name, "in_progress"
            call, added = self._add("mcp_call", mc.id, item)
            call.name, call.server_label = name, route.server_label
            events.append(added)
        self._calls[chunk.index] = call
        if chunk.arguments:
            self._tool_delta(ToolCallDelta(index=chunk.index, arguments=chunk.arguments), events)

    def _close_one(self, open_item: _OpenItem) -> list[Event]:
        self._open.pop(open_item.index, None)
        if open_item is self._text:
            self._text = None
        if open_item is self._reasoning:
            self._reasoning = None
        return self._close(open_item, "completed")

    def _close(self, o: _OpenItem, status: str) -> list[Event]:
        text = "".join(o.pieces)
        item = items_pb2.Item()
        events: list[Event] = []
        if o.kind in ("message", "refusal"):
            msg = item.message
            msg.id, msg.role, msg.status = o.item_id, "assistant", status
            done, part = Event(), Event()
            d = done.refusal_done if o.kind == "refusal" else done.output_text_done
            d.item_id, d.output_index, d.content_index, d.text = o.item_id, o.index, 0, text
            p = part.content_part_done
            p.item_id, p.output_index, p.content_index = o.item_id, o.index, 0
            if o.kind == "refusal":
                msg.content.add().refusal.refusal = text
                p.part.refusal.refusal = text
            else:
                out = msg.content.add().output_text
                out.text = text
                if o.logprobs:
                    out.logprobs_json = d.logprobs_json = orjson.dumps(o.logprobs).decode()
                p.part.output_text.CopyFrom(out)
            events += [done, part]
        elif o.kind == "reasoning" and self.reasoning_summary:
            r = item.reasoning
            r.id, r.status = o.item_id, status
            r.summary.append(text)
            done, part = Event(), Event()
            sd = done.reasoning_summary_text_done
            sd.item_id, sd.output_index, sd.summary_index, sd.text = o.item_id, o.index, 0, text
            sp = part.reasoning_summary_part_done
            sp.item_id, sp.output_index, sp.summary_index, sp.text = o.item_id, o.index, 0, text
            events += [done, part]
        elif o.kind == "reasoning":
            r = item.reasoning
            r.id, r.status = o.item_id, status
            r.content.append(text)
            done = Event()
            d = done.reasoning_text_done
            d.item_id, d.output_index, d.content_index, d.text = o.item_id, o.index, 0, text
            events.append(done)
        elif o.kind == "mcp_call":
            mc = item.mcp_call
            mc.id, mc.server_label, mc.name, mc.arguments, mc.status = o.item_id, o.server_label, o.name, text, "calling"
            done = Event()
            md = done.mcp_call_arguments_done
            md.item_id, md.output_index, md.arguments = o.item_id, o.index, text
            self._external[o.index] = item  # `output_item.done` once it has run
            return [done]
        elif o.kind == "mcp_approval_request":
            ar = item.mcp_approval_request
            ar.id, ar.server_label, ar.name, ar.arguments = o.item_id, o.server_label, o.name, text
            if self.approval_id is not None:  # sent whole now: its id may sign what it asks
                ar.id = self.approval_id(ar)
            self.approvals_requested += 1
            added = Event()
            added.output_item_added.output_index = o.index
            added.output_item_added.item.CopyFrom(item)
            events.append(added)
        elif o.kind == "custom_tool_call":
            item = custom_call_item(o.item_id, o.call_id, o.name, text, status)
            done = Event()
            cd = done.custom_tool_call_input_done
            cd.item_id, cd.output_index, cd.input = o.item_id, o.index, text
            events.append(done)
        else:
            fc = item.function_call
            fc.id, fc.call_id, fc.name, fc.arguments, fc.status = o.item_id, o.call_id, o.name, text, status
            done = Event()
            fd = done.function_call_arguments_done
            fd.item_id, fd.output_index, fd.name, fd.arguments = o.item_id, o.index, o.name, text
            events.append(done)
        if o.kind == "reasoning" and self.seal_reasoning is not None:
            self.seal_reasoning(item)
        item_done = Event()
        item_done.output_item_done.output_index = o.index
        item_done.output_item_done.item.CopyFrom(item)
        events.append(item_done)
        self._record(item, o.index)
        return events

    def _record(self, item: items_pb2.Item, index: int) -> None:
        self._done.append((index, item))

    def add_finished_item(self, item: items_pb2.Item, index: int | None = None) -> tuple[int, list[Event]]:
        """Append an item produced whole (a compaction item): added + done at the next index, or
        at `index` taken earlier with `reserve`."""
        if index is None:
            index = self.reserve()
        added = Event()
        added.output_item_added.output_index = index
        added.output_item_added.item.CopyFrom(item)
        done = Event()
        done.output_item_done.output_index = index
        done.output_item_done.item.CopyFrom(item)
        self._record(item, index)
        return index, [added, done]


_ARGUMENT_DELTAS = {"custom_tool_call": "custom_tool_call_input_delta", "mcp_call": "mcp_call_arguments_delta"}


def _delta(events: list[Emitted], arm: str, item: _OpenItem, text: str) -> Delta:
    """Append `text` to the events as a delta of `item`: merged into the last event when that is
    already a delta of the same item (consecutive chunks of one wake-up make one event)."""
    if events:
        last = events[-1]
        if type(last) is Delta and last.item_id == item.item_id:
            last.append(text)
            return last
    delta = Delta(arm, item.item_id, item.index, text)
    events.append(delta)
    return delta


def _add_logprobs(item: _OpenItem, delta: Delta, logprobs: list[dict]) -> None:
    """Record a chunk's log probabilities on its message (for the done events) and its delta."""
    if item.logprobs is None:
        item.logprobs = []
    item.logprobs.extend(logprobs)
    delta.add_logprobs(logprobs)
