"""A multi-agent smoke run on the real model (SmolLM2 on llama-cpp-python): whatever a 135M model
makes of the actions, the rollout ends within its output cap with every item tagged with its agent
and one usage (docs/multi-agent.md). (`tool_choice: required` is not used: llama-cpp-python cannot
honour it with several tools, and the actions are tools.)"""

from __future__ import annotations

from .conftest import ALIAS, RealStack

TOOL = {"type": "function", "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip


async def test_the_real_model_runs_a_multi_agent_rollout(real: RealStack) -> None:
    async with real.client() as client:
        r = await client.beta.responses.create(
            model=ALIAS, input="Delegate the weather check for Paris to a subagent, then answer.", tools=[TOOL],
            temperature=0, max_output_tokens=160, multi_agent={"enabled": True},
            betas=["responses_multi_agent=v1"],
        )  # fmt: skip
    print("real multi-agent rollout:", [(it.type, it.agent.agent_name if it.agent else None,
                                         getattr(it, "action", None) or getattr(it, "name", None)) for it in r.output])  # fmt: skip
    assert r.status in ("completed", "incomplete"), r.error
    assert r.output and all(it.agent is not None and it.agent.agent_name.startswith("/root") for it in r.output)
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
