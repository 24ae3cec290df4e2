"""Maintenance's scheduled verification: a model whose shared-root turn was busy is tried again in the same pass."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from model_agent.agent.maintenance import BUSY_ROUNDS, Maintenance
from model_agent.agent.shared_root import VerifyTurn
from model_agent.local.manifest import FileRecord, Manifest
from tests.support.waiting import until

DEADLINE_S = 10.0


class Turns:
    """Shared-root turns from a script: each model's turns in order, then ``then`` for good."""

    def __init__(self, script: dict[str, list[VerifyTurn]], then: VerifyTurn) -> None:
        self.script, self.then = script, then
        self.asked: list[str] = []
        self.recorded: list[str] = []

    @contextlib.asynccontextmanager
    async def verify_turn(self, manifest: Manifest, interval_s: float) -> AsyncIterator[VerifyTurn]:
        self.asked.append(manifest.key)
        turns = self.script.get(manifest.key) or []
        yield turns.pop(0) if turns else self.then

    def record_verification(self, manifest: Manifest, damaged: list[str]) -> None:
        self.recorded.append(manifest.key)


class Records:
    def __init__(self, manifests: list[Manifest]) -> None:
        self.by_key = {m.key: m for m in manifests}

    def all(self) -> list[Manifest]:
        return list(self.by_key.values())

    def load(self, key: str) -> Manifest | None:
        return self.by_key.get(key)


def _maintenance(
    tmp_path: Path, turns: Turns, keys: list[str], concurrency: int = 1
) -> tuple[Maintenance, list[str], Counter]:
    manifests = [
        Manifest(k, "uid", "s3://b/m", str(tmp_path / k), files=[FileRecord("w.bin", 1)], owned=True) for k in keys
    ]
    skipped = Counter("skipped", "", ["turn"], registry=CollectorRegistry())
    wiring: Any = SimpleNamespace(
        manifests=Records(manifests),
        shared_roots=turns,
        settings=SimpleNamespace(verify_interval_s=86400.0, model_verification_concurrency=concurrency),
        metrics=SimpleNamespace(verifications_skipped=skipped),
    )
    maintenance = Maintenance(wiring, set, busy_retry_s=0.0)
    hashed: list[str] = []

    async def verify_one(manifest: Manifest) -> list[str]:
        hashed.append(manifest.key)
        return []

    maintenance._verify_one = verify_one  # type: ignore[method-assign]
    return maintenance, hashed, skipped


async def test_model_verification_concurrency_re_hashes_that_many_models_at_once(tmp_path: Path) -> None:
    """OME's ``--model-verification-concurrency``: N models hashed at once, never more."""
    turns = Turns({}, VerifyTurn.ALONE)
    maintenance, _, _ = _maintenance(tmp_path, turns, ["a", "b", "c", "d", "e"], concurrency=2)
    running, most = 0, 0
    release = asyncio.Event()

    async def verify_one(manifest: Manifest) -> list[str]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1
        return []

    maintenance._verify_one = verify_one  # type: ignore[method-assign]
    task = asyncio.create_task(maintenance.verify(scheduled=True))
    await until(lambda: running == 2, "two models hashed at once")
    release.set()
    assert sorted(await asyncio.wait_for(task, DEADLINE_S)) == ["a", "b", "c", "d", "e"]
    assert most == 2


async def test_a_model_busy_at_the_pass_is_verified_once_its_turn_frees(tmp_path: Path) -> None:
    """An API outage at the pass's instant (every Lease unreadable: busy) no longer skips a model for a whole
    interval: the pass tries it again and hashes it once the turn is its own."""
    turns = Turns({"a": [VerifyTurn.BUSY, VerifyTurn.BUSY]}, VerifyTurn.VERIFY)
    maintenance, hashed, skipped = _maintenance(tmp_path, turns, ["a", "b"])
    report = await asyncio.wait_for(maintenance.verify(scheduled=True), DEADLINE_S)
    assert sorted(report) == ["a", "b"] and sorted(hashed) == ["a", "b"]
    assert turns.asked == ["a", "b", "a", "a"]  # b is not asked again: it was verified
    assert turns.recorded.count("a") == 1
    assert skipped.labels("busy")._value.get() == 2


async def test_a_peer_verifying_meanwhile_ends_the_retries_with_a_skip(tmp_path: Path) -> None:
    turns = Turns({"a": [VerifyTurn.BUSY]}, VerifyTurn.SKIP)  # the peer's record makes the next turn a skip
    maintenance, hashed, _ = _maintenance(tmp_path, turns, ["a"])
    assert await asyncio.wait_for(maintenance.verify(scheduled=True), DEADLINE_S) == {}
    assert hashed == [] and turns.asked == ["a", "a"]


async def test_a_turn_busy_for_good_is_tried_a_bounded_number_of_times(tmp_path: Path) -> None:
    turns = Turns({}, VerifyTurn.BUSY)
    maintenance, hashed, _ = _maintenance(tmp_path, turns, ["a"])
    assert await asyncio.wait_for(maintenance.verify(scheduled=True), DEADLINE_S) == {}
    assert hashed == [] and turns.asked == ["a"] * (BUSY_ROUNDS + 1)
