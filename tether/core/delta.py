"""What a response's run carries and a connection sends: protobuf `ServerEvent`s, and text deltas
as `Delta` records (`Outgoing`, tagged by type: `type(ev) is Delta`).

A streamed token is merged into the delta before it (appending to a list) and encoded once per
write from the merged text, so a delta costs no protobuf message per token on any transport; a
transport that sends protobuf builds one message per delta it writes (`Delta.to_event`). Its own
module because both the run (`tether.core.run`, which numbers, merges and logs them) and the
outbox (`tether.core.outbox`, which queues them for a connection) hold them.
"""

from __future__ import annotations

from typing import final

import orjson

from tether.responses.v1 import events_pb2


@final  # so `type(ev) is Delta` tells the two kinds of `Outgoing` apart, both ways
class Delta:
    """One streamed text delta (any arm in `DELTA_ARMS`) as plain fields: the pieces merged into
    it are joined once, when it is encoded. It has the attributes the arm's protobuf message and
    JSON object have (`item_id`, `output_index`, `content_index`, `summary_index`, `delta`), so
    the JSON codec encodes it with the arm's own field table."""

    __slots__ = ("stream_id", "response_id", "arm", "item_id", "output_index", "content_index",
                 "summary_index", "pieces", "size", "sequence_number", "logprobs", "agent")  # fmt: skip

    def __init__(self, arm: str, item_id: str, output_index: int, text: str, content_index: int = 0,
                 summary_index: int = 0) -> None:  # fmt: skip
        self.stream_id = ""
        self.response_id = ""
        self.arm = arm
        self.item_id = item_id
        self.output_index = output_index
        self.content_index = content_index
        self.summary_index = summary_index
        self.pieces = [text]
        self.size = len(text)
        self.sequence_number = 0
        # output_text only, when asked for: the pieces' token log probabilities, in order (merged
        # deltas concatenate their lists); None when the response carries none.
        self.logprobs: list | None = None
        self.agent = ""  # a multi-agent response's agent that generated it ("" for none)

    @classmethod
    def from_event(cls, event: events_pb2.ServerEvent, arm: str) -> Delta:
        p = getattr(event, arm)
        d = cls(arm, p.item_id, p.output_index, p.delta, getattr(p, "content_index", 0), getattr(p, "summary_index", 0))
        d.stream_id, d.response_id = event.stream_id, event.response_id
        if event.HasField("agent"):
            d.agent = event.agent.agent_name
        if getattr(p, "logprobs_json", ""):
            d.logprobs = orjson.loads(p.logprobs_json)
        return d

    @property
    def logprobs_json(self) -> str:
        """The log probabilities as JSON array text ("" for none), as the event messages hold them."""
        return orjson.dumps(self.logprobs).decode() if self.logprobs else ""

    def merge(self, other: Delta) -> None:
        """Take `other`'s text (and log probabilities) after this one's."""
        self.pieces.extend(other.pieces)
        self.size += other.size
        if other.logprobs:
            self.add_logprobs(other.logprobs)

    def add_logprobs(self, logprobs: list) -> None:
        """Append the log probabilities of text that joined this delta."""
        if self.logprobs is None:
            self.logprobs = []
        self.logprobs.extend(logprobs)

    @property
    def delta(self) -> str:
        pieces = self.pieces
        if len(pieces) > 1:
            pieces[:] = ["".join(pieces)]
        return pieces[0]

    def append(self, text: str) -> None:
        self.pieces.append(text)
        self.size += len(text)

    def continues(self, other: Delta) -> bool:
        """Whether `other` is more text for the same content (so it may be merged into this one)."""
        return (
            other.item_id == self.item_id
            and other.arm == self.arm
            and other.response_id == self.response_id
            and other.content_index == self.content_index
            and other.summary_index == self.summary_index
        )

    def to_event(self) -> events_pb2.ServerEvent:
        ev = events_pb2.ServerEvent(
            stream_id=self.stream_id, response_id=self.response_id, sequence_number=self.sequence_number
        )
        if self.agent:
            ev.agent.agent_name = self.agent
        arm = self.arm
        p = getattr(ev, arm)
        p.item_id, p.output_index, p.delta = self.item_id, self.output_index, self.delta
        if self.logprobs:
            p.logprobs_json = self.logprobs_json
        if arm == "reasoning_summary_text_delta":
            p.summary_index = self.summary_index
        elif arm not in ("function_call_arguments_delta", "custom_tool_call_input_delta", "mcp_call_arguments_delta"):
            p.content_index = self.content_index
        return ev


# What a run logs and an outbox hands out: protobuf events, and text deltas as `Delta` records
# (an outbox turns them into events unless its reader asked for them: `get_batch(lazy_deltas=True)`).
# Tagged by type: `type(ev) is Delta` (a final class).
Outgoing = events_pb2.ServerEvent | Delta
