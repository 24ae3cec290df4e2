"""Download deadlines: the verdict table, and the actor that cancels a trickling fetch."""

from __future__ import annotations

import asyncio

import pytest

from model_agent.agent.download_limits import DownloadLimits, Sample, Verdict, judge, run_within_limits
from model_agent.sources.base import Progress, SourceError

LIMITS = DownloadLimits(timeout_s=100.0, min_rate_bytes_s=10.0, window_s=20.0)


def s(at: float, transferring: bool, done: int) -> Sample:
    return Sample(at, transferring, done)


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param([], Verdict.OK, id="no samples yet"),
        pytest.param([s(0, True, 0)], Verdict.OK, id="one sample: nothing to judge"),
        pytest.param([s(0, True, 0), s(10, True, 0)], Verdict.OK, id="slow but the window is not full"),
        pytest.param([s(0, True, 0), s(10, True, 50), s(20, True, 150)], Verdict.TOO_SLOW, id="150 B in 20 s < 200"),
        pytest.param([s(0, True, 0), s(10, True, 100), s(20, True, 200)], Verdict.OK, id="exactly the floor"),
        pytest.param(
            [s(0, False, 0), s(10, False, 0), s(20, False, 0), s(30, True, 0)], Verdict.OK, id="queued time not judged"
        ),
        pytest.param(
            [s(0, False, 0), s(15, True, 0), s(30, True, 0)], Verdict.OK, id="window only partly transferring"
        ),
        pytest.param([s(0, True, 0), s(101, True, 10_000)], Verdict.TIMED_OUT, id="fast but past the deadline"),
        pytest.param(
            [s(0, False, 0), s(500, True, 0), s(550, True, 10_000)], Verdict.OK, id="waiting does not use the deadline"
        ),
        pytest.param(
            [s(0, True, 0), s(60, False, 10_000), s(200, True, 10_000), s(250, True, 20_000)],
            Verdict.TIMED_OUT,
            id="transfer time adds up across a pause",
        ),
    ],
)
def test_verdicts(samples: list[Sample], expected: Verdict) -> None:
    assert judge(samples, LIMITS) == expected


def test_no_limits_never_judge() -> None:
    assert judge([s(0, True, 0), s(10**6, True, 0)], DownloadLimits()) == Verdict.OK


async def test_a_trickling_fetch_is_cancelled_with_a_reason() -> None:
    progress = Progress(phase="downloading")
    cancelled = asyncio.Event()

    async def trickle() -> str:
        try:
            while True:
                progress.completed_bytes += 1  # one byte per tick: never a read timeout
                await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    limits = DownloadLimits(min_rate_bytes_s=10_000.0, window_s=0.1, sample_s=0.02)
    with pytest.raises(SourceError) as info:
        await asyncio.wait_for(run_within_limits(trickle(), lambda: progress, limits), timeout=10)
    assert info.value.reason == "DownloadTooSlow" and info.value.retryable
    assert "--download-min-rate" in info.value.message
    assert cancelled.is_set()


async def test_an_overlong_fetch_times_out_but_queued_time_is_free() -> None:
    progress = Progress(phase="queued")
    started_transfer = asyncio.Event()

    async def fetch() -> str:
        await asyncio.sleep(0.2)  # waiting for an origin slot: longer than the timeout, not counted
        progress.phase = "downloading"
        started_transfer.set()
        while True:
            progress.completed_bytes += 10**6
            await asyncio.sleep(0.005)

    limits = DownloadLimits(timeout_s=0.1, sample_s=0.01)
    with pytest.raises(SourceError) as info:
        await asyncio.wait_for(run_within_limits(fetch(), lambda: progress, limits), timeout=10)
    assert info.value.reason == "DownloadTimeout"
    assert started_transfer.is_set()


async def test_a_fetch_within_limits_returns_its_result() -> None:
    progress = Progress(phase="downloading")

    async def fetch() -> str:
        for _ in range(5):
            progress.completed_bytes += 10**6
            await asyncio.sleep(0.01)
        return "done"

    limits = DownloadLimits(timeout_s=5.0, min_rate_bytes_s=1.0, window_s=0.02, sample_s=0.005)
    assert await run_within_limits(fetch(), lambda: progress, limits) == "done"
