"""Unit tests for the reflector's retry policy (:func:`plan_next`, one test per table row) and its loop.

The loop runs against a fake API (:class:`~tests.support.fake_kube.FakeKubeClient` plus scripted watches)
with an injected sleep that records each wait: the tests assert what the reflector waits, never sleep to
synchronise, and every wait on the reflector has a deadline.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from model_agent.kube import reflector as reflector_module
from model_agent.kube.reflector import (
    BACKOFF_CAP_S,
    BACKOFF_INITIAL_S,
    MIN_WATCH_S,
    Attempt,
    Phase,
    Plan,
    Reflector,
    Result,
    plan_next,
)
from model_agent.kube.resources import CLUSTERBASEMODELS
from model_agent.kube.store import Change
from tests.support.fake_kube import FakeKubeClient, status_error

LIST_PATH = CLUSTERBASEMODELS.path()
DEADLINE_S = 5.0
LONG = MIN_WATCH_S + 1
SHORT = MIN_WATCH_S / 10

# ------------------------------------------------------------------------------- plan_next, row by row


@pytest.mark.parametrize("result", list(Result))
def test_a_failed_list_relists_after_the_backoff_and_grows_it(result: Result) -> None:
    # The row for a 410 on a LIST's continue token (result=GONE) is the one that used to relist at once.
    assert plan_next(Attempt(Phase.LIST, result), 1.6) == Plan(relist=True, delay_s=1.6, backoff_s=3.2)


def test_a_watch_that_ran_and_ended_is_reopened_at_once_with_the_backoff_reset() -> None:
    assert plan_next(Attempt(Phase.WATCH, Result.ENDED, LONG), 6.4) == Plan(False, 0.0, BACKOFF_INITIAL_S)


def test_a_watch_that_ended_at_once_is_reopened_after_the_backoff() -> None:
    assert plan_next(Attempt(Phase.WATCH, Result.ENDED, SHORT), 0.8) == Plan(False, 0.8, 1.6)


def test_a_watch_that_ran_then_expired_relists_at_once() -> None:
    attempt = Attempt(Phase.WATCH, Result.GONE, LONG, after_relist=True)
    assert plan_next(attempt, 6.4) == Plan(True, 0.0, BACKOFF_INITIAL_S)


def test_an_old_resource_version_refused_at_once_relists_at_once() -> None:
    # Resuming after a long watch: the server compacted past it. Relist now, keep the backoff base.
    attempt = Attempt(Phase.WATCH, Result.GONE, SHORT, after_relist=False)
    assert plan_next(attempt, 3.2) == Plan(True, 0.0, 3.2)


def test_a_fresh_list_whose_watch_expires_at_once_relists_after_a_minimum_wait() -> None:
    attempt = Attempt(Phase.WATCH, Result.GONE, SHORT, after_relist=True)
    assert plan_next(attempt, 3.2) == Plan(True, BACKOFF_INITIAL_S, 3.2)  # a floor: the LIST itself worked


def test_a_failed_watch_retries_the_watch_after_the_backoff() -> None:
    assert plan_next(Attempt(Phase.WATCH, Result.FAILED, SHORT), 0.8) == Plan(False, 0.8, 1.6)


def test_a_failed_watch_without_a_resource_version_relists() -> None:
    attempt = Attempt(Phase.WATCH, Result.FAILED, SHORT, have_resource_version=False)
    assert plan_next(attempt, 0.8) == Plan(True, 0.8, 1.6)


def test_a_watch_that_ran_long_then_failed_starts_its_backoff_afresh() -> None:
    assert plan_next(Attempt(Phase.WATCH, Result.FAILED, LONG), 25.6) == Plan(False, 0.8, 1.6)


def test_the_backoff_is_capped() -> None:
    assert plan_next(Attempt(Phase.LIST, Result.FAILED), BACKOFF_CAP_S).backoff_s == BACKOFF_CAP_S


# ------------------------------------------------------------------------------------------ the loop


class WatchingFakeKube(FakeKubeClient):
    """The fake API with watches: each ``watch_lines`` call plays the next scripted list of events and ends;
    when none is left it stays open (silent) until cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.watches: deque[list[dict[str, Any]] | BaseException] = deque()
        self.watch_calls = 0

    async def watch_lines(
        self, path: str, *, query: Mapping[str, str | int], read_timeout: float, connect_timeout: float = 10.0
    ) -> AsyncIterator[dict[str, Any]]:
        self.watch_calls += 1
        if not self.watches:
            await asyncio.Event().wait()
        script = self.watches.popleft()
        if isinstance(script, BaseException):
            raise script
        for event in script:
            yield event


