"""Simulated replicas that prefill like real ones (tether/backends/kvsim.py): the KV prefix cache,
the prefill queue, decode slowing with concurrency, and what the simulated backend reports."""

from __future__ import annotations

import pytest

from tether.backends.balancer import Block, prefix_chain
from tether.backends.base import BackendRequest, Finish
from tether.backends.kvsim import LLAMA_31_8B_H100, KVPrefixCache, ReplicaPhysics
from tether.backends.registry import build_backend
from tether.core.items import user_message


def chain(*labels: str):
    return prefix_chain("instructions", [], [user_message(label) for label in labels])


def blocks(*spec: tuple[str, int]) -> list[Block]:
    """A chain given as (digest label, tokens) pairs: ("h", 1000), ("hx", 1000) ..."""
    return [Block(label.encode(), tokens) for label, tokens in spec]


def physics(**kw) -> ReplicaPhysics:
    return ReplicaPhysics(**{"prefill_tokens_per_s": 10_000.0, "kv_cache_tokens": 100_000, "decode_slowdown": 0.5, **kw})


def test_ttft_is_base_plus_uncached_tokens_over_the_prefill_rate():
    p = physics()
    first = p.admit(chain("a", "b"), 0.02, now=0.0)
    total = sum(b.tokens for b in chain("a", "b"))
    assert first.cached_tokens == 0 and first.prefill_tokens == total
    assert first.ttft_s == pytest.approx(0.02 + total / 10_000)
    # The continuation hits the whole earlier prompt and prefills only its new block.
    longer = chain("a", "b", "c")
    second = p.admit(longer, 0.02, now=10.0)
    assert second.cached_tokens == total
    assert second.prefill_tokens == longer[-1].tokens
    assert second.ttft_s == pytest.approx(0.02 + longer[-1].tokens / 10_000)
    assert (p.prompt_tokens, p.cached_tokens) == (total + sum(b.tokens for b in longer), total)


def test_prefills_queue_behind_each_other_on_one_replica():
    p = physics()
    a = p.admit(chain("a"), 0.0, now=0.0)
    b = p.admit(chain("b"), 0.0, now=0.0)  # the header is shared: only b's own block is prefilled
    assert b.cached_tokens == chain("b")[0].tokens
    assert b.ttft_s == pytest.approx(a.ttft_s + b.prefill_tokens / 10_000)  # waited for a's prefill
    later = p.admit(chain("c"), 0.0, now=100.0)  # the queue drained long ago
    assert later.ttft_s == pytest.approx(later.prefill_tokens / 10_000)


def test_kv_cache_is_an_lru_bounded_in_tokens_that_keeps_shared_roots():
    cache = KVPrefixCache(capacity_tokens=3000)
    x, y, z = (blocks(("h", 1000), (f"h{c}", 1000)) for c in "xyz")  # a shared 1000-token header
    cache.insert(x)
    cache.insert(y)
    assert cache.used == 3000
    cache.insert(z)  # over capacity: the least recently used leaf (x's block) goes
    assert cache.used == 3000
    assert cache.lookup(x) == 1000 and cache.lookup(y) == 2000 and cache.lookup(z) == 2000
    cache.insert(blocks(("h", 1000), ("huge", 5000)))  # a block bigger than the cache is not kept
    assert cache.used <= 3000 and cache.lookup(y) == 2000


def test_decode_slows_with_sequences_sharing_the_replica():
    p = physics(decode_slowdown=0.5)
    assert p.decode_rate(100.0) == 100.0
    p.decoding = 3
    assert p.decode_rate(100.0) == pytest.approx(50.0)


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        physics(prefill_tokens_per_s=0)
    with pytest.raises(ValueError, match="decode_slowdown"):
        build_backend("s", "simulated", {"prefill_tokens_per_s": 1000, "decode_slowdown": -1})


def test_published_profile_is_a_valid_simulated_config():
    backend = build_backend("h100", "simulated", dict(LLAMA_31_8B_H100))
    assert backend.physics is not None and backend.physics.cache.capacity == 400_000


async def _finish(backend, items) -> Finish:
    request = BackendRequest(model="m", instructions="instructions", items=items, input_tokens=4000)
    async for chunk in backend.stream(request):
        if isinstance(chunk, Finish):
            return chunk
    raise AssertionError("no Finish")


async def test_simulated_backend_reports_the_replica_cache_hit_as_cached_tokens():
    backend = build_backend(
        "s", "simulated", {"ttft_ms": 0, "tokens_per_s": 0, "output_tokens": 3, "prefill_tokens_per_s": 1e9}
    )
    first = await _finish(backend, [user_message("hello")])
    assert first.usage.cached_tokens == 0
    again = await _finish(backend, [user_message("hello"), user_message("more")])
    assert 0 < again.usage.cached_tokens < again.usage.input_tokens
    assert backend.physics.decoding == 0  # every sequence ended


async def test_without_the_prefill_model_nothing_changes():
    """No prefix cache of its own: it reports no cached count, so the turn reports Tether's."""
    backend = build_backend("s", "simulated", {"ttft_ms": 0, "tokens_per_s": 0, "output_tokens": 3})
    assert backend.physics is None
    for _ in range(2):
        assert (await _finish(backend, [user_message("hello")])).usage.cached_tokens is None
