"""Download deadlines: an overall time limit and a minimum throughput for one model's fetch.

Role: the transfer engine has a per-read timeout, which a body trickling one byte just inside it never
trips: two such models (a tenant's, or a broken mirror's) would hold the node's download workers forever.
This module bounds a whole fetch instead:

* ``timeout_s`` (``--download-timeout``): the longest a fetch may spend transferring. Time spent waiting for
  an origin slot (phase ``queued``) or before the first byte is planned (``scanning``) does not count: a node
  that waits its turn in a fleet is not slow.
* ``min_rate_bytes_s`` over ``window_s`` (``--download-min-rate``): once transferring, fewer bytes than
  ``min_rate_bytes_s × window_s`` in any whole window fails the fetch. The window is long (default 2 min)
  so a retry with backoff inside the engine does not count as slow.

Decisions as data: :func:`judge` is a pure function from the progress samples to a :class:`Verdict`,
table-tested; :func:`run_within_limits` is the one actor: it samples the job's progress, asks
:func:`judge`, and cancels the fetch with a ``SourceError`` (``DownloadTimeout`` or ``DownloadTooSlow``,
both retryable with the fetcher's backoff) when the verdict says so. Partial files stay for resume.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from model_agent.model.reasons import Reason
from model_agent.sources.base import Progress, SourceError

T = TypeVar("T")

# Phases in which the clock runs: the fetch is moving bytes (or should be). Not "finalizing": hashing and
# publishing a large model move no bytes and are bounded by the disk, not by a peer.
TRANSFER_PHASES = frozenset({"downloading"})


@dataclass(frozen=True)
class DownloadLimits:
    """The two bounds of one fetch (the module's contract); zero turns a bound off."""

    timeout_s: float = 0.0  # 0: no overall limit
    min_rate_bytes_s: float = 0.0  # 0: no throughput floor
    window_s: float = 120.0
    sample_s: float = 5.0

    @property
    def enabled(self) -> bool:
        """Whether any bound is set: when none is, the fetch runs unwatched (no sampling task)."""
        return self.timeout_s > 0 or self.min_rate_bytes_s > 0


class Verdict(StrEnum):
    """:func:`judge`'s answer; the failing values are the ``Reason`` words the fetch fails with."""

    OK = "ok"
    TIMED_OUT = Reason.DOWNLOAD_TIMEOUT.value
    TOO_SLOW = Reason.DOWNLOAD_TOO_SLOW.value


@dataclass(frozen=True)
class Sample:
    """One look at a job's progress: when, whether it was moving bytes then, and how many it had."""

    at: float  # monotonic seconds
    transferring: bool  # in a phase of TRANSFER_PHASES
    completed_bytes: int


def judge(samples: list[Sample], limits: DownloadLimits) -> Verdict:
    """The verdict on a fetch from its progress samples (oldest first; the last one is now).

    Transfer time is the sum of the intervals that start in a transferring sample. The rate is judged over
    the last ``window_s`` only when the whole window was spent transferring.
    """
    if len(samples) < 2:
        return Verdict.OK
    transfer_s = sum(b.at - a.at for a, b in itertools.pairwise(samples) if a.transferring)
    if limits.timeout_s > 0 and transfer_s > limits.timeout_s:
        return Verdict.TIMED_OUT
    if limits.min_rate_bytes_s > 0:
        now = samples[-1]
        start = None
        for sample in reversed(samples[:-1]):
            if not sample.transferring:
                break
            start = sample
            if now.at - sample.at >= limits.window_s:
                break
        if start is not None and now.at - start.at >= limits.window_s:
            moved = now.completed_bytes - start.completed_bytes
            if moved < limits.min_rate_bytes_s * (now.at - start.at):
                return Verdict.TOO_SLOW
    return Verdict.OK


def _message(verdict: Verdict, limits: DownloadLimits) -> str:
    if verdict == Verdict.TIMED_OUT:
        return f"the download took longer than --download-timeout ({limits.timeout_s:.0f}s); it resumes on retry"
    return (
        f"the download moved less than {limits.min_rate_bytes_s:.0f} bytes/s over {limits.window_s:.0f}s "
        "(--download-min-rate); it resumes on retry"
    )


async def run_within_limits(
    fetch: Awaitable[T],
    progress: Callable[[], Progress],
    limits: DownloadLimits,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Await ``fetch``; cancel it and raise ``SourceError`` when :func:`judge` says it is too slow or too long."""
    task = asyncio.ensure_future(fetch)
    if not limits.enabled:
        return await task
    keep = max(3, int(limits.window_s / limits.sample_s) + 3)
    samples: deque[Sample] = deque(maxlen=keep)
    transfer_s = 0.0  # kept outside the bounded sample list: the timeout counts the whole fetch
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=limits.sample_s)
            if done:
                return task.result()
            p = progress()
            samples.append(Sample(clock(), p.phase in TRANSFER_PHASES, p.completed_bytes))
            if len(samples) >= 2 and samples[-2].transferring:
                transfer_s += samples[-1].at - samples[-2].at
            verdict = judge(list(samples), DownloadLimits(0.0, limits.min_rate_bytes_s, limits.window_s))
            if limits.timeout_s > 0 and transfer_s > limits.timeout_s:
                verdict = Verdict.TIMED_OUT
            if verdict != Verdict.OK:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise SourceError(verdict.value, _message(verdict, limits))
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
