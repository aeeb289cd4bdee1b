"""The JSON codec: round-trip properties, error cases, and parsing by the official SDK types."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai._models import construct_type_unchecked
from openai.types.beta.beta_responses_server_event import BetaResponsesServerEvent
from openai.types.responses import CompactedResponse, Response, ResponseItemList, ResponseStreamEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent, ResponseWsError
from pydantic import TypeAdapter

from tether import errors
from tether.errors import TetherError
from tether.protocol import json_codec as jc
from tether.responses.v1 import events_pb2, items_pb2, request_pb2, response_pb2, service_pb2

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# Strategies: OpenAI-shaped JSON, including nulls, explicit defaults and unknown keys.
# ---------------------------------------------------------------------------------------------

INT64 = st.integers(-(2**63), 2**63 - 1)
UINT31 = st.integers(0, 2**31 - 1)
SEQ = st.integers(0, 2**40)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=10)
NONEMPTY = st.text(min_size=1, max_size=10)
BOOLS = st.booleans()
JSON_SCALARS = st.none() | BOOLS | INT64 | FLOATS | TEXT
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
JSON_OBJECTS = st.dictionaries(TEXT, JSON_VALUES, max_size=3)
# Unknown keys: prefixed so they never collide with a modelled key.
EXTRAS = st.dictionaries(TEXT.map(lambda s: "x_" + s), JSON_VALUES, max_size=2)
STR_MAPS = st.dictionaries(TEXT, TEXT, max_size=3)


def nullable(s: st.SearchStrategy) -> st.SearchStrategy:
    return s | st.none()


OPT_TEXT = nullable(TEXT)  # "" and null both exercise the stash


def obj(required: dict, optional: dict | None = None, *, extras: bool = True) -> st.SearchStrategy[dict]:
    base = st.fixed_dictionaries(required, optional=optional or {})
    if not extras:
        return base
    return st.tuples(base, EXTRAS).map(lambda t: {**t[0], **t[1]})


def typed(
    t: str, required: dict | None = None, optional: dict | None = None, **kw
) -> st.SearchStrategy[dict]:
    return obj({"type": st.just(t), **(required or {})}, optional, **kw)


# content parts
PART = st.one_of(
    typed("input_text", {"text": nullable(TEXT)}),
    typed(
        "output_text",
        {
            "text": TEXT,
            "annotations": st.lists(JSON_OBJECTS, max_size=2),
            "logprobs": st.lists(JSON_OBJECTS, max_size=2),
        },
    ),
    typed("input_image", optional={"image_url": OPT_TEXT, "file_id": OPT_TEXT, "detail": OPT_TEXT}),
    typed("input_file", optional={k: OPT_TEXT for k in ("file_id", "file_data", "filename", "file_url")}),
    typed("refusal", {"refusal": TEXT}),
    obj({"type": st.sampled_from(["input_audio", "reasoning_text", ""]), "data": JSON_VALUES}),
    obj({"text": TEXT}),  # no type at all: kept whole
)
CONTENT = TEXT | st.lists(PART, max_size=3)
SUMMARY_PART = (
    obj({"type": st.just("summary_text"), "text": TEXT}, extras=False)
    | typed("summary_text", {"text": TEXT})
    | obj({"type": st.just("something_else"), "text": TEXT}, extras=False)
)
REASONING_PART = obj({"type": st.just("reasoning_text"), "text": TEXT}, extras=False) | typed(
    "odd", {"text": TEXT}
)

ITEM = st.one_of(
    typed(
        "message",
        {"role": st.sampled_from(["user", "assistant", "developer", "system", ""]), "content": CONTENT},
        {"id": OPT_TEXT, "status": OPT_TEXT, "phase": st.sampled_from(["commentary", "final_answer", ""])},
    ),
    typed(
        "function_call",
        {"call_id": TEXT, "name": TEXT, "arguments": nullable(TEXT)},
        {"id": OPT_TEXT, "status": OPT_TEXT, "namespace": TEXT},
    ),
    typed(
        "function_call_output",
        {"call_id": TEXT},
        {"output": TEXT | st.lists(PART, max_size=2), "id": OPT_TEXT, "status": OPT_TEXT},
    ),
    typed(
        "reasoning",
        {"summary": st.lists(SUMMARY_PART, max_size=2)},
        {
            "id": OPT_TEXT,
            "content": nullable(st.lists(REASONING_PART, max_size=2)),
            "encrypted_content": OPT_TEXT,
            "status": OPT_TEXT,
        },
    ),
    typed("compaction", {"encrypted_content": TEXT}, {"id": OPT_TEXT, "created_by": OPT_TEXT}),
    typed("item_reference", {"id": TEXT}),
    typed(
        "mcp_list_tools",
        {
            "server_label": TEXT,
            "tools": st.lists(
                obj({"name": TEXT, "description": nullable(TEXT), "input_schema": JSON_OBJECTS,
                     "annotations": nullable(JSON_OBJECTS.filter(bool))}),  # fmt: skip
                max_size=2,
            ),
            "error": nullable(TEXT),
        },
        {"id": OPT_TEXT},
    ),
    typed(
        "mcp_call",
        {"server_label": TEXT, "name": TEXT, "arguments": TEXT, "output": nullable(TEXT),
         "approval_request_id": nullable(TEXT), "error": nullable(JSON_OBJECTS.filter(bool))},  # fmt: skip
        {"id": OPT_TEXT, "status": OPT_TEXT},
    ),
    typed("mcp_approval_request", {"server_label": TEXT, "name": TEXT, "arguments": TEXT}, {"id": OPT_TEXT}),
    typed(
        "mcp_approval_response",
        {"approval_request_id": TEXT, "approve": BOOLS, "reason": nullable(TEXT)},
        {"id": OPT_TEXT},
    ),
    obj(
        {"type": st.sampled_from(["web_search_call", "custom_tool_call", "local_shell_call", ""]), "id": TEXT}
    ),
)

FUNCTION_TOOL = typed(
    "function",
    {"name": TEXT},
    {
        "description": OPT_TEXT,
        "parameters": nullable(JSON_OBJECTS),
        "strict": nullable(BOOLS),
        "defer_loading": BOOLS,
    },
)
TOOL = st.one_of(
    FUNCTION_TOOL,
    typed("namespace", {"name": TEXT, "description": TEXT, "tools": st.lists(FUNCTION_TOOL, max_size=2)}),
    typed("web_search", optional={"external_web_access": BOOLS}),
    obj({"type": st.sampled_from(["mcp", "custom", "file_search", ""]), "name": TEXT}),
    typed(
        "mcp",
        {"server_label": TEXT},
        {
            "server_url": OPT_TEXT,
            "server_description": OPT_TEXT,
            "headers": nullable(STR_MAPS),
            "authorization": OPT_TEXT,
            "allowed_tools": nullable(
                st.lists(TEXT, max_size=2)
                | obj({}, {"tool_names": st.lists(TEXT, max_size=2), "read_only": nullable(BOOLS)})
            ),
            "require_approval": nullable(
                st.sampled_from(["always", "never"])
                | obj({}, {k: obj({}, {"tool_names": st.lists(TEXT, max_size=2)}) for k in ("always", "never")})
            ),
        },
    ),
)
TOOL_CHOICE = st.one_of(
    st.sampled_from(["auto", "none", "required"]),
    TEXT,
    st.fixed_dictionaries({"type": st.just("function"), "name": TEXT}),
    typed("function", {"name": TEXT}),  # with extra keys: kept as other_json
    obj(
        {"type": st.sampled_from(["allowed_tools", "web_search", "mcp"])},
        {"mode": TEXT, "tools": st.lists(JSON_OBJECTS)},
    ),
)
TEXT_FORMAT = st.one_of(
    st.just({"type": "text"}),
    st.just({"type": "json_object"}),
    obj(
        {"type": st.just("json_schema"), "name": OPT_TEXT, "schema": JSON_OBJECTS},
        {"strict": nullable(BOOLS), "description": OPT_TEXT},
        extras=False,
    ),
    typed("json_schema", {"name": TEXT}),  # unknown key inside `format`: stashed whole
)
TEXT_CONFIG = obj({}, {"format": TEXT_FORMAT, "verbosity": OPT_TEXT})
REASONING_CONFIG = obj({}, {"effort": OPT_TEXT, "summary": OPT_TEXT, "generate_summary": TEXT})
CONTEXT_MANAGEMENT = st.lists(
    obj({"type": st.just("compaction")}, {"compact_threshold": nullable(INT64)}, extras=False)
    | typed("compaction", {"compact_threshold": INT64}),
    max_size=2,
)

CREATE_BODY = obj(
    {},
    {
        "model": OPT_TEXT,
        "instructions": OPT_TEXT,
        "input": nullable(TEXT | st.lists(ITEM, max_size=4)),
        "tools": nullable(st.lists(TOOL, max_size=3)),
        "tool_choice": nullable(TOOL_CHOICE),
        "parallel_tool_calls": nullable(BOOLS),
        "previous_response_id": OPT_TEXT,
        "store": nullable(BOOLS),
        "generate": nullable(BOOLS),
        "max_output_tokens": nullable(INT64),
        "max_tool_calls": nullable(INT64),
        "temperature": nullable(FLOATS | st.integers(-(2**53), 2**53)),  # ints a double holds exactly
        "top_p": nullable(FLOATS),
        "reasoning": nullable(REASONING_CONFIG),
        "text": nullable(TEXT_CONFIG),
        "metadata": nullable(STR_MAPS),
        "context_management": nullable(CONTEXT_MANAGEMENT),
        "prompt_cache_key": OPT_TEXT,
        "include": nullable(st.lists(TEXT, max_size=2)),
        "user": OPT_TEXT,
        "safety_identifier": OPT_TEXT,
        "stream_id": OPT_TEXT,
        "truncation": OPT_TEXT,
        "service_tier": OPT_TEXT,
        "background": nullable(BOOLS),
        "stream": nullable(BOOLS),
        "client_metadata": STR_MAPS,
        "prompt_cache_options": JSON_OBJECTS,
        "conversation": nullable(TEXT | obj({"id": TEXT})),
    },
)

USAGE = st.fixed_dictionaries(
    {
        "input_tokens": INT64,
        "input_tokens_details": st.fixed_dictionaries({"cached_tokens": INT64, "cache_write_tokens": INT64}),
        "output_tokens": INT64,
        "output_tokens_details": st.fixed_dictionaries({"reasoning_tokens": INT64}),
        "total_tokens": INT64,
    }
)
# Keys every written Response carries with a fixed default (Tether has no value for them).
RESPONSE_DEFAULTS = {
    "top_logprobs": 0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    **dict.fromkeys(
        ("prompt", "prompt_cache_retention", "prompt_cache_options", "prompt_cache_diagnostics",
         "access_programs", "image", "moderation", "input_transformations", "tool_usage")
    ),
}  # fmt: skip


def canonical_response(resp: dict) -> dict:
    """What `response_to_json` writes for `resp`: the defaults added, and echoed function tools
    always with `description` and `strict`."""
    tools = [
        {**t, "description": t.get("description"), "strict": t.get("strict")} if t.get("type") == "function" else t
        for t in resp["tools"]
    ]
    return {**resp, **RESPONSE_DEFAULTS, "tools": tools}


# A failed Response's `error` as written: the API's code for Tether's, kept in `tether_code`.
RESPONSE_ERROR = st.builds(
    lambda code, message: {"code": errors.response_code(code), "tether_code": code, "message": message},
    st.sampled_from(sorted(errors.CATALOGUE)) | NONEMPTY,
    TEXT,
)

# A Response in the canonical form `response_to_json` writes (every key, nulls for unset).
RESPONSE = obj(
    {
        "id": TEXT,
        "object": st.just("response"),
        "created_at": INT64,
        "status": nullable(NONEMPTY),
        "completed_at": nullable(INT64),
        "background": BOOLS,
        "error": nullable(RESPONSE_ERROR),
        "incomplete_details": nullable(st.fixed_dictionaries({"reason": TEXT})),
        "instructions": nullable(TEXT),
        "max_output_tokens": nullable(INT64),
        "max_tool_calls": nullable(INT64),
        "model": TEXT,
        "output": st.lists(ITEM, max_size=3),
        "parallel_tool_calls": BOOLS,
        "previous_response_id": nullable(NONEMPTY),
        "reasoning": obj({"effort": nullable(TEXT), "summary": nullable(TEXT)}),
        "store": BOOLS,
        "temperature": FLOATS,
        "text": obj({"format": TEXT_FORMAT}, {"verbosity": TEXT}),
        "tool_choice": TOOL_CHOICE,
        "tools": st.lists(TOOL, max_size=2),
        "top_p": FLOATS,
        "truncation": NONEMPTY,
        "usage": nullable(USAGE),
        "user": nullable(NONEMPTY),
        "metadata": STR_MAPS,
        "prompt_cache_key": nullable(NONEMPTY),
        "safety_identifier": nullable(NONEMPTY),
        "service_tier": nullable(NONEMPTY),
        "conversation": nullable(st.fixed_dictionaries({"id": TEXT})),
    },
    {
        "backend_timing": st.fixed_dictionaries(
            {k: FLOATS for k in ("queue_time", "prompt_time", "completion_time", "total_time")}
        ),
        "server_timing": st.fixed_dictionaries(
            {"stages_ms": st.dictionaries(TEXT, FLOATS, max_size=3), "overhead_ms": FLOATS}
        ),
    },
).map(canonical_response)


def event(t: str, fields: dict) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries(
        {"type": st.just(t), **fields, "sequence_number": SEQ}, optional={"stream_id": NONEMPTY}
    )


IDX = {"item_id": TEXT, "output_index": UINT31}
TEXT_IDX = {**IDX, "content_index": UINT31}
SUMMARY_IDX = {**IDX, "summary_index": UINT31}
STEER_REF = st.fixed_dictionaries({"id": TEXT, "previous_response_id": TEXT})
EMPTY_LIST = st.just([])
# (arm, JSON strategy): one entry per oneof arm of ServerEvent, so the test can check coverage.
EVENT_STRATEGIES: list[tuple[str, st.SearchStrategy[dict]]] = [
    *(
        (arm, event(f"response.{arm}", {"response": RESPONSE}))
        for arm in ("created", "in_progress", "completed", "failed", "incomplete", "queued")
    ),
    ("output_item_added", event("response.output_item.added", {"output_index": UINT31, "item": ITEM})),
    ("output_item_done", event("response.output_item.done", {"output_index": UINT31, "item": ITEM})),
    ("content_part_added", event("response.content_part.added", {**TEXT_IDX, "part": PART})),
    ("content_part_done", event("response.content_part.done", {**TEXT_IDX, "part": PART})),
    (
        "output_text_delta",
        event("response.output_text.delta", {**TEXT_IDX, "delta": TEXT, "logprobs": EMPTY_LIST}),
    ),
    (
        "output_text_done",
        event("response.output_text.done", {**TEXT_IDX, "text": TEXT, "logprobs": EMPTY_LIST}),
    ),
    ("refusal_delta", event("response.refusal.delta", {**TEXT_IDX, "delta": TEXT})),
    ("refusal_done", event("response.refusal.done", {**TEXT_IDX, "refusal": TEXT})),
    (
        "function_call_arguments_delta",
        event("response.function_call_arguments.delta", {**IDX, "delta": TEXT}),
    ),
    (
        "function_call_arguments_done",
        event("response.function_call_arguments.done", {**IDX, "name": TEXT, "arguments": TEXT}),
    ),
    (
        "custom_tool_call_input_delta",
        event("response.custom_tool_call_input.delta", {**IDX, "delta": TEXT}),
    ),
    ("custom_tool_call_input_done", event("response.custom_tool_call_input.done", {**IDX, "input": TEXT})),
    ("mcp_call_arguments_delta", event("response.mcp_call_arguments.delta", {**IDX, "delta": TEXT})),
    ("mcp_call_arguments_done", event("response.mcp_call_arguments.done", {**IDX, "arguments": TEXT})),
    *(
        (f"mcp_{what}_{stage}", event(f"response.mcp_{what}.{stage}", IDX))
        for what in ("call", "list_tools")
        for stage in ("in_progress", "completed", "failed")
    ),
    ("reasoning_text_delta", event("response.reasoning_text.delta", {**TEXT_IDX, "delta": TEXT})),
    ("reasoning_text_done", event("response.reasoning_text.done", {**TEXT_IDX, "text": TEXT})),
    *(
        (
            f"reasoning_summary_part_{s}",
            event(
                f"response.reasoning_summary_part.{s}",
                {
                    **SUMMARY_IDX,
                    "part": st.fixed_dictionaries({"type": st.just("summary_text"), "text": TEXT}),
                },
            ),
        )
        for s in ("added", "done")
    ),
    (
        "reasoning_summary_text_delta",
        event("response.reasoning_summary_text.delta", {**SUMMARY_IDX, "delta": TEXT}),
    ),
    (
        "reasoning_summary_text_done",
        event("response.reasoning_summary_text.done", {**SUMMARY_IDX, "text": TEXT}),
    ),
    ("compaction_compacting", event("response.compaction.compacting", IDX)),
    (
        "error",
        event(
            "error",
            {
                "status": st.integers(100, 599),
                "error": st.fixed_dictionaries(
                    {
                        "type": NONEMPTY,
                        "code": nullable(NONEMPTY),
                        "message": TEXT,
                        "param": nullable(NONEMPTY),
                    }
                ),
            },
        ),
    ),
    ("steer_accepted", event("response.steer.accepted", {"steer": STEER_REF})),
    (
        "steer_pending",
        event(
            "response.steer.pending",
            {"steer": STEER_REF, "reason": TEXT, "required_input": st.lists(JSON_OBJECTS, max_size=2)},
        ),
    ),
    (
        "steer_failed",
        event(
            "response.steer.failed",
            {
                "error": st.fixed_dictionaries(
                    {"code": TEXT, "message": TEXT, "type": NONEMPTY}, optional={"param": NONEMPTY}
                ),
                "steer": st.fixed_dictionaries(
                    {"input": TEXT | st.lists(ITEM, max_size=2), "previous_response_id": TEXT},
                    optional={"id": NONEMPTY},
                ),
            },
        ),
    ),
    ("inject_created", event("response.inject.created", {"response_id": TEXT})),
    (
        "inject_failed",
        event(
            "response.inject.failed",
            {
                "response_id": TEXT,
                "input": st.lists(ITEM, max_size=2),
                "error": st.fixed_dictionaries({"code": TEXT, "message": TEXT}),
            },
        ),
    ),
    (
        "other",
        st.tuples(
            event(
                "response.web_search_call.searching",
                {"item_id": TEXT, "output_index": UINT31},
            ),
            EXTRAS,
        ).map(lambda t: {**t[0], **t[1]}),
    ),
]
HTTP_ERROR_EVENT = st.fixed_dictionaries(
    {
        "type": st.just("error"),
        "code": nullable(NONEMPTY),
        "message": TEXT,
        "param": nullable(NONEMPTY),
        "sequence_number": SEQ,
    }
)

# ---------------------------------------------------------------------------------------------
# Round-trip properties.
# ---------------------------------------------------------------------------------------------


@PROPS
@given(CREATE_BODY)
def test_create_body_round_trips(body: dict) -> None:
    params = jc.params_from_json(body)
    assert jc.params_to_json(params) == body
    again = jc.params_from_json(jc.params_to_json(params))
    assert again == params
    # ... and survives the wire format of the gRPC core.
    assert request_pb2.ResponseCreateParams.FromString(params.SerializeToString()) == params


@PROPS
@given(CREATE_BODY)
def test_ws_create_event_round_trips(body: dict) -> None:
    req = jc.client_event_from_json({"type": "response.create", **body})
    assert req.WhichOneof("event") == "create"
    assert jc.client_event_to_json(req) == {"type": "response.create", **body}


@PROPS
@given(ITEM)
def test_item_round_trips(item: dict) -> None:
    msg = jc.item_from_json(item)
    assert jc.item_to_json(msg) == item
    assert jc.item_from_json(jc.item_to_json(msg)) == msg


@PROPS
@given(RESPONSE)
def test_response_round_trips(resp: dict) -> None:
    msg = jc.response_from_json(resp)
    assert jc.response_to_json(msg) == resp
    assert jc.loads(jc.dumps(jc.response_to_json(msg))) == resp
    assert jc.response_from_json(jc.response_to_json(msg)) == msg


@PROPS
@given(st.one_of(*(s.map(lambda d, a=arm: (a, d)) for arm, s in EVENT_STRATEGIES)), BOOLS)
def test_event_round_trips(arm_and_event: tuple[str, dict], ws: bool) -> None:
    arm, ev_json = arm_and_event
    if arm == "error":
        ws = True  # the nested envelope is the WS shape; the flat one has its own test
    ev = jc.event_from_json(ev_json)
    assert ev.WhichOneof("event") == arm
    out = jc.event_to_json(ev, ws=ws)
    assert out == ev_json
    assert jc.loads(jc.dumps(out)) == out  # plain JSON all the way down
    assert jc.event_from_json(out) == ev


@PROPS
@given(HTTP_ERROR_EVENT)
def test_http_error_event_round_trips(ev_json: dict) -> None:
    ev = jc.event_from_json(ev_json)
    assert ev.WhichOneof("event") == "error"
    assert jc.event_to_json(ev, ws=False) == ev_json


def test_event_strategies_cover_every_arm() -> None:
    arms = {f.name for f in events_pb2.ServerEvent.DESCRIPTOR.oneofs_by_name["event"].fields}
    assert {arm for arm, _ in EVENT_STRATEGIES} == arms


@PROPS
@given(
    st.fixed_dictionaries(
        {"previous_response_id": TEXT, "input": TEXT | st.lists(ITEM, min_size=1, max_size=3)}
    ),
)
def test_steer_round_trips(body: dict) -> None:
    req = jc.client_event_from_json({"type": "response.steer", **body})
    assert req.WhichOneof("event") == "steer"
    assert jc.client_event_to_json(req) == {"type": "response.steer", **body}


@PROPS
@given(st.lists(ITEM, max_size=3), st.fixed_dictionaries({}, optional={"client_metadata": STR_MAPS}))
def test_append_round_trips(items: list, extra: dict) -> None:
    body = {"type": "response.append", "input": items, **extra}
    req = jc.client_event_from_json(body)
    assert req.WhichOneof("event") == "append"
    assert jc.client_event_to_json(req) == body


@pytest.mark.parametrize(("t", "arm"), [("response.processed", "processed"), ("response.cancel", "cancel")])
def test_response_id_events(t: str, arm: str) -> None:
    req = jc.client_event_from_json({"type": t, "response_id": "resp_1"})
    assert req.WhichOneof("event") == arm
    assert getattr(req, arm).response_id == "resp_1"
    assert jc.client_event_to_json(req) == {"type": t, "response_id": "resp_1"}


# ---------------------------------------------------------------------------------------------
# Specific shapes.
# ---------------------------------------------------------------------------------------------

CODEX_CREATE = {
    "type": "response.create",
    "model": "mock-model",
    "stream": True,
    "input": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "developer",
            "content": [{"type": "input_text", "text": "…"}],
        },
        {"type": "message", "role": "user", "content": "run ls"},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "exec",
            "arguments": "{}",
            "namespace": "ns",
        },
        {"type": "function_call_output", "id": "fco_1", "call_id": "call_1", "output": "ok"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_text", "text": "x"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "phase": "final_answer",
            "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}],
        },
    ],
    "tools": [
        {
            "type": "function",
            "name": "exec_command",
            "strict": False,
            "parameters": {"type": "object", "properties": {}},
        },
        {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "spawn"}]},
        {"type": "web_search", "external_web_access": False},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "3f7c",
    "generate": False,
    "client_metadata": {"x-codex-turn-metadata": "{}", "session_id": "s"},
}


def test_codex_create_body_is_faithful() -> None:
    req = jc.client_event_from_json(CODEX_CREATE)
    p = req.create
    assert p.model == "mock-model" and p.stream and not p.store and p.HasField("generate") and not p.generate
    assert [i.WhichOneof("item") for i in p.input] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
    ]
    assert p.input[1].message.content_text == "run ls"
    assert p.input[3].function_call_output.output_text == "ok"
    assert json.loads(p.input[4].function_call_output.output_json) == [{"type": "input_text", "text": "x"}]
    assert json.loads(p.input[2].extra_json) == {"namespace": "ns"}
    assert p.input[5].message.phase == "final_answer"
    assert [t.WhichOneof("tool") for t in p.tools] == ["function", "other", "other"]
    assert p.tools[1].other.type == "namespace"
    assert json.loads(p.extra_json) == {"client_metadata": CODEX_CREATE["client_metadata"]}
    body = dict(CODEX_CREATE)
    del body["type"]
    assert jc.params_to_json(p) == body
    assert jc.client_event_to_json(req) == CODEX_CREATE


def test_params_type_key() -> None:
    assert jc.params_from_json({"type": "response.create", "model": "m"}) == request_pb2.ResponseCreateParams(
        model="m"
    )
    other = jc.params_from_json({"type": "something", "model": "m"})
    assert json.loads(other.extra_json) == {"type": "something"}


def test_input_string_and_nulls() -> None:
    p = jc.params_from_json({"model": "m", "input": "hi", "previous_response_id": None, "instructions": None})
    assert p.input_text == "hi" and not p.previous_response_id and not p.HasField("instructions")
    assert jc.params_to_json(p) == {
        "model": "m",
        "input": "hi",
        "previous_response_id": None,
        "instructions": None,
    }


def test_normalisations() -> None:
    """The documented non-identities: type-less items gain their type, output_text its arrays."""
    assert jc.item_to_json(jc.item_from_json({"role": "user", "content": "hi"})) == {
        "type": "message",
        "role": "user",
        "content": "hi",
    }
    assert jc.item_to_json(jc.item_from_json({"id": "msg_1"})) == {"type": "item_reference", "id": "msg_1"}
    part = {"type": "output_text", "text": "hi"}
    item = jc.item_from_json({"type": "message", "role": "assistant", "content": [part]})
    assert jc.item_to_json(item)["content"] == [{**part, "annotations": [], "logprobs": []}]


def test_stashed_sub_objects_keep_their_meaning() -> None:
    """Shapes a message without extra_json cannot hold still fill the typed fields."""
    p = jc.params_from_json(
        {
            "text": {
                "format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "future": 1}
            },
            "context_management": [{"type": "compaction", "compact_threshold": None}],
        }
    )
    assert p.text.format.type == "json_schema" and json.loads(p.text.format.schema_json) == {"type": "object"}
    assert p.context_management[0].type == "compaction"
    assert not p.context_management[0].HasField("compact_threshold")
    r = jc.item_from_json({"type": "reasoning", "summary": [{"type": "summary_text", "text": "a", "x": 1}]})
    assert list(r.reasoning.summary) == ["a"]


def test_response_defaults() -> None:
    r = response_pb2.Response(id="resp_1", created_at=5, status="in_progress", model="m")
    j = jc.response_to_json(r)
    assert j["object"] == "response"
    for key in (
        "error",
        "incomplete_details",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "completed_at",
        "previous_response_id",
        "usage",
        "user",
    ):
        assert key in j and j[key] is None, key
    assert j["metadata"] == {} and j["tools"] == [] and j["output"] == []
    assert j["reasoning"] == {"effort": None, "summary": None}
    assert j["text"] == {"format": {"type": "text"}}
    assert j["tool_choice"] == "auto" and j["truncation"] == "disabled"
    assert "backend_timing" not in j and "server_timing" not in j
    r.backend_timing.total_time = 0.5
    r.server_timing.stages_ms["render"] = 1.5
    r.usage.total_tokens = 3
    j = jc.response_to_json(r)
    assert j["backend_timing"]["total_time"] == 0.5
    assert j["server_timing"] == {"stages_ms": {"render": 1.5}, "overhead_ms": 0.0}
    assert j["usage"] == {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 3,
    }


def test_response_extra_json_only_adds_keys() -> None:
    r = response_pb2.Response(
        id="r", model="m", extra_json='{"model": "other", "x_extension": "24h"}'
    )
    j = jc.response_to_json(r)
    assert j["model"] == "m" and j["x_extension"] == "24h"


@pytest.mark.parametrize(
    ("code", "api_code"),
    [
        ("backend_error", "server_error"),
        ("backend_timeout", "server_error"),
        ("server_shutting_down", "server_error"),
        ("websocket_connection_limit_reached", "server_error"),
        ("context_length_exceeded", "invalid_prompt"),
        ("invalid_request", "invalid_prompt"),
        ("rate_limit_exceeded", "rate_limit_exceeded"),
        ("too_many_queued_responses", "rate_limit_exceeded"),
        ("invalid_prompt", "invalid_prompt"),  # already the API's: kept
        ("some_peer_code", "server_error"),  # unknown here
    ],
)
def test_failed_response_error_uses_the_api_code_and_keeps_tethers(code: str, api_code: str) -> None:
    r = _response("failed", [])
    r.error.CopyFrom(response_pb2.ResponseError(code=code, message="m", retry_after_s=1.5))
    j = jc.response_to_json(r)
    assert j["error"] == {"code": api_code, "tether_code": code, "message": "m", "retry_after_s": 1.5}
    assert Response.model_validate(j, strict=True).error.code == api_code  # the SDK's closed list
    ev = events_pb2.ServerEvent(sequence_number=3, failed=events_pb2.ResponseEvent(response=r))
    for ws in (True, False):
        assert jc.event_to_json(ev, ws=ws)["response"]["error"] == j["error"]
    assert jc.response_from_json(j).error == r.error  # the precise code reads back


def test_response_error_reads_tether_code_over_code() -> None:
    def read(error: dict) -> str:
        return jc.response_from_json({"error": error}).error.code

    assert read({"code": "server_error", "tether_code": "backend_error", "message": ""}) == "backend_error"
    assert read({"tether_code": "backend_error", "code": "server_error", "message": ""}) == "backend_error"
    assert read({"code": "server_error", "message": ""}) == "server_error"  # an API-shaped error
    assert read({"code": "invalid_prompt", "tether_code": "", "message": ""}) == "invalid_prompt"
    for error, param in (({"code": 1}, "error.code"), ({"code": "x", "tether_code": []}, "error.tether_code")):
        with pytest.raises(TetherError) as info:
            jc.response_from_json({"error": error})
        assert (info.value.code, info.value.param) == (errors.INVALID_TYPE, param)


def test_event_envelope() -> None:
    ev = events_pb2.ServerEvent(
        sequence_number=7,
        response_id="resp_1",
        output_text_delta=events_pb2.TextDeltaEvent(item_id="msg", delta="x"),
    )
    assert jc.event_to_json(ev, ws=True) == {
        "type": "response.output_text.delta",
        "item_id": "msg",
        "output_index": 0,
        "content_index": 0,
        "delta": "x",
        "logprobs": [],
        "sequence_number": 7,
    }
    ev.stream_id = "lane"
    assert jc.event_to_json(ev, ws=True)["stream_id"] == "lane"
    assert jc.event_type(ev) == "response.output_text.delta"


def test_error_event_shapes() -> None:
    err = errors.TetherError(errors.INVALID_STREAM_ID, "bad lane", param="stream_id").to_proto()
    ev = events_pb2.ServerEvent(sequence_number=0, stream_id="a", error=events_pb2.ErrorEvent(error=err))
    assert jc.event_to_json(ev, ws=True) == {
        "type": "error",
        "status": 400,
        "error": {
            "type": "invalid_request_error",
            "code": "invalid_stream_id",
            "message": "bad lane",
            "param": "stream_id",
        },
        "sequence_number": 0,
        "stream_id": "a",
    }
    ev.ClearField("stream_id")
    assert jc.event_to_json(ev, ws=False) == {
        "type": "error",
        "code": "invalid_stream_id",
        "message": "bad lane",
        "param": "stream_id",
        "sequence_number": 0,
    }
    assert jc.error_to_http_json(err) == {
        "error": {
            "message": "bad lane",
            "type": "invalid_request_error",
            "param": "stream_id",
            "code": "invalid_stream_id",
        }
    }
    assert jc.error_to_http_json(events_pb2.Error(code="x", message="m", status=500))["error"] == {
        "message": "m",
        "type": "server_error",
        "param": None,
        "code": "x",
    }


def test_compact_and_input_items_bodies() -> None:
    item = items_pb2.Item(compaction=items_pb2.CompactionItem(id="cmp_1", encrypted_content="e"))
    compact = service_pb2.CompactResponseResponse(id="resp_c", created_at=9, output=[item])
    compact.usage.input_tokens = 4
    j = jc.compact_response_to_json(compact)
    assert j["object"] == "response.compaction" and j["output"] == [
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "e"}
    ]
    CompactedResponse.model_validate(j)
    assert jc.compact_response_from_json(j) == compact

    empty = jc.input_items_to_json(service_pb2.ListInputItemsResponse())
    assert empty == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    msg = items_pb2.Item(
        message=items_pb2.Message(id="msg_1", role="user", status="completed", content_text="hi")
    )
    page = service_pb2.ListInputItemsResponse(data=[msg], first_id="msg_1", last_id="msg_1", has_more=True)
    j = jc.input_items_to_json(page)
    assert j["data"] == [
        {"type": "message", "id": "msg_1", "role": "user", "status": "completed", "content": "hi"}
    ]
    assert jc.input_items_from_json(j) == page


# ---------------------------------------------------------------------------------------------
# Errors.
# ---------------------------------------------------------------------------------------------


def _raises(code: str, param: str | None, fn, *args, **kwargs):
    with pytest.raises(TetherError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, info.value.message
    assert info.value.param == param, info.value.message
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": 5}, "model"),
        ({"input": 3}, "input"),
        ({"input": {"type": "message"}}, "input"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "function"}, 5]}, "tools[1]"),
        ({"tools": [{"type": "function", "parameters": "{}"}]}, "tools[0].parameters"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"max_output_tokens": 1.5}, "max_output_tokens"),
        ({"max_output_tokens": True}, "max_output_tokens"),
        ({"max_output_tokens": 2**63}, "max_output_tokens"),
        ({"store": "yes"}, "store"),
        ({"metadata": {"a": 1}}, "metadata"),
        ({"metadata": []}, "metadata"),
        ({"include": ["a", 1]}, "include"),
        ({"reasoning": "high"}, "reasoning"),
        ({"reasoning": {"effort": 3}}, "reasoning.effort"),
        ({"text": {"format": {"type": 1}}}, "text.format.type"),
        ({"text": {"format": "json"}}, "text.format"),
        ({"tool_choice": 1}, "tool_choice"),
        (
            {"context_management": [{"type": "compaction", "compact_threshold": "1000"}]},
            "context_management[0].compact_threshold",
        ),
        ({"input": ["hi"]}, "input[0]"),
        (
            {
                "input": [{"type": "message", "role": "user", "content": "a"}] * 3
                + [{"type": "message", "content": 1}]
            },
            "input[3].content",
        ),
        ({"input": [{"type": "message", "content": ["x"]}]}, "input[0].content[0]"),
        (
            {"input": [{"type": "message", "content": [{"type": "input_text", "text": 1}]}]},
            "input[0].content[0].text",
        ),
        ({"input": [{"type": 7}]}, "input[0].type"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": {"a": 1}}]},
            "input[0].output",
        ),
        ({"input": [{"type": "function_call", "arguments": {}}]}, "input[0].arguments"),
        (
            {"input": [{"type": "reasoning", "summary": [{"type": "summary_text"}]}]},
            "input[0].summary[0].text",
        ),
        ({"input": [{"type": "reasoning", "summary": "x"}]}, "input[0].summary"),
    ],
)
def test_invalid_types(body: dict, param: str) -> None:
    err = _raises(errors.INVALID_TYPE, param, jc.params_from_json, body)
    assert f"'{param}'" in err.message and "expected" in err.message


def test_body_must_be_an_object() -> None:
    _raises(errors.INVALID_TYPE, None, jc.params_from_json, [1])
    _raises(errors.INVALID_TYPE, None, jc.client_event_from_json, "response.create")


def test_item_path_parameter() -> None:
    _raises(
        errors.INVALID_TYPE, "input[7].role", jc.item_from_json, {"type": "message", "role": 1}, "input[7]"
    )


@pytest.mark.parametrize("event", [{}, {"type": 5}, {"type": None}, {"model": "m"}])
def test_client_event_without_type(event: dict) -> None:
    _raises(errors.INVALID_REQUEST, "type", jc.client_event_from_json, event)


def test_client_event_unknown_type() -> None:
    err = _raises(errors.UNKNOWN_EVENT_TYPE, "type", jc.client_event_from_json, {"type": "response.interrupt"})
    assert err.message == "Unknown event type 'response.interrupt'"


def test_client_event_field_types() -> None:
    _raises(errors.INVALID_TYPE, "input", jc.client_event_from_json, {"type": "response.steer", "input": 1})
    _raises(
        errors.INVALID_TYPE,
        "response_id",
        jc.client_event_from_json,
        {"type": "response.cancel", "response_id": 1},
    )
    _raises(
        errors.INVALID_TYPE, "input", jc.client_event_from_json, {"type": "response.append", "input": "x"}
    )
    _raises(errors.INVALID_TYPE, "model", jc.client_event_from_json, {"type": "response.create", "model": []})


# ---------------------------------------------------------------------------------------------
# JSON text: parse errors and the depth limit.
# ---------------------------------------------------------------------------------------------


def test_loads_and_dumps() -> None:
    assert jc.loads(b'{"a": [1, "x"]}') == {"a": [1, "x"]}
    assert jc.loads('{"a": "é"}') == {"a": "é"}
    assert jc.dumps({"a": 1}) == b'{"a":1}'
    for bad in (b"{", b"", b'{"a": NaN}', b"\xff"):
        _raises(errors.INVALID_JSON, None, jc.loads, bad)


def _nest(depth: int) -> str:
    return "[" * (depth - 1) + "{}" + "]" * (depth - 1)


def test_depth_limit() -> None:
    assert jc.loads(_nest(64)) is not None
    _raises(errors.INVALID_JSON, None, jc.loads, _nest(65))
    _raises(errors.INVALID_JSON, None, jc.loads, _nest(1000).encode())
    assert jc.loads(_nest(65), max_depth=65) is not None
    _raises(errors.INVALID_JSON, None, jc.loads, _nest(5), max_depth=4)
    # Brackets inside strings do not count, escaped quotes do not end a string.
    deep_text = '{"a": "' + "[{" * 500 + '\\"[[[' + '"}'
    assert jc.loads(deep_text)["a"].startswith("[{")
    # ... and cannot hide real nesting either.
    hidden = '["' + "]" * 100 + '", ' + _nest(70) + "]"
    _raises(errors.INVALID_JSON, None, jc.loads, hidden)
    # Many siblings are wide, not deep.
    assert len(jc.loads("[" + ",".join(["[[]]"] * 5000) + "]")) == 5000


def _depth(v: object) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


BRACKETY_TEXT = st.text(alphabet='[]{}"\\ax', max_size=8)
NESTED = st.recursive(
    st.none() | INT64 | BRACKETY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(BRACKETY_TEXT, inner, max_size=3),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(NESTED, st.integers(1, 8), BOOLS)
def test_depth_check_matches_a_recursive_walk(value: object, limit: int, as_str: bool) -> None:
    text = json.dumps(value)
    data = text if as_str else text.encode()
    if _depth(value) > limit:
        _raises(errors.INVALID_JSON, None, jc.loads, data, max_depth=limit)
    else:
        assert jc.loads(data, max_depth=limit) == value


# ---------------------------------------------------------------------------------------------
# The official SDK parses what we emit.
# ---------------------------------------------------------------------------------------------

HTTP_EVENTS = TypeAdapter(ResponseStreamEvent)
WS_EVENTS = TypeAdapter(ResponsesServerEvent)
BETA_WS_EVENTS = TypeAdapter(BetaResponsesServerEvent)
STEER_EVENTS = {"steer_accepted", "steer_pending", "steer_failed"}
INJECT_EVENTS = {"inject_created", "inject_failed"}  # beta, WebSocket only


def _ws_adapter(arm: str) -> TypeAdapter:
    return BETA_WS_EVENTS if arm in INJECT_EVENTS else WS_EVENTS


def _response(status: str, output: list[items_pb2.Item], **kw) -> response_pb2.Response:
    r = response_pb2.Response(
        id="resp_1",
        created_at=1741290958,
        status=status,
        model="gpt-test",
        parallel_tool_calls=True,
        store=True,
        temperature=1.0,
        top_p=1.0,
        output=output,
        **kw,
    )
    r.tools.add().function.CopyFrom(
        request_pb2.FunctionTool(name="exec_command", parameters_json='{"type":"object"}', strict=False)
    )
    return r


def _with_usage(r: response_pb2.Response) -> response_pb2.Response:
    r.usage.CopyFrom(
        response_pb2.Usage(
            input_tokens=36, cached_tokens=0, output_tokens=87, reasoning_tokens=0, total_tokens=123
        )
    )
    r.completed_at = r.created_at + 2
    return r


def _message(text: str, status: str) -> items_pb2.Item:
    part = items_pb2.ContentPart(output_text=items_pb2.OutputText(text=text))
    return items_pb2.Item(
        message=items_pb2.Message(id="msg_1", role="assistant", status=status, content=[part] if text else [])
    )


def _function_call(arguments: str, status: str) -> items_pb2.Item:
    return items_pb2.Item(
        function_call=items_pb2.FunctionCall(
            id="fc_1", call_id="call_1", name="exec_command", arguments=arguments, status=status
        )
    )


def _reasoning(status: str) -> items_pb2.Item:
    return items_pb2.Item(
        reasoning=items_pb2.ReasoningItem(id="rs_1", summary=["thought"], content=["raw"], status=status)
    )


def _mcp_items() -> dict[str, items_pb2.Item]:
    """One of each MCP item, as Tether produces them (a failed call carries an error object)."""
    IP = items_pb2
    listed = IP.McpListTools(id="mcpl_1", server_label="dice", tools=[
        IP.McpToolInfo(name="roll", description="Roll dice", input_schema_json='{"type":"object"}',
                      annotations_json='{"readOnlyHint":true}'),
        IP.McpToolInfo(name="bare", input_schema_json="{}")])  # fmt: skip
    return {
        "mcp_list_tools": IP.Item(mcp_list_tools=listed),
        "mcp_list_tools_failed": IP.Item(mcp_list_tools=IP.McpListTools(id="mcpl_2", server_label="x", error="down")),
        "mcp_call": IP.Item(mcp_call=IP.McpCall(id="mcp_1", server_label="dice", name="roll", arguments='{"n":2}',
                                              output="7", status="completed", approval_request_id="mcpr_1")),
        "mcp_call_failed": IP.Item(mcp_call=IP.McpCall(
            id="mcp_2", server_label="dice", name="roll", arguments="{}", status="failed",
            error_json='{"type":"mcp_protocol_error","code":-32001,"message":"timed out"}')),
        "mcp_approval_request": IP.Item(mcp_approval_request=IP.McpApprovalRequest(
            id="mcpr_1", server_label="dice", name="roll", arguments="{}")),
        "mcp_approval_response": IP.Item(mcp_approval_response=IP.McpApprovalResponse(
            id="mcpa_1", approval_request_id="mcpr_1", approve=False, reason="no")),
    }  # fmt: skip


def _mcp_events(E) -> list[tuple[str, object]]:  # noqa: N803
    items = _mcp_items()
    arms: list[tuple[str, object]] = [("output_item_added", E.OutputItemEvent(output_index=4, item=items["mcp_list_tools"]))]
    arms += [(f"mcp_list_tools_{s}", E.McpItemEvent(item_id="mcpl_1", output_index=4))
             for s in ("in_progress", "completed", "failed")]  # fmt: skip
    arms += [
        ("output_item_done", E.OutputItemEvent(output_index=4, item=items["mcp_list_tools"])),
        ("output_item_added", E.OutputItemEvent(output_index=5, item=items["mcp_call"])),
        ("mcp_call_arguments_delta", E.FunctionCallArgumentsDeltaEvent(item_id="mcp_1", output_index=5, delta="{")),
        ("mcp_call_arguments_done", E.McpCallArgumentsDoneEvent(item_id="mcp_1", output_index=5, arguments="{}")),
    ]
    arms += [(f"mcp_call_{s}", E.McpItemEvent(item_id="mcp_1", output_index=5))
             for s in ("in_progress", "completed", "failed")]  # fmt: skip
    arms += [("output_item_done", E.OutputItemEvent(output_index=i, item=items[k]))
             for i, k in enumerate(("mcp_call", "mcp_call_failed", "mcp_list_tools_failed", "mcp_approval_request"), 5)]  # fmt: skip
    return arms


def test_sdk_parses_every_mcp_item_strictly() -> None:
    """Each MCP item Tether writes is the openai SDK's own type, strictly validated; the approval
    response parses as an input item too."""
    from openai.types.responses import ResponseInputItem, ResponseOutputItem
    from pydantic import TypeAdapter

    out, inp = TypeAdapter(ResponseOutputItem), TypeAdapter(ResponseInputItem)
    for name, item in _mcp_items().items():
        d = jc.item_to_json(item)
        parsed = out.validate_python(d, strict=True)
        assert parsed.type == d["type"] and type(parsed).__name__.startswith("Mcp"), name
        assert jc.item_to_json(jc.item_from_json(d)) == d
    failed = out.validate_python(jc.item_to_json(_mcp_items()["mcp_call_failed"]), strict=True)
    assert failed.error.type == "mcp_protocol_error" and failed.output is None
    answer = inp.validate_python(jc.item_to_json(_mcp_items()["mcp_approval_response"]), strict=True)
    assert answer.approve is False and answer.approval_request_id == "mcpr_1"


def test_sdk_mcp_tool_and_choice_round_trip() -> None:
    """The SDK's `Mcp` tool (every field Tether models) and `ToolChoiceMcp` survive the create
    codec unchanged."""
    from openai.types.responses import Tool
    from pydantic import TypeAdapter

    tools = [
        {"type": "mcp", "server_label": "dice", "server_url": "http://127.0.0.1:1/mcp", "server_description": "d",
         "headers": {"X-Key": "k"}, "authorization": "tok", "allowed_tools": ["roll"],
         "require_approval": {"never": {"tool_names": ["roll"]}, "always": {"read_only": False}}},
        {"type": "mcp", "server_label": "b", "server_url": "http://h/mcp",
         "allowed_tools": {"tool_names": ["a"], "read_only": True}, "require_approval": "always"},
    ]  # fmt: skip
    for t in tools:
        TypeAdapter(Tool).validate_python(t, strict=True)
    body = {"model": "m", "tools": tools, "tool_choice": {"type": "mcp", "server_label": "dice", "name": "roll"}}
    assert jc.params_to_json(jc.params_from_json(body)) == body
    assert jc.params_from_json(body).tools[0].WhichOneof("tool") == "mcp"


def _sdk_stream() -> list[events_pb2.ServerEvent]:
    """Realistic events of every modelled arm, in a plausible order."""
    E = events_pb2
    text_part = items_pb2.ContentPart(output_text=items_pb2.OutputText(text="Hello"))
    refusal_part = items_pb2.ContentPart(refusal=items_pb2.Refusal(refusal="no"))
    completed = _with_usage(_response("completed", [_reasoning("completed"), _message("Hello", "completed")]))
    failed = _response("failed", [])
    failed.error.CopyFrom(response_pb2.ResponseError(code="server_error", message="upstream died"))
    incomplete = _response("incomplete", [])
    incomplete.incomplete_details.reason = "max_output_tokens"
    steer = E.SteerRef(id="steer_1", previous_response_id="resp_1")
    arms = [
        ("queued", E.ResponseEvent(response=_response("queued", []))),
        ("created", E.ResponseEvent(response=_response("in_progress", []))),
        ("in_progress", E.ResponseEvent(response=_response("in_progress", []))),
        ("output_item_added", E.OutputItemEvent(output_index=0, item=_reasoning("in_progress"))),
        ("reasoning_summary_part_added", E.ReasoningSummaryPartEvent(item_id="rs_1", summary_index=0)),
        ("reasoning_summary_text_delta", E.ReasoningSummaryTextDeltaEvent(item_id="rs_1", delta="thou")),
        ("reasoning_summary_text_done", E.ReasoningSummaryTextDoneEvent(item_id="rs_1", text="thought")),
        ("reasoning_summary_part_done", E.ReasoningSummaryPartEvent(item_id="rs_1", text="thought")),
        ("reasoning_text_delta", E.TextDeltaEvent(item_id="rs_1", delta="ra")),
        ("reasoning_text_done", E.TextDoneEvent(item_id="rs_1", text="raw")),
        ("output_item_done", E.OutputItemEvent(output_index=0, item=_reasoning("completed"))),
        ("output_item_added", E.OutputItemEvent(output_index=1, item=_message("", "in_progress"))),
        (
            "content_part_added",
            E.ContentPartEvent(
                item_id="msg_1",
                output_index=1,
                part=items_pb2.ContentPart(output_text=items_pb2.OutputText()),
            ),
        ),
        ("output_text_delta", E.TextDeltaEvent(item_id="msg_1", output_index=1, delta="Hello")),
        ("output_text_done", E.TextDoneEvent(item_id="msg_1", output_index=1, text="Hello")),
        ("content_part_done", E.ContentPartEvent(item_id="msg_1", output_index=1, part=text_part)),
        (
            "content_part_added",
            E.ContentPartEvent(item_id="msg_1", output_index=1, content_index=1, part=refusal_part),
        ),
        ("refusal_delta", E.TextDeltaEvent(item_id="msg_1", output_index=1, content_index=1, delta="no")),
        ("refusal_done", E.TextDoneEvent(item_id="msg_1", output_index=1, content_index=1, text="no")),
        ("output_item_done", E.OutputItemEvent(output_index=1, item=_message("Hello", "completed"))),
        ("output_item_added", E.OutputItemEvent(output_index=2, item=_function_call("", "in_progress"))),
        (
            "function_call_arguments_delta",
            E.FunctionCallArgumentsDeltaEvent(item_id="fc_1", output_index=2, delta="{"),
        ),
        (
            "function_call_arguments_done",
            E.FunctionCallArgumentsDoneEvent(
                item_id="fc_1", output_index=2, name="exec_command", arguments="{}"
            ),
        ),
        ("output_item_done", E.OutputItemEvent(output_index=2, item=_function_call("{}", "completed"))),
        (
            "custom_tool_call_input_delta",
            E.CustomToolCallInputDeltaEvent(item_id="ctc_1", output_index=2, delta="*** Begin"),
        ),
        (
            "custom_tool_call_input_done",
            E.CustomToolCallInputDoneEvent(item_id="ctc_1", output_index=2, input="*** Begin Patch"),
        ),
        *_mcp_events(E),
        ("compaction_compacting", E.CompactionCompactingEvent(item_id="cmp_1", output_index=3)),
        (
            "output_item_done",
            E.OutputItemEvent(
                output_index=3,
                item=items_pb2.Item(compaction=items_pb2.CompactionItem(id="cmp_1", encrypted_content="enc")),
            ),
        ),
        ("completed", E.ResponseEvent(response=completed)),
        ("failed", E.ResponseEvent(response=failed)),
        ("incomplete", E.ResponseEvent(response=incomplete)),
        ("steer_accepted", E.SteerAcceptedEvent(steer=steer)),
        (
            "steer_pending",
            E.SteerPendingEvent(
                steer=steer,
                reason="waiting_for_required_input",
                required_input_json='[{"type":"function_call_output","call_id":"call_1","name":"exec_command"}]',
            ),
        ),
        (
            "steer_failed",
            E.SteerFailedEvent(
                steer=steer,
                input_text="go left",
                error=E.Error(
                    code="response_already_completed", message="done", type="invalid_request_error"
                ),
            ),
        ),
        ("inject_created", E.InjectCreatedEvent(response_id="resp_1")),
        (
            "inject_failed",
            E.InjectFailedEvent(
                response_id="resp_1",
                error=E.Error(code="response_already_completed", message="done"),
                input=[jc.item_from_json({"type": "function_call_output", "call_id": "call_1", "output": "42"})],
            ),
        ),
        (
            "error",
            E.ErrorEvent(error=TetherError(errors.INVALID_STREAM_ID, "bad", param="stream_id").to_proto()),
        ),
    ]
    out = []
    for seq, (arm, payload) in enumerate(arms):
        ev = E.ServerEvent(sequence_number=seq, response_id="resp_1")
        getattr(ev, arm).CopyFrom(payload)
        out.append(ev)
    return out


def test_sdk_stream_covers_every_modelled_arm() -> None:
    arms = {ev.WhichOneof("event") for ev in _sdk_stream()}
    assert arms == set(jc._EVENT_ARMS)


@pytest.mark.parametrize("stream_id", ["", "agent_1"])
def test_sdk_parses_every_ws_event(stream_id: str) -> None:
    for ev in _sdk_stream():
        ev.stream_id = stream_id
        d = jc.event_to_json(ev, ws=True)
        if ev.WhichOneof("event") == "error":
            parsed = ResponseWsError.model_validate(d)
            assert parsed.status == 400 and parsed.error.code == "invalid_stream_id"
        parsed = _ws_adapter(ev.WhichOneof("event")).validate_python(d)
        assert parsed.type == d["type"]
        assert getattr(parsed, "stream_id", None) == (stream_id or None)


def test_sdk_runtime_parser_picks_the_right_event_class() -> None:
    """Clients parse frames leniently (`construct_type_unchecked`), keyed by `type`: check it lands
    on the same class as strict validation for every event we emit."""
    for ev in _sdk_stream():
        d = jc.event_to_json(ev, ws=True)
        beta = ev.WhichOneof("event") in INJECT_EVENTS
        loose = construct_type_unchecked(value=d, type_=BetaResponsesServerEvent if beta else ResponsesServerEvent)
        assert type(loose) is type(_ws_adapter(ev.WhichOneof("event")).validate_python(d)), d["type"]


def test_sdk_parses_every_http_event() -> None:
    for ev in _sdk_stream():
        if ev.WhichOneof("event") in INJECT_EVENTS:
            continue  # WebSocket only
        d = jc.event_to_json(ev, ws=False)
        adapter = WS_EVENTS if ev.WhichOneof("event") in STEER_EVENTS else HTTP_EVENTS
        parsed = adapter.validate_python(d)
        assert parsed.type == d["type"]
        if d["type"] == "error":
            assert parsed.code == "invalid_stream_id" and parsed.param == "stream_id"


def test_sdk_parses_text_and_function_call_responses() -> None:
    text = Response.model_validate(
        jc.response_to_json(_with_usage(_response("completed", [_message("Hi", "completed")])))
    )
    assert text.output_text == "Hi" and text.usage.total_tokens == 123
    assert text.text.format.type == "text" and text.tool_choice == "auto"
    fc = Response.model_validate(
        jc.response_to_json(
            _with_usage(_response("completed", [_function_call('{"cmd":"ls"}', "completed")]))
        )
    )
    assert fc.output[0].type == "function_call" and fc.output[0].arguments == '{"cmd":"ls"}'
    assert fc.tools[0].type == "function" and fc.tools[0].parameters == {"type": "object"}
    in_progress = Response.model_validate(jc.response_to_json(_response("in_progress", [])))
    assert in_progress.usage is None and in_progress.error is None


def test_sdk_parses_items_page() -> None:
    page = service_pb2.ListInputItemsResponse(
        data=[
            jc.item_from_json(
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "user",
                    "status": "completed",
                    "content": [{"type": "input_text", "text": "hi"}],
                }
            )
        ],
        first_id="msg_1",
        last_id="msg_1",
    )
    ResponseItemList.model_validate(jc.input_items_to_json(page))


MULTI_AGENT_ITEMS = [
    {"type": "multi_agent_call", "id": "mac_1", "action": "spawn_agent", "call_id": "call_1",
     "arguments": '{"task_name":"w","message":"go"}', "agent": {"agent_name": "/root"}},
    {"type": "multi_agent_call_output", "id": "maco_1", "action": "spawn_agent", "call_id": "call_1",
     "output": [{"type": "output_text", "text": '{"task_name":"/root/w"}', "annotations": [], "logprobs": []}],
     "agent": {"agent_name": "/root"}},
    {"type": "agent_message", "id": "amsg_1", "author": "/root", "recipient": "/root/w",
     "content": [{"type": "input_text", "text": "hi"}], "agent": {"agent_name": "/root"}},
    {"type": "function_call_output", "call_id": "call_2", "output": "sunny", "agent": {"agent_name": "/root/w"},
     "client_key": 1},
]  # fmt: skip


@pytest.mark.parametrize("item", MULTI_AGENT_ITEMS, ids=lambda i: i["type"])
def test_multi_agent_items_round_trip_with_their_agent(item: dict) -> None:
    """The multi-agent beta's items, and `agent` on any item: typed fields, unknown keys kept."""
    decoded = jc.item_from_json(item)
    assert decoded.agent.agent_name == item["agent"]["agent_name"]
    assert jc.item_to_json(decoded) == item


def test_multi_agent_create_field_and_event_agent() -> None:
    body = {"model": "m", "multi_agent": {"enabled": True, "max_concurrent_subagents": 2}}
    params = jc.params_from_json(body)
    assert params.multi_agent.enabled and params.multi_agent.max_concurrent_subagents == 2
    assert jc.params_to_json(params) == body
    ev = events_pb2.ServerEvent(sequence_number=3, output_text_delta=events_pb2.TextDeltaEvent(item_id="msg", delta="x"))
    ev.agent.agent_name = "/root/worker_1"
    obj = jc.event_to_json(ev, ws=True)
    assert obj["agent"] == {"agent_name": "/root/worker_1"}
    assert jc.event_from_json(obj) == ev
    assert TypeAdapter(BetaResponsesServerEvent).validate_python(obj).agent.agent_name == "/root/worker_1"  # type: ignore[union-attr]  # the SDK reads it
