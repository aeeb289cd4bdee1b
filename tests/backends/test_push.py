"""A streamed response's runs handed to the caller's `RunSink` in the step that read them
(tether/backends/chat_completions.py `_Push`, tether/backends/base.py `RunSink`), against the fake
chat server on loopback: which runs are pushed and which yielded, a sink that asks for its task,
failures and stalls met while pushing, and a stream closed while it pushes."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.fakes import chat_server as fk
from tests.fakes.items import request
from tether.backends.base import BackendError, Chunk, Finish, TextDelta
from tether.backends.registry import build_backend

FAST = {"api_key": "test-key", "max_retries": 0, "dialect": "cerebras"}


def backend(base_url: str, **options):
    return build_backend("push-test", "openai", {"base_url": base_url, **FAST, **options})


class RecordingSink:
    """Takes every run; records each with whether it came in a task's step (None: a callback's)."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.taken: list[tuple[list[Chunk], asyncio.Task | None]] = []
        self.refuse = refuse or set()  # the takes (by number) that ask for the owner's task

    def take(self, run: list[Chunk]) -> bool:
        self.taken.append((run, asyncio.current_task()))
        return len(self.taken) not in self.refuse


def text(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


async def read(b, sink, **kw) -> list[list[Chunk]]:
    req = request("hi", **kw)
    req.sink = sink
    return [run async for run in b.stream_runs(req)]


async def test_the_runs_between_the_first_and_the_last_are_pushed_in_the_socket_callback(fake_chat_server):
    b = backend(fake_chat_server.base_url)
    try:
        fake_chat_server.push(fk.paced(6, 0.02))
        sink = RecordingSink()
        yielded = await read(b, sink)
        # The first run and the last (its Finish) come through the generator, for a pool's failover
        # and tagging; every paced token between them was handed over as it was read.
        # (Tokens 20 ms apart are each a read of their own, unless the machine stalls for longer.)
        assert text(yielded[0]).startswith(" w0") and isinstance(yielded[-1][-1], Finish) and len(yielded) == 2
        pushed = [text(run) for run, _ in sink.taken]
        assert text(yielded[0]) + "".join(pushed) == " w0 w1 w2 w3 w4 w5" and len(pushed) >= 3
        assert all(task is None for _, task in sink.taken)  # in the connection's data_received, no task
        assert [] not in yielded
        # Without a sink the same stream is all yielded.
        fake_chat_server.push(fk.paced(6, 0.02))
        plain = [run async for run in b.stream_runs(request("hi"))]
        assert text([c for run in plain for c in run]) == " w0 w1 w2 w3 w4 w5"
    finally:
        await b.aclose()


async def test_a_sink_that_asks_for_its_task_gets_an_empty_run_then_more_pushes(fake_chat_server):
    b = backend(fake_chat_server.base_url)
    try:
        fake_chat_server.push(fk.paced(6, 0.02))
        sink = RecordingSink(refuse={2})
        yielded = await read(b, sink)
        # The first run, the owner's turn (after the second take), the end; pushes go on after it.
        assert len(yielded) == 3 and yielded[1] == [] and isinstance(yielded[2][-1], Finish)
        pushed = [text(run) for run, _ in sink.taken]
        assert text(yielded[0]) + "".join(pushed) == " w0 w1 w2 w3 w4 w5" and len(pushed) >= 3
    finally:
        await b.aclose()


async def test_an_upstream_error_after_pushed_tokens_fails_the_stream(fake_chat_server):
    b = backend(fake_chat_server.base_url)
    try:
        fake_chat_server.push(fk.mid_stream_error(503, "overloaded", content="one two three four"))
        sink = RecordingSink()
        with pytest.raises(BackendError) as ei:
            await read(b, sink)
        assert ei.value.status == 503 and "overloaded" in ei.value.message
    finally:
        await b.aclose()


async def test_a_stall_while_pushing_times_out_and_a_closed_stream_releases_its_connection(fake_chat_server):
    b = backend(fake_chat_server.base_url, stream_idle_timeout_s=0.3, max_connections=1)
    try:
        paced_then_silent = [fk.chunk({"content": "a"}), fk.Pause(0.05), fk.chunk({"content": "b"}), fk.Pause(5),
                             fk.chunk({}, "stop"), "data: [DONE]\n\n"]  # fmt: skip
        fake_chat_server.push(lambda req: fk.Reply(200, {}, sse=paced_then_silent))
        sink = RecordingSink()
        t0 = time.monotonic()
        with pytest.raises(BackendError) as ei:
            await read(b, sink)
        assert ei.value.code == "backend_timeout" and 0.25 <= time.monotonic() - t0 < 3
        assert [text(run) for run, _ in sink.taken] == ["b"]  # it was pushing when the upstream went silent
        # Closed while pushing (the turn cancelled): the one connection is free for the next call.
        fake_chat_server.push(fk.paced(50, 0.02))
        req = request("hi")
        req.sink = RecordingSink()
        stream = b.stream_runs(req)
        await anext(stream)
        await asyncio.sleep(0.1)
        await stream.aclose()
        fake_chat_server.push(fk.paced(3, 0.01))
        runs = await asyncio.wait_for(read(b, RecordingSink()), 5)
        assert isinstance(runs[-1][-1], Finish)
    finally:
        await b.aclose()


async def test_a_body_that_ends_in_the_read_that_pushed_its_last_token_ends_the_stream():
    """The last token and the end of the chunked body in one network read, without `[DONE]`: the
    stream fails at once as a stream that ended early (not, much later, as a stalled one)."""

    served = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # discovery and warming are answered 404; the chat call is streamed
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"POST"):
                break
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(4):
            if i:
                await asyncio.sleep(0.03)  # each token a read of its own
            frame = fk._frame_bytes(fk.chunk({"content": f" t{i}"}))
            end = b"0\r\n\r\n" if i == 3 else b""
            writer.write(b"%x\r\n%s\r\n%s" % (len(frame), frame, end))  # the last with the body's end
        await reader.read()  # until the client lets go
        writer.close()
        served.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    b = backend(f"http://127.0.0.1:{port}/v1", stream_idle_timeout_s=5, api_key="k")
    try:
        sink = RecordingSink()
        t0 = time.monotonic()
        with pytest.raises(BackendError) as ei:
            await read(b, sink)
        assert ei.value.code == "backend_error" and "without [DONE]" in ei.value.message
        assert time.monotonic() - t0 < 2  # not the 5 s idle timeout
        assert " t3" in [text(run) for run, _ in sink.taken]  # the last token was pushed
    finally:
        await b.aclose()
        await asyncio.wait_for(served.wait(), 5)
        server.close()


def test_the_upstream_client_streams_on_uvloop(fake_chat_server):
    """uvloop calls a protocol's `connection_made` a step after `create_connection` returns."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[list[list[Chunk]], RecordingSink]:
        b = backend(fake_chat_server.base_url)
        try:
            sink = RecordingSink()
            return await read(b, sink), sink
        finally:
            await b.aclose()

    fake_chat_server.push(fk.paced(4, 0.02))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        yielded, sink = runner.run(main())
    assert text([c for run in yielded for c in run] + [c for run, _ in sink.taken for c in run]) == " w0 w1 w2 w3"
    assert isinstance(yielded[-1][-1], Finish)
