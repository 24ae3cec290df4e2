"""How many small files are fetched at once (transfer.pacing): the rule as a table, the gate's behaviour."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from model_agent.transfer.pacing import MIN_IN_FLIGHT, WINDOW, SmallFileGate, small_files_in_flight
from tests.support.waiting import until


@pytest.mark.parametrize(
    ("waited_s", "cpu_s", "cap", "expected"),
    [
        (0.0001, 0.0008, 8, MIN_IN_FLIGHT),  # a loopback origin: the CPU is the limit, two suffice
        (0.0008, 0.0008, 8, 2),  # waiting as long as working: one waits while one works
        (0.0009, 0.0008, 8, 3),  # a little more waiting than work: rounded up
        (0.020, 0.001, 8, 8),  # an object store 20 ms away: every slot
        (0.020, 0.001, 32, 21),  # ... up to Little's law when the cap is higher
        (0.020, 0.0, 8, 8),  # no CPU measured: all waiting
        (0.0, 0.001, 1, 1),  # a downloader of one slot: one
        (0.020, 0.001, 2, 2),
    ],
)
def test_files_in_flight_follow_the_origins_wait_over_the_cpu(
    waited_s: float, cpu_s: float, cap: int, expected: int
) -> None:
    assert small_files_in_flight(waited_s, cpu_s, cap) == expected


async def _holders(
    gate: SmallFileGate, count: int, release: asyncio.Event
) -> tuple[list[asyncio.Task[None]], list[int]]:
    inside: list[int] = []

    async def hold(i: int) -> None:
        async with gate.admit():
            inside.append(i)
            await release.wait()

    tasks = [asyncio.ensure_future(hold(i)) for i in range(count)]
    return tasks, inside


async def test_the_gate_starts_at_two_and_opens_as_far_origins_are_seen() -> None:
    gate, release = SmallFileGate(cap=8), asyncio.Event()
    tasks, inside = await _holders(gate, 6, release)
    await until(lambda: len(inside) == MIN_IN_FLIGHT and len(gate._waiters) == 6 - MIN_IN_FLIGHT)

    gate.observe(waited_s=0.030, cpu_s=0.001)  # a file that waited 30 ms on its origin
    assert gate.limit == 8
    await until(lambda: len(inside) == 6)  # the waiters are let in without anyone leaving
    release.set()
    await asyncio.gather(*tasks)
    assert gate._active == 0


async def test_a_near_origin_keeps_the_gate_narrow_whatever_a_few_files_waited() -> None:
    """The least recent wait stands for the origin: files that waited for the interpreter lock or a busy core
    (contention, not distance) do not open the gate; a run of long waits (a far or slowed origin) does."""
    gate = SmallFileGate(cap=8)
    for _ in range(5):
        gate.observe(waited_s=0.0002, cpu_s=0.001)
    assert gate.limit == MIN_IN_FLIGHT
    for _ in range(WINDOW - 1):
        gate.observe(waited_s=0.004, cpu_s=0.001)
    assert gate.limit == MIN_IN_FLIGHT  # one near answer is still in the window
    gate.observe(waited_s=0.004, cpu_s=0.001)
    assert gate.limit == 5  # 1 + 4 ms waited / 1 ms of CPU


async def test_a_cancelled_waiter_holds_nothing() -> None:
    gate, release = SmallFileGate(cap=8), asyncio.Event()
    tasks, inside = await _holders(gate, 3, release)
    await until(lambda: len(inside) == 2)
    tasks[2].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await tasks[2]
    assert gate._active == 2 and not gate._waiters
    release.set()
    await asyncio.gather(*tasks[:2])
    assert gate._active == 0


async def test_a_waiter_cancelled_as_it_is_let_in_gives_its_place_on() -> None:
    gate, release = SmallFileGate(cap=8), asyncio.Event()
    tasks, inside = await _holders(gate, 4, release)
    await until(lambda: len(inside) == 2)
    gate.observe(waited_s=0.0015, cpu_s=0.001)  # room for one more: the first waiter is let in ...
    assert gate.limit == 3
    tasks[2].cancel()  # ... and cancelled before it runs
    with contextlib.suppress(asyncio.CancelledError):
        await tasks[2]
    await until(lambda: len(inside) == 3)  # its place went to the next waiter
    assert 3 in inside and 2 not in inside
    release.set()
    await asyncio.gather(*(t for i, t in enumerate(tasks) if i != 2))
    assert gate._active == 0
