"""The blocking client, for scripts: stream one answer, then continue the conversation.

    tether serve &
    python examples/sync_hello.py [HOST:PORT]
"""

from __future__ import annotations

import os
import sys

import tether.client


def main(target: str) -> None:
    with tether.client.connect_sync(target, api_key=os.environ.get("TETHER_API_KEY")) as s:
        print("models:", ", ".join(m.id for m in s.list_models()))
        stream = s.create("tether-sim", "Say hello.")
        for delta in stream.text_deltas():
            print(delta, end="", flush=True)
        print()
        first = stream.final_response()
        again = s.create("tether-sim", "And once more.", previous_response_id=first.id).final_response()
        print(f"{first.id} -> {again.id}: {again.usage.cached_tokens} of {again.usage.input_tokens} "
              "input tokens reused from the connection")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TETHER_TARGET", "127.0.0.1:50051"))
