"""Unit tests for the asyncio work queue (client-go ``util/workqueue`` semantics).

Nothing here sleeps to synchronise: tests wait for conditions with deadlines, and delayed adds use small
delays whose *order* is asserted, never their duration.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest

from model_agent.kube.workqueue import ShutDown, WorkQueue

DEADLINE_S = 2.0


class FixedRandom(random.Random):
    """A ``random.Random`` whose ``random()`` always returns ``value`` (pins the jitter factor)."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


async def get(q: WorkQueue[str]) -> str:
    return await asyncio.wait_for(q.get(), DEADLINE_S)


async def blocked_getter(q: WorkQueue[str]) -> asyncio.Task[str]:
    """Start a task calling ``q.get()`` and return once it is parked inside ``get`` (or finished)."""
    entered = asyncio.Event()

    async def run() -> str:
        entered.set()
        return await q.get()  # runs synchronously up to its first suspension, in the same step

    task = asyncio.create_task(run())
    await asyncio.wait_for(entered.wait(), DEADLINE_S)
    return task


# ------------------------------------------------------------------------------------------ basics


async def test_fifo_and_dedup_of_waiting_keys() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ["a", "b", "a", "c", "b", "a"]:
        q.add(key)
    assert len(q) == 3 and q.depth == 3
    assert [await get(q), await get(q), await get(q)] == ["a", "b", "c"]
    assert len(q) == 0 and q.processing_count == 3
    for key in "abc":
        q.done(key)
    assert q.processing_count == 0
    q.shutdown()


async def test_key_added_during_processing_is_processed_once_more_after_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert await get(q) == "a"
    for _ in range(5):
        q.add("a")
    # Not handed out while processing: another getter gets "b" instead.
    assert len(q) == 0
    q.add("b")
    assert await get(q) == "b"
    waiting = await blocked_getter(q)
    assert not waiting.done()
    q.done("a")
    assert await asyncio.wait_for(waiting, DEADLINE_S) == "a"
    q.done("a")
    q.done("b")
    assert len(q) == 0 and q.processing_count == 0
    q.shutdown()


async def test_done_for_a_key_not_processing_raises() -> None:
    q: WorkQueue[str] = WorkQueue()
    with pytest.raises(ValueError):
        q.done("never")
    q.add("a")
    assert await get(q) == "a"
    q.done("a")
    with pytest.raises(ValueError):
        q.done("a")
    q.shutdown()


async def test_get_waits_for_an_add() -> None:
    q: WorkQueue[str] = WorkQueue()
    task = await blocked_getter(q)
    assert not task.done()
    q.add("x")
    assert await asyncio.wait_for(task, DEADLINE_S) == "x"
    q.done("x")
    q.shutdown()


async def test_cancelled_getter_passes_its_wakeup_on() -> None:
    q: WorkQueue[str] = WorkQueue()
    first = await blocked_getter(q)
    second = await blocked_getter(q)
    q.add("a")  # wakes `first` ...
    first.cancel()  # ... which is cancelled before it can take the key
    assert await asyncio.wait_for(second, DEADLINE_S) == "a"
    with pytest.raises(asyncio.CancelledError):
        await first
    q.done("a")
    q.shutdown()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_no_key_is_processed_by_two_of_eight_workers_at_once(seed: int) -> None:
    rng = random.Random(seed)
    q: WorkQueue[str] = WorkQueue()
    keys = [f"k{i}" for i in range(6)]
    active: set[str] = set()
    violations: list[str] = []
    clock = itertools.count()
    last_add: dict[str, int] = {}
    last_start: dict[str, int] = {}
    processed = 0

    def add(key: str) -> None:
        if not q.shutting_down:
            last_add[key] = next(clock)
        q.add(key)

    async def worker() -> None:
        nonlocal processed
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            if key in active:
                violations.append(key)
            active.add(key)
            last_start[key] = next(clock)
            try:
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)  # simulated work: yield to other workers
                    if rng.random() < 0.3:
                        add(rng.choice(keys))  # includes re-adding the key being processed
            finally:
                active.discard(key)
                processed += 1
                q.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    for _ in range(300):
        add(rng.choice(keys))
        if rng.random() < 0.5:
            await asyncio.sleep(0)
    assert await asyncio.wait_for(q.shutdown_with_drain(DEADLINE_S), DEADLINE_S * 2) is True
    await asyncio.wait_for(asyncio.gather(*workers), DEADLINE_S)

    assert violations == []
    assert processed > 0
    # Every accepted add was followed by a processing of that key.
    for key, added in last_add.items():
        assert last_start[key] > added, key
    assert q.processing_count == 0 and len(q) == 0


