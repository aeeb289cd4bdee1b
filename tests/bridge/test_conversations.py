"""Conversations: `/v1/conversations` with the openai SDK, tenant isolation, `conversation` on a
create over HTTP, WebSocket and gRPC, and the OpenAI Agents SDK's `conversation_id` sessions
running a two-turn tool loop over HTTP and WebSocket."""

from __future__ import annotations

import grpc
import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from agents.responses_websocket_session import responses_websocket_session

from tether.protocol import json_codec
from tether.responses.v1 import service_pb2, service_pb2_grpc

from ..support.grpc_client import RawSession
from .conftest import Stack
from .helpers import KEY_A, KEY_B, recv_response, send_json


async def test_crud_with_the_sdk(stack: Stack) -> None:
    async with stack.client() as client:
        conv = await client.conversations.create(
            items=[{"type": "message", "role": "user", "content": "hello"}], metadata={"topic": "demo"}
        )
        assert conv.id.startswith("conv_") and conv.metadata == {"topic": "demo"}
        assert (await client.conversations.retrieve(conv.id)).id == conv.id
        updated = await client.conversations.update(conv.id, metadata={"topic": "other"})
        assert updated.metadata == {"topic": "other"}

        added = await client.conversations.items.create(
            conv.id,
            items=[
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
                {"type": "message", "role": "user", "content": "again"},
            ],
        )
        assert len(added.data) == 2 and all(i.id for i in added.data)
        page = await client.conversations.items.list(conv.id, order="asc", limit=2)
        assert [i.role for i in page.data] == ["user", "assistant"] and page.has_more
        everything = [i async for i in client.conversations.items.list(conv.id, order="asc", limit=1)]
        assert len(everything) == 3
        first = everything[0]
        got = await client.conversations.items.retrieve(first.id, conversation_id=conv.id)
        assert got.id == first.id
        after_delete = await client.conversations.items.delete(first.id, conversation_id=conv.id)
        assert after_delete.id == conv.id
        with pytest.raises(openai.NotFoundError):
            await client.conversations.items.retrieve(first.id, conversation_id=conv.id)
        deleted = await client.conversations.delete(conv.id)
        assert deleted.deleted and deleted.id == conv.id
        with pytest.raises(openai.NotFoundError) as info:
            await client.conversations.retrieve(conv.id)
        assert info.value.body["code"] == "conversation_not_found"


async def test_bad_bodies_are_400(stack: Stack) -> None:
    async with stack.client() as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.conversations.create(extra_body={"colour": "blue"})
        assert info.value.body["code"] == "unknown_parameter" and info.value.body["param"] == "colour"
        with pytest.raises(openai.BadRequestError) as info:
            await client.conversations.create(items=[{"type": "message", "role": "user", "content": "x"}] * 21)
        assert info.value.body["code"] == "too_many_items"
        with pytest.raises(openai.BadRequestError) as info:
            await client.conversations.create(metadata={f"k{i}": "v" for i in range(17)})
        assert info.value.body["param"] == "metadata"


async def test_tenants_do_not_see_each_other(stack: Stack) -> None:
    async with stack.client(KEY_A) as a, stack.client(KEY_B) as b:
        conv = await a.conversations.create()
        for call in (
            lambda: b.conversations.retrieve(conv.id),
            lambda: b.conversations.update(conv.id, metadata={}),
            lambda: b.conversations.delete(conv.id),
            lambda: b.conversations.items.list(conv.id),
            lambda: b.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}]),
            lambda: b.responses.create(model="sim-model", input="x", conversation=conv.id),
        ):
            with pytest.raises(openai.NotFoundError):
                await call()
        assert (await a.conversations.retrieve(conv.id)).id == conv.id


async def test_http_create_continues_and_fills_the_conversation(stack: Stack) -> None:
    async with stack.client() as client:
        conv = await client.conversations.create()
        first = await client.responses.create(model="sim-model", input="one", conversation=conv.id)
        assert first.conversation is not None and first.conversation.id == conv.id
        second = await client.responses.create(model="sim-model", input="two", conversation={"id": conv.id})
        items = [i async for i in client.conversations.items.list(conv.id, order="asc")]
        assert [i.type for i in items] == ["message"] * 4
        assert items[1].id == first.output[0].id and items[3].id == second.output[0].id
        # The second turn saw the first: its stored input is the whole conversation.
        inputs = await client.responses.input_items.list(second.id, order="asc")
        assert [i.id for i in inputs.data] == [i.id for i in items[:3]]
        assert second.usage.input_tokens > first.usage.input_tokens

        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(
                model="sim-model", input="x", conversation=conv.id, previous_response_id=first.id
            )
        assert info.value.body["param"] == "conversation"
        with pytest.raises(openai.NotFoundError) as info:
            await client.responses.create(model="sim-model", input="x", conversation="conv_missing")
        assert (info.value.body["code"], info.value.body["param"]) == ("conversation_not_found", "conversation")


