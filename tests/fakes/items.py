"""Small builders for protobuf items/tools/requests, shared by the suites' tests."""

from __future__ import annotations

from typing import Any

import orjson

from tether.backends.base import BackendRequest
from tether.compaction_codec import encode_summary
from tether.responses.v1 import items_pb2, request_pb2


def user(text: str) -> items_pb2.Item:
    return items_pb2.Item(message=items_pb2.Message(role="user", content_text=text))


def user_parts(*texts: str, image_url: str | None = None) -> items_pb2.Item:
    parts = [items_pb2.ContentPart(input_text=items_pb2.InputText(text=t)) for t in texts]
    if image_url is not None:
        parts.append(
            items_pb2.ContentPart(input_image=items_pb2.InputImage(image_url=image_url, detail="auto"))
        )
    return items_pb2.Item(message=items_pb2.Message(role="user", content=parts))


def message(role: str, text: str) -> items_pb2.Item:
    return items_pb2.Item(message=items_pb2.Message(role=role, content_text=text))


def assistant(text: str) -> items_pb2.Item:
    part = items_pb2.ContentPart(output_text=items_pb2.OutputText(text=text))
    return items_pb2.Item(message=items_pb2.Message(role="assistant", status="completed", content=[part]))


def function_call(call_id: str, name: str, arguments: Any = None) -> items_pb2.Item:
    args = arguments if isinstance(arguments, str) else orjson.dumps(arguments or {}).decode()
    return items_pb2.Item(
        function_call=items_pb2.FunctionCall(id="fc_" + call_id, call_id=call_id, name=name, arguments=args)
    )


def function_output(call_id: str, output: str) -> items_pb2.Item:
    return items_pb2.Item(
        function_call_output=items_pb2.FunctionCallOutput(call_id=call_id, output_text=output)
    )


def reasoning(text: str) -> items_pb2.Item:
    return items_pb2.Item(reasoning=items_pb2.ReasoningItem(id="rs_1", content=[text]))


def compaction(summary: str) -> items_pb2.Item:
    return items_pb2.Item(
        compaction=items_pb2.CompactionItem(id="cmp_1", encrypted_content=encode_summary(summary))
    )


def function_tool(
    name: str, parameters: dict[str, Any] | None = None, description: str | None = None
) -> request_pb2.Tool:
    params = parameters if parameters is not None else {"type": "object", "properties": {}}
    fn = request_pb2.FunctionTool(name=name, parameters_json=orjson.dumps(params).decode())
    if description is not None:
        fn.description = description
    return request_pb2.Tool(function=fn)


def other_tool(obj: dict[str, Any]) -> request_pb2.Tool:
    return request_pb2.Tool(other=items_pb2.OtherJson(type=obj["type"], json=orjson.dumps(obj).decode()))


def request(*items: items_pb2.Item | str, model: str = "gpt-oss-120b", **kw: Any) -> BackendRequest:
    """A BackendRequest; a lone string item becomes a user message."""
    resolved = [user(i) if isinstance(i, str) else i for i in items]
    return BackendRequest(model=model, instructions=kw.pop("instructions", None), items=resolved, **kw)
