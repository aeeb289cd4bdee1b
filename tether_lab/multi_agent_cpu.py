"""CPU per continuation turn of a multi-agent rollout whose agents' contexts grow.

`python -m tether_lab.multi_agent_cpu [--rounds N] [--input-bytes B]` serves Tether in process
(the simulated model, no delay) and drives one WebSocket-mode chain: the client asks the root to
"delegate" (the message carries `--input-bytes` of text, so the root's context is large), the two
workers call a client tool, the client answers in a create continuing the response
(`limits.multi_agent_inject_wait_s = 0`), the workers answer and the root writes its final
answer; then `--rounds` creates each continue the chain with a short user message the root
answers. Prints the process CPU time (server and client together, one process) per continuation
create: the median and the last round's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import orjson
from websockets.asyncio.client import connect

from tether import server
from tether.auth import Authenticator
from tether_lab.multi_agent_inject import HEADERS, TOOL, lab_config


async def _rollout(url: str, rounds: int, filler: str) -> list[float]:
    cpu: list[float] = []
    async with connect(url, additional_headers=HEADERS, compression=None, max_size=None) as ws:

        async def create(body: dict) -> dict:
            started = time.process_time()
            await ws.send(orjson.dumps({"type": "response.create", "model": "sim-model", "tools": [TOOL],
                                        "multi_agent": {"enabled": True}, **body}).decode())  # fmt: skip
            while True:
                ev = orjson.loads(await ws.recv())
                if ev["type"] in ("response.failed", "error"):
                    raise RuntimeError(f"rollout failed: {ev}")
                if ev["type"] == "response.completed":
                    if "previous_response_id" in body:
                        cpu.append(time.process_time() - started)
                    return ev["response"]

        first = await create({"input": "Please delegate this." + filler})
        outputs = [{"type": "function_call_output", "call_id": it["call_id"], "output": "sunny"}
                   for it in first["output"] if it["type"] == "function_call"]  # fmt: skip
        response = await create({"input": outputs, "previous_response_id": first["id"]})
        for n in range(rounds):
            response = await create({"input": f"And now, question {n}?", "previous_response_id": response["id"]})
            if response["output"][-1].get("phase") != "final_answer":
                raise RuntimeError("the root did not answer")
    return cpu


async def main(rounds: int, input_bytes: int) -> None:
    running = await server.start(lab_config(0.0, {"ttft_ms": 0, "output_tokens": 20}),
                                 authenticator=Authenticator({"sk-lab": "lab"}))  # fmt: skip
    try:
        url = f"ws://127.0.0.1:{running.bridge.port}/v1/responses"  # type: ignore[union-attr]  # bridge on
        await _rollout(url, 2, "")  # warm up
        cpu = await _rollout(url, rounds, " filler" * (input_bytes // 7))
    finally:
        await running.stop(0.5)
    print(f"{rounds} rounds, {len(cpu)} continuation creates: CPU per continuation median "
          f"{statistics.median(cpu) * 1000:.1f} ms, last {cpu[-1] * 1000:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=14)
    ap.add_argument("--input-bytes", type=int, default=200_000)
    a = ap.parse_args()
    asyncio.run(main(a.rounds, a.input_bytes))
