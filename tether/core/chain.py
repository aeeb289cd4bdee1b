"""Connection-scoped conversation state: persistent chain nodes and the response cache.

A `Node` holds one step of a conversation (a request's new input, or a response's output) and
points at its parent, so a continuation shares its whole prefix with the response it continues:
extending a conversation is O(new items) in time and memory. Each node carries the state every
pipeline stage needs for the prefix it ends (running token count, open function calls, safety
findings), which is what lets a cached continuation skip re-validating, re-classifying and
re-tokenising its history.

`CachedResponse` is what the connection cache keeps per response id; `ResponseCache` is the
per-connection LRU, and `CacheBudget` the per-process byte budget shared by all connections, a
fair share per tenant.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tether import ids, render
from tether.compaction_codec import effective_context, starts_window
from tether.protocol.calls import answered_call_id, call_of
from tether.responses.v1 import items_pb2, response_pb2


@dataclass(frozen=True, slots=True)
class Segment:
    """One item with its storage key and its rendered tokens."""

    key: str
    item: items_pb2.Item
    tokens: array

    @staticmethod
    def of(key: str, item: items_pb2.Item, text: str | None = None) -> Segment:
        """Render and tokenise `item` (`text`: its rendering, when the caller already has it)."""
        return Segment(key, item, render.encode(render.render_item(item) if text is None else text))


def segments_of(items: Sequence[items_pb2.Item], keys: Sequence[str] | None = None) -> tuple[Segment, ...]:
    """`Segment.of` each item (rendered and tokenised), keyed by `keys` or by new item ids."""
    if keys is None:
        return tuple(Segment.of(ids.new_id("itm"), item) for item in items)
    return tuple(Segment.of(key, item) for key, item in zip(keys, items, strict=True))


@dataclass(frozen=True, slots=True, eq=False)
class Node:
    parent: Node | None
    segments: tuple[Segment, ...]
    token_count: int  # tokens of the whole chain ending here
    length: int  # items in the whole chain ending here
    open_calls: frozenset[str]  # call_ids of tool calls (function, custom) still waiting for an output
    findings: int  # safety findings in the whole chain
    nbytes: int  # approximate memory of this node's own segments
    agents: bool  # the chain holds a multi-agent response's items (tagged with their `agent`)
    # The chain's items, once asked for (`items()`): a tuple of references, so the next turn's
    # backend request copies its parent's list instead of walking the whole chain again.
    memo_items: tuple[items_pb2.Item, ...] | None = field(default=None, repr=False)

    @staticmethod
    def extend(parent: Node | None, segments: tuple[Segment, ...], findings: int = 0) -> Node:
        open_calls = set(parent.open_calls) if parent else set()
        nbytes = 0
        agents = parent.agents if parent else False
        for seg in segments:
            agents = agents or seg.item.HasField("agent")
            call = call_of(seg.item)
            if call is not None:
                open_calls.add(call.call_id)
            else:
                answered = answered_call_id(seg.item)
                if answered is not None:
                    open_calls.discard(answered)
            nbytes += seg.item.ByteSize() + seg.tokens.itemsize * len(seg.tokens) + 64
        return Node(
            parent=parent,
            segments=segments,
            token_count=(parent.token_count if parent else 0) + sum(len(s.tokens) for s in segments),
            length=(parent.length if parent else 0) + len(segments),
            open_calls=frozenset(open_calls),
            findings=(parent.findings if parent else 0) + findings,
            nbytes=nbytes,
            agents=agents,
        )

    @staticmethod
    def continue_with(parent: Node | None, segments: tuple[Segment, ...], findings: int = 0) -> Node:
        """`parent` extended by `segments`; a compaction item among them starts a new window
        (no parent) holding what `effective_context` keeps, its tokens reused."""
        if not any(starts_window(s.item) for s in segments):
            return Node.extend(parent, segments, findings)
        prefix = parent.all_segments() if parent else []
        return Node.extend(None, tuple(effective_context([*prefix, *segments], lambda s: s.item)), findings)

    def all_segments(self) -> list[Segment]:
        """Every segment of the chain, oldest first (a pointer walk; no copying of items)."""
        chunks: list[tuple[Segment, ...]] = []
        node: Node | None = self
        while node is not None:
            chunks.append(node.segments)
            node = node.parent
        out: list[Segment] = []
        for chunk in reversed(chunks):
            out.extend(chunk)
        return out

    def items(self) -> list[items_pb2.Item]:
        """Every item of the chain, oldest first: the nearest ancestor's memo plus the items of the
        nodes after it (a turn's continuation walks two nodes, not the whole history)."""
        if self.memo_items is not None:
            return list(self.memo_items)
        walked: list[Node] = []
        node: Node | None = self
        while node is not None and node.memo_items is None:
            walked.append(node)
            node = node.parent
        items = list(node.memo_items) if node is not None and node.memo_items is not None else []
        for n in reversed(walked):
            items += [s.item for s in n.segments]
        object.__setattr__(self, "memo_items", tuple(items))  # a cache, not state: frozen otherwise
        return items


@dataclass(slots=True)
class CachedResponse:
    """A finished response as the connection remembers it."""

    response: response_pb2.Response
    input_node: Node | None  # the effective input chain (parent context + this request's input)
    context_node: Node | None  # what a continuation builds on: input + output (or the compacted window)
    lane: str
    store: bool
    tenant: str
    # Keys of the input chain, for the store record of a child (parent keys + new keys).
    input_keys: tuple[str, ...] = ()
    output_keys: tuple[str, ...] = ()
    nbytes: int = 0
    replica: str = ""  # the backend-pool replica that served it (chain-affine routing)


class CacheBudget:
    """The per-process bound on cached response state, shared by all connections, with a fair
    share per tenant. Past the bound, the tenant holding the most bytes gives up its least recently
    used entry (max-min fairness): a tenant holding no more than `max_bytes` / (tenants holding
    entries) is never evicted while another holds more, so one tenant's burst of warm-ups evicts
    its own state, not another tenant's. Within a tenant, eviction is LRU across its connections."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        # tenant -> its entries, least recently used first: (id(cache), response id) -> (cache, bytes)
        self._tenants: dict[str, OrderedDict[tuple[int, str], tuple[ResponseCache, int]]] = {}
        self._tenant_used: dict[str, int] = {}

    def used_by(self, tenant: str) -> int:
        """Bytes of cached state `tenant` holds now."""
        return self._tenant_used.get(tenant, 0)

    def charge(self, cache: ResponseCache, response_id: str, nbytes: int) -> None:
        key = (id(cache), response_id)
        tenant = cache.tenant
        self._tenants.setdefault(tenant, OrderedDict())[key] = (cache, nbytes)
        self._tenant_used[tenant] = self._tenant_used.get(tenant, 0) + nbytes
        self.used += nbytes
        while self.used > self.max_bytes:
            victim = self._victim(key, tenant)
            if victim is None:  # only the entry just charged is left: keep it
                break
            victim_cache, victim_id = victim
            victim_cache.evict(victim_id, reason="process_budget")

    def _victim(self, charged: tuple[int, str], charging: str) -> tuple[ResponseCache, str] | None:
        """The least recently used entry of the tenant holding the most bytes (on a tie, the
        tenant charging now), never the entry just charged."""
        best: tuple[int, bool] | None = None
        found: tuple[ResponseCache, str] | None = None
        for tenant, entries in self._tenants.items():
            first = next((k for k in entries if k != charged), None)
            if first is None:
                continue
            rank = (self._tenant_used[tenant], tenant == charging)
            if best is None or rank > best:
                best, found = rank, (entries[first][0], first[1])
        return found

    def touch(self, cache: ResponseCache, response_id: str) -> None:
        entries = self._tenants.get(cache.tenant)
        key = (id(cache), response_id)
        if entries is not None and key in entries:
            entries.move_to_end(key)

    def release(self, cache: ResponseCache, response_id: str) -> None:
        tenant = cache.tenant
        entries = self._tenants.get(tenant)
        entry = entries.pop((id(cache), response_id), None) if entries is not None else None
        if entry is None:
            return
        self.used -= entry[1]
        self._tenant_used[tenant] -= entry[1]
        if not entries:
            del self._tenants[tenant], self._tenant_used[tenant]


class ResponseCache:
    """The connection's recent responses (LRU by use, bounded by count and the process budget,
    where they count against `tenant`'s share)."""

    def __init__(
        self, capacity: int, budget: CacheBudget, on_evict: Callable[[str], None] | None = None,
        *, tenant: str = "",
    ) -> None:  # fmt: skip
        self.capacity = capacity
        self.tenant = tenant
        self._budget = budget
        self._entries: OrderedDict[str, CachedResponse] = OrderedDict()
        self._on_evict = on_evict

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._entries

    def get(self, response_id: str) -> CachedResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
            self._budget.touch(self, response_id)
        return entry

    def put(self, entry: CachedResponse) -> None:
        rid = entry.response.id
        if rid in self._entries:
            self._budget.release(self, rid)
        self._entries[rid] = entry
        self._entries.move_to_end(rid)
        self._budget.charge(self, rid, entry.nbytes)
        while len(self._entries) > self.capacity:
            oldest = next(iter(self._entries))
            self.evict(oldest, reason="connection_capacity")

    def evict(self, response_id: str, *, reason: str = "explicit") -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._budget.release(self, response_id)
        if self._on_evict is not None:
            self._on_evict(reason)
        return True

    def clear(self) -> None:
        for rid in list(self._entries):
            self._budget.release(self, rid)
        self._entries.clear()
