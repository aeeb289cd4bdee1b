"""Property tests from the proto side: protocol messages built as the core builds them survive
Tether's JSON codec (`tether.protocol.json_codec`: proto -> JSON text -> proto) unchanged,
including the typed escape hatches that carry unknown tool types, item types and fields.
(tests/protocol/test_json_codec.py goes the other way, from JSON bodies.)"""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.protocol import json_codec
from tether.responses.v1 import events_pb2, items_pb2, request_pb2

text = st.text(max_size=40)
# Unknown fields (`extra_json`): non-empty, with names no typed field has (an empty object is
# stored as "", which is what the codec normalises it to).
extra_obj = st.dictionaries(st.text(min_size=1, max_size=8).map(lambda k: f"x_{k}"), st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=40), st.booleans()), min_size=1, max_size=4).map(
    lambda d: orjson.dumps(dict(sorted(d.items()))).decode()
)
json_obj = st.dictionaries(st.text(min_size=1, max_size=8), st.one_of(st.integers(-(2**53), 2**53), text, st.booleans()), max_size=4).map(
    lambda d: orjson.dumps(d).decode()
)


@st.composite
def items(draw) -> items_pb2.Item:
    item = items_pb2.Item(extra_json=draw(st.one_of(st.just(""), extra_obj)))
    kind = draw(st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "compaction", "other"]))
    if kind == "message":
        item.message.role = draw(st.sampled_from(["user", "assistant", "developer", "system"]))
        item.message.id = draw(text)
        if draw(st.booleans()):
            item.message.content_text = draw(text)
        else:
            for part_text in draw(st.lists(text, max_size=3)):
                item.message.content.add().input_text.text = part_text
    elif kind == "function_call":
        item.function_call.call_id, item.function_call.name = draw(text), draw(text)
        item.function_call.arguments = draw(json_obj)
    elif kind == "function_call_output":
        item.function_call_output.call_id = draw(text)
        item.function_call_output.output_text = draw(text)
    elif kind == "reasoning":
        item.reasoning.summary.extend(draw(st.lists(text, max_size=2)))
    elif kind == "compaction":
        item.compaction.encrypted_content = draw(text)
    else:
        item.other.type = draw(st.sampled_from(["web_search_call", "custom_tool_call", "x_future"]))
        item.other.json = orjson.dumps({"type": item.other.type, **orjson.loads(draw(extra_obj))}).decode()
        item.ClearField("extra_json")  # an unknown item type is kept whole in `other.json`
    return item


@st.composite
def params(draw) -> request_pb2.ResponseCreateParams:
    p = request_pb2.ResponseCreateParams(
        model=draw(text), previous_response_id=draw(text), stream_id=draw(text), extra_json=draw(extra_obj)
    )
    p.input.extend(draw(st.lists(items(), max_size=5)))
    for name in draw(st.lists(text, max_size=3)):
        tool = p.tools.add()
        if draw(st.booleans()):
            tool.function.name, tool.function.parameters_json = name, draw(json_obj)
        else:
            tool.other.type = draw(st.sampled_from(["namespace", "web_search"]))
            tool.other.json = orjson.dumps({"type": tool.other.type, **orjson.loads(draw(extra_obj))}).decode()
    for flag in ("store", "generate", "background", "stream", "parallel_tool_calls"):
        if draw(st.booleans()):
            setattr(p, flag, draw(st.booleans()))
    if draw(st.booleans()):
        p.max_output_tokens = draw(st.integers(1, 10**6))
    if draw(st.booleans()):
        p.temperature = draw(st.floats(0, 2))
    p.metadata.update(draw(st.dictionaries(text, text, max_size=3)))
    return p


def _through_json(obj: dict) -> dict:
    return json_codec.loads(json_codec.dumps(obj))


@settings(max_examples=200, deadline=None)
@given(params())
def test_create_params_round_trip(p):
    back = json_codec.params_from_json(_through_json(json_codec.params_to_json(p)))
    assert back == p
    assert back.HasField("store") == p.HasField("store")  # presence survives too


@settings(max_examples=200, deadline=None)
@given(st.lists(items(), min_size=1, max_size=4), st.booleans())
def test_output_item_events_round_trip(item_list, ws):
    for index, item in enumerate(item_list):
        ev = events_pb2.ServerEvent(sequence_number=index, response_id="resp_x")
        ev.output_item_done.output_index = index
        ev.output_item_done.item.CopyFrom(item)
        back = json_codec.event_from_json(_through_json(json_codec.event_to_json(ev, ws=ws)))
        assert back.output_item_done.item == item
        assert back.sequence_number == index
