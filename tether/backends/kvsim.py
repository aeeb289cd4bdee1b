"""How a simulated replica spends time on a prompt: a KV prefix cache, a prefill queue, and a
decode rate that falls as sequences share the replica. The simulated backend
(`tether.backends.simulated`) uses it when `prefill_tokens_per_s > 0`; otherwise its TTFT is the
flat `ttft_ms` (the behaviour the rest of the suite relies on).

With the model on, one call on a replica:

1. looks up the longest prefix of its prompt (`tether.backends.balancer.prefix_chain`: the rendered
   header, then one block per item, hashed per tenant as a server salted per tenant would,
   vLLM's `cache_salt`) in the replica's KV cache: an LRU of blocks bounded by
   `kv_cache_tokens` in total (blocks are inserted leaf first, so a shared root outlives its
   leaves, as vLLM frees blocks in reverse order);
2. queues its uncached tokens on the replica's prefill engine (one prefill at a time, FIFO, at
   `prefill_tokens_per_s`), then inserts the whole prompt into the cache;
3. TTFT = `ttft_ms` (scheduling and the first decode step) + time queued + uncached tokens /
   prefill rate; `cached_tokens` in the response's usage is the hit, as a real server reports it
   (block sizes are estimated from the rendered text, `routing.CHARS_PER_TOKEN`);
4. decodes at `tokens_per_s / (1 + decode_slowdown * (sequences decoding on the replica - 1))`,
   re-evaluated at every emission, so a sequence slows down while others share the replica.

The generated tokens are not inserted (the next turn's prompt holds them as rendered items whose
text the simulator cannot know in advance), so a continuation recomputes its parent's output
items: a few dozen tokens a turn, where a real server would hit them too.

Default figures: `LLAMA_31_8B_H100` below, cited in docs/replicas.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from tether.backends.balancer import Block

# Llama 3.1 8B Instruct (BF16) on one H100 SXM 80 GB, served by vLLM (see docs/replicas.md for the
# sources and the arithmetic): option name -> value, ready to splice into a simulated backend.
LLAMA_31_8B_H100: dict[str, float | int] = {
    "ttft_ms": 20.0,  # scheduling + first decode step
    "prefill_tokens_per_s": 16_000.0,
    "tokens_per_s": 150.0,  # one sequence alone
    "decode_slowdown": 0.014,  # per extra concurrent sequence: 80 tok/s each at 64 sequences
    "kv_cache_tokens": 400_000,  # ~55 GB of KV at 128 KiB per token
}


class KVPrefixCache:
    """An LRU of prompt blocks bounded in tokens."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = capacity_tokens
        self.used = 0
        self._blocks: OrderedDict[bytes, int] = OrderedDict()

    def lookup(self, chain: Sequence[Block]) -> int:
        """Tokens of the longest cached prefix of `chain` (touching the blocks it hits)."""
        hit = 0
        touched = []
        for block in chain:
            if block.digest not in self._blocks:
                break
            hit += block.tokens
            touched.append(block.digest)
        for digest in reversed(touched):
            self._blocks.move_to_end(digest)
        return hit

    def insert(self, chain: Sequence[Block]) -> None:
        for block in reversed(chain):
            if block.digest in self._blocks:
                self._blocks.move_to_end(block.digest)
                continue
            if block.tokens > self.capacity:
                continue
            self._blocks[block.digest] = block.tokens
            self.used += block.tokens
        while self.used > self.capacity and self._blocks:
            _, tokens = self._blocks.popitem(last=False)
            self.used -= tokens


@dataclass(frozen=True)
class Admission:
    ttft_s: float
    cached_tokens: int
    prefill_tokens: int


class ReplicaPhysics:
    """One simulated replica's shared state: its KV cache, prefill queue and decoding sequences."""

    def __init__(self, *, prefill_tokens_per_s: float, kv_cache_tokens: int, decode_slowdown: float) -> None:
        if prefill_tokens_per_s <= 0 or kv_cache_tokens < 0 or decode_slowdown < 0:
            raise ValueError(
                "simulated backend: prefill_tokens_per_s must be > 0, kv_cache_tokens and decode_slowdown >= 0"
            )
        self.prefill_rate = prefill_tokens_per_s
        self.cache = KVPrefixCache(kv_cache_tokens)
        self.decode_slowdown = decode_slowdown
        self.decoding = 0  # sequences between their first and last token
        self._prefill_free_at = 0.0
        # Totals since start, for tests and the lab.
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def admit(self, chain: Sequence[Block], base_ttft_s: float, now: float) -> Admission:
        """Reserve the prefill of one prompt; returns its TTFT and cache hit."""
        total = sum(b.tokens for b in chain)
        hit = min(self.cache.lookup(chain), total)
        uncached = total - hit
        start = max(now, self._prefill_free_at)
        prefill_s = uncached / self.prefill_rate
        self._prefill_free_at = start + prefill_s
        self.cache.insert(chain)
        self.prompt_tokens += total
        self.cached_tokens += hit
        return Admission(ttft_s=base_ttft_s + (start - now) + prefill_s, cached_tokens=hit, prefill_tokens=uncached)

    def decode_rate(self, tokens_per_s: float) -> float:
        """Per-sequence decode rate with the sequences now decoding on this replica."""
        return tokens_per_s / (1.0 + self.decode_slowdown * max(0, self.decoding - 1))
