"""Per-turn MCP overhead, turns 1..N, over one WebSocket vs stateless HTTP.

    python -m tether_lab.mcp_overhead                  # 20 turns, 3 repetitions
    python -m tether_lab.mcp_overhead --turns 20 --reps 5 --json out.json

An in-process Tether (memory store, an instant simulated model) and the demo MCP server
(`tether_lab.mcp_demo`, streamable HTTP on 127.0.0.1) run side by side. Each repetition is one
conversation of N turns, each turn chained by `previous_response_id` and asking for the `roll`
tool, so every turn makes one MCP call:

- `ws`: all turns on one WebSocket; the connection keeps one initialised MCP session;
- `http`: one `POST /v1/responses` per turn (store=true), each a connection of its own that opens,
  initialises and closes its own MCP session.

Per turn it reads the response's `server_timing.stages_ms["mcp"]` (`include:
["tether:server_timing"]`): the time the turn spent on the MCP server (opening a session,
listing, calling), and reports the median over repetitions for turn 1, turn 2 and turns 2..N.
Turn 1 lists the tools on both transports; later turns do not (the history holds the listing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

import httpx
import orjson

from tether import server
from tether.auth import Authenticator
from tether.config import BackendSpec, Route, TetherConfig
from tether_lab.mcp_demo import DemoServer

TIMING = "tether:server_timing"


def lab_config() -> TetherConfig:
    cfg = TetherConfig()
    cfg.store = "memory://"
    cfg.backends = {"sim": BackendSpec(kind="simulated", options={"ttft_ms": 0, "tokens_per_s": 0,
                                                                  "output_tokens": 12, "tick_ms": 1})}  # fmt: skip
    cfg.models = {"*": Route(backend="sim")}
    cfg.server.bridge_host = cfg.server.grpc_host = "127.0.0.1"
    cfg.server.bridge_port = cfg.server.grpc_port = 0
    cfg.server.console = False
    cfg.mcp.allowed_servers = ["127.0.0.1"]
    cfg.mcp.allow_private_networks = ["127.0.0.0/8"]
    return cfg


def _body(url: str, previous: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "sim", "input": "please roll the dice", "include": [TIMING],
        "tools": [{"type": "mcp", "server_label": "dice", "server_url": url, "require_approval": "never"}],
    }  # fmt: skip
    if previous:
        body["previous_response_id"] = previous
    return body


def _mcp_ms(response: dict[str, Any]) -> float:
    assert [i["type"] for i in response["output"]][-2:] == ["mcp_call", "message"], response["output"]
    return response["server_timing"]["stages_ms"].get("mcp", 0.0)


async def ws_conversation(base: str, url: str, turns: int) -> list[float]:
    from websockets.asyncio.client import connect

    out, previous = [], None
    async with connect(base.replace("http", "ws") + "/responses", max_size=None) as ws:
        for _ in range(turns):
            await ws.send(orjson.dumps({"type": "response.create", **_body(url, previous)}).decode())
            while True:
                ev = orjson.loads(await ws.recv())
                if ev["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                    break
            assert ev["type"] == "response.completed", ev
            out.append(_mcp_ms(ev["response"]))
            previous = ev["response"]["id"]
    return out


async def http_conversation(base: str, url: str, turns: int) -> list[float]:
    out, previous = [], None
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(turns):
            r = await client.post(base + "/responses", json=_body(url, previous))
            r.raise_for_status()
            response = r.json()
            out.append(_mcp_ms(response))
            previous = response["id"]
    return out


async def measure(turns: int, reps: int) -> dict[str, list[list[float]]]:
    results: dict[str, list[list[float]]] = {"ws": [], "http": []}
    with DemoServer() as mcp:
        running = await server.start(lab_config(), authenticator=Authenticator({}))
        try:
            base = running.bridge.base_url  # type: ignore[union-attr]
            for _ in range(reps):
                results["ws"].append(await ws_conversation(base, mcp.url, turns))
                results["http"].append(await http_conversation(base, mcp.url, turns))
        finally:
            await running.stop(1.0)
    return results


def summary(results: dict[str, list[list[float]]]) -> dict[str, dict[str, float]]:
    out = {}
    for transport, runs in results.items():
        per_turn = [statistics.median(run[t] for run in runs) for t in range(len(runs[0]))]
        out[transport] = {
            "turn_1_ms": per_turn[0],
            "turn_2_ms": per_turn[1],
            "turns_2_to_n_median_ms": statistics.median(per_turn[1:]),
            "turns_2_to_n_mean_ms": statistics.fmean(per_turn[1:]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", help="write the per-turn figures here")
    args = parser.parse_args()
    results = asyncio.run(measure(args.turns, args.reps))
    figures = summary(results)
    print(f"MCP time per turn (median of {args.reps} conversations of {args.turns} turns), ms:")
    print(f"{'transport':<10}{'turn 1':>10}{'turn 2':>10}{'2..N p50':>12}{'2..N mean':>12}")
    for transport, f in figures.items():
        print(f"{transport:<10}{f['turn_1_ms']:>10.2f}{f['turn_2_ms']:>10.2f}"
              f"{f['turns_2_to_n_median_ms']:>12.2f}{f['turns_2_to_n_mean_ms']:>12.2f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"summary": figures, "per_turn_ms": results}, fh, indent=2)


if __name__ == "__main__":
    main()
