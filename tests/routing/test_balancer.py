"""The routing policies and health rules of a backend pool (tether/backends/balancer.py), without I/O."""

from __future__ import annotations

from tether.backends.balancer import (
    Balancer,
    BalancerSettings,
    Block,
    Health,
    Policy,
    PrefixIndex,
    prefix_chain,
)
from tether.core.items import user_message


def balancer(policy: Policy, n: int = 3, **settings) -> Balancer:
    return Balancer([f"r{i}" for i in range(n)], BalancerSettings(policy=policy.value, **settings))


def chain(*labels: str) -> list[Block]:
    return prefix_chain("You are a coding agent.", [], [user_message(label) for label in labels])


def test_round_robin_rotates_and_lists_the_others_for_failover():
    b = balancer(Policy.ROUND_ROBIN)
    firsts = [b.order(0.0)[0].name for _ in range(6)]
    assert firsts == ["r0", "r1", "r2", "r0", "r1", "r2"]
    order = b.order(0.0)
    assert sorted(r.name for r in order) == ["r0", "r1", "r2"]


def test_least_loaded_takes_the_idlest_replica():
    b = balancer(Policy.LEAST_LOADED)
    r0, r1, r2 = b.replicas
    b.started(r0)
    b.started(r0)
    b.started(r2)
    assert b.order(0.0)[0] is r1
    b.started(r1)
    b.started(r1)
    assert b.order(0.0)[0] is r2
    b.ended(r0)
    b.ended(r0)
    assert b.order(0.0)[0] is r0


def test_chain_affine_follows_the_parent_and_falls_back_on_load_and_health():
    b = balancer(Policy.CHAIN_AFFINE, balance_abs=2, balance_rel=1.5, eject_after_failures=1)
    r0, r1, r2 = b.replicas
    assert [b.order(0.0, affinity="r2")[0] for _ in range(5)] == [r2] * 5  # sticky, whatever the rotation
    assert b.order(0.0, affinity="gone")[0].in_flight == 0  # unknown replica: least-loaded
    for _ in range(2):
        b.started(r2)
    assert b.order(0.0, affinity="r2")[0] is r2  # 2 in flight vs 0: not past balance_abs = 2
    b.started(r2)  # 3 - 0 > 2 and 3 > 1.5 * 0: overloaded, so the call goes to the least-loaded one
    assert b.order(0.0, affinity="r2")[0] in (r0, r1)
    for _ in range(3):
        b.ended(r2)
    b.failed(r2, now=100.0)
    assert r2.health is Health.EJECTED
    assert b.order(100.0, affinity="r2")[0] is not r2


def test_prefix_aware_routes_to_the_replica_that_saw_the_longest_prefix():
    b = balancer(Policy.PREFIX_AWARE, min_prefix_match=0.5)
    r0, r1, r2 = b.replicas
    convo = chain("fix the bug in parser.py", "tool output: 3 failures")
    b.started(r1, convo)
    b.ended(r1)
    longer = chain("fix the bug in parser.py", "tool output: 3 failures", "tool output: 0 failures")
    assert [b.order(0.0, chain=longer)[0] for _ in range(4)] == [r1] * 4
    # A different conversation shares only the header (1 block of 4): below the 0.5 threshold.
    other = chain("write docs", "tool output: listing", "tool output: file")
    assert {b.order(0.0, chain=other)[0].name for _ in range(3)} == {"r0", "r1", "r2"}  # least-loaded, rotating


def test_prefix_aware_with_a_prompt_cache_key_is_a_stable_hash_that_skips_ejected_replicas():
    b = balancer(Policy.PREFIX_AWARE, eject_after_failures=1)
    picks = {b.order(0.0, cache_key="agent-7")[0].name for _ in range(5)}
    assert len(picks) == 1
    spread = {b.order(0.0, cache_key=f"agent-{k}")[0].name for k in range(40)}
    assert spread == {"r0", "r1", "r2"}
    (chosen,) = picks
    b.failed(b.get(chosen), now=0.0)
    assert b.order(1.0, cache_key="agent-7")[0].name != chosen


