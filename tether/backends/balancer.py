"""Replica selection for a backend pool: health, load and the routing policies, with no I/O.

A pool (`tether.backends.pool`) asks a `Balancer` for an ordered list of candidate replicas for
each model call (first choice first, the rest for failover before the first byte) and reports
back what happened (`started`, `succeeded`, `failed`, `probed`). Everything here is plain state
and arithmetic, so the policies are tested without sockets or clocks.

Policies (`Policy`):

- `round-robin`: rotate over the routable replicas.
- `least-loaded`: the replica with the fewest calls in flight (ties rotate).
- `chain-affine`: a continuation goes to the replica that served its parent (`affinity`, the
  replica recorded with the parent response, in the connection cache or the store), unless that
  replica is not routable or is overloaded (see below). Otherwise, and for a first turn, the call
  places the conversation: on the replica with the fewest conversations placed so far, then the
  least loaded (calls in flight alone undercount a replica whose sticky conversations are between
  turns). This is the policy a persistent connection makes natural: the parent's replica holds
  the conversation's KV prefix.
- `prefix-aware`: what gateways do for stateless requests (SGLang's cache-aware router, llm-d's
  prefix scorer): with a `prompt_cache_key`, rendezvous hashing of the key (scoped to the
  tenant) over the routable replicas; otherwise the replica whose routed-prefix index holds the longest prefix of the
  request's rendered prompt (`prefix_chain`, hashed per tenant), if that match covers at least `min_prefix_match`
  of the prompt and the replica is not overloaded; else least-loaded.

Overload (both cache-seeking policies): a preferred replica is skipped when its in-flight count
exceeds the least-loaded routable replica's by more than `balance_abs` *and* by a factor of more
than `balance_rel` (SGLang's `balance_abs_threshold` / `balance_rel_threshold`).

Health (`Health`): a replica is UP, EJECTED (not routable until `ejected_until`, or until a health
probe succeeds) or on PROBATION (routable again; one success makes it UP, one failure ejects it
again). `eject_after_failures` consecutive failures before the first byte eject an UP replica. When no
replica is routable every replica is a candidate (a pool never refuses on stale health alone).
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tether import render
from tether.responses.v1 import items_pb2, request_pb2


class Policy(enum.StrEnum):
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    CHAIN_AFFINE = "chain-affine"
    PREFIX_AWARE = "prefix-aware"


class Health(enum.Enum):
    UP = "up"
    EJECTED = "ejected"
    PROBATION = "probation"


# --- the rendered prefix as a hash chain ------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One block of a prompt: the header (instructions + tools) or one item. `digest` hashes this
    block *and every block before it*, so equal digests mean equal prefixes."""

    digest: bytes
    tokens: int


CHARS_PER_TOKEN = 4  # a block's token estimate: stable for the same text, whatever follows it


