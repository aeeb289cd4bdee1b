"""GET /v1/models lists what a client can use on every configuration: the routed names, the name
a catch-all route's backend answers to by default, the lab's workload models where a simulated
catch-all serves them, each with the `owned_by` its backend reports. Driven with the official
`openai` SDK (and `tether.client` over gRPC, which lists the same)."""

from __future__ import annotations

from openai import AsyncOpenAI

import tether.client
from tests.fakes import chat_server as fk
from tests.support.served import loopback, served
from tether.config import TetherConfig, from_dict
from tether.workloads import available

LAB_MODELS = [f"tether-lab/{name}" for name in available()]


async def listed(config: TetherConfig) -> list[tuple[str, str]]:
    async with served(loopback(config), {}) as s, AsyncOpenAI(base_url=s.base_url, api_key="any") as client:
        return [(m.id, m.owned_by) async for m in client.models.list()]


async def test_the_default_configuration_lists_the_simulated_model_and_the_lab_models() -> None:
    config = loopback(TetherConfig())  # the embedded defaults, as `tether serve` with no file
    config.store = "memory://"
    async with served(config, {}) as s, AsyncOpenAI(base_url=s.base_url, api_key="any") as client:
        models = [(m.id, m.owned_by) async for m in client.models.list()]
        # A listed lab model answers: its workload's scripted rollout (a tool call first).
        lab = await client.responses.create(model="tether-lab/chat3", input="hi", store=False)
        async with tether.client.connect(f"127.0.0.1:{s.grpc_port}") as session:
            over_grpc = [(m.id, m.owned_by) for m in await session.list_models()]
    assert LAB_MODELS and len(LAB_MODELS) >= 3
    assert models == [("tether-sim", "tether")] + [(name, "tether") for name in LAB_MODELS]
    assert over_grpc == models
    assert lab.status == "completed" and lab.output


async def test_a_catch_all_alone_lists_its_backends_default_name() -> None:
    # Before: {"data": []}, so model pickers found nothing though every name works.
    config = from_dict({"store": "memory://", "models": {"*": {"backend": "sim"}}})
    assert await listed(config) == [("tether-sim", "tether")] + [(name, "tether") for name in LAB_MODELS]


async def test_upstream_models_carry_the_upstreams_owned_by_and_lab_models_only_where_served() -> None:
    with fk.FakeChatServer(api_key=None, owned_by="vllm", models=("qwen-7b",)) as upstream:
        config = from_dict({
            "store": "memory://",
            "backends": {"gpu": {"kind": "openai", "base_url": upstream.base_url}, "sim": {"kind": "simulated"}},
            "models": {"coder": {"backend": "gpu", "upstream_model": "qwen-7b"}, "sim-model": {"backend": "sim"},
                       "*": {"backend": "gpu"}},
        })  # fmt: skip
        models = await listed(config)
    # The catch-all reaches the upstream, which serves no lab model: none listed.
    assert models == [("coder", "vllm"), ("qwen-7b", "vllm"), ("sim-model", "tether")]
