"""Conversations (`/v1/conversations`): durable item lists that creates continue.

The one implementation behind every transport: the engine answers the eight conversation RPCs
through `Conversations.call`, the gRPC servicer registers one handler per name in `RPCS`, and the
remote adapter forwards by the same names, so HTTP, gRPC and a bridge in front of a remote
engine all share it.

A create with `conversation` (validated exclusive with `previous_response_id`) reads the
conversation's items once (`context`) and uses them as the chain it continues; when the turn ends
(completed or incomplete) with `store: true` its new input and its output are appended (`append`)
before the terminal event goes out (`store: false` keeps nothing), so the client's next create
sees them on any transport or replica.
Every call is tenant-scoped: another tenant's conversation ids behave like ids that do not exist.

A conversation is bounded (`max_conversation_items`, `max_conversation_bytes`): adding items past
either, or a create whose new input would pass them, is 400 `conversation_too_large` (a turn's
output is still appended, so the conversation may end one output past the bound; the next create
on it is refused).

Item ids are unique within a conversation (`check_new_ids`): a client-chosen id it already holds
is a 400, on items/create, on create and on a turn's input.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from tether import errors, ids, offload
from tether.config import Limits
from tether.core.items import assign_ids
from tether.core.stages import validate
from tether.errors import TetherError
from tether.protocol.calls import call_of
from tether.responses.v1 import items_pb2, service_pb2
from tether.store._common import item_api_id, page
from tether.store.base import Store

log = logging.getLogger("tether.conversations")

MAX_ITEMS_PER_CALL = 20  # OpenAI's bound for items on create and on items/create

# The gRPC service methods this module answers (each takes and returns that RPC's messages).
RPCS = (
    "CreateConversation",
    "GetConversation",
    "UpdateConversation",
    "DeleteConversation",
    "ListConversationItems",
    "CreateConversationItems",
    "GetConversationItem",
    "DeleteConversationItem",
)


def list_args(limit: int, order: str) -> tuple[int, str]:
    """`limit` (1..100, 0 = 20) and `order` (asc|desc, "" = desc) of a list endpoint."""
    limit = limit or 20
    if not 1 <= limit <= 100:
        raise TetherError(errors.INVALID_REQUEST, "'limit' must be between 1 and 100.", param="limit")
    order = order or "desc"
    if order not in ("asc", "desc"):
        raise TetherError(errors.INVALID_REQUEST, "'order' must be asc or desc.", param="order")
    return limit, order


def not_found(conversation_id: str, param: str = "conversation_id") -> TetherError:
    return TetherError(
        errors.CONVERSATION_NOT_FOUND, f"Conversation with id '{conversation_id}' not found.", param=param
    )


class Conversations:
    def __init__(self, store: Store, limits: Limits) -> None:
        self.store = store
        self.limits = limits

    async def call(self, tenant: str, method: str, request):  # noqa: ANN001, ANN201 - typed by RPCS
        """Answer one conversation RPC by name (see `RPCS`); an id no conversation or item can
        have (`ids.well_formed`) is a 404 at once, before any store key is built from it."""
        conversation_id, item_id = getattr(request, "conversation_id", ""), getattr(request, "item_id", "")
        if conversation_id and not ids.well_formed(conversation_id):
            raise not_found(conversation_id[:64])
        if item_id and not ids.well_formed(item_id):
            raise _item_not_found(item_id[:64])
        return await getattr(self, method)(tenant, request)

    # -- for turns --------------------------------------------------------------------------------

    async def context(self, tenant: str, conversation_id: str,
                      adding: Sequence[items_pb2.Item] = ()) -> list[items_pb2.Item]:  # fmt: skip
        """Every item of the conversation, oldest first (404 `conversation_not_found` when none);
        400 `conversation_too_large` when it and the create's new input (`adding`) pass the limits."""
        items = await self.store.conversation_items(tenant, conversation_id) if ids.well_formed(conversation_id) else None
        if items is None:
            raise not_found(conversation_id, param="conversation")
        if items:  # measuring a large conversation is itself a pass over its bytes: off the loop
            await offload.in_thread(self.check_size, items, adding, "conversation")
        return items

    def check_size(self, items: Sequence[items_pb2.Item], adding: Sequence[items_pb2.Item], param: str) -> None:
        """`max_conversation_items` and `max_conversation_bytes` (protobuf size) over a
        conversation's items and those being added (0 = no bound)."""
        limits = self.limits
        count = len(items) + len(adding)
        if limits.max_conversation_items and count > limits.max_conversation_items:
            raise TetherError(
                errors.CONVERSATION_TOO_LARGE,
                f"The conversation would hold {count} items; the limit is {limits.max_conversation_items}. "
                "Start a new conversation (or compact this one into it).",
                param=param,
            )
        if limits.max_conversation_bytes:
            size = sum(item.ByteSize() for item in items) + sum(item.ByteSize() for item in adding)
            if size > limits.max_conversation_bytes:
                raise TetherError(
                    errors.CONVERSATION_TOO_LARGE,
                    f"The conversation would hold {size} bytes; the limit is {limits.max_conversation_bytes}. "
                    "Start a new conversation (or compact this one into it).",
                    param=param,
                )

    async def append(self, tenant: str, conversation_id: str, items: Sequence[items_pb2.Item]) -> None:
        """A finished turn's input and output; a conversation deleted meanwhile takes nothing."""
        if not await self.store.append_conversation_items(tenant, conversation_id, [output_item(i) for i in items]):
            log.info("conversation %s was deleted during a turn; its items were not kept", conversation_id)

    # -- the RPCs ---------------------------------------------------------------------------------

    def _checked_items(
        self, items: Sequence[items_pb2.Item], before: Sequence[items_pb2.Item]
    ) -> list[items_pb2.Item]:
        """Validated copies of items to add, with ids (an output must answer a call made before)."""
        if len(items) > MAX_ITEMS_PER_CALL:
            raise TetherError(
                errors.TOO_MANY_ITEMS, f"At most {MAX_ITEMS_PER_CALL} items may be added at once.", param="items"
            )
        calls = frozenset(call.call_id for call in map(call_of, before) if call is not None)
        validate.validate_items(items, calls, self.limits, param="items")
        self.check_size(before, items, "items")
        check_new_ids(items, before, param="items")
        return [output_item(item) for item in items]

    async def _get(self, tenant: str, conversation_id: str) -> service_pb2.Conversation:
        conversation = await self.store.get_conversation(tenant, conversation_id)
        if conversation is None:
            raise not_found(conversation_id)
        return conversation

    async def CreateConversation(self, tenant: str, request: service_pb2.CreateConversationRequest):
        validate.check_metadata(request.metadata, self.limits)
        items = await offload.in_thread(self._checked_items, request.items, ())
        conversation = service_pb2.Conversation(
            id=ids.new_id("conv"), created_at=int(time.time()), metadata=request.metadata
        )
        await self.store.put_conversation(tenant, conversation)
        if items:
            await self.store.append_conversation_items(tenant, conversation.id, items)
        return service_pb2.CreateConversationResponse(conversation=conversation)

    async def GetConversation(self, tenant: str, request: service_pb2.GetConversationRequest):
        return service_pb2.GetConversationResponse(conversation=await self._get(tenant, request.conversation_id))

    async def UpdateConversation(self, tenant: str, request: service_pb2.UpdateConversationRequest):
        validate.check_metadata(request.metadata, self.limits)
        conversation = await self._get(tenant, request.conversation_id)
        conversation.metadata.clear()
        conversation.metadata.update(request.metadata)
        if not await self.store.update_conversation(tenant, conversation):  # deleted meanwhile: stays deleted
            raise not_found(request.conversation_id)
        return service_pb2.UpdateConversationResponse(conversation=conversation)

    async def DeleteConversation(self, tenant: str, request: service_pb2.DeleteConversationRequest):
        if not await self.store.delete_conversation(tenant, request.conversation_id):
            raise not_found(request.conversation_id)
        return service_pb2.DeleteConversationResponse(id=request.conversation_id, deleted=True)

    async def ListConversationItems(self, tenant: str, request: service_pb2.ListConversationItemsRequest):
        limit, order = list_args(request.limit, request.order)
        items = await self.store.conversation_items(tenant, request.conversation_id)
        if items is None:
            raise not_found(request.conversation_id)
        chosen, has_more = page([(item_api_id(i), i) for i in items], request.after or None, limit, order)
        return await offload.in_thread(_page, chosen, has_more)  # copies megabytes of items

    async def CreateConversationItems(self, tenant: str, request: service_pb2.CreateConversationItemsRequest):
        before = await self.store.conversation_items(tenant, request.conversation_id)
        if before is None:
            raise not_found(request.conversation_id)
        items = await offload.in_thread(self._checked_items, request.items, before)  # sizes: a pass over the bytes
        if not await self.store.append_conversation_items(tenant, request.conversation_id, items):
            raise not_found(request.conversation_id)
        return await offload.in_thread(_added_page, items)  # copies megabytes of items

    async def GetConversationItem(self, tenant: str, request: service_pb2.GetConversationItemRequest):
        items = await self.store.conversation_items(tenant, request.conversation_id)
        if items is None:
            raise not_found(request.conversation_id)
        for item in items:
            if item_api_id(item) == request.item_id:
                return service_pb2.GetConversationItemResponse(item=item)
        raise _item_not_found(request.item_id)

    async def DeleteConversationItem(self, tenant: str, request: service_pb2.DeleteConversationItemRequest):
        conversation = await self._get(tenant, request.conversation_id)
        if not await self.store.delete_conversation_item(tenant, request.conversation_id, request.item_id):
            raise _item_not_found(request.item_id)
        return service_pb2.DeleteConversationItemResponse(conversation=conversation)


