"""Unit tests for :mod:`model_agent.agent.supervisor`: every unexpected end of a background task is logged
with its traceback, counted, restarted with backoff, and reported down until the component works again."""

from __future__ import annotations

import asyncio
import random

import pytest
import structlog

from model_agent.agent.supervisor import (
    HEALTHY_RUN_S,
    RESTART_CAP_S,
    RESTART_INITIAL_S,
    Supervisor,
    restart_delay,
)
from tests.support.waiting import until

DEADLINE_S = 5.0


@pytest.mark.parametrize(
    ("previous", "ran_for", "expected"),
    [
        (None, 0.0, RESTART_INITIAL_S),  # first failure
        (RESTART_INITIAL_S, 0.1, 2 * RESTART_INITIAL_S),  # quick again: doubles
        (RESTART_CAP_S, 0.1, RESTART_CAP_S),  # capped
        (32.0, HEALTHY_RUN_S, RESTART_INITIAL_S),  # it ran well for a while: afresh
    ],
)
def test_restart_delay(previous: float | None, ran_for: float, expected: float) -> None:
    assert restart_delay(previous, ran_for) == expected


class Gate:
    """The injected sleep: records each restart wait and holds it until the test opens the gate."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.open = asyncio.Event()
        self.waiting = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.waiting.set()
        await self.open.wait()
        await asyncio.sleep(0)  # an open gate still yields, as a real sleep does


async def test_a_failing_component_is_logged_counted_down_and_restarted() -> None:
    runs = 0
    progressed_at = 0.0
    failures: list[str] = []
    release = asyncio.Event()

    async def component() -> None:
        nonlocal runs, progressed_at
        runs += 1
        if runs == 1:
            raise ValueError("an answer of an unexpected shape")
        await release.wait()
        progressed_at = asyncio.get_running_loop().time() + 1e9  # "made progress after the failure"
        await asyncio.Event().wait()

    gate = Gate()
    supervisor = Supervisor(on_failure=failures.append, rng=random.Random(0), sleep=gate.sleep)
    with structlog.testing.capture_logs() as logs:
        supervisor.spawn("reflector x", component, recovered=lambda since: progressed_at > since)
        await asyncio.wait_for(gate.waiting.wait(), DEADLINE_S)
        assert failures == ["reflector x"]
        assert "reflector x" in supervisor.down()
        assert "ValueError" in (supervisor.problem() or "")
        failed = [e for e in logs if e["event"] == "background task failed"]
        assert failed and failed[0]["exc_info"] is True and failed[0]["component"] == "reflector x"
        assert RESTART_INITIAL_S * 0.75 <= gate.waits[0] <= RESTART_INITIAL_S * 1.25
        gate.open.set()
        await until(lambda: runs == 2, timeout=DEADLINE_S)
        assert "reflector x" in supervisor.down()  # restarted, but not working yet
        release.set()
        await until(lambda: not supervisor.down(), timeout=DEADLINE_S)
    assert supervisor.problem() is None
    assert supervisor.failures("reflector x") == 1
    await supervisor.stop()


async def test_a_component_that_returns_is_an_unexpected_end_too() -> None:
    runs = 0

    async def component() -> None:
        nonlocal runs
        runs += 1
        if runs > 1:
            await asyncio.Event().wait()

    gate = Gate()
    gate.open.set()
    failures: list[str] = []
    supervisor = Supervisor(on_failure=failures.append, sleep=gate.sleep)
    supervisor.spawn("loop tick", component)
    await until(lambda: runs == 2, timeout=DEADLINE_S)
    assert failures == ["loop tick"]
    assert supervisor.down() == {}  # no recovery check: running again is enough
    await supervisor.stop()


async def test_quick_repeated_failures_back_off_exponentially() -> None:
    async def component() -> None:
        raise RuntimeError("still broken")

    gate = Gate()
    gate.open.set()
    supervisor = Supervisor(rng=random.Random(0), sleep=gate.sleep)
    supervisor.spawn("purge", component)
    await until(lambda: len(gate.waits) >= 4, timeout=DEADLINE_S)
    await supervisor.stop()
    for i, wait in enumerate(gate.waits[:4]):
        base = RESTART_INITIAL_S * 2**i
        assert base * 0.75 <= wait <= base * 1.25


async def test_cancellation_is_not_a_failure() -> None:
    started = asyncio.Event()

    async def component() -> None:
        started.set()
        await asyncio.Event().wait()

    failures: list[str] = []
    supervisor = Supervisor(on_failure=failures.append)
    supervisor.spawn("resync", component)
    await asyncio.wait_for(started.wait(), DEADLINE_S)
    await supervisor.stop()
    assert failures == []


async def test_a_reported_pass_failure_is_down_until_a_pass_succeeds() -> None:
    failures: list[str] = []
    supervisor = Supervisor(on_failure=failures.append)
    with structlog.testing.capture_logs() as logs:
        try:
            raise OSError("disk went away")
        except OSError as exc:
            supervisor.report("verify", exc)
    assert failures == ["verify"]
    assert supervisor.down() == {"verify": "OSError: disk went away"}
    assert any(e["event"] == "background task failed" and isinstance(e.get("exc_info"), OSError) for e in logs)
    supervisor.ok("verify")
    assert supervisor.down() == {}
