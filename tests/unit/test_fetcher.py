"""Unit tests for the fetcher pool: bounded, one job per key, cancellable, failures with backoff.

Job bodies are coroutines that park on events; nothing sleeps to synchronise, every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from model_agent.agent.fetcher import Fetcher, Job
from model_agent.sources.base import SourceError
from tests.support.waiting import until

DEADLINE_S = 2.0


class Done:
    """The ``on_done`` callback: counts calls per key and lets a test wait for a number of calls."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self._changed = asyncio.Event()

    def __call__(self, key: str) -> None:
        self.keys.append(key)
        self._changed.set()

    async def wait_for(self, count: int) -> None:
        async def reached() -> None:
            while len(self.keys) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(reached(), DEADLINE_S)

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.keys)


@pytest.fixture
async def done() -> Done:
    return Done()


@pytest.fixture
async def fetcher(done: Done) -> AsyncIterator[Fetcher]:
    pool = Fetcher(workers=2, on_done=done)
    try:
        yield pool
    finally:
        await asyncio.wait_for(pool.stop(), DEADLINE_S)


def parked(started: list[str], release: asyncio.Event) -> Callable[[Job], Awaitable[None]]:
    async def body(job: Job) -> None:
        started.append(job.key)
        await release.wait()

    return body


async def test_at_most_workers_jobs_run_at_once(fetcher: Fetcher, done: Done) -> None:
    release = asyncio.Event()
    running = 0
    most = 0
    started: list[str] = []

    async def body(job: Job) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        started.append(job.key)
        try:
            await release.wait()
        finally:
            running -= 1

    for i in range(5):
        assert await fetcher.submit(f"k{i}", "t", body)
    await until(lambda: len(started) == 2, "two jobs to start")
    assert sorted(j.key for j in fetcher.jobs()) == [f"k{i}" for i in range(5)]
    assert sum(not j.waiting_for_slot for j in fetcher.jobs()) == 2
    assert running == 2
    release.set()
    await done.wait_for(5)
    assert most == 2
    assert sorted(started) == [f"k{i}" for i in range(5)]
    assert fetcher.jobs() == []


async def test_submit_for_the_same_key_and_target_is_idempotent(fetcher: Fetcher, done: Done) -> None:
    release = asyncio.Event()
    started: list[str] = []
    assert await fetcher.submit("k", "t1", parked(started, release))
    job = fetcher.job("k")
    assert job is not None
    assert await fetcher.submit("k", "t1", parked(started, release))
    assert fetcher.job("k") is job
    await until(lambda: started == ["k"], "the job to start")
    assert await fetcher.submit("k", "t1", parked(started, release))
    assert fetcher.job("k") is job
    release.set()
    await done.wait_for(1)
    assert started == ["k"]
    assert done.counts == Counter({"k": 1})


async def test_a_different_target_cancels_the_old_job_first(fetcher: Fetcher, done: Done) -> None:
    events: list[str] = []
    old_started = asyncio.Event()
    never = asyncio.Event()
    release = asyncio.Event()

    async def old(job: Job) -> None:
        events.append("old started")
        old_started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            events.append("old cancelled")
            raise

    async def new(job: Job) -> None:
        events.append("new started")
        await release.wait()

    assert await fetcher.submit("k", "t1", old)
    await asyncio.wait_for(old_started.wait(), DEADLINE_S)
    old_job = fetcher.job("k")
    assert old_job is not None
    assert await asyncio.wait_for(fetcher.submit("k", "t2", new), DEADLINE_S)
    # By the time submit returned, the old job has stopped, and it stopped before the new one began.
    assert old_job.task.done()
    assert events[:2] == ["old started", "old cancelled"]
    current = fetcher.job("k")
    assert current is not None
    assert current.target == "t2"
    await until(lambda: "new started" in events, "the new job to start")
    assert events == ["old started", "old cancelled", "new started"]
    release.set()
    await done.wait_for(2)
    assert done.counts == Counter({"k": 2})  # one per job end: the cancelled one and the finished one


