"""Per-message cost of the bridge's WebSocket stack vs a plain `websockets` server.

    python -m tether_lab.bench_bridge [--pings 3000] [--flood 20000] [--rounds 3]

Each server runs in its own process on 127.0.0.1; the client (`websockets.asyncio.client`, no
compression) runs here. Servers:

- `websockets`: a `websockets.asyncio.server` echo (the floor).
- `uvicorn-sansio`: the bridge's stack (uvicorn h11 + `ws="websockets-sansio"`) with a raw ASGI
  echo app: what the ASGI layer adds per message.
- `uvicorn-legacy`: the same with uvicorn's `ws="websockets"` (built on `websockets.legacy`), the
  alternative the app module's docstring argues against.
- `bridge`: the real bridge app (`tether.bridge.app.BridgeApp`) over a trivial in-memory API that
  answers each `response.create` with `response.output_text.delta` events: adds JSON decode,
  `client_event_from_json`, `event_to_json` and orjson per message (the full adapter cost
  without the core).

Two measures per server: ping-pong (one ~250-byte frame each way, round trip per message, p50 and
mean) and a one-way flood (the server streams N frames; time per frame at the client). Best of
`--rounds` is printed; the delta columns are vs the `websockets` floor. Figures are loopback and
noisy; compare them with each other, not across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import time
from typing import Any

from tether import eventloop

PAYLOAD = (
    '{"type":"response.output_text.delta","sequence_number":7,"item_id":"msg_0123456789abcdef0123",'
    '"output_index":0,"content_index":0,"delta":"Hello there, this is a token or three of text",'
    '"logprobs":[],"obfuscation":"abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz01"}'
)


# -- servers (child processes) ----------------------------------------------------------------


def _plain_server(port_out: Any) -> None:
    from websockets.asyncio.server import serve

    async def handler(conn: Any) -> None:
        async for msg in conn:
            if msg.startswith("flood:"):
                for _ in range(int(msg[6:])):
                    await conn.send(PAYLOAD)
                await conn.send("end")
            else:
                await conn.send(msg)

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
            port_out.put(server.sockets[0].getsockname()[1])
            await asyncio.Future()

    eventloop.run(main())


async def _echo_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "websocket":
        return
    await receive()
    await send({"type": "websocket.accept"})
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            return
        text = msg.get("text") or ""
        if text.startswith("flood:"):
            for _ in range(int(text[6:])):
                await send({"type": "websocket.send", "text": PAYLOAD})
            await send({"type": "websocket.send", "text": "end"})
        else:
            await send({"type": "websocket.send", "text": text})


def _serve_uvicorn(app: Any, port_out: Any, ws: str = "websockets-sansio") -> None:
    import socket

    import uvicorn

    async def main() -> None:
        cfg = uvicorn.Config(
            app,
            http="h11",
            ws=ws,
            ws_per_message_deflate=False,
            lifespan="off",
            log_config=None,
            access_log=False,
            ws_max_size=128 * 1024 * 1024,
        )
        cfg.load()
        sock = socket.create_server(("127.0.0.1", 0))
        server = uvicorn.Server(cfg)
        server.lifespan = cfg.lifespan_class(cfg)
        await server.startup(sockets=[sock])
        port_out.put(sock.getsockname()[1])
        await server.main_loop()

    eventloop.run(main())


def _uvicorn_server(port_out: Any) -> None:
    _serve_uvicorn(_echo_asgi, port_out)


def _uvicorn_legacy_server(port_out: Any) -> None:
    import warnings

    warnings.simplefilter("ignore")  # websockets.legacy is deprecated: that is the point
    _serve_uvicorn(_echo_asgi, port_out, ws="websockets")


class _EchoSession:
    """Answers a create with one delta event, or `flood:N` input with N events then a marker."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=256)

    async def send(self, request: Any, *, nbytes: int | None = None) -> None:
        from tether.responses.v1 import events_pb2

        text = request.create.input_text
        if text.startswith("flood:"):
            n = int(text[6:])
            ev = _delta(events_pb2)
            for _ in range(n):
                await self._queue.put([ev])
            await self._queue.put([_delta(events_pb2, "end")])
        else:
            await self._queue.put([_delta(events_pb2, text)])

    async def events(self) -> Any:
        while True:
            batch = await self._queue.get()
            if batch is None:
                return
            yield batch

    async def close(self) -> None:
        self._queue.put_nowait(None)


