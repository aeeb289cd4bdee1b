"""An agent tool loop over gRPC: the model calls tools, this script runs them, Tether keeps the
conversation state on the connection so each turn sends only the tool outputs.

    tether serve &                      # simulated model on 127.0.0.1:50051
    python examples/tool_loop.py [HOST:PORT]

Address: argv[1], else $TETHER_TARGET, else 127.0.0.1:50051; API key: $TETHER_API_KEY.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import tether.client


def read_file(path: str) -> str:
    """Read a text file (the first 2,000 characters)."""
    p = Path(path)
    if not p.is_file():
        return f"no such file: {path}"
    return p.read_text(errors="replace")[:2000]


def list_dir(path: str = ".") -> list[str]:
    """List a directory (plain functions run in worker threads; async ones work too)."""
    return sorted(entry.name for entry in Path(path).iterdir())[:50]


def show(event) -> None:
    arm = event.WhichOneof("event")
    if arm == "output_text_delta":
        print(event.output_text_delta.delta, end="", flush=True)
    elif arm == "output_item_done" and event.output_item_done.item.HasField("function_call"):
        call = event.output_item_done.item.function_call
        print(f"[tool call] {call.name}({call.arguments})", flush=True)


async def main(target: str) -> None:
    async with tether.client.connect(target, api_key=os.environ.get("TETHER_API_KEY")) as s:
        final = await s.run_tool_loop(
            "tether-sim",
            "Summarise the README of this project.",
            tools={"read_file": read_file, "list_dir": list_dir},
            instructions="You are a careful assistant. Use the tools to look at files.",
            on_event=show,
            max_turns=8,
        )
        print()
        print(f"final response {final.id}: {final.status}, {final.usage.input_tokens} input tokens "
              f"({final.usage.cached_tokens} cached), {final.usage.output_tokens} output tokens")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TETHER_TARGET", "127.0.0.1:50051")))
