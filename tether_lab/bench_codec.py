"""Micro-benchmark: the hand-written codec against `json_format.MessageToDict`, per event.

Run `python -m tether_lab.bench_codec`. Both paths end in `orjson.dumps`, so the ratio is
the cost of building the dict. (MessageToDict does not even produce the OpenAI shape: it would
need a per-event rewrite on top, so the real gap is larger.)
"""

from __future__ import annotations

import timeit

import orjson
from google.protobuf import json_format

from tether.protocol.json_codec import event_to_json
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, response_pb2


def _delta_event() -> events_pb2.ServerEvent:
    return events_pb2.ServerEvent(
        sequence_number=42,
        response_id="resp_1",
        output_text_delta=events_pb2.TextDeltaEvent(
            item_id="msg_0123456789abcdef", output_index=0, content_index=0, delta="Hello, world"
        ),
    )


def _completed_event() -> events_pb2.ServerEvent:
    r = response_pb2.Response(
        id="resp_0123456789abcdef",
        created_at=1741290958,
        completed_at=1741290960,
        status="completed",
        model="gpt-test",
        parallel_tool_calls=True,
        store=True,
        temperature=1.0,
        top_p=1.0,
    )
    r.tools.add().function.CopyFrom(
        request_pb2.FunctionTool(name="exec_command", parameters_json='{"type":"object","properties":{}}')
    )
    r.output.add().reasoning.CopyFrom(items_pb2.ReasoningItem(id="rs_1", summary=["Thinking about it."]))
    part = items_pb2.ContentPart(output_text=items_pb2.OutputText(text="A paragraph of answer text. " * 20))
    r.output.add().message.CopyFrom(
        items_pb2.Message(id="msg_1", role="assistant", status="completed", content=[part])
    )
    r.usage.CopyFrom(
        response_pb2.Usage(input_tokens=1200, cached_tokens=1024, output_tokens=87, total_tokens=1287)
    )
    return events_pb2.ServerEvent(sequence_number=99, completed=events_pb2.ResponseEvent(response=r))


def _per_call_us(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    print(f"{'event':<28}{'codec µs':>10}{'MessageToDict µs':>18}{'ratio':>8}")
    for name, ev, number in (
        ("response.output_text.delta", _delta_event(), 50_000),
        ("response.completed", _completed_event(), 5_000),
    ):
        ours = _per_call_us(lambda ev=ev: orjson.dumps(event_to_json(ev, ws=True)), number)
        theirs = _per_call_us(
            lambda ev=ev: orjson.dumps(json_format.MessageToDict(ev, preserving_proto_field_name=True)),
            number,
        )
        print(f"{name:<28}{ours:>10.2f}{theirs:>18.2f}{theirs / ours:>7.1f}x")


if __name__ == "__main__":
    main()
