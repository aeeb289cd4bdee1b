"""`tether_lab.hotpath.SpinningSelector`: polls through a short wait, then blocks; returns what is
ready either way, and an asyncio loop runs on it."""

from __future__ import annotations

import asyncio
import selectors
import socket

from tether_lab.hotpath import SpinningSelector


def test_it_returns_what_is_ready_while_spinning_after_it_and_nothing_at_the_timeout() -> None:
    a, b = socket.socketpair()
    sel = SpinningSelector(0.002)
    try:
        sel.register(a, selectors.EVENT_READ)
        assert sel.select(0.05) == []  # nothing came: the spin, then the blocking rest, then []
        b.send(b"x")
        assert [key.fileobj for key, _ in sel.select(1.0)] == [a]  # ready: found while spinning
        assert [key.fileobj for key, _ in sel.select(0)] == [a]  # a zero timeout polls once
    finally:
        sel.close()
        a.close()
        b.close()


def test_an_asyncio_loop_runs_timers_and_sockets_on_it() -> None:
    async def main() -> bytes:
        await asyncio.sleep(0.01)  # a wait longer than the spin: spins, then blocks
        reader, writer = await asyncio.open_unix_connection(sock=pair[0])
        pair[1].send(b"ping")
        data = await asyncio.wait_for(reader.read(4), 5)
        writer.close()
        return data

    pair = socket.socketpair()
    try:
        with asyncio.Runner(
            loop_factory=lambda: asyncio.SelectorEventLoop(SpinningSelector(0.002))
        ) as runner:
            assert runner.run(main()) == b"ping"
    finally:
        pair[1].close()
