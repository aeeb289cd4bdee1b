"""`python -m tether_lab.token_path`: the CPU of one streamed token's Python path in Tether, stage
by stage, warm, in one process and without sockets.

    python -m tether_lab.token_path [--tokens 200] [--turns 500] [--reps 5]

The paced upstream's reads (one token per SSE event, each event one HTTP chunk, as
`tether_lab.upstream` and vLLM send them) go through the code a served token goes through, each
stage on its own and then all of them as the upstream socket's callback runs them:

- `http1`: the upstream response's chunked body (`Response`, tether/backends/chat/http1.py);
- `sse`: the event-stream decoder (`SSEDecoder`);
- `parse`: the chunk's JSON to backend chunks (`StreamParser`, the adapter's `_parse`);
- `intake`: the turn's intake, builder, outbox and run (numbered, logged, handed to the
  connection's inline writer, which here takes it without encoding it);
- `encode ws` / `encode sse`: the delta event's WebSocket JSON / SSE frame;
- `one pass (ws)`: all of it from the upstream's bytes, as `_Connection.data_received` runs it
  (`Response` -> the adapter's push -> intake -> outbox -> the WebSocket JSON).

What it leaves out is what no Python change removes: the system calls (the upstream read, the
client write, the loop's poll) and the event loop's own dispatch. The paced lab
(`tether_lab.upstream`) measures a token with all of that, and on a shared 2-core machine its
figure moves 10-20% between minutes; a process's CPU for a warm loop does not, so this one shows
what a change to the Python path saves (the paced lab's figure moves about three times as much:
there each token runs with caches the other processes have used since the last one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable

from tether.backends.base import BackendError, Chunk, TextDelta
from tether.backends.chat.http1 import Response
from tether.backends.chat.sse import SSEDecoder
from tether.backends.chat.stream import StreamParser
from tether.backends.chat_completions import ChatCompletionsBackend, _IdleWatch, _Push
from tether.bridge.common import encode_event
from tether.bridge.http import sse_frame
from tether.core.accounting import OutputCap
from tether.core.builder import OutputBuilder
from tether.core.delta import Delta
from tether.core.intake import Intake
from tether.core.outbox import CoalesceWindow, Outbox
from tether.core.outcome import TurnControl
from tether.core.run import ResponseRun
from tether_lab.upstream import _http_chunk, sse_chunk

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class _Upstream:
    """What a `Response` asks of its connection: nothing happens."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def response_released(self, response: Response, reusable: bool) -> None: ...


class _Writer:
    """The connection's inline writer (`InlineWriter`): takes every delta, encoding it or not."""

    def __init__(self, encode: bool) -> None:
        self.encode = encode
        self.deltas = 0

    def write_now(self, delta: Delta) -> bool:
        if self.encode:
            encode_event(delta, ws=True)
        self.deltas += 1
        return True


def _text(i: int) -> str:
    """Token `i`'s text, as the paced upstream stamps it (its send time)."""
    return f" {1000 + i * 0.02:.6f}"


def upstream_reads(tokens: int) -> list[bytes]:
    """The paced upstream's reads of one answer: one chunk per token, each its own read."""
    return [_http_chunk(sse_chunk("paced", {"content": _text(i)})) for i in range(tokens)]


class _Turn:
    """One turn's intake side, its first token taken (the message and its part are open), with a
    reader waiting on the outbox as a connection's writer does: the deltas after it go inline."""

    def __init__(self, writer: _Writer) -> None:
        self.outbox = Outbox(max_events=64, window=CoalesceWindow.fixed(0.0), max_coalesced_bytes=1 << 16)
        self.outbox.bind(ResponseRun("resp_lab"))
        self.intake = Intake(OutputBuilder(), self.outbox, OutputCap(1 << 30), "", "resp_lab", TurnControl())
        self.intake.armed = True
        self.outbox.write_inline(writer)
        self.reader: asyncio.Task | None = None

    async def open(self) -> None:
        self.intake.take([TextDelta(" first")])
        await self.outbox.get_batch()  # the item and part added, the first delta
        self.reader = asyncio.create_task(self.outbox.get_batch())
        await asyncio.sleep(0)  # the reader waits: the outbox writes the next deltas inline

    async def close(self) -> None:
        self.outbox.close()
        if self.reader is not None:
            await self.reader


# A stage set up for one answer: (run the answer through it, giving the tokens that came out; tear it down).
Stage = tuple[Callable[[], int], Callable[[], Awaitable[None]]]


async def _nothing() -> None:
    return None


def _response() -> Response:
    resp = Response(_Upstream())  # type: ignore[arg-type]  # all a Response asks of its connection
    resp._feed(SSE_HEAD)
    return resp


def _payloads(reads: list[bytes]) -> list[bytes]:
    return [r[r.index(b"\r\n") + 2 : -2] for r in reads]


