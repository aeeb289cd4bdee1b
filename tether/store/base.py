"""The store contract: durable store=true responses, their items, and the usage ledger.

Layout every engine follows (agentic-api ADR-02): each item is written once, under a storage key;
each response keeps the ordered key list of its whole model-visible input (the chain it continued
plus its own new input) and of its output. Hydrating a response for a continuation is therefore
one read (`load_context`), never a walk up the `previous_response_id` chain.

Every call is scoped by `tenant` (the API key's tenant, "" when auth is open): another tenant's
ids behave exactly like ids that do not exist.

store=false responses never reach a store: the session core keeps them in connection memory only.

Conversations (`/v1/conversations`) are a second, simpler layout: a conversation row (the
`Conversation` proto) and its ordered items, each held by value with its API id. Items are only
ever appended at the end or deleted one by one, and a create reads them all at once
(`conversation_items`), so paging happens in the engine core over that one read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tether.responses.v1 import items_pb2, response_pb2, service_pb2


@dataclass(frozen=True)
class KeyedItem:
    """An item and its storage key (unique per tenant; not the item's API-visible `id`)."""

    key: str
    item: items_pb2.Item


@dataclass(frozen=True)
class ResponseRecord:
    """What a completed store=true response writes, in one transaction."""

    tenant: str
    response: response_pb2.Response  # the final Response object, output included
    input_keys: Sequence[str]  # the whole effective input, in order (parent chain + new input)
    output_keys: Sequence[str]  # this response's output items, in order
    new_items: Sequence[KeyedItem]  # items not stored before: this turn's new input and its output
    conversation_tokens: int = 0  # rendered tokens of input + output (lets hydration skip a recount)
    replica: str = ""  # the backend-pool replica that served it (chain-affine routing survives reconnects)
    # The writer's fencing token (its run's ownership epoch, `tether.store.runbus`): a response
    # stored with a higher epoch is not replaced (`FencedWrite`); 0 for runs kept in one process.
    epoch: int = 0


@dataclass(frozen=True)
class Hydrated:
    """A stored response with its whole context, as `load_context` returns it in one read."""

    response: response_pb2.Response
    inputs: Sequence[KeyedItem]
    outputs: Sequence[KeyedItem]
    conversation_tokens: int = 0
    replica: str = ""


@dataclass(frozen=True)
class UsageRecord:
    """One ledger line per completed response (the response id is the idempotency key)."""

    tenant: str
    response_id: str
    model: str
    backend: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int
    status: str
    created_at: float  # unix seconds


@dataclass(frozen=True)
class ItemPage:
    items: Sequence[items_pb2.Item]
    has_more: bool


class Store(Protocol):
    """A response store engine. Implementations: memory.py (tests), sqlite.py (default),
    postgres.py and redis.py; `factory.open_store(url)` picks and opens one from a URL."""

    async def open(self) -> None:
        """Connect and create or migrate the schema."""
        ...

    async def close(self) -> None: ...

    async def ping(self) -> bool:
        """Readiness: True when the engine answers."""
        ...

    async def put_response(self, record: ResponseRecord) -> None:
        """Write the new items and the response row atomically. Writing the same response id
        twice replaces the response row and ignores items whose keys already exist, unless the
        row was written with a higher `epoch`, or (engines that share runs between replicas,
        `tether.store.runbus`) the response's run is owned with a higher one: then nothing is
        written (`FencedWrite`, checked in the same write)."""
        ...

    async def get_response(self, tenant: str, response_id: str) -> response_pb2.Response | None: ...

    async def load_context(self, tenant: str, response_id: str) -> Hydrated | None:
        """The response, its ordered input items and its output items, in one read."""
        ...

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        """Delete the response row (and items no other response of the tenant references).
        Returns False when there was no such response."""
        ...

    async def list_input_items(
        self, tenant: str, response_id: str, *, after: str | None, limit: int, order: str
    ) -> ItemPage | None:
        """Page through the response's effective input items by API item id (`after` is an
        item id; order asc|desc). None when the response does not exist."""
        ...

    async def record_usage(self, record: UsageRecord) -> None:
        """Append to the usage ledger; a second record for the same response id is ignored."""
        ...

    async def usage_records(self, tenant: str | None = None) -> list[UsageRecord]: ...

    # -- conversations -------------------------------------------------------------------

    async def put_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> None:
        """Create the conversation (a new id; an existing row would be replaced, keeping its items)."""
        ...

    async def update_conversation(self, tenant: str, conversation: service_pb2.Conversation) -> bool:
        """Replace the row (metadata) of an existing conversation, keeping its items, in one atomic
        step; False, and nothing written, when there is none (an update racing a delete never
        brings the conversation back)."""
        ...

    async def get_conversation(self, tenant: str, conversation_id: str) -> service_pb2.Conversation | None: ...

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        """Delete the conversation and its items; False when there was none."""
        ...

    async def append_conversation_items(
        self, tenant: str, conversation_id: str, items: Sequence[items_pb2.Item]
    ) -> bool:
        """Append items (each with its API id) in order, atomically; False when there is no such
        conversation (nothing is written)."""
        ...

    async def conversation_items(self, tenant: str, conversation_id: str) -> list[items_pb2.Item] | None:
        """Every item of the conversation in order, in one read; None when there is none."""
        ...

    async def delete_conversation_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        """Delete the item with that API id; False when the conversation or the item is missing."""
        ...
