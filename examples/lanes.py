"""Lanes: several independent conversations multiplexed over one gRPC session.

Each lane (`stream_id`) runs its creates in order; lanes run concurrently. Events come back on
the one stream and the client hands each to its own `ResponseStream`.

    tether serve &
    python examples/lanes.py [HOST:PORT]
"""

from __future__ import annotations

import asyncio
import os
import sys

import tether.client


async def converse(lane: tether.client.ClientLane, topic: str) -> str:
    first = await lane.create("tether-sim", f"Tell me about {topic}.")
    chunks = 0
    async for event in first:
        if event.HasField("output_text_delta"):
            chunks += 1
    reply = await first.final_response()
    # Continue this lane's conversation: only the new input travels.
    follow = await lane.create("tether-sim", "Shorter, please.", previous_response_id=reply.id)
    second = await follow.final_response()
    return (f"lane {lane.name}: {chunks} deltas, then {second.id} "
            f"({second.usage.cached_tokens}/{second.usage.input_tokens} input tokens cached)")


async def main(target: str) -> None:
    async with tether.client.connect(target, api_key=os.environ.get("TETHER_API_KEY")) as s:
        topics = {"planner": "the plan", "coder": "the code", "reviewer": "the review"}
        lines = await asyncio.gather(*(converse(s.lane(name), topic) for name, topic in topics.items()))
        for line in lines:
            print(line)
        print(f"{len(topics)} lanes over {s.connections_opened} connection(s)")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TETHER_TARGET", "127.0.0.1:50051")))