async def test_concurrent_submits_with_new_targets_leave_one_job(fetcher: Fetcher, done: Done) -> None:
    started: list[str] = []
    never = asyncio.Event()

    def body(name: str) -> Callable[[Job], Awaitable[None]]:
        async def run(job: Job) -> None:
            started.append(name)
            await never.wait()

        return run

    assert await fetcher.submit("k", "t1", body("t1"))
    await until(lambda: started == ["t1"], "the first job to start")
    await asyncio.wait_for(
        asyncio.gather(fetcher.submit("k", "t2", body("t2")), fetcher.submit("k", "t3", body("t3"))), DEADLINE_S
    )
    await until(lambda: len(started) >= 2, "a successor to start")
    await asyncio.wait_for(fetcher.cancel("k"), DEADLINE_S)
    # Whatever the interleaving, one job per key: after cancel(key) nothing of this key runs.
    assert fetcher.job("k") is None
    assert [t for t in asyncio.all_tasks() if t.get_name() == "fetch k" and not t.done()] == []


async def test_failure_records_backoff(done: Done) -> None:
    pool = Fetcher(workers=1, on_done=done, backoff_base_s=10.0, backoff_cap_s=1000.0)
    try:

        async def fail(job: Job) -> None:
            raise SourceError("Unavailable", "503 from the hub")

        before = time.monotonic()
        assert await pool.submit("k", "t", fail)
        await done.wait_for(1)
        first = pool.failure("k", "t")
        assert first is not None
        assert (first.reason, first.message, first.attempts, first.retryable) == (
            "Unavailable",
            "503 from the hub",
            1,
            True,
        )
        assert before + 8.0 <= first.retry_at <= time.monotonic() + 12.0  # 10 s, jittered ±20 %
        assert pool.failure("k", "another-target") is None

        before = time.monotonic()
        assert await pool.submit("k", "t", fail)
        await done.wait_for(2)
        second = pool.failure("k", "t")
        assert second is not None
        assert second.attempts == 2
        assert before + 16.0 <= second.retry_at <= time.monotonic() + 24.0
        assert second.retry_at > first.retry_at

        # Another target starts counting afresh.
        assert await pool.submit("k", "t-new", fail)
        await done.wait_for(3)
        fresh = pool.failure("k", "t-new")
        assert fresh is not None
        assert fresh.attempts == 1

        # A success clears the failure.
        async def succeed(job: Job) -> None:
            return None

        assert await pool.submit("k", "t-new", succeed)
        await done.wait_for(4)
        assert pool.failure("k", "t-new") is None
    finally:
        await asyncio.wait_for(pool.stop(), DEADLINE_S)


async def test_non_retryable_source_errors_keep_their_flag(fetcher: Fetcher, done: Done) -> None:
    async def fail(job: Job) -> None:
        raise SourceError("RepositoryNotFound", "no such repo", retryable=False)

    assert await fetcher.submit("k", "t", fail)
    await done.wait_for(1)
    failure = fetcher.failure("k", "t")
    assert failure is not None
    assert failure.retryable is False
    assert failure.reason == "RepositoryNotFound"


async def test_a_crash_is_a_retryable_internal_error(fetcher: Fetcher, done: Done) -> None:
    async def crash(job: Job) -> None:
        raise KeyError("boom")

    assert await fetcher.submit("k", "t", crash)
    await done.wait_for(1)
    failure = fetcher.failure("k", "t")
    assert failure is not None
    assert failure.reason == "InternalError"
    assert failure.retryable is True
    assert "KeyError" in failure.message


async def test_on_done_is_called_once_per_job_end(fetcher: Fetcher, done: Done) -> None:
    never = asyncio.Event()
    started = asyncio.Event()

    async def ok(job: Job) -> None:
        return None

    async def fail(job: Job) -> None:
        raise SourceError("X", "y")

    async def hang(job: Job) -> None:
        started.set()
        await never.wait()

    assert await fetcher.submit("ok", "t", ok)
    assert await fetcher.submit("fail", "t", fail)
    await done.wait_for(2)
    assert await fetcher.submit("cancelled", "t", hang)
    await asyncio.wait_for(started.wait(), DEADLINE_S)
    await asyncio.wait_for(fetcher.cancel("cancelled"), DEADLINE_S)
    await done.wait_for(3)
    assert done.counts == Counter({"ok": 1, "fail": 1, "cancelled": 1})
    assert fetcher.jobs() == []