def test_prefix_aware_does_not_pile_onto_an_overloaded_replica():
    b = balancer(Policy.PREFIX_AWARE, balance_abs=1, balance_rel=1.0)
    r0 = b.replicas[0]
    convo = chain("task A")
    b.started(r0, convo)
    b.started(r0, convo)
    assert b.order(0.0, chain=chain("task A", "more"))[0] is not r0


def test_ejection_probation_and_return():
    b = balancer(Policy.ROUND_ROBIN, n=2, eject_after_failures=2, eject_s=10.0)
    r0, r1 = b.replicas
    b.failed(r0, now=0.0)
    assert r0.health is Health.UP  # one failure is not enough
    b.failed(r0, now=0.0)
    assert r0.health is Health.EJECTED
    assert {b.order(5.0)[0].name for _ in range(4)} == {"r1"}
    assert b.order(5.0)[-1] is not r0 and len(b.order(5.0)) == 1  # not even a failover candidate
    # After eject_s it is on probation: routable; one failure ejects it again at once.
    assert r0.routable(10.0) and r0.health is Health.PROBATION
    b.failed(r0, now=10.0)
    assert r0.health is Health.EJECTED and not r0.routable(15.0)
    # A successful probe readmits it; a successful call makes it UP.
    b.probed(r0, True, now=15.0)
    assert r0.health is Health.PROBATION and r0.routable(15.0)
    b.succeeded(r0)
    assert r0.health is Health.UP and r0.failures == 0
    b.probed(r1, False, now=20.0)
    assert r1.health is Health.EJECTED


def test_when_every_replica_is_ejected_all_are_still_tried():
    b = balancer(Policy.LEAST_LOADED, n=2, eject_after_failures=1)
    for r in b.replicas:
        b.failed(r, now=0.0)
    assert len(b.order(1.0)) == 2


def test_prefix_chain_hashes_rendered_text_with_stable_token_estimates():
    a = chain("same", "prefix")
    b = chain("same", "prefix", "then more")
    assert a == b[:3]  # digests and token estimates of a prefix do not depend on what follows
    assert b[2].tokens == -(-len("<|start|>user<|message|>then more<|end|>") // 4)
    c = chain("different", "prefix")
    assert a[0].digest == c[0].digest and a[1].digest != c[1].digest and a[2].digest != c[2].digest


def test_prefix_index_is_bounded_and_keeps_shared_roots():
    index = PrefixIndex(max_entries=4)
    index.add(chain("x", "y"))  # 3 blocks
    index.add(chain("z", "w"))  # 3 more, the header shared: 5 distinct > 4
    assert len(index) == 4
    zw = chain("z", "w")
    assert index.match(zw) == sum(b.tokens for b in zw)
    # The least recently used leaf went (x, y's last block); the shared header and x stayed.
    xy = chain("x", "y")
    assert index.match(xy) == xy[0].tokens + xy[1].tokens


def test_chain_affine_places_new_conversations_evenly_even_while_they_are_idle():
    """Between turns a sticky conversation has nothing in flight; placing by conversations keeps
    first turns from piling onto the replica whose conversations happen to be idle right now."""
    b = balancer(Policy.CHAIN_AFFINE, n=2)
    r0, r1 = b.replicas
    b.started(r0)  # conversation A placed on r0 ...
    b.ended(r0)
    for _ in range(3):  # ... and continued there three times; idle now
        b.started(r0, affinity="r0")
        b.ended(r0)
    first = b.order(0.0)[0]
    assert first is r1  # conversation B goes to r1, though both have nothing in flight
    b.started(r1)
    b.started(r1, affinity="r1")  # B is generating
    assert b.order(0.0)[0] is r0  # C: one placed each, r0 less loaded
    assert r0.placed == 1 and r1.placed == 1
