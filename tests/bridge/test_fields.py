"""The create-field rule (tether/core/stages/fields.py): every field of the openai SDK's
`ResponseCreateParams` has a declared treatment, the docs table is that table, and what Tether
cannot honour is a 400 naming the parameter on HTTP, WebSocket and gRPC alike."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from openai.types.responses import response_create_params
from openai.types.responses.response_includable import ResponseIncludable

from tether.core.stages.fields import CREATE_FIELDS, INCLUDES, Treatment, json_keys_of_proto, markdown_table
from tether.protocol import json_codec

from ..support.grpc_client import RawSession
from .conftest import Stack
from .helpers import KEY_A, recv_response, send_json

DOCS = Path(__file__).resolve().parents[2] / "docs" / "fields.md"


def _sdk_create_keys() -> set[str]:
    keys: set[str] = set()
    for cls in (response_create_params.ResponseCreateParamsNonStreaming, response_create_params.ResponseCreateParamsStreaming):
        keys |= set(typing.get_type_hints(cls))
    return keys


def test_every_sdk_create_field_has_a_treatment() -> None:
    sdk = _sdk_create_keys()
    assert len(sdk) > 30  # the walk found the SDK's fields, not an empty class
    assert sorted(sdk - CREATE_FIELDS.keys()) == []


def test_every_modelled_field_has_a_treatment() -> None:
    assert sorted(json_keys_of_proto() - CREATE_FIELDS.keys()) == []


def test_every_sdk_include_value_has_a_treatment() -> None:
    values = set(typing.get_args(ResponseIncludable))
    assert values and sorted(values - INCLUDES.keys()) == []


def test_docs_table_is_the_table() -> None:
    assert markdown_table() in DOCS.read_text(), "regenerate with `python -m tether.core.stages.fields`"


REJECTED = [k for k, f in CREATE_FIELDS.items() if f.treatment is Treatment.REJECTED]
# (body extra, code, param)
REFUSALS: list[tuple[dict[str, Any], str, str]] = [
    *(({key: {"x": 1} if key != "top_logprobs" else 3}, "unsupported_parameter", key) for key in REJECTED),
    ({"tool_choice": {"type": "custom", "name": "apply_patch"}}, "invalid_request", "tool_choice"),
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "peg", "definition": "x"}}]},
     "invalid_request", "tools[0].format"),
    ({"frobnicate": True}, "unknown_parameter", "frobnicate"),
    ({"top_logprobs": 21}, "invalid_request", "top_logprobs"),
    ({"prompt": {"id": "pmpt_nope"}}, "invalid_request", "prompt.id"),
    ({"include": ["reasoning.encrypted_content", "no.such.value"]}, "invalid_request", "include[1]"),
]
IDS = [f"{param}-{code}" for _, code, param in REFUSALS]


@pytest.mark.parametrize(("extra", "code", "param"), REFUSALS, ids=IDS)
async def test_http_refuses(stack: Stack, extra: dict[str, Any], code: str, param: str) -> None:
    async with stack.client() as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", input="hi", extra_body=extra)
    body = info.value.body
    assert isinstance(body, dict)
    assert (body["code"], body["param"], body["type"]) == (code, param, "invalid_request_error")
    assert param.split("[")[0] in body["message"]


@pytest.mark.parametrize(("extra", "code", "param"), REFUSALS[-4:], ids=IDS[-4:])
async def test_websocket_refuses_and_the_connection_goes_on(
    stack: Stack, extra: dict[str, Any], code: str, param: str
) -> None:
    async with stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "hi", **extra})
        (err,) = await recv_response(conn)
        assert (err["type"], err["error"]["code"], err["error"]["param"]) == ("error", code, param)
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "hi"})
        assert (await recv_response(conn))[-1]["type"] == "response.completed"


async def test_grpc_refuses(stack: Stack, grpc_port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        session = RawSession(channel, KEY_A)
        req = json_codec.client_event_from_json(
            {"type": "response.create", "model": "sim-model", "input": "hi", "prompt": {"id": "pmpt_1"}}
        )
        await session.send(req)
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "error"
        assert (ev.error.error.code, ev.error.error.param) == ("invalid_request", "prompt.id")
        session.call.cancel()


@pytest.mark.parametrize("extra_json", ['{"prompt": ', "[1, 2]"])
async def test_grpc_extra_json_that_is_not_an_object_is_a_400(stack: Stack, grpc_port: int, extra_json: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        session = RawSession(channel, KEY_A)
        req = json_codec.client_event_from_json({"type": "response.create", "model": "sim-model", "input": "hi"})
        req.create.extra_json = extra_json
        await session.send(req)
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "error"
        assert (ev.error.error.code, ev.error.error.param) == ("invalid_request", "extra_json")
        session.call.cancel()


async def test_declared_client_fields_still_work(stack: Stack) -> None:
    """Codex's and the SDKs' fields with an ACCEPTED treatment change nothing and pass."""
    extra = {
        "client_metadata": {"x-codex-turn-metadata": "{}"},
        "prompt_cache_retention": "24h",
        "stream_options": {"include_obfuscation": False},
        "top_logprobs": None,  # null is "not sent", even for a rejected field
        "include": ["reasoning.encrypted_content", "web_search_call.results"],
    }
    async with stack.client() as client:
        r = await client.responses.create(model="sim-model", input="hi", extra_body=extra)
    assert r.status == "completed"


async def test_forward_compatible_list_accepts_named_fields_only(stack: Stack) -> None:
    stack.config.server.accept_unknown_parameters = ["new_field"]
    async with stack.client() as client:
        r = await client.responses.create(model="sim-model", input="hi", extra_body={"new_field": 1})
        assert r.status == "completed"
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model="sim-model", input="hi", extra_body={"other_field": 1})
