"""In-process store (`store = "memory://"`): dicts, for tests and throwaway servers.

It keeps the same layout as the durable engines (items once per tenant and key, each response
with its ordered key lists, a reference count per item for deletion) and stores protos as
serialized bytes, so callers never share mutable proto objects with the store. Every method runs
without awaiting, so each call is atomic with respect to the event loop. Nothing survives
`close()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tether.responses.v1 import items_pb2, response_pb2, service_pb2

from ._common import FencedWrite, MissingItemError, check_page_args, item_api_id, page, parse_items
from .base import Hydrated, ItemPage, KeyedItem, ResponseRecord, UsageRecord


@dataclass
class _StoredResponse:
    response: bytes
    input_keys: tuple[str, ...]
    output_keys: tuple[str, ...]
    conversation_tokens: int
    replica: str
    epoch: int = 0


@dataclass
class _StoredItem:
    item_id: str
    data: bytes
    refs: int = 0


class MemoryStore:
    def __init__(self) -> None:
        self._items: dict[tuple[str, str], _StoredItem] = {}
        self._responses: dict[tuple[str, str], _StoredResponse] = {}
        self._usage: list[UsageRecord] = []
        self._usage_ids: set[tuple[str, str]] = set()
        # (tenant, conversation id) -> [serialized Conversation, [(item id, serialized Item)]]
        self._conversations: dict[tuple[str, str], tuple[bytes, list[tuple[str, bytes]]]] = {}
        self._open = False

    async def open(self) -> None:
        self._open = True

    async def close(self) -> None:
        self._open = False
        self._items.clear()
        self._responses.clear()
        self._usage.clear()
        self._usage_ids.clear()
        self._conversations.clear()

    async def ping(self) -> bool:
        return self._open

    # -- responses -----------------------------------------------------------------------

    async def put_response(self, record: ResponseRecord) -> None:
        tenant = record.tenant
        rid = record.response.id
        if not rid:
            raise ValueError("response.id is empty")
        stored = self._responses.get((tenant, rid))
        if stored is not None and stored.epoch > record.epoch:
            raise FencedWrite(tenant, rid, record.epoch)
        data = record.response.SerializeToString()
        known = {k.key for k in record.new_items}
        for key in (*record.input_keys, *record.output_keys):
            if key not in known and (tenant, key) not in self._items:
                raise MissingItemError(tenant, rid, key)
        for keyed in record.new_items:
            if (tenant, keyed.key) not in self._items:
                self._items[(tenant, keyed.key)] = _StoredItem(
                    item_api_id(keyed.item), keyed.item.SerializeToString()
                )
        new_keys = set(record.input_keys) | set(record.output_keys)
        for key in new_keys:
            item = self._items.get((tenant, key))
            if item is not None:
                item.refs += 1
        old = self._responses.get((tenant, rid))
        self._responses[(tenant, rid)] = _StoredResponse(
            data, tuple(record.input_keys), tuple(record.output_keys), record.conversation_tokens, record.replica,
            record.epoch,
        )
        if old is not None:
            self._release(tenant, set(old.input_keys) | set(old.output_keys))

    def _release(self, tenant: str, keys: set[str]) -> None:
        for key in keys:
            item = self._items.get((tenant, key))
            if item is None:
                continue
            item.refs -= 1
            if item.refs <= 0:
                del self._items[(tenant, key)]

    async def get_response(self, tenant: str, response_id: str) -> response_pb2.Response | None:
        stored = self._responses.get((tenant, response_id))
        if stored is None:
            return None
        return response_pb2.Response.FromString(stored.response)

    def _item(self, tenant: str, response_id: str, key: str) -> _StoredItem:
        item = self._items.get((tenant, key))
        if item is None:
            raise MissingItemError(tenant, response_id, key)
        return item

    async def load_context(self, tenant: str, response_id: str) -> Hydrated | None:
        stored = self._responses.get((tenant, response_id))
        if stored is None:
            return None

        def keyed(keys: tuple[str, ...]) -> list[KeyedItem]:
            return [
                KeyedItem(key, items_pb2.Item.FromString(self._item(tenant, response_id, key).data))
                for key in keys
            ]

        return Hydrated(
            response=response_pb2.Response.FromString(stored.response),
            inputs=keyed(stored.input_keys),
            outputs=keyed(stored.output_keys),
            conversation_tokens=stored.conversation_tokens,
            replica=stored.replica,
        )

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        stored = self._responses.pop((tenant, response_id), None)
        if stored is None:
            return False
        self._release(tenant, set(stored.input_keys) | set(stored.output_keys))
        return True

    async def list_input_items(
        self, tenant: str, response_id: str, *, after: str | None, limit: int, order: str
    ) -> ItemPage | None:
        after = check_page_args(after, limit, order)
        stored = self._responses.get((tenant, response_id))
        if stored is None:
            return None
        entries = []
        for key in stored.input_keys:
            item = self._item(tenant, response_id, key)
            entries.append((item.item_id, item.data))
        chosen, has_more = page(entries, after, limit, order)
        return ItemPage([items_pb2.Item.FromString(data) for data in chosen], has_more)

    # -- usage ledger --------------------------------------------------------------------

    async def record_usage(self, record: UsageRecord) -> None:
        ident = (record.tenant, record.response_id)
        if ident in self._usage_ids:
            return
        self._usage_ids.add(ident)
        self._usage.append(record)

    async def usage_records(self, tenant: str | None = None) -> list[UsageRecord]:
        return [r for r in self._usage if tenant is None or r.tenant == tenant]

    # -- conversations -------------------------------------------------------------------

    async def put_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> None:
        old = self._conversations.get((tenant, conversation.id))
        self._conversations[(tenant, conversation.id)] = (
            conversation.SerializeToString(), old[1] if old is not None else []
        )

    async def update_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> bool:
        old = self._conversations.get((tenant, conversation.id))
        if old is None:
            return False
        self._conversations[(tenant, conversation.id)] = (conversation.SerializeToString(), old[1])
        return True

    async def get_conversation(self, tenant: str, conversation_id: str) -> service_pb2.Conversation | None:
        stored = self._conversations.get((tenant, conversation_id))
        return None if stored is None else service_pb2.Conversation.FromString(stored[0])

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        return self._conversations.pop((tenant, conversation_id), None) is not None

    async def append_conversation_items(
        self, tenant: str, conversation_id: str, items: Sequence[items_pb2.Item]
    ) -> bool:
        stored = self._conversations.get((tenant, conversation_id))
        if stored is None:
            return False
        stored[1].extend((item_api_id(i), i.SerializeToString()) for i in items)
        return True

    async def conversation_items(self, tenant: str, conversation_id: str) -> list[items_pb2.Item] | None:
        stored = self._conversations.get((tenant, conversation_id))
        return None if stored is None else await parse_items([d for _, d in stored[1]])

    async def delete_conversation_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        stored = self._conversations.get((tenant, conversation_id))
        if stored is None:
            return False
        for index, (iid, _) in enumerate(stored[1]):
            if iid == item_id:
                del stored[1][index]
                return True
        return False

    # -- test aids -----------------------------------------------------------------------

    async def item_count(self, tenant: str) -> int:
        """How many items the tenant holds (tests check deletion collects unreferenced items)."""
        return sum(1 for (t, _) in self._items if t == tenant)