def _delta(events_pb2: Any, text: str = "Hello there, this is a token or three of text") -> Any:
    return events_pb2.ServerEvent(
        sequence_number=7,
        output_text_delta=events_pb2.TextDeltaEvent(item_id="msg_0123456789abcdef0123", delta=text),
    )


class _EchoAPI:
    async def open_session(self, tenant: str, *, transport: str) -> _EchoSession:
        return _EchoSession()


def _bridge_server(port_out: Any) -> None:
    from tether.auth import Authenticator
    from tether.bridge.app import BridgeApp
    from tether.bridge.common import BridgeContext
    from tether.config import Limits, ServerConfig

    api: Any = _EchoAPI()  # only open_session is used on the WebSocket path
    ctx = BridgeContext(api=api, authenticator=Authenticator({}), limits=Limits(), server=ServerConfig())
    _serve_uvicorn(BridgeApp(ctx), port_out)


# -- client -------------------------------------------------------------------------------------


def _ping_message(kind: str) -> str:
    if kind == "bridge":
        return '{"type":"response.create","model":"m","input":"ping"}'
    return PAYLOAD


def _flood_message(kind: str, n: int) -> str:
    if kind == "bridge":
        return '{"type":"response.create","model":"m","input":"flood:' + str(n) + '"}'
    return f"flood:{n}"


async def _measure(kind: str, port: int, pings: int, flood: int) -> tuple[float, float, float]:
    from websockets.asyncio.client import connect

    path = "/v1/responses" if kind == "bridge" else "/"
    async with connect(f"ws://127.0.0.1:{port}{path}", compression=None, max_size=None) as conn:
        ping = _ping_message(kind)
        for _ in range(200):  # warm-up
            await conn.send(ping)
            await conn.recv()
        samples = []
        for _ in range(pings):
            t0 = time.perf_counter()
            await conn.send(ping)
            await conn.recv()
            samples.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await conn.send(_flood_message(kind, flood))
        count = 0
        while True:
            msg = await conn.recv()
            if msg == "end" or '"delta":"end"' in msg:
                break
            count += 1
        flood_s = time.perf_counter() - t0
    return statistics.median(samples) * 1e6, statistics.fmean(samples) * 1e6, flood_s / max(count, 1) * 1e6


SERVERS = {
    "websockets": _plain_server,
    "uvicorn-sansio": _uvicorn_server,
    "uvicorn-legacy": _uvicorn_legacy_server,
    "bridge": _bridge_server,
}


def run(pings: int, flood: int, rounds: int) -> dict[str, tuple[float, float, float]]:
    ctx = mp.get_context("spawn")
    results: dict[str, tuple[float, float, float]] = {}
    servers = dict(SERVERS)
    try:
        import tether.protocol.json_codec  # noqa: F401
    except ImportError:
        print("(tether.protocol.json_codec not importable: skipping the `bridge` server)")
        servers.pop("bridge")
    for kind, target in servers.items():
        port_out = ctx.Queue()
        proc = ctx.Process(target=target, args=(port_out,), daemon=True)
        proc.start()
        try:
            port = port_out.get(timeout=30)
            runs = [eventloop.run(_measure(kind, port, pings, flood)) for _ in range(rounds)]
            results[kind] = (min(r[0] for r in runs), min(r[1] for r in runs), min(r[2] for r in runs))
        finally:
            proc.terminate()
            proc.join(5)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pings", type=int, default=3000)
    parser.add_argument("--flood", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    results = run(args.pings, args.flood, args.rounds)
    base = results["websockets"]
    print(
        f"{'server':<16}{'rtt p50 µs':>12}{'rtt mean µs':>13}{'flood µs/msg':>14}{'Δrtt µs':>10}{'Δflood µs':>11}"
    )
    for kind, (p50, mean, per_msg) in results.items():
        print(
            f"{kind:<16}{p50:>12.1f}{mean:>13.1f}{per_msg:>14.2f}"
            f"{p50 - base[0]:>10.1f}{per_msg - base[2]:>11.2f}"
        )
    print(
        f"(best of {args.rounds} rounds; {args.pings} pings, {args.flood}-frame flood; loopback, python {sys.version.split()[0]})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