async def test_cancel_right_after_submit_leaves_no_stale_job(fetcher: Fetcher, done: Done) -> None:
    # The job's task has not run a single step yet when it is cancelled.
    ran = False

    async def body(job: Job) -> None:
        nonlocal ran
        ran = True

    assert await fetcher.submit("k", "t1", body)
    async with asyncio.timeout(DEADLINE_S):  # no wait_for here: a new task would let the job take a step
        await fetcher.cancel("k")
    assert not ran
    assert fetcher.job("k") is None
    assert done.counts == Counter({"k": 1})  # a job end like any other
    # A later submit for the same target must start a real job, not report a dead one as running.
    assert await fetcher.submit("k", "t1", body)
    await until(lambda: ran, "the resubmitted job to run")


async def test_after_stop_submit_refuses_and_nothing_runs(done: Done) -> None:
    pool = Fetcher(workers=1, on_done=done)
    never = asyncio.Event()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def hang(job: Job) -> None:
        started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    assert await pool.submit("running", "t", hang)
    assert await pool.submit("waiting", "t", hang)  # parked on the single slot
    await asyncio.wait_for(started.wait(), DEADLINE_S)
    await asyncio.wait_for(pool.stop(), DEADLINE_S)
    assert cancelled.is_set()
    assert pool.jobs() == []
    ran = False

    async def body(job: Job) -> None:
        nonlocal ran
        ran = True

    assert await asyncio.wait_for(pool.submit("late", "t", body), DEADLINE_S) is False
    assert pool.job("late") is None
    # Give the loop a chance to run anything that was (wrongly) scheduled.
    for _ in range(10):
        await asyncio.sleep(0)
    assert not ran
    assert done.keys == []  # no on_done after stop: the work queue is gone


async def test_a_caller_cancelled_inside_cancel_stays_cancelled(fetcher: Fetcher, done: Done) -> None:
    # A job slow to stop (a thread finishing a file write); the caller of cancel() is itself cancelled
    # meanwhile (shutdown): the caller's cancellation must not be swallowed.
    entered = asyncio.Event()
    stopping = asyncio.Event()
    never = asyncio.Event()
    release = asyncio.Event()
    after: list[str] = []

    async def slow_to_stop(job: Job) -> None:
        entered.set()
        try:
            await never.wait()
        finally:
            stopping.set()
            await release.wait()

    async def caller() -> None:
        await fetcher.cancel("k")
        after.append("went on after being cancelled")

    assert await fetcher.submit("k", "t", slow_to_stop)
    await asyncio.wait_for(entered.wait(), DEADLINE_S)
    task = asyncio.get_running_loop().create_task(caller())
    await asyncio.wait_for(stopping.wait(), DEADLINE_S)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE_S)
    assert after == []
    await until(lambda: fetcher.job("k") is None, "the job to end")


# ------------------------------------------------------------------------------------- thread work


async def test_cancel_returns_only_after_the_jobs_thread_work_has_stopped(fetcher: Fetcher, done: Done) -> None:
    entered = threading.Event()
    release = threading.Event()
    thread_ended: list[bool] = []
    after_thread: list[str] = []

    def slow_write() -> str:
        entered.set()
        release.wait(DEADLINE_S)
        thread_ended.append(True)
        return "written"

    async def body(job: Job) -> None:
        await job.in_thread(slow_write)
        after_thread.append("went on after a cancel")

    assert await fetcher.submit("k", "t", body)
    assert await asyncio.to_thread(entered.wait, DEADLINE_S)
    cancelling = asyncio.get_running_loop().create_task(fetcher.cancel("k"))
    await until(lambda: cancelling.done() or bool(getattr(fetcher.job("k"), "cancel_requested", False)), "cancel")
    for _ in range(20):  # the thread is still running: cancel must not have returned
        await asyncio.sleep(0)
    assert not cancelling.done()
    release.set()
    await asyncio.wait_for(cancelling, DEADLINE_S)
    assert thread_ended == [True]
    assert after_thread == []  # the cancellation is raised once the thread has returned
    assert fetcher.job("k") is None
    assert done.counts == Counter({"k": 1})


