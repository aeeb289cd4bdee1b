"""The agent loop on the client: the model calls tools, the client runs them and sends their
outputs as the next turn (chained with `previous_response_id`), until the model answers without
a tool call. A call is a function call (`tools[name](**arguments)`, answered with a
`function_call_output`) or a custom (freeform) tool call (`tools[name](input)`, answered with a
`custom_tool_call_output`): `tether.protocol.calls` says which is which, as it does for the server.

It needs only a way to create a response (`Creator`: the client session, or a lane of it) and
the retry policy; a turn whose connection was lost mid-generation (`ConnectionLost`) is redone.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

import orjson

from tether import errors
from tether.client._connection import ConnectionLost, RetryPolicy
from tether.client._params import InputLike, ToolLike, to_tools, tool_call_output, tool_calls
from tether.client._streams import ResponseStream
from tether.errors import CATALOGUE, MAX_TURNS_EXCEEDED, TetherError
from tether.protocol.calls import CUSTOM_OUTPUT, Call
from tether.responses.v1 import events_pb2, request_pb2, response_pb2


class ToolLoopError(TetherError):
    """`run_tool_loop` stopped: the model still wanted tools after `max_turns` turns
    (`max_turns_exceeded`), or a turn failed (the response's own error code). `response` is the
    last Response."""

    def __init__(self, code: str, message: str, response: response_pb2.Response) -> None:
        # A failed response's code is the server's: one this client's catalogue does not know
        # (a newer server) keeps a plain 500.
        super().__init__(code, message, status=None if code in CATALOGUE else 500)
        self.response = response


class Creator(Protocol):
    """What the loop creates its turns with."""

    retry: RetryPolicy
    closed: bool

    def create(self, model: str, input: InputLike = None, **kwargs: Any) -> Awaitable[ResponseStream]: ...


async def run_tool_loop(
    creator: Creator,
    model: str,
    input: InputLike,
    *,
    tools: Mapping[str, Callable[..., Any]],
    tool_specs: Iterable[ToolLike] | None,
    max_turns: int,
    previous_response_id: str | None,
    on_event: Callable[[events_pb2.ServerEvent], Any] | None,
    raise_tool_errors: bool,
    run_sync_tools_in_thread: bool,
    create_fields: dict[str, Any],
) -> response_pb2.Response:
    """`ClientSession.run_tool_loop` (its docstring says what each argument does)."""
    specs = to_tools(tool_specs if tool_specs is not None else tools)
    next_input: InputLike = input
    previous = previous_response_id
    response: response_pb2.Response | None = None
    for _turn in range(max_turns):
        response = await _turn_with_retries(creator, model, next_input, previous, specs, on_event, create_fields)
        if response.status == "failed":
            raise ToolLoopError(
                response.error.code or errors.SERVER_ERROR,
                response.error.message or "The response failed.",
                response,
            )
        calls = tool_calls(response)
        if not calls:
            return response
        outputs = await asyncio.gather(
            *(run_tool(tools, call, raise_tool_errors, run_sync_tools_in_thread) for call in calls)
        )
        next_input = [tool_call_output(call, out) for call, out in zip(calls, outputs, strict=True)]
        previous = response.id
    assert response is not None
    raise ToolLoopError(MAX_TURNS_EXCEEDED, f"The model still called tools after {max_turns} turns.", response)


async def _turn_with_retries(
    creator: Creator,
    model: str,
    input: InputLike,
    previous: str | None,
    specs: list[request_pb2.Tool],
    on_event: Callable[[events_pb2.ServerEvent], Any] | None,
    create_fields: dict[str, Any],
) -> response_pb2.Response:
    attempt = 0
    while True:
        attempt += 1
        stream = await creator.create(model, input, previous_response_id=previous, tools=specs, **create_fields)
        try:
            if on_event is None:
                return await stream.final_response()
            async for ev in stream:
                result = on_event(ev)
                if inspect.isawaitable(result):
                    await result
            return await stream.final_response()
        except ConnectionLost:
            if attempt >= creator.retry.max_attempts or creator.closed:
                raise
            await asyncio.sleep(creator.retry.delay(attempt))


async def run_tool(
    tools: Mapping[str, Callable[..., Any]],
    call: Call,
    raise_errors: bool,
    in_thread: bool,
) -> str:
    """One tool call's output text: `tools[call.name](**arguments)` for a function call (JSON
    arguments that are not an object are passed as one value), `tools[call.name](input)` for a
    custom tool call; sync (in a worker thread unless `in_thread` is False) or async; a failure is
    the text `Error: ...` unless `raise_errors`."""
    fn = tools.get(call.name)
    if fn is None:
        if raise_errors:
            raise KeyError(f"the model called an unknown tool {call.name!r}")
        return f"Error: no tool named {call.name!r}."
    args: Any
    if call.output_type == CUSTOM_OUTPUT:
        args = call.text
    else:
        try:
            args = orjson.loads(call.text) if call.text.strip() else {}
        except orjson.JSONDecodeError:
            args = call.text

    def invoke() -> Any:
        return fn(**args) if isinstance(args, dict) else fn(args)

    try:
        if inspect.iscoroutinefunction(fn) or not in_thread:
            result = invoke()
        else:
            result = await asyncio.to_thread(invoke)
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        if raise_errors:
            raise
        return f"Error: {type(exc).__name__}: {exc}"
    if isinstance(result, str):
        return result
    return orjson.dumps(result, default=str).decode()
