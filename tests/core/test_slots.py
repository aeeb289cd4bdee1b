"""Background slots shared fairly between keys (tether/core/slots.py): the pure order, then the
waiters on a loop."""

from __future__ import annotations

import asyncio

import pytest

from tether.core.slots import BackgroundSlots, FairSlots, per_key_cap


def test_the_per_key_cap_is_a_share_of_the_slots_and_at_least_one() -> None:
    assert per_key_cap(64, 0.5) == 32
    assert per_key_cap(1, 0.5) == 1
    assert per_key_cap(4, 1.0) == 4
    assert per_key_cap(3, 0.1) == 1


def test_a_key_at_its_cap_leaves_the_other_slots_to_other_keys() -> None:
    slots = FairSlots(total=4, per_key=2)
    for _ in range(2):
        assert slots.can_take("a")
        slots.take("a")
    assert not slots.can_take("a") and slots.can_take("b")
    slots.wait("a")
    assert slots.next_grant() is None  # a free slot, but "a" is at its cap
    ticket = slots.wait("b")
    assert slots.next_grant() == ("b", ticket)


def test_a_freed_slot_goes_to_the_key_running_the_fewest_before_older_waiters() -> None:
    slots = FairSlots(total=2, per_key=2)
    slots.take("a")
    slots.take("a")
    older = [slots.wait("a") for _ in range(5)]
    other = slots.wait("b")
    slots.release("a")  # one slot turnover
    assert slots.next_grant() == ("b", other)  # "b" runs none: it goes first, whatever "a" has queued
    slots.release("a")
    assert slots.next_grant() == ("a", older[0])
    assert slots.next_grant() is None


def test_a_waiter_that_leaves_is_never_granted() -> None:
    slots = FairSlots(total=1, per_key=1)
    slots.take("a")
    gone = slots.wait("b")
    kept = slots.wait("c")
    slots.leave("b", gone)
    slots.release("a")
    assert slots.next_grant() == ("c", kept)


async def test_background_slots_serve_waiters_fairly_and_survive_cancels() -> None:
    slots = BackgroundSlots(total=2, per_key=2)
    order: list[str] = []
    release = asyncio.Event()

    async def run(key: str) -> None:
        async with slots.hold(key):
            order.append(key)
            await release.wait()

    holding = [asyncio.create_task(run("a")) for _ in range(2)]
    await asyncio.sleep(0)
    queued_a = asyncio.create_task(run("a"))
    cancelled_b = asyncio.create_task(run("b"))
    queued_c = asyncio.create_task(run("c"))
    await asyncio.sleep(0)
    cancelled_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled_b
    release.set()
    await asyncio.gather(*holding, queued_a, queued_c)
    assert order == ["a", "a", "c", "a"]  # "c" (running none) before a's third run; "b" gave up
    assert slots.fair.in_use == 0 and not slots.fair.has_waiters


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_key_share_outside_zero_to_one_is_refused_at_config_load(share: float) -> None:
    from tether.config import from_dict

    assert from_dict({"limits": {"background_key_share": 1.0}}).limits.background_key_share == 1.0
    with pytest.raises(ValueError, match="background_key_share"):
        from_dict({"limits": {"background_key_share": share}})


async def test_a_waiter_cancelled_as_its_slot_frees_gives_the_slot_back() -> None:
    """The slot frees (its holder ends) after a waiter's task was cancelled but before that task
    has run its handler: the grant skips the cancelled waiter and the slot goes on."""
    slots = BackgroundSlots(total=1, per_key=1)
    release = asyncio.Event()

    async def run(key: str) -> None:
        async with slots.hold(key):
            await release.wait()

    holder = asyncio.create_task(run("a"))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(run("b"))
    later = asyncio.create_task(run("c"))
    await asyncio.sleep(0)
    release.set()  # the holder wakes first ...
    waiter.cancel()  # ... and its release finds this waiter's future cancelled
    await holder
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await later  # got the slot
    assert slots.fair.in_use == 0 and not slots.fair.has_waiters