def _deltas(count: int) -> list[Delta]:
    deltas = []
    for i in range(count):
        d = Delta("output_text_delta", "msg_0123456789abcdef0123456789abcdef", 0, _text(i))
        d.response_id, d.sequence_number = "resp_lab", i + 3
        deltas.append(d)
    return deltas


async def _http1(reads: list[bytes]) -> Stage:
    resp = _response()

    def run() -> int:
        got = 0
        for data in reads:
            resp._feed(data)
            got += bool(resp.read_nowait())
        return got

    return run, _nothing


async def _sse(reads: list[bytes]) -> Stage:
    payloads, decoder = _payloads(reads), SSEDecoder()
    return (lambda: sum(len(decoder.feed(p)) for p in payloads)), _nothing


async def _parse(reads: list[bytes]) -> Stage:
    events = [SSEDecoder().feed(p) for p in _payloads(reads)]
    parser, generated = StreamParser(), list[str]()
    return (
        lambda: sum(len(ChatCompletionsBackend._parse(e, parser, generated)[0]) for e in events)
    ), _nothing


async def _intake(reads: list[bytes]) -> Stage:
    writer = _Writer(encode=False)
    turn = _Turn(writer)
    await turn.open()
    runs: list[list[Chunk]] = [[TextDelta(_text(i))] for i in range(len(reads))]
    intake = turn.intake

    def run() -> int:
        for r in runs:
            intake.take(r)
        return writer.deltas

    return run, turn.close


async def _encode_ws(reads: list[bytes]) -> Stage:
    deltas = _deltas(len(reads))
    return (lambda: sum(1 for d in deltas if encode_event(d, ws=True))), _nothing


async def _encode_sse(reads: list[bytes]) -> Stage:
    deltas = _deltas(len(reads))
    return (lambda: sum(1 for d in deltas if sse_frame(d))), _nothing


async def _one_pass(reads: list[bytes]) -> Stage:
    writer = _Writer(encode=True)
    turn = _Turn(writer)
    await turn.open()
    resp = _response()
    decoder, parser, generated = SSEDecoder(), StreamParser(), list[str]()

    def feed(data: bytes) -> tuple[list[Chunk], BackendError | None]:
        return ChatCompletionsBackend._parse(decoder.feed(data), parser, generated)

    watch = _IdleWatch(resp, 3600.0)
    listening = asyncio.create_task(_Push(resp, feed, parser, turn.intake, watch).until_woken())
    await asyncio.sleep(0)

    def run() -> int:
        for data in reads:  # what `_Connection.data_received` does with each read
            resp._feed(data)
            resp._notify()
        return writer.deltas

    async def done() -> None:
        resp.close()
        await listening
        watch.cancel()
        await turn.close()

    return run, done


STAGES: dict[str, Callable[[list[bytes]], Awaitable[Stage]]] = {
    "http1": _http1, "sse": _sse, "parse": _parse, "intake": _intake, "encode ws": _encode_ws,
    "encode sse": _encode_sse, "one pass (ws)": _one_pass,
}  # fmt: skip


async def _stage(name: str, reads: list[bytes], turns: int) -> tuple[float, int]:
    """CPU seconds of `turns` answers of `reads` through stage `name` (its setup untimed), and
    the tokens that came out of it."""
    cpu, out = 0.0, 0
    for _ in range(turns):
        run, done = await STAGES[name](reads)
        t0 = time.process_time()
        out += run()
        cpu += time.process_time() - t0
        await done()
    return cpu, out


async def measure(tokens: int, turns: int, reps: int) -> dict:
    """Each stage's CPU µs per token: the least of `reps` runs of `turns` answers of `tokens`."""
    reads = upstream_reads(tokens)
    rows = []
    for name in STAGES:
        best, out = float("inf"), 0
        for _ in range(reps):
            cpu, out = await _stage(name, reads, turns)
            best = min(best, cpu)
        rows.append({"stage": name, "us_per_token": best / (tokens * turns) * 1e6, "tokens_out": out})
    return {"tokens": tokens, "turns": turns, "reps": reps, "rows": rows}


def render(result: dict) -> str:
    whole = result["rows"][-1]["us_per_token"]
    lines = [f"CPU µs per streamed token, warm, in one process ({result['turns']} answers of {result['tokens']} "
             f"tokens, the least of {result['reps']} runs): `python -m tether_lab.token_path`", "",
             "| stage | µs/token | share of one pass |", "|---|---|---|"]  # fmt: skip
    for r in result["rows"]:
        lines.append(f"| {r['stage']} | {r['us_per_token']:.2f} | {r['us_per_token'] / whole:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tether_lab.token_path", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=200, help="tokens per answer")
    p.add_argument("--turns", type=int, default=500, help="answers per run")
    p.add_argument("--reps", type=int, default=5, help="runs per stage (the least is reported)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    result = asyncio.run(measure(args.tokens, args.turns, args.reps))
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