# ------------------------------------------------------------------------------------------ delays


async def test_add_after_hands_keys_out_in_deadline_order() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("c", 0.05)
    q.add_after("a", 0.01)
    q.add_after("b", 0.03)
    assert len(q) == 0 and q.delayed_count == 3
    assert [await get(q), await get(q), await get(q)] == ["a", "b", "c"]
    assert q.delayed_count == 0
    q.shutdown()


async def test_add_after_dedups_and_the_earliest_deadline_wins() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("a", 0.04)
    q.add_after("a", 0.01)  # earlier: replaces
    q.add_after("a", 0.03)  # later: ignored
    q.add_after("b", 0.02)
    q.add_after("z", 0.06)  # sentinel after every "a" deadline
    assert q.delayed_count == 3
    assert await get(q) == "a"
    q.done("a")
    assert await get(q) == "b"
    q.done("b")
    # Had a superseded deadline fired, "a" would come before the sentinel.
    assert await get(q) == "z"
    assert q.delayed_count == 0 and len(q) == 0
    q.done("z")
    q.shutdown()


async def test_add_after_without_delay_adds_now() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("a", 0)
    q.add_after("b", -1)
    assert len(q) == 2 and q.delayed_count == 0
    q.shutdown()


async def test_delayed_add_of_a_waiting_key_is_deduplicated() -> None:
    z_added = asyncio.Event()
    q: WorkQueue[str] = WorkQueue(on_add=lambda key: z_added.set() if key == "z" else None)
    q.add("a")
    q.add_after("a", 0.01)
    q.add_after("z", 0.03)
    await asyncio.wait_for(z_added.wait(), DEADLINE_S)
    assert q.delayed_count == 0
    # The delayed "a" fired while "a" was still waiting: deduplicated, so "a" keeps its place.
    assert len(q) == 2
    assert [await get(q), await get(q)] == ["a", "z"]
    q.shutdown()


# ------------------------------------------------------------------------------------------ backoff


async def test_backoff_doubles_from_one_second_to_the_cap() -> None:
    q: WorkQueue[str] = WorkQueue(rng=FixedRandom(0.5))  # factor exactly 1: no jitter
    delays = [q.add_rate_limited("a") for _ in range(12)]
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    assert q.num_requeues("a") == 12
    assert q.delayed_count == 1  # one pending add, the earliest deadline
    q.shutdown()


async def test_backoff_jitter_stays_within_twenty_percent_and_the_cap() -> None:
    q: WorkQueue[str] = WorkQueue(rng=random.Random(1234))
    for n in range(14):
        nominal = min(300.0, 2.0**n)
        delay = q.add_rate_limited("a")
        assert 0.8 * nominal <= delay <= min(300.0, 1.2 * nominal), (n, delay)
    low: WorkQueue[str] = WorkQueue(rng=FixedRandom(0.0))
    high: WorkQueue[str] = WorkQueue(rng=FixedRandom(0.999999))
    assert [low.add_rate_limited("a") for _ in range(3)] == pytest.approx([0.8, 1.6, 3.2])
    assert [high.add_rate_limited("a") for _ in range(3)] == pytest.approx([1.2, 2.4, 4.8], rel=1e-5)
    for _ in range(10):
        assert high.add_rate_limited("a") <= 300.0
    for queue in (q, low, high):
        queue.shutdown()