def prefix_chain(
    instructions: str | None,
    tools: Sequence[request_pb2.Tool],
    items: Sequence[items_pb2.Item],
    *,
    scope: str = "",
) -> list[Block]:
    """The prompt as a chain of blocks, hashed over the rendered text (what the model sees, so a
    resent history hashes like a cached one). Token counts are estimated from the rendered length
    (`CHARS_PER_TOKEN`), not tokenised: routing and the simulator need them per block, every call.
    `scope` (the tenant) seeds the hash: the same prompt from two tenants makes two unrelated
    chains, so neither's routing (or cache hint) reveals whether the other sent that prefix."""
    texts = [render.render_header(instructions, list(tools)), *(render.render_item(i) for i in items)]
    chain: list[Block] = []
    h = hashlib.blake2b(digest_size=16)
    h.update(scope.encode())
    h.update(b"\x00")
    for text in texts:
        data = text.encode()
        h.update(data)
        h.update(b"\x00")
        chain.append(Block(h.copy().digest(), -(-len(data) // CHARS_PER_TOKEN)))
    return chain


def conversation_key(chain: Sequence[Block]) -> str:
    """A stable key for one conversation: the digest of its header and first item (the same on
    every turn of the conversation). Used for upstream cache/slot hints."""
    if not chain:
        return ""
    return chain[min(1, len(chain) - 1)].digest.hex()


class PrefixIndex:
    """What was routed to one replica: an LRU set of block digests, bounded in entries. The
    gateway-side approximation of the replica's KV cache (SGLang's approximate radix tree)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._lru: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, chain: Sequence[Block]) -> int:
        """Tokens of the longest prefix of `chain` this index holds."""
        matched = 0
        for block in chain:
            if block.digest not in self._lru:
                break
            matched += block.tokens
        return matched

    def add(self, chain: Sequence[Block]) -> None:
        # Leaves first, root last: the shared root stays the most recently used.
        for block in reversed(chain):
            self._lru[block.digest] = None
            self._lru.move_to_end(block.digest)
        while len(self._lru) > self.max_entries:
            self._lru.popitem(last=False)


# --- replicas and the balancer ----------------------------------------------------------------


@dataclass
class ReplicaState:
    name: str
    index: int
    in_flight: int = 0
    placed: int = 0  # conversations placed here (calls that followed no affinity), ever
    health: Health = Health.UP
    failures: int = 0  # consecutive failures before the first byte
    ejected_until: float = 0.0
    prefixes: PrefixIndex = field(default_factory=lambda: PrefixIndex(0))

    def routable(self, now: float) -> bool:
        if self.health is Health.EJECTED and now >= self.ejected_until:
            self.health = Health.PROBATION
        return self.health is not Health.EJECTED


@dataclass(frozen=True, kw_only=True)
class BalancerSettings:
    """The balancer's knobs; a pool's `pool` table holds these plus its own (tether.backends.pool)."""

    policy: str = Policy.ROUND_ROBIN.value  # a Policy value
    eject_after_failures: int = 2
    eject_s: float = 10.0
    balance_abs: int = 8
    balance_rel: float = 1.5
    min_prefix_match: float = 0.5
    prefix_index_entries: int = 200_000


class Balancer:
    def __init__(self, names: Sequence[str], settings: BalancerSettings) -> None:
        if not names:
            raise ValueError("a pool needs at least one replica")
        if len(set(names)) != len(names):
            raise ValueError(f"replica names must be distinct: {list(names)}")
        self.settings = settings
        self.policy = Policy(settings.policy)  # ValueError for an unknown policy
        self.replicas = [
            ReplicaState(name, i, prefixes=PrefixIndex(settings.prefix_index_entries)) for i, name in enumerate(names)
        ]
        self._by_name = {r.name: r for r in self.replicas}
        self._next = 0

    def get(self, name: str) -> ReplicaState | None:
        return self._by_name.get(name)

    # -- choosing ---------------------------------------------------------------------------------

    def order(
        self,
        now: float,
        *,
        affinity: str | None = None,
        chain: Sequence[Block] = (),
        cache_key: str | None = None,
    ) -> list[ReplicaState]:
        """Candidates for one call, first choice first; the rest are failover candidates."""
        candidates = [r for r in self.replicas if r.routable(now)] or list(self.replicas)
        rotation = self._rotate(candidates)
        by_load = sorted(rotation, key=lambda r: r.in_flight)
        policy = self.policy
        first: ReplicaState | None = None
        if policy is Policy.ROUND_ROBIN:
            first = rotation[0]
        elif policy is Policy.LEAST_LOADED:
            first = by_load[0]
        elif policy is Policy.CHAIN_AFFINE:
            preferred = self._by_name.get(affinity or "")
            if preferred is not None and preferred in candidates and not self._overloaded(preferred, by_load[0]):
                first = preferred
            else:  # place the conversation: fewest placed so far, then least loaded
                first = min(by_load, key=lambda r: r.placed)
        elif policy is Policy.PREFIX_AWARE:
            preferred = self._prefix_choice(candidates, chain, cache_key)
            if preferred is not None and not self._overloaded(preferred, by_load[0]):
                first = preferred
        first = first or by_load[0]
        return [first, *(r for r in by_load if r is not first)]

    def _rotate(self, candidates: list[ReplicaState]) -> list[ReplicaState]:
        k = self._next % len(candidates)
        self._next += 1
        return candidates[k:] + candidates[:k]

    def _overloaded(self, replica: ReplicaState, least: ReplicaState) -> bool:
        s = self.settings
        excess = replica.in_flight - least.in_flight
        return excess > s.balance_abs and replica.in_flight > s.balance_rel * least.in_flight

    def _prefix_choice(
        self, candidates: list[ReplicaState], chain: Sequence[Block], cache_key: str | None
    ) -> ReplicaState | None:
        if cache_key:
            return max(candidates, key=lambda r: hashlib.blake2b(f"{cache_key}\x00{r.name}".encode(), digest_size=8).digest())
        total = sum(b.tokens for b in chain)
        if total <= 0:
            return None
        best, best_tokens = None, 0
        for r in candidates:
            matched = r.prefixes.match(chain)
            if matched > best_tokens:
                best, best_tokens = r, matched
        if best is None or best_tokens < self.settings.min_prefix_match * total:
            return None
        return best

    # -- outcomes ---------------------------------------------------------------------------------

    def started(self, replica: ReplicaState, chain: Sequence[Block] = (), *, affinity: str | None = None) -> None:
        """A call starts on `replica`; `affinity` is the replica its parent asked for, if any."""
        replica.in_flight += 1
        if replica.name != affinity:
            replica.placed += 1
        if chain and self.policy is Policy.PREFIX_AWARE:
            replica.prefixes.add(chain)

    def ended(self, replica: ReplicaState) -> None:
        replica.in_flight = max(0, replica.in_flight - 1)

    def succeeded(self, replica: ReplicaState) -> None:
        """The replica answered (its first chunk arrived)."""
        replica.failures = 0
        if replica.health is Health.PROBATION:
            replica.health = Health.UP

    def failed(self, replica: ReplicaState, now: float) -> None:
        """The replica failed before its first chunk (connection refused, 5xx, timeout)."""
        replica.failures += 1
        if replica.health is Health.PROBATION or replica.failures >= self.settings.eject_after_failures:
            self._eject(replica, now)

    def probed(self, replica: ReplicaState, ok: bool, now: float) -> None:
        """An active health probe's result: a failure ejects, a success readmits on probation."""
        if not ok:
            self._eject(replica, now)
        elif replica.health is Health.EJECTED:
            replica.health = Health.PROBATION
            replica.failures = 0

    def _eject(self, replica: ReplicaState, now: float) -> None:
        replica.health = Health.EJECTED
        replica.ejected_until = now + self.settings.eject_s