async def test_in_thread_returns_the_result_and_raises_the_threads_error(fetcher: Fetcher, done: Done) -> None:
    results: list[object] = []

    def boom() -> None:
        raise SourceError("UnsafePath", "refused", retryable=False)

    async def body(job: Job) -> None:
        results.append(await job.in_thread(lambda a, b: a + b, 2, b=3))
        await job.in_thread(boom)

    assert await fetcher.submit("k", "t", body)
    await done.wait_for(1)
    assert results == [5]
    failure = fetcher.failure("k", "t")
    assert failure is not None and failure.reason == "UnsafePath"


async def test_a_committed_job_is_not_interrupted_by_cancel(fetcher: Fetcher, done: Done) -> None:
    # Past the point of no return (publishing), a cancel waits for the job to record what it published.
    published = asyncio.Event()
    record = asyncio.Event()
    recorded: list[str] = []

    async def body(job: Job) -> None:
        job.commit()
        published.set()
        await record.wait()  # an await after commit: a cancel must not land here
        recorded.append(job.key)

    assert await fetcher.submit("k", "t", body)
    await asyncio.wait_for(published.wait(), DEADLINE_S)
    cancelling = asyncio.get_running_loop().create_task(fetcher.cancel("k"))
    await until(lambda: bool(getattr(fetcher.job("k"), "cancel_requested", False)), "the cancel request")
    assert not cancelling.done()
    record.set()
    await asyncio.wait_for(cancelling, DEADLINE_S)
    assert recorded == ["k"]
    assert fetcher.job("k") is None


async def test_a_job_asked_to_cancel_never_commits(done: Done) -> None:
    pool = Fetcher(workers=1, on_done=done)
    committed: list[bool] = []

    async def body(job: Job) -> None:
        job.cancel_requested = True  # as cancel() marks it before the task sees its cancellation
        job.commit()
        committed.append(True)

    assert await pool.submit("k", "t", body)
    await done.wait_for(1)
    assert committed == []
    await asyncio.wait_for(pool.stop(), DEADLINE_S)


async def test_stop_waits_for_a_committed_job(done: Done) -> None:
    pool = Fetcher(workers=1, on_done=done)
    committed = asyncio.Event()
    finish = asyncio.Event()
    recorded: list[str] = []

    async def body(job: Job) -> None:
        job.commit()
        committed.set()
        await finish.wait()
        recorded.append(job.key)

    assert await pool.submit("k", "t", body)
    await asyncio.wait_for(committed.wait(), DEADLINE_S)
    stopping = asyncio.get_running_loop().create_task(pool.stop())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not stopping.done()
    finish.set()
    await asyncio.wait_for(stopping, DEADLINE_S)
    assert recorded == ["k"]
    assert pool.jobs() == []


async def test_a_tenant_with_stuck_downloads_leaves_a_worker_for_other_namespaces() -> None:
    """Two trickling BaseModels of one namespace on a two-worker node: another namespace's model still runs."""
    fetcher = Fetcher(2, Done())
    release = asyncio.Event()
    started: list[str] = []

    def body(key: str) -> Callable[[Job], Awaitable[None]]:
        async def run(_job: Job) -> None:
            started.append(key)
            await release.wait()

        return run

    try:
        for name in ("slow-1", "slow-2"):
            await fetcher.submit(f"BaseModel/team-evil/{name}", "t", body(name))
        await fetcher.submit("BaseModel/team-a/llama", "t", body("llama"))

        await until(lambda: "llama" in started, what="the other namespace's download", timeout=DEADLINE_S)
        assert started.count("slow-1") + started.count("slow-2") == 1  # the tenant got one of the two workers
    finally:
        release.set()
        await fetcher.stop()