async def test_backoff_is_deterministic_with_a_seeded_rng_and_configurable() -> None:
    one: WorkQueue[str] = WorkQueue(base_delay_s=0.5, max_delay_s=3.0, rng=random.Random(7))
    two: WorkQueue[str] = WorkQueue(base_delay_s=0.5, max_delay_s=3.0, rng=random.Random(7))
    seq_one = [one.add_rate_limited("a") for _ in range(6)]
    assert seq_one == [two.add_rate_limited("a") for _ in range(6)]
    assert all(d <= 3.0 for d in seq_one) and seq_one[0] >= 0.4
    exact: WorkQueue[str] = WorkQueue(base_delay_s=0.5, max_delay_s=3.0, jitter=0)
    assert [exact.add_rate_limited("a") for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    for queue in (one, two, exact):
        queue.shutdown()


async def test_forget_resets_the_backoff_per_key() -> None:
    q: WorkQueue[str] = WorkQueue(rng=FixedRandom(0.5))
    for _ in range(4):
        q.add_rate_limited("a")
    q.add_rate_limited("b")
    assert (q.num_requeues("a"), q.num_requeues("b")) == (4, 1)
    q.forget("a")
    assert q.num_requeues("a") == 0
    assert q.add_rate_limited("a") == 1
    assert q.add_rate_limited("b") == 2  # untouched by forgetting "a"
    q.forget("unknown")
    q.shutdown()


async def test_rate_limited_add_hands_the_key_out_after_its_delay() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay_s=0.01, max_delay_s=0.05)
    q.add_rate_limited("a")
    assert len(q) == 0
    assert await get(q) == "a"
    assert q.num_requeues("a") == 1
    q.done("a")
    q.shutdown()


def test_constructor_rejects_bad_backoff_settings() -> None:
    with pytest.raises(ValueError):
        WorkQueue(base_delay_s=0)
    with pytest.raises(ValueError):
        WorkQueue(base_delay_s=2, max_delay_s=1)
    with pytest.raises(ValueError):
        WorkQueue(jitter=1.0)


# ------------------------------------------------------------------------------------------ shutdown


async def test_shutdown_wakes_every_getter_and_ignores_adds() -> None:
    q: WorkQueue[str] = WorkQueue()
    getters = [await blocked_getter(q) for _ in range(4)]
    assert not any(t.done() for t in getters)
    q.shutdown()
    results = await asyncio.wait_for(asyncio.gather(*getters, return_exceptions=True), DEADLINE_S)
    assert all(isinstance(r, ShutDown) for r in results)
    q.add("a")
    q.add_after("b", 0.01)
    q.add_rate_limited("c")
    assert len(q) == 0 and q.delayed_count == 0
    with pytest.raises(ShutDown):
        await get(q)
    q.shutdown()  # idempotent


async def test_shutdown_drops_ready_keys_but_accepts_done_for_keys_in_flight() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("b")
    assert await get(q) == "a"
    q.add("a")  # re-added during processing
    q.shutdown()
    assert len(q) == 0
    with pytest.raises(ShutDown):
        await get(q)
    assert q.processing_count == 1
    q.done("a")  # accepted, not requeued
    assert q.processing_count == 0 and len(q) == 0


async def test_drain_hands_out_ready_keys_and_waits_for_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("b")
    assert await get(q) == "a"
    q.add("a")  # dirty while processing: must still be processed during the drain
    q.add_after("later", 0.01)  # dropped at shutdown
    started = asyncio.Event()

    async def drain_queue() -> bool:
        started.set()
        return await q.shutdown_with_drain(DEADLINE_S)  # shuts down before its first suspension

    drain = asyncio.create_task(drain_queue())
    await asyncio.wait_for(started.wait(), DEADLINE_S)
    assert q.shutting_down
    assert q.delayed_count == 0
    q.add("new")  # rejected
    assert len(q) == 1
    assert await get(q) == "b"
    q.done("b")
    assert not drain.done()
    q.done("a")  # requeues "a"
    assert await get(q) == "a"
    assert not drain.done()
    with pytest.raises(ShutDown):
        await get(q)  # nothing ready while "a" is processing
    q.done("a")
    assert await asyncio.wait_for(drain, DEADLINE_S) is True
    with pytest.raises(ShutDown):
        await get(q)


async def test_drain_of_an_idle_queue_returns_at_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    assert await asyncio.wait_for(q.shutdown_with_drain(DEADLINE_S), DEADLINE_S) is True
    assert q.shutting_down


async def test_drain_honours_its_timeout() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("stuck")
    q.add("never-taken")
    assert await get(q) == "stuck"
    assert await asyncio.wait_for(q.shutdown_with_drain(0.02), DEADLINE_S) is False
    # The queue ends fully shut down: the ready key was dropped, the in-flight one may still finish.
    assert len(q) == 0
    with pytest.raises(ShutDown):
        await get(q)
    q.done("stuck")
    assert q.processing_count == 0


