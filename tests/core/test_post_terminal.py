"""A finished turn's bookkeeping after its terminal event (`PostInference.after_terminal`): paced
one per event-loop iteration, run even when its caller is cancelled, waited for by `flush()`."""

from __future__ import annotations

import asyncio

from tests.support.configs import make_config
from tether.core.postinference import PostInference
from tether.protocol import json_codec
from tether.server import build_engine
from tether.store.memory import MemoryStore


class Iterations:
    """Counts event-loop iterations: one step per iteration, always ready."""

    def __init__(self) -> None:
        self.n = 0
        self._task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            self.n += 1
            await asyncio.sleep(0)

    def stop(self) -> None:
        self._task.cancel()


async def test_turns_ending_together_run_their_bookkeeping_one_per_iteration_in_order() -> None:
    post = PostInference(MemoryStore())
    clock = Iterations()
    ran: list[tuple[int, int]] = []
    try:
        # Ten callers that become ready in the same iteration (turns whose last chunk came together).
        await asyncio.gather(*(post.after_terminal(lambda i=i: ran.append((i, clock.n))) for i in range(10)))
    finally:
        clock.stop()
        await post.aclose()
    assert [i for i, _ in ran] == list(range(10))
    at = [n for _, n in ran]
    assert all(b > a for a, b in zip(at, at[1:], strict=False)), at  # never two in one iteration


async def test_the_work_runs_when_its_caller_is_cancelled_and_flush_waits_for_it() -> None:
    post = PostInference(MemoryStore())
    ran: list[str] = []
    try:
        # A first caller occupies the pacer, so the second's work is still queued when it is cancelled.
        first = asyncio.create_task(post.after_terminal(lambda: ran.append("first")))
        second = asyncio.create_task(post.after_terminal(lambda: ran.append("second")))
        await asyncio.sleep(0)
        second.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
        assert second.cancelled()
        await asyncio.wait_for(post.flush(), 5)
        assert ran == ["first", "second"]
    finally:
        await post.aclose()


async def test_the_works_error_reaches_its_caller_and_pacing_goes_on() -> None:
    post = PostInference(MemoryStore())
    ran: list[str] = []

    def broken() -> None:
        raise ValueError("bookkeeping bug")

    try:
        failed, ok = await asyncio.gather(post.after_terminal(broken), post.after_terminal(lambda: ran.append("next")),
                                          return_exceptions=True)  # fmt: skip
        assert isinstance(failed, ValueError) and ok is None
        assert ran == ["next"]
        await asyncio.wait_for(post.flush(), 5)
    finally:
        await post.aclose()


async def test_responses_are_stored_when_their_clients_hang_up_right_after_the_terminal_event() -> None:
    """Twenty sessions end together and close as soon as their terminal event arrives, while the
    paced bookkeeping of most of them is still queued: every response is stored all the same."""
    engine = await build_engine(make_config())
    try:

        async def one() -> str:
            session = await engine.open_session("", transport="websocket")
            events = session.events()
            await session.send(json_codec.client_event_from_json(
                {"type": "response.create", "model": "m", "input": "hi", "store": True}))  # fmt: skip
            while True:
                for ev in await anext(events):
                    if ev.WhichOneof("event") == "completed":
                        await session.close()  # at once
                        return ev.completed.response.id

        ids = await asyncio.gather(*(one() for _ in range(20)))
        await asyncio.wait_for(engine.post.flush(), 10)
        missing = [rid for rid in ids if await engine.store.get_response("", rid) is None]
        assert not missing
    finally:
        await engine.aclose()