async def test_websocket_and_grpc_create_with_conversation(stack: Stack, grpc_port: int) -> None:
    async with stack.client() as client:
        conv = await client.conversations.create()
    async with stack.ws() as conn:
        await send_json(conn, {"type": "response.create", "model": "sim-model", "input": "ws", "conversation": conv.id})
        done = (await recv_response(conn))[-1]
        assert done["type"] == "response.completed" and done["response"]["conversation"] == {"id": conv.id}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        session = RawSession(channel, KEY_A)
        await session.send(
            json_codec.client_event_from_json(
                {"type": "response.create", "model": "sim-model", "input": "grpc", "conversation": conv.id}
            )
        )
        ev = await session.until_terminal()
        assert ev.WhichOneof("event") == "completed", ev
        assert ev.completed.response.usage.input_tokens > 0
        session.call.cancel()
        # The conversation RPCs are on the gRPC service too.
        stub = service_pb2_grpc.ResponsesServiceStub(channel)
        page = await stub.ListConversationItems(
            service_pb2.ListConversationItemsRequest(conversation_id=conv.id, order="asc"),
            metadata=(("authorization", f"Bearer {KEY_A}"),),
        )
        texts = [i.message.content_text or i.message.content[0].input_text.text for i in page.data[::2]]
        assert texts == ["ws", "grpc"]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetConversation(
                service_pb2.GetConversationRequest(conversation_id=conv.id),
                metadata=(("authorization", f"Bearer {KEY_B}"),),
            )
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_store_false_with_a_conversation_keeps_nothing(stack: Stack) -> None:
    """`store: false` keeps nothing: the conversation is the turn's context (the model sees it) but
    gains no items, and the response itself is not stored. Before, every store appended the turn."""
    async with stack.client() as client:
        conv = await client.conversations.create(items=[{"type": "message", "role": "user", "content": "earlier"}])
        first = await client.responses.create(model="sim-model", input="private", conversation=conv.id, store=False)
        assert first.store is False and first.status == "completed"
        items = [i async for i in client.conversations.items.list(conv.id, order="asc")]
        assert [(i.role, i.content[0].text) for i in items] == [("user", "earlier")]
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(first.id)
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-model", input="x", previous_response_id=first.id)
        assert info.value.body["code"] == "previous_response_not_found"
        kept = await client.responses.create(model="sim-model", input="kept", conversation=conv.id)
        items = [i async for i in client.conversations.items.list(conv.id, order="asc")]
        assert [i.role for i in items] == ["user", "user", "assistant"] and items[2].id == kept.output[0].id


async def test_a_warm_up_adds_nothing_so_the_real_turn_sends_its_input_once(stack: Stack) -> None:
    """`generate: false` with `conversation`, then the real turn with the same input: the input is
    in the conversation (and in what the model saw) once, not twice."""
    async with stack.client() as client:
        conv = await client.conversations.create(items=[{"type": "message", "role": "user", "content": "earlier"}])
    async with stack.ws() as conn:
        create = {"type": "response.create", "model": "sim-model", "input": "question", "conversation": conv.id}
        await send_json(conn, {**create, "generate": False})
        warm = (await recv_response(conn))[-1]
        assert warm["type"] == "response.completed" and warm["response"]["output"] == []
        await send_json(conn, create)
        real = (await recv_response(conn))[-1]
        assert real["type"] == "response.completed", real
    async with stack.client() as client:
        items = [i async for i in client.conversations.items.list(conv.id, order="asc")]
        texts = [c.text for i in items for c in i.content if i.role == "user"]
        assert texts == ["earlier", "question"]
        assert [i.role for i in items] == ["user", "user", "assistant"]
        inputs = await client.responses.input_items.list(real["response"]["id"], order="asc")
        assert [i.content[0].text for i in inputs.data] == ["earlier", "question"]


# -- the OpenAI Agents SDK ---------------------------------------------------------------------

calls: list[str] = []
set_tracing_disabled(True)  # the SDK would export traces to OpenAI when OPENAI_API_KEY is set: no network


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return f"sunny in {city}"


def _agent(model: object) -> Agent:
    return Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        model=model,  # type: ignore[arg-type]
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="auto"),
    )


async def _two_turns(run, conversation_id: str) -> None:
    """Run 1 is a tool loop (call, tool output, answer: two model calls on the conversation); run
    2 continues the same conversation (the simulated model answers directly once a tool output is
    in its context)."""
    calls.clear()
    for question in ("weather in Paris?", "and in Rome?"):
        result = await run(question, conversation_id)
        assert isinstance(result.final_output, str) and result.final_output
    assert calls == ["Paris"]


def _check_conversation(items: list) -> None:
    types = [i.type for i in items]
    assert types == ["message", "function_call", "function_call_output", "message", "message", "message"]
    assert [items[0].role, items[3].role, items[4].role, items[5].role] == ["user", "assistant", "user", "assistant"]
    assert items[2].call_id == items[1].call_id


async def test_agents_sdk_conversation_over_http(stack: Stack) -> None:
    async with stack.client() as client:
        conv = await client.conversations.create()
        agent = _agent(OpenAIResponsesModel(model="sim-model", openai_client=client))
        await _two_turns(lambda q, cid: Runner.run(agent, q, conversation_id=cid), conv.id)
        _check_conversation([i async for i in client.conversations.items.list(conv.id, order="asc")])


async def test_agents_sdk_conversation_over_websocket(stack: Stack) -> None:
    async with stack.client() as client:
        conv = await client.conversations.create()
    async with responses_websocket_session(
        api_key=KEY_A, base_url=stack.base_url, websocket_base_url=f"ws://127.0.0.1:{stack.port}/v1"
    ) as ws:
        agent = _agent("sim-model")
        websockets = stack.engine.telemetry.connections_total.labels("websocket")
        before = websockets._value.get()
        await _two_turns(lambda q, cid: ws.run(agent, q, conversation_id=cid), conv.id)
        assert websockets._value.get() == before + 1  # all four model calls on one WebSocket
    async with stack.client() as client:
        _check_conversation([i async for i in client.conversations.items.list(conv.id, order="asc")])