async def test_drain_wakes_idle_getters_with_shutdown() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert await get(q) == "a"
    idle = await blocked_getter(q)
    drain = asyncio.create_task(q.shutdown_with_drain(DEADLINE_S))
    with pytest.raises(ShutDown):
        await asyncio.wait_for(idle, DEADLINE_S)
    q.done("a")
    assert await asyncio.wait_for(drain, DEADLINE_S) is True


async def test_shutdown_leaks_no_task_and_no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    handles: list[asyncio.TimerHandle] = []
    real_call_at = loop.call_at

    def spy(when: float, callback: Callable[..., object], *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        handle = real_call_at(when, callback, *args, **kwargs)
        handles.append(handle)
        return handle

    monkeypatch.setattr(loop, "call_at", spy)
    before = asyncio.all_tasks()

    q: WorkQueue[str] = WorkQueue(base_delay_s=10)
    q.add_after("a", 30)
    q.add_after("b", 20)  # re-arms the timer for the earlier deadline
    q.add_rate_limited("c")
    q.add("d")
    getters = [await blocked_getter(q) for _ in range(2)]
    assert await asyncio.wait_for(getters[0], DEADLINE_S) == "d"
    q.done("d")
    assert handles and q.delayed_count == 3
    assert await asyncio.wait_for(q.shutdown_with_drain(DEADLINE_S), DEADLINE_S) is True
    with pytest.raises(ShutDown):
        await asyncio.wait_for(getters[1], DEADLINE_S)

    assert q.delayed_count == 0
    assert all(h.cancelled() for h in handles)
    assert asyncio.all_tasks() - before == set()


async def test_shutdown_while_a_delayed_add_is_due_drops_it() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("a", 0.01)
    q.shutdown()
    with pytest.raises(ShutDown):
        await get(q)
    assert q.delayed_count == 0 and len(q) == 0


# ------------------------------------------------------------------------------------------ metrics


async def test_metric_hooks_observe_adds_wait_and_processing() -> None:
    adds: list[str] = []
    waits: list[tuple[str, float]] = []
    processed: list[tuple[str, float]] = []
    q: WorkQueue[str] = WorkQueue(
        on_add=adds.append,
        on_wait=lambda key, s: waits.append((key, s)),
        on_processed=lambda key, s: processed.append((key, s)),
    )
    q.add("a")
    q.add("a")  # deduplicated: not observed
    q.add("b")
    assert await get(q) == "a"
    q.add("a")  # accepted while processing: observed
    q.done("a")
    assert await get(q) == "b"
    q.done("b")
    q.shutdown()
    q.add("c")  # ignored: not observed
    assert adds == ["a", "b", "a"]
    assert [k for k, _ in waits] == ["a", "b"] and all(s >= 0 for _, s in waits)
    assert [k for k, _ in processed] == ["a", "b"] and all(s >= 0 for _, s in processed)


async def test_a_failing_hook_does_not_disturb_the_queue() -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("metrics backend down")

    q: WorkQueue[str] = WorkQueue(on_add=boom, on_wait=boom, on_processed=boom)
    q.add("a")
    assert len(q) == 1
    assert await get(q) == "a"
    assert q.processing_count == 1
    q.done("a")
    assert q.processing_count == 0
    q.shutdown()


# ------------------------------------------------------------------------------------------ lanes


async def test_urgent_keys_are_handed_out_before_normal_ones() -> None:
    urgent = {"gone-1", "gone-2"}
    q: WorkQueue[str] = WorkQueue(urgent=urgent.__contains__)
    for key in ("a", "gone-1", "b", "gone-2"):
        q.add(key)
    assert [await get(q) for _ in range(4)] == ["gone-1", "gone-2", "a", "b"]
    q.shutdown()


async def test_an_urgent_only_getter_waits_past_normal_keys_and_takes_the_urgent_one() -> None:
    urgent: set[str] = set()
    q: WorkQueue[str] = WorkQueue(urgent=urgent.__contains__)
    lane = await blocked_getter_urgent(q)
    q.add("a")
    q.add("b")
    assert not lane.done()
    assert await get(q) == "a"  # a general getter takes the normal key
    urgent.add("gone")
    q.add("gone")
    assert await asyncio.wait_for(lane, DEADLINE_S) == "gone"
    assert await get(q) == "b"
    q.shutdown()
    with pytest.raises(ShutDown):
        await q.get(urgent_only=True)


async def test_a_waiting_key_that_becomes_urgent_moves_to_the_urgent_lane() -> None:
    urgent: set[str] = set()
    q: WorkQueue[str] = WorkQueue(urgent=urgent.__contains__)
    for key in ("a", "b", "c"):
        q.add(key)
    urgent.add("c")  # its delete arrived while it waited in line
    q.add("c")
    assert len(q) == 3  # still once
    assert await asyncio.wait_for(q.get(urgent_only=True), DEADLINE_S) == "c"
    assert [await get(q) for _ in range(2)] == ["a", "b"]
    q.shutdown()


async def test_a_key_requeued_by_done_is_classified_again() -> None:
    urgent: set[str] = set()
    q: WorkQueue[str] = WorkQueue(urgent=urgent.__contains__)
    q.add("m")
    assert await get(q) == "m"
    q.add("m")  # changed while processing
    urgent.add("m")  # ... into a delete
    q.done("m")
    assert await asyncio.wait_for(q.get(urgent_only=True), DEADLINE_S) == "m"
    q.done("m")
    q.shutdown()


async def test_a_failing_classifier_counts_the_key_as_normal() -> None:
    def broken(key: str) -> bool:
        raise RuntimeError("boom")

    q: WorkQueue[str] = WorkQueue(urgent=broken)
    q.add("a")
    assert await get(q) == "a"
    q.shutdown()


async def blocked_getter_urgent(q: WorkQueue[str]) -> asyncio.Task[str]:
    entered = asyncio.Event()

    async def run() -> str:
        entered.set()
        return await q.get(urgent_only=True)

    task = asyncio.create_task(run())
    await asyncio.wait_for(entered.wait(), DEADLINE_S)
    return task


@pytest.mark.parametrize("seed", range(8))
async def test_lanes_keep_every_queue_guarantee_under_random_interleavings(seed: int) -> None:
    """Random adds, urgency flips and processing by 2 urgent-only and 4 general workers: no key is processed by two
    workers at once, every accepted add is followed by a processing, and while every general worker is held, urgent
    keys still flow through the lane."""
    rng = random.Random(seed)
    urgent: set[str] = set()
    q: WorkQueue[str] = WorkQueue(urgent=urgent.__contains__)
    keys = [f"k{i}" for i in range(10)]
    active: set[str] = set()
    violations: list[str] = []
    clock = itertools.count()
    last_add: dict[str, int] = {}
    last_start: dict[str, int] = {}
    lane_keys: list[str] = []
    hold = asyncio.Event()  # general workers block on it for the first phase

    def add(key: str) -> None:
        if rng.random() < 0.3:
            urgent.symmetric_difference_update({key})
        if not q.shutting_down:
            last_add[key] = next(clock)
        q.add(key)

    async def worker(urgent_only: bool) -> None:
        while True:
            try:
                key = await q.get(urgent_only=urgent_only)
            except ShutDown:
                return
            if urgent_only:
                lane_keys.append(key)
            if key in active:
                violations.append(key)
            active.add(key)
            last_start[key] = next(clock)
            try:
                if not urgent_only:
                    await hold.wait()
                for _ in range(rng.randrange(4)):
                    await asyncio.sleep(0)
                    if rng.random() < 0.3:
                        add(rng.choice(keys))
            finally:
                active.discard(key)
                q.done(key)

    lane = [asyncio.create_task(worker(True)) for _ in range(2)]
    general = [asyncio.create_task(worker(False)) for _ in range(4)]
    for _ in range(200):
        add(rng.choice(keys))
        if rng.random() < 0.5:
            await asyncio.sleep(0)
    # General workers are held: only the lane moves. Every urgent key not held by a general worker gets processed.
    urgent.update({"gone-a", "gone-b"})
    q.add("gone-a")
    q.add("gone-b")

    async def lane_took_both() -> None:
        while not {"gone-a", "gone-b"} <= set(lane_keys):
            await asyncio.sleep(0)

    await asyncio.wait_for(lane_took_both(), DEADLINE_S)
    hold.set()
    assert await asyncio.wait_for(q.shutdown_with_drain(DEADLINE_S), DEADLINE_S * 2) is True
    await asyncio.wait_for(asyncio.gather(*lane, *general), DEADLINE_S)
    assert violations == []
    for key, added in last_add.items():
        assert last_start[key] > added, key
    assert q.processing_count == 0 and len(q) == 0
