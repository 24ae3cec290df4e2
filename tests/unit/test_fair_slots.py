"""Fair download slots: a tenant cannot hold every worker; freed slots go to the group holding the fewest."""

from __future__ import annotations

import asyncio

import pytest

from model_agent.agent.fair_slots import CLUSTER_GROUP, FairSlots


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_namespace_leaves_a_slot_for_others() -> None:
    slots = FairSlots(2)
    await slots.acquire("team-evil")
    blocked = asyncio.ensure_future(slots.acquire("team-evil"))
    await _settle()
    assert not blocked.done() and slots.in_use == 1  # capped at total - 1 = 1
    await asyncio.wait_for(slots.acquire("team-a"), timeout=1)  # another tenant still gets the free slot
    assert slots.in_use == 2
    blocked.cancel()


async def test_cluster_models_are_not_capped() -> None:
    slots = FairSlots(3)
    for _ in range(3):
        await asyncio.wait_for(slots.acquire(CLUSTER_GROUP), timeout=1)
    assert slots.held(CLUSTER_GROUP) == 3


async def test_a_freed_slot_goes_to_the_group_holding_the_fewest() -> None:
    slots = FairSlots(3, per_group=3)
    for _ in range(3):
        await slots.acquire("big")
    order: list[str] = []

    async def wait(group: str) -> None:
        await slots.acquire(group)
        order.append(group)

    waiters = [asyncio.ensure_future(wait(g)) for g in ("big", "big", "small")]
    await _settle()
    slots._release("big")  # one slot frees: "small" (holding 0) goes before the older "big" waiters
    await _settle()
    assert order == ["small"]
    slots._release("big")
    await _settle()
    assert order == ["small", "big"]
    for w in waiters:
        w.cancel()


async def test_a_cancelled_waiter_takes_no_slot() -> None:
    slots = FairSlots(1)
    await slots.acquire("a")
    waiter = asyncio.ensure_future(slots.acquire("b"))
    await _settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    slots._release("a")
    assert slots.in_use == 0
    await asyncio.wait_for(slots.acquire("c"), timeout=1)


async def test_the_context_manager_releases_once_even_on_error() -> None:
    slots = FairSlots(1)
    with pytest.raises(RuntimeError):
        async with slots.slot("a"):
            assert slots.in_use == 1
            raise RuntimeError("boom")
    assert slots.in_use == 0


async def test_a_hold_stepping_away_queues_again_and_a_cancel_there_releases_nothing() -> None:
    slots = FairSlots(1)
    entered = asyncio.Event()

    async def holder() -> None:
        async with slots.hold("") as hold, hold.away():
            assert slots.in_use == 0  # the slot is free while it waits on someone else
            async with slots.slot("ns"):  # another job takes it meanwhile
                entered.set()
                await asyncio.sleep(3600)

    task = asyncio.create_task(holder())
    await asyncio.wait_for(entered.wait(), 5)
    assert slots.in_use == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert slots.in_use == 0  # cancelled while away (and queued to take one again): nothing held, nothing owed
    async with slots.hold("ns") as hold:
        assert hold.held and slots.in_use == 1
        async with hold.away():
            assert slots.in_use == 0
        assert hold.held and slots.in_use == 1
    assert slots.in_use == 0
