"""Backend pools against real HTTP upstreams (the fake chat-completions server, one per replica):
spreading, failover before the first byte, ejection and return, cache/slot hints, metrics, config."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest

from tests.fakes import FakeChatServer, bad_request, unavailable
from tether.backends.balancer import Health, prefix_chain
from tether.backends.base import BackendError, BackendRequest, Finish
from tether.backends.pool import BackendPool, build_configured_backend
from tether.config import from_dict
from tether.core.items import user_message
from tether.logging_setup import RedactingFilter
from tether.observability.metrics import Metrics


@pytest.fixture
def upstreams() -> Iterator[list[FakeChatServer]]:
    servers = [FakeChatServer(api_key=None, strict=False).start() for _ in range(3)]
    yield servers
    for s in servers:
        s.close()


def make_pool(servers: list[FakeChatServer], **pool) -> BackendPool:
    options = {"max_retries": 0, "connect_timeout_s": 2}
    spec = {"replicas": [s.base_url for s in servers], **pool}
    backend = build_configured_backend("llm", "openai", options, spec)
    assert isinstance(backend, BackendPool)
    backend.bind_metrics(Metrics())
    return backend


def request(*texts: str, affinity: str | None = None, key: str | None = None, tenant: str = "") -> BackendRequest:
    return BackendRequest(
        model="llama3.1-8b",
        instructions="be brief",
        items=[user_message(t) for t in texts],
        input_tokens=20,
        affinity=affinity,
        prompt_cache_key=key,
        tenant=tenant,
    )


async def finish_of(pool: BackendPool, req: BackendRequest) -> Finish:
    """Consume the whole stream (as a turn does) and return its Finish."""
    chunks = [chunk async for chunk in pool.stream(req)]
    assert isinstance(chunks[-1], Finish)
    return chunks[-1]


def calls(server: FakeChatServer) -> int:
    return len(server.chat_requests)


def metric(pool: BackendPool, name: str, **labels: str) -> float:
    value = pool.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_round_robin_spreads_calls_and_tags_the_serving_replica(upstreams):
    pool = make_pool(upstreams, policy="round-robin")
    try:
        served = [(await finish_of(pool, request("hi"))).replica for _ in range(6)]
        assert sorted(served) == sorted([s.base_url for s in upstreams] * 2)
        assert [calls(s) for s in upstreams] == [2, 2, 2]
        for s in upstreams:
            labels = {"backend": "llm", "replica": s.base_url}
            assert metric(pool, "tether_replica_calls_total", outcome="ok", **labels) == 2
            assert metric(pool, "tether_replica_in_flight", **labels) == 0
            assert metric(pool, "tether_replica_prompt_tokens_total", kind="prompt", **labels) > 0
    finally:
        await pool.aclose()


async def test_chain_affine_keeps_a_conversation_on_its_replica(upstreams):
    pool = make_pool(upstreams, policy="chain-affine")
    try:
        first = await finish_of(pool, request("turn 1"))
        replica = first.replica
        for n in range(2, 6):
            assert (await finish_of(pool, request("turn 1", f"turn {n}", affinity=replica))).replica == replica
        assert sorted(calls(s) for s in upstreams) == [0, 0, 5]
    finally:
        await pool.aclose()


async def test_a_dead_replica_fails_over_before_the_first_byte_and_is_ejected(upstreams):
    pool = make_pool(upstreams[:2], policy="chain-affine", eject_after_failures=1, eject_s=3600)
    a, b = upstreams[:2]
    a_url = a.base_url
    try:
        a.close()  # connection refused from now on
        got = await finish_of(pool, request("hello", affinity=a_url))
        assert got.replica == b.base_url and got.reason == "stop"
        state = pool.balancer.get(a_url)
        assert state.health is Health.EJECTED
        labels = {"backend": "llm", "replica": a_url}
        assert metric(pool, "tether_replica_calls_total", outcome="failover", **labels) == 1
        assert metric(pool, "tether_replica_up", **labels) == 0
        for _ in range(3):  # ejected: not even tried, whatever the affinity
            assert (await finish_of(pool, request("again", affinity=a_url))).replica == b.base_url
        assert metric(pool, "tether_replica_calls_total", outcome="failover", **labels) == 1
    finally:
        await pool.aclose()


async def test_5xx_and_429_fail_over_but_a_4xx_is_the_requests_fault(upstreams):
    pool = make_pool(upstreams[:2], policy="chain-affine", eject_after_failures=5)
    a, b = upstreams[:2]
    try:
        a.push(unavailable())
        assert (await finish_of(pool, request("x", affinity=a.base_url))).replica == b.base_url
        assert pool.balancer.get(a.base_url).health is Health.UP  # one failure of five
        a.push(bad_request("messages: bad shape"))
        before = calls(b)
        with pytest.raises(BackendError) as err:
            await finish_of(pool, request("x", affinity=a.base_url))
        assert err.value.status == 400 and calls(b) == before  # not retried elsewhere
    finally:
        await pool.aclose()


async def test_failover_is_bounded_and_the_last_error_surfaces(upstreams):
    pool = make_pool(upstreams, policy="round-robin", failover_attempts=1)
    try:
        for s in upstreams:
            s.push(unavailable())
        with pytest.raises(BackendError) as err:
            await finish_of(pool, request("x"))
        assert "HTTP 503" in err.value.message
        assert sum(calls(s) for s in upstreams) == 2  # the first choice and one failover
    finally:
        await pool.aclose()


async def test_active_health_checks_eject_and_readmit(upstreams):
    a, b = upstreams[:2]
    pool = make_pool([a, b], policy="round-robin", health_path="models", health_interval_s=3600)
    try:
        await pool.start()
        a.api_key = "now-required"  # GET /v1/models answers 401: unhealthy
        await pool.check_health()
        assert pool.balancer.get(a.base_url).health is Health.EJECTED
        assert {(await finish_of(pool, request("x"))).replica for _ in range(4)} == {b.base_url}
        a.api_key = None
        await pool.check_health()
        assert pool.balancer.get(a.base_url).health is Health.PROBATION
        assert {(await finish_of(pool, request("x"))).replica for _ in range(4)} == {a.base_url, b.base_url}
        assert pool.balancer.get(a.base_url).health is Health.UP
        # (a Cerebras replica also reads each model's info and warms its connection: not probes)
        probes = [r.path for r in a.requests if r.method == "GET" and not r.path.startswith(("/v1/models/", "/v1/tcp"))]
        assert len(probes) >= 2 and set(probes) == {"/v1/models"}  # health_path resolved against base_url
    finally:
        await pool.aclose()


async def test_slot_hint_pins_each_conversation_to_one_llama_cpp_slot(upstreams):
    pool = make_pool(upstreams[:1], cache_hint="id_slot", slots_per_replica=4)
    try:
        for n in range(1, 4):
            await finish_of(pool, request(*(f"task A turn {k}" for k in range(n))))
        await finish_of(pool, request("task B"))
        slots = [r.body["id_slot"] for r in upstreams[0].chat_requests]
        assert len(set(slots[:3])) == 1 and all(0 <= s < 4 for s in slots)
    finally:
        await pool.aclose()


async def test_prompt_cache_key_hint_is_stable_per_conversation_and_keeps_the_clients_key(upstreams):
    pool = make_pool(upstreams[:1], cache_hint="prompt_cache_key")
    try:
        await finish_of(pool, request("task A"))
        await finish_of(pool, request("task A", "more"))
        await finish_of(pool, request("task B", key="client-key"))
        keys = [r.body["prompt_cache_key"] for r in upstreams[0].chat_requests]
        assert keys[0] == keys[1] and len(keys[0]) == 32 and keys[2] == "client-key"
    finally:
        await pool.aclose()


async def test_prefix_routing_and_cache_hints_are_scoped_per_tenant(upstreams):
    """Two tenants sending the same prefix (or the same `prompt_cache_key`) share no routing key and
    no upstream hint: b's routing never follows what a sent, so its latency cannot tell."""
    shared = ("the long shared system context " * 20, "what is in it?")
    pool = make_pool(upstreams, policy="prefix-aware")
    try:
        await finish_of(pool, request(*shared, tenant="a"))
        req_a, req_b = request(*shared, tenant="a"), request(*shared, tenant="b")
        chain_a = prefix_chain(req_a.instructions, req_a.tools, req_a.items, scope="a")
        chain_b = prefix_chain(req_b.instructions, req_b.tools, req_b.items, scope="b")
        assert not {b.digest for b in chain_a} & {b.digest for b in chain_b}
        matched_a = [r.prefixes.match(chain_a) for r in pool.balancer.replicas]
        assert max(matched_a) == sum(b.tokens for b in chain_a)  # a's own prefix is indexed...
        assert [r.prefixes.match(chain_b) for r in pool.balancer.replicas] == [0, 0, 0]  # ...b finds none
        # The client's own key is scoped too: rendezvous over (tenant, key).
        key_a, key_b = req_a.scoped_cache_key("agent-7"), req_b.scoped_cache_key("agent-7")
        assert key_a != key_b and "agent-7" not in (key_a, key_b)
    finally:
        await pool.aclose()
    hinted = make_pool(upstreams[:1], cache_hint="prompt_cache_key")
    try:
        for tenant in ("a", "b", "a"):
            await finish_of(hinted, request(*shared, tenant=tenant))
        for tenant in ("a", "b", "a"):
            await finish_of(hinted, request("other", key="agent-7", tenant=tenant))
        sent = upstreams[0].chat_requests[-6:]
        keys = [r.body["prompt_cache_key"] for r in sent]
        assert keys[0] == keys[2] != keys[1]  # same prefix: a's key is stable, b's differs
        assert keys[3] == keys[5] != keys[4]  # same client key: scoped to each tenant
        assert "agent-7" not in keys  # a tenant's key never reaches the upstream as is
        assert all("cache_salt" not in r.body for r in sent)  # the generic dialect takes no salt
    finally:
        await hinted.aclose()