def check_new_ids(items: Sequence[items_pb2.Item], before: Sequence[items_pb2.Item], *, param: str) -> None:
    """Item ids a client chose must be new to the conversation (`before`) and to the request: a
    list pages by item id (`after`) and deletes by item id, so two items with one id would be
    deleted together and make a paginating client (the openai SDK's auto-pagination) loop.
    400 `invalid_item` naming `param[i].id`, as OpenAI refuses a duplicate item."""
    seen = {item_api_id(item) for item in before}
    for i, item in enumerate(items):
        item_id = item_api_id(item)
        if not item_id:
            continue
        if item_id in seen:
            raise TetherError(
                errors.INVALID_ITEM,
                f"Duplicate item found with id '{item_id}': {param}[{i}] has the id of an item the conversation "
                "already holds or this request sent before it; item ids are unique within a conversation.",
                param=f"{param}[{i}].id",
            )
        seen.add(item_id)


def output_item(item: items_pb2.Item) -> items_pb2.Item:
    """An input item as an output item (what `/v1/responses/compact` returns and a conversation holds): with an `id`, a
    `status`, and a message's plain-string content as a content part (`output_text` for the
    assistant, `input_text` otherwise)."""
    out = items_pb2.Item()
    out.CopyFrom(item)
    assign_ids([out])
    arm = out.WhichOneof("item")
    if arm in ("message", "function_call", "function_call_output") and not getattr(out, arm).status:
        getattr(out, arm).status = "completed"
    if arm == "message" and out.message.HasField("content_text"):
        text = out.message.content_text
        out.message.ClearField("content_text")
        part = out.message.content.add()
        if out.message.role == "assistant":
            part.output_text.text = text
        else:
            part.input_text.text = text
    return out


def _added_page(items: Sequence[items_pb2.Item]) -> service_pb2.CreateConversationItemsResponse:
    response = service_pb2.CreateConversationItemsResponse()
    _fill_page(response.page, items, False)
    return response


def _page(items: Sequence[items_pb2.Item], has_more: bool) -> service_pb2.ListConversationItemsResponse:
    return _fill_page(service_pb2.ListConversationItemsResponse(), items, has_more)


def _fill_page(out: service_pb2.ListConversationItemsResponse, items: Sequence[items_pb2.Item],
               has_more: bool) -> service_pb2.ListConversationItemsResponse:  # fmt: skip
    out.has_more = has_more
    out.data.extend(items)
    if items:
        out.first_id, out.last_id = item_api_id(items[0]), item_api_id(items[-1])
    return out


def _item_not_found(item_id: str) -> TetherError:
    return TetherError(errors.ITEM_NOT_FOUND, f"Item with id '{item_id}' not found.", param="item_id")