def page(items: list[dict[str, Any]], rv: str = "10", cont: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {"kind": "ClusterBaseModelList", "metadata": meta, "items": items}


def cbm(name: str, rv: str = "5") -> dict[str, Any]:
    return {"kind": "ClusterBaseModel", "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv}}


class Recorder:
    """The injected sleep: records each wait and yields once (the test decides how long "time" is)."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.changed = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.changed.set()
        await asyncio.sleep(0)

    async def until(self, count: int) -> None:
        async with asyncio.timeout(DEADLINE_S):
            while len(self.waits) < count:
                self.changed.clear()
                await self.changed.wait()


def make(client: WatchingFakeKube, recorder: Recorder, changes: list[Change] | None = None) -> Reflector:
    sink = changes if changes is not None else []
    return Reflector(
        client,  # type: ignore[arg-type]
        CLUSTERBASEMODELS,
        lambda change, _source: sink.append(change),
        rng=random.Random(1),
        sleep=recorder.sleep,
    )


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_410_on_a_lists_continue_token_relists_only_after_a_growing_backoff() -> None:
    client = WatchingFakeKube()
    gone = status_error(410, "Expired", "The provided continue parameter is too old")
    # Every LIST: the first page arrives, the continue page answers 410.
    client.script("GET", LIST_PATH, *[x for _ in range(4) for x in (page([cbm("a")], cont="c1"), gone)])
    recorder = Recorder()
    reflector = make(client, recorder)
    task = asyncio.create_task(reflector.run())
    try:
        await recorder.until(4)
    finally:
        await stop(task)
    first_pages = len(client.calls_to("GET", LIST_PATH)) // 2
    assert first_pages <= len(recorder.waits) + 1  # every failed LIST was followed by a wait
    bases = [BACKOFF_INITIAL_S * 2**i for i in range(4)]
    for wait, base in zip(recorder.waits, bases, strict=True):
        assert base * 0.5 <= wait <= base * 1.5  # 0.8, 1.6, 3.2, 6.4 s, jittered
    assert not reflector.synced.is_set()  # a partial LIST never reached the store
    assert len(reflector.store) == 0


async def test_a_watch_that_ends_at_once_is_reopened_only_after_a_backoff() -> None:
    client = WatchingFakeKube()
    client.always("GET", LIST_PATH, page([cbm("a")]))
    client.watches.extend([[], [], []])  # three watches that end the instant they open
    recorder = Recorder()
    reflector = make(client, recorder)
    task = asyncio.create_task(reflector.run())
    try:
        await recorder.until(3)
    finally:
        await stop(task)
    assert len(client.calls_to("GET", LIST_PATH)) == 1  # a clean end resumes the watch, no relist
    assert all(w >= BACKOFF_INITIAL_S * 0.5 for w in recorder.waits)
    assert recorder.waits[2] > recorder.waits[0]  # growing
    assert reflector.synced.is_set()


async def test_an_error_event_relists_and_the_store_reports_what_vanished() -> None:
    client = WatchingFakeKube()
    client.script("GET", LIST_PATH, page([cbm("a"), cbm("b")]), page([cbm("a")], rv="20"))
    client.watches.append([{"type": "ERROR", "object": {"kind": "Status", "code": 410}}])
    changes: list[Change] = []
    recorder = Recorder()
    reflector = make(client, recorder, changes)
    task = asyncio.create_task(reflector.run())
    try:
        async with asyncio.timeout(DEADLINE_S):
            while reflector.resource_version != "20":
                await asyncio.sleep(0.01)
    finally:
        await stop(task)
    assert [c.key for c in changes if c.vanished] == ["b"]
    assert reflector.store.keys() == ["a"]
    assert reflector.store.heard("b") is not None and reflector.store.heard("b").deleted  # type: ignore[union-attr]


async def test_an_event_of_an_unexpected_shape_ends_run_with_the_exception() -> None:
    # Not swallowed, not silent: the supervisor above logs, counts and restarts it (tests/unit/test_supervisor.py).
    client = WatchingFakeKube()
    client.always("GET", LIST_PATH, page([]))
    client.watches.append([{"type": "ADDED", "object": {"kind": "ClusterBaseModel", "metadata": "garbage"}}])
    reflector = make(client, Recorder())
    with pytest.raises(reflector_module.MalformedEvent):
        await asyncio.wait_for(reflector.run(), DEADLINE_S)


async def test_api_errors_on_a_watch_are_retried_from_the_resource_version() -> None:
    client = WatchingFakeKube()
    client.always("GET", LIST_PATH, page([cbm("a")], rv="33"))
    client.watches.extend([status_error(500, "InternalError"), status_error(503, "ServiceUnavailable")])
    recorder = Recorder()
    reflector = make(client, recorder)
    task = asyncio.create_task(reflector.run())
    try:
        await recorder.until(2)
        async with asyncio.timeout(DEADLINE_S):
            while client.watch_calls < 3:
                await asyncio.sleep(0.01)
    finally:
        await stop(task)
    assert len(client.calls_to("GET", LIST_PATH)) == 1
    assert recorder.waits[0] >= reflector_module.BACKOFF_INITIAL_S * 0.5
