"""What `response.inject` saves against end-and-recreate on one multi-agent rollout.

`python -m tether_lab.multi_agent_inject [--runs N]` serves Tether in process (the simulated model
at a given speed) and drives one rollout over a raw WebSocket both ways: the root is asked to
"delegate", each of its two workers calls a client tool once (the client takes `--tool-ms` for
the first worker's call and `--slow-tool-ms` for the second's), then answers, and the root
answers. With inject, the client injects each output as soon as it has it, into the running
response; with end-and-recreate (`limits.multi_agent_inject_wait_s = 0`, as over HTTP), the
response completes once both workers wait, and the client sends both outputs in a new create
continuing it, which repeats the create's tools and instructions (`--instructions-bytes`).
Prints, per mode: creates sent, responses, bytes sent and received, wall time
(median of the runs).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import orjson
from websockets.asyncio.client import connect

from tether import server
from tether.auth import Authenticator
from tether.config import BackendSpec, Route, TetherConfig

TOOL = {"type": "function", "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
HEADERS = {"Authorization": "Bearer sk-lab", "OpenAI-Beta": "responses_multi_agent=v1"}


def lab_config(inject_wait_s: float, backend: dict[str, Any]) -> TetherConfig:
    cfg = TetherConfig()
    cfg.store = "memory://"
    cfg.backends = {"sim": BackendSpec(kind="simulated", options=backend)}
    cfg.models = {"*": Route(backend="sim")}
    cfg.server.bridge, cfg.server.bridge_host, cfg.server.bridge_port = True, "127.0.0.1", 0
    cfg.server.grpc_host, cfg.server.grpc_port, cfg.server.metrics_port = "127.0.0.1", 0, 0
    cfg.limits.multi_agent_inject_wait_s = inject_wait_s
    return cfg


async def _rollout(url: str, inject: bool, tool_s: tuple[float, float], instructions: str) -> dict[str, float]:
    sent = received = creates = 0
    responses: set[str] = set()
    started = time.perf_counter()
    async with connect(url, additional_headers=HEADERS, compression=None, max_size=None) as ws:

        async def send(obj: dict) -> None:
            nonlocal sent
            text = orjson.dumps(obj).decode()
            sent += len(text)
            await ws.send(text)

        create = {"type": "response.create", "model": "sim-model", "input": "Please delegate the weather check.",
                  "tools": [TOOL], "multi_agent": {"enabled": True}, "instructions": instructions}  # fmt: skip
        await send(create)
        creates += 1
        pending: dict[str, str] = {}  # call_id -> agent
        outputs: list[dict] = []
        tools: set[asyncio.Task] = set()
        rid = ""

        async def run_tool(call_id: str, agent: str) -> None:
            await asyncio.sleep(tool_s[0] if agent.endswith("_1") else tool_s[1])
            out = {"type": "function_call_output", "call_id": call_id, "output": "sunny"}
            if inject:
                await send({"type": "response.inject", "response_id": rid, "input": [out]})
            else:
                outputs.append(out)

        while True:
            raw = await ws.recv()
            received += len(raw)
            ev = orjson.loads(raw)
            kind = ev["type"]
            if kind == "response.created":
                rid = ev["response"]["id"]
                responses.add(rid)
            elif kind == "response.output_item.done" and ev["item"]["type"] == "function_call":
                item = ev["item"]
                pending[item["call_id"]] = item["agent"]["agent_name"]
                task = asyncio.create_task(run_tool(item["call_id"], item["agent"]["agent_name"]))
                tools.add(task)
            elif kind in ("response.failed", "error", "response.inject.failed"):
                raise RuntimeError(f"rollout failed: {ev}")
            elif kind == "response.completed":
                final = [it for it in ev["response"]["output"] if it.get("phase") == "final_answer"]
                if final:
                    break
                if inject:
                    raise RuntimeError("the response completed while its workers waited for injects")
                await asyncio.gather(*tools)  # the client answers every pending call in the next create
                tools.clear()
                await send({**create, "input": outputs, "previous_response_id": rid})
                creates += 1
                outputs = []
    return {"creates": creates, "responses": len(responses), "sent": sent, "received": received,
            "wall_s": time.perf_counter() - started}  # fmt: skip


async def main(runs: int, tool_s: tuple[float, float], backend: dict[str, Any], instructions: str) -> None:
    for mode, inject in (("inject", True), ("end-and-recreate", False)):
        running = await server.start(lab_config(30.0 if inject else 0.0, backend), authenticator=Authenticator({"sk-lab": "lab"}))
        try:
            url = f"ws://127.0.0.1:{running.bridge.port}/v1/responses"  # type: ignore[union-attr]  # bridge on
            results = [await _rollout(url, inject, tool_s, instructions) for _ in range(runs)]
        finally:
            await running.stop(0.5)
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        print(f"{mode:17} creates {med['creates']:.0f}  responses {med['responses']:.0f}  sent {med['sent']:.0f} B  "
              f"received {med['received']:.0f} B  wall {med['wall_s'] * 1000:.0f} ms (median of {runs})")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tool-ms", type=float, default=200)
    ap.add_argument("--slow-tool-ms", type=float, default=1000)
    ap.add_argument("--ttft-ms", type=float, default=150)
    ap.add_argument("--tokens-per-s", type=float, default=200)
    ap.add_argument("--output-tokens", type=int, default=60)
    ap.add_argument("--instructions-bytes", type=int, default=0, help="instructions of this size (an agent's system prompt)")
    a = ap.parse_args()
    sim = {"ttft_ms": a.ttft_ms, "tokens_per_s": a.tokens_per_s, "output_tokens": a.output_tokens}
    asyncio.run(main(a.runs, (a.tool_ms / 1000, a.slow_tool_ms / 1000), sim, "x " * (a.instructions_bytes // 2)))
