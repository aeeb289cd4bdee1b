"""Two Tether replicas sharing one store: a conversation started on one continues on the other.

    python examples/two_replicas.py [STORE_URL]

STORE_URL: a store both replicas reach, default a SQLite file in a temporary folder (one machine);
redis://127.0.0.1:6379/0 or postgresql://user@host/db work across machines (extras `redis` and
`postgres`). This script starts both replicas itself (`tether serve` twice, ports picked by the
system) with `store_durability = "before_terminal"`, so that a stored response is durable before
its client sees it complete and a reconnect to the other replica always finds it. In production
put a load balancer in front (deploy/nginx/tether.conf, docs/deployment.md).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from openai import OpenAI


def start_replica(store: str) -> subprocess.Popen[str]:
    """`tether serve` on ports the system picks, sharing `store`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tether", "serve", "--store", store, "--port", "0", "--grpc-port", "0",
         "--set", "store_durability=before_terminal", "--log-level", "warning", "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def base_url(proc: subprocess.Popen[str], name: str) -> str:
    """The replica's HTTP base URL, read from its banner ("  HTTP       http://127.0.0.1:PORT/v1 ...")."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.match(r"  HTTP +(\S+)", line):
            print(f"replica {name}: {m.group(1)}")
            return m.group(1)
    raise RuntimeError(f"replica {name} exited with {proc.wait()}")


def main(store: str) -> None:
    replicas = [start_replica(store), start_replica(store)]  # both start at once
    try:
        a = OpenAI(base_url=base_url(replicas[0], "A"), api_key="unused-when-open")
        b = OpenAI(base_url=base_url(replicas[1], "B"), api_key="unused-when-open")
        first = a.responses.create(model="tether-sim", input="Remember: the build number is 42.", store=True)
        # Another connection, another process: the parent comes from the shared store.
        second = b.responses.create(model="tether-sim", input="Which build number?", previous_response_id=first.id,
                                    store=True)  # fmt: skip
        fetched = b.responses.retrieve(first.id)
        items = re.search(r"received (\d+) input items", second.output_text)
        print(f"A answered {first.id}; B continued it as {second.id} ({second.status}) with "
              f"{items.group(1) if items else '?'} input items from the shared store, and reads {fetched.id} too")
    finally:
        for proc in replicas:
            proc.send_signal(signal.SIGTERM)
        for proc in replicas:
            proc.wait(30)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{Path(tmp) / 'shared.db'}")