async def test_credentials_in_replica_urls_never_reach_metric_labels_or_logs(upstreams, caplog):
    live = upstreams[0].base_url.replace("http://", "http://agent:pa55word@")
    replicas = [
        "http://t0ken-in-userinfo@127.0.0.1:9/v1",  # refused: fails over, logged
        {"base_url": "http://127.0.0.1:9/v2?token=qu3ry-secret&region=eu"},
        live,
    ]
    backend = build_configured_backend(
        "llm", "openai", {"max_retries": 0, "connect_timeout_s": 2},
        {"replicas": replicas, "policy": "round-robin", "failover_attempts": 2},
    )  # fmt: skip
    assert isinstance(backend, BackendPool)
    metrics = Metrics()
    backend.bind_metrics(metrics)
    secrets = ("t0ken-in-userinfo", "qu3ry-secret", "pa55word")
    try:
        caplog.handler.addFilter(RedactingFilter())  # the filter every handler of `tether serve` has
        with caplog.at_level("INFO"):
            served = {(await finish_of(backend, request("hi"))).replica for _ in range(3)}
        assert served == {live.replace("pa55word", "***")}  # the live one served, as its masked name
        assert upstreams[0].chat_requests  # the credentials still went where they belong
        names = [r.name for r in backend.replicas]
        assert names == ["http://***@127.0.0.1:9/v1", "http://127.0.0.1:9/v2?token=***&region=eu", served.pop()]
        exposition = generate_latest(metrics.registry).decode()
        logged = caplog.text
        assert "failed before its first chunk" in logged and "tether_replica_calls_total" in exposition
        for secret in secrets:
            assert secret not in exposition and secret not in logged
    finally:
        await backend.aclose()


