"""The fetcher pool: runs downloads beside the reconciler, bounded, cancellable, one per model.

The reconciler hands over a job (a model key, a target description and a coroutine factory) and returns at
once; it never waits for a download. At most ``workers`` jobs run at a time (``--num-download-worker``);
the others wait for a slot, shared fairly between namespaces (:class:`~model_agent.agent.fair_slots.FairSlots`:
one tenant's models never hold every slot). When a job ends — success, failure or cancellation — ``on_done(key)`` is
called so the work queue looks at the model again (level-triggered: the reconciler reads the outcome from
the manifest or from :meth:`Fetcher.failure`).

Guarantees:
* at most one job per key; :meth:`submit` for a key with a job for another target cancels the old job
  first (awaited), so two downloads never write one model's staging area at once;
* thread work a job runs through :meth:`Job.in_thread` is part of the job: threads cannot be interrupted, so a
  job cancelled while such a thread runs ends only when the thread has returned, and :meth:`cancel` (and
  :meth:`stop`) return only then — a cancelled job is finished only when its thread work has stopped;
* a job that has called :meth:`Job.commit` (it is about to publish into the model's destination) is past
  the point of no return: a cancel no longer interrupts it but waits for it to end, so what it published it
  has also recorded (its manifest), and the caller of :meth:`cancel` finds the record and can act on it
  (the Remover quarantines it). Publishing without recording would leave a complete model on disk that no
  record explains; interrupting the remaining local work (parse, record) would save nothing;
* :meth:`cancel` returns only when the job has stopped touching its staging area and its destination
  (threads a source starts itself, still finishing a file write into staging, are not tracked: staging is
  never published without verification);
* after :meth:`stop` no job runs and :meth:`submit` refuses (returns False) instead of blocking;
* where the bytes of a key's last successful fetch came from (:meth:`bytes_by_source`, when its source counted
  them: :mod:`model_agent.sources.byte_sources`) is kept until the key's next fetch starts or its failure is
  cleared, so the entry of the Ready copy can show it after the job is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

import structlog

from model_agent.agent.fair_slots import FairSlots, Hold
from model_agent.model.entry import BytesBySource
from model_agent.sources.base import Progress, SourceError
from model_agent.sources.byte_sources import by_source

log = structlog.get_logger(__name__)

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 300.0

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class Failure:
    """The last failure of a key's fetch: for which target, why, and when the next attempt is due.

    Kept per key so the reconciler can show ``Failed`` and requeue at ``retry_at`` without fetching again.
    """

    target: str
    reason: str
    message: str
    attempts: int
    retry_at: float
    retryable: bool = True


@dataclass
class Job:
    """One running (or queued) fetch of one key: its target, progress and cancel state (see the module guarantees)."""

    key: str
    target: str
    task: asyncio.Task[None]
    progress: Progress = field(default_factory=Progress)
    started: float = field(default_factory=time.monotonic)
    waiting_for_slot: bool = True
    # Set by Job.commit: from here on a cancel waits for the job instead of interrupting it.
    committed: bool = False
    # Set by Fetcher.cancel/stop: someone wants this job gone (honoured at once unless committed).
    cancel_requested: bool = False
    hold: Hold | None = field(default=None, repr=False)  # its download slot, once it has one

    @contextlib.asynccontextmanager
    async def outside_slot(self) -> AsyncIterator[None]:
        """Give the download slot back for the block (a wait on another node's work), and queue for one after."""
        if self.hold is None:
            yield
            return
        self.waiting_for_slot = True
        async with self.hold.away():
            yield
        self.waiting_for_slot = False

    async def in_thread(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` in a worker thread as part of this job and return its result.

        A thread cannot be interrupted: if the job is cancelled while ``fn`` runs, this waits for ``fn`` to
        return and only then raises the cancellation, so the job's task ends after its thread work (unlike
        ``asyncio.to_thread``, whose thread outlives the cancelled await).
        """
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        future = loop.run_in_executor(None, call)
        cancelled = False
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                cancelled = True  # keep waiting: the thread is still touching the job's files
        if cancelled:
            if not future.cancelled():
                future.exception()  # retrieved: the cancellation is what the caller gets
            raise asyncio.CancelledError
        return future.result()

    def commit(self) -> None:
        """Mark the point of no return (about to publish): a later cancel waits for the job to end.

        Raises the cancellation instead when one was already asked for, so a cancelled job never starts
        publishing.
        """
        if self.cancel_requested:
            raise asyncio.CancelledError
        self.committed = True


JobBody = Callable[[Job], Awaitable[None]]


class Fetcher:
    """The fetch pool of one agent (see the module guarantees): ``workers`` slots, one job per key."""

    def __init__(
        self,
        workers: int,
        on_done: Callable[[str], None],
        *,
        backoff_base_s: float = BACKOFF_BASE_S,
        backoff_cap_s: float = BACKOFF_CAP_S,
    ) -> None:
        self._slots = FairSlots(workers)
        self._on_done = on_done
        self._jobs: dict[str, Job] = {}
        self._failures: dict[str, Failure] = {}
        self._sources: dict[str, BytesBySource] = {}
        self._stopped = False
        self._base = backoff_base_s
        self._cap = backoff_cap_s
        self._rng = random.Random()

    def job(self, key: str) -> Job | None:
        """The job of ``key``, running or waiting for a slot, or None."""
        return self._jobs.get(key)

    def jobs(self) -> list[Job]:
        """A snapshot of every job, for ``/status`` and shutdown."""
        return list(self._jobs.values())

    def failure(self, key: str, target: str) -> Failure | None:
        """The last failure of ``key`` if it was for ``target``: an older target's failure says nothing of this one."""
        failure = self._failures.get(key)
        return failure if failure is not None and failure.target == target else None

    def clear_failure(self, key: str) -> None:
        """Forget ``key``'s failure (the model went away or became Ready another way), so its backoff starts afresh.

        Where its last fetch's bytes came from is forgotten too: it no longer describes a copy on this node.
        """
        self._failures.pop(key, None)
        self._sources.pop(key, None)

    def bytes_by_source(self, key: str) -> BytesBySource | None:
        """Where the bytes of ``key``'s last successful fetch came from; None when unknown or not counted."""
        return self._sources.get(key)

    async def submit(self, key: str, target: str, body: JobBody) -> bool:
        """Start ``body`` as the job of ``key`` for ``target`` unless one runs already; it never awaits the fetch.

        A job for another target is cancelled first (awaited). Returns False once the fetcher is stopping.
        """
        if self._stopped:
            return False
        # A loop, not an if: another submit for this key may have started a job while this one waited.
        while (current := self._jobs.get(key)) is not None:
            if current.target == target:
                return True
            await self.cancel(key)
            if self._stopped:
                return False
        self._sources.pop(key, None)  # a new copy is on its way: the old one's counts no longer apply
        job = Job(key, target, task=None)  # type: ignore[arg-type]
        job.task = asyncio.get_running_loop().create_task(self._run(job, body), name=f"fetch {key}")
        self._jobs[key] = job
        return True

    async def _run(self, job: Job, body: JobBody) -> None:
        outcome = "cancelled"
        try:
            async with self._slots.hold(_namespace_of(job.key)) as hold:
                job.hold = hold
                job.waiting_for_slot = False
                job.started = time.monotonic()
                await body(job)
            self._failures.pop(job.key, None)
            sources = by_source(job.progress)
            if sources is not None:
                self._sources[job.key] = sources
            outcome = "done"
        except asyncio.CancelledError:
            raise
        except SourceError as exc:
            self._record_failure(job, exc.reason, exc.message, exc.retryable)
            outcome = "failed"
        except Exception as exc:
            log.exception("fetch crashed", key=job.key)
            self._record_failure(job, "InternalError", f"{type(exc).__name__}: {exc}", True)
            outcome = "failed"
        finally:
            if self._jobs.get(job.key) is job:
                del self._jobs[job.key]
            log.info("fetch ended", key=job.key, outcome=outcome)
            if not self._stopped:
                self._on_done(job.key)

    def _record_failure(self, job: Job, reason: str, message: str, retryable: bool) -> None:
        previous = self._failures.get(job.key)
        attempts = previous.attempts + 1 if previous is not None and previous.target == job.target else 1
        delay = min(self._cap, self._base * 2 ** (attempts - 1)) * (0.8 + 0.4 * self._rng.random())
        self._failures[job.key] = Failure(job.target, reason, message, attempts, time.monotonic() + delay, retryable)

    async def cancel(self, key: str) -> None:
        """Stop the job for ``key`` and return when it (and its thread work) has ended.

        A committed job is not interrupted: this waits for it to finish recording what it published.
        """
        job = self._jobs.get(key)
        if job is None:
            return
        self._interrupt(job)
        # asyncio.wait, not ``await job.task`` under suppress(CancelledError): that would also swallow the
        # cancellation of the caller itself (shutdown) while it waits here.
        await asyncio.wait([job.task])
        self._forget(job)

    @staticmethod
    def _interrupt(job: Job) -> None:
        job.cancel_requested = True
        if job.committed:
            log.info("cancel waits for a publishing fetch to record what it published", key=job.key)
        else:
            job.task.cancel()

    def _forget(self, job: Job) -> None:
        # A task cancelled before its first step never runs _run's ``finally``: drop its entry here.
        if self._jobs.get(job.key) is job:
            del self._jobs[job.key]
            if not self._stopped:
                self._on_done(job.key)

    async def stop(self) -> None:
        """Cancel every job and wait for them; partial downloads stay in staging for resume."""
        self._stopped = True
        jobs = list(self._jobs.values())
        for job in jobs:
            self._interrupt(job)
        if jobs:
            await asyncio.wait([job.task for job in jobs])
        for job in jobs:
            self._forget(job)


def _namespace_of(key: str) -> str:
    """The namespace part of a model key (``Kind/namespace/name``); ``""`` for a ClusterBaseModel."""
    parts = key.split("/")
    return parts[1] if len(parts) == 3 else ""
