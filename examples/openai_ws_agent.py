"""An agent over WebSocket mode with the official openai SDK: one connection for the whole task,
each turn sending only what is new (the tool outputs) with `previous_response_id`; Tether keeps
the conversation on the connection.

    tether serve &
    python examples/openai_ws_agent.py [BASE_URL]

Base URL: argv[1], else $OPENAI_BASE_URL, else http://127.0.0.1:8000/v1; API key:
$OPENAI_API_KEY (any value when the server has no keys).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from openai import AsyncOpenAI

TOOLS = [
    {
        "type": "function",
        "name": "list_dir",
        "description": "List the files of a directory.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]


def list_dir(path: str) -> str:
    p = Path(path)
    return "\n".join(sorted(e.name for e in p.iterdir())[:50]) if p.is_dir() else f"no such directory: {path}"


async def main(base_url: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused-when-open"))
    async with client.responses.connect() as conn:  # ws(s)://.../v1/responses
        await conn.response.create(model="tether-sim", input="What is in this directory?", tools=TOOLS,
                                   store=False)  # fmt: skip
        turns = 0
        while True:
            calls, response = [], None
            async for event in conn:
                if event.type == "response.output_text.delta":
                    print(event.delta, end="", flush=True)
                elif event.type == "response.output_item.done" and event.item.type == "function_call":
                    calls.append(event.item)
                elif event.type in ("response.completed", "response.failed", "error"):
                    response = event.response if event.type != "error" else None
                    break
            turns += 1
            if response is None or response.status != "completed" or not calls:
                break
            outputs = []
            for call in calls:  # run the tools; only their outputs travel on the next turn
                print(f"[tool call] {call.name}({call.arguments})", flush=True)
                result = list_dir(**json.loads(call.arguments))
                outputs.append({"type": "function_call_output", "call_id": call.call_id, "output": result})
            await conn.response.create(model="tether-sim", input=outputs, tools=TOOLS,
                                       previous_response_id=response.id, store=False)  # fmt: skip
    print()
    status = response.status if response is not None else "error"
    print(f"{turns} turns over one WebSocket: {status}, {response.usage.input_tokens if response else 0} input "
          f"tokens on the last turn ({response.usage.input_tokens_details.cached_tokens if response else 0} cached)")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")))