def test_pool_config_from_toml_tables_and_its_errors():
    cfg = from_dict(
        {
            "backends": {
                "sim": {"kind": "simulated", "ttft_ms": 1, "pool": {"replicas": 3, "policy": "least-loaded"}},
                "llm": {
                    "kind": "openai",
                    "pool": {"replicas": ["http://127.0.0.1:9/v1", {"name": "big", "base_url": "http://127.0.0.1:10/v1"}]},
                },
            },
            "models": {"*": {"backend": "sim"}},
        }
    )
    assert cfg.backends["sim"].options == {"ttft_ms": 1} and cfg.backends["sim"].pool["replicas"] == 3
    sim = build_configured_backend("sim", "simulated", cfg.backends["sim"].options, cfg.backends["sim"].pool)
    assert [r.name for r in sim.replicas] == ["sim/0", "sim/1", "sim/2"] and sim.kind == "simulated"
    llm = build_configured_backend("llm", "openai", cfg.backends["llm"].options, cfg.backends["llm"].pool)
    assert [r.name for r in llm.replicas] == ["http://127.0.0.1:9/v1", "big"]
    bad = [
        ({"replicas": 2, "policy": "random"}, "pool.policy must be one of"),
        ({"replicas": 2, "colour": "red"}, "unknown option"),
        ({"replicas": 0}, "at least 1"),
        ({"replicas": [3]}, r"replicas\[0\]"),
        ({"replicas": 2, "health_path": "/health"}, "needs a base_url"),
        ({"replicas": 2, "cache_hint": "magic"}, "cache_hint"),
        ({}, "missing required option"),
    ]
    for pool, message in bad:
        with pytest.raises(ValueError, match=message):
            build_configured_backend("sim", "simulated", {}, pool)
