"""Unit tests for the cluster's record of resolved revisions: one node resolves, the others read its record.

Two :class:`ResolveCache` instances (two nodes) share :class:`~tests.unit.test_shared_root.LeaseApi`, an
in-memory fake of the API server's Leases that stores the record's ConfigMap the same way (by name). Every
wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from model_agent.agent.origin_slots import OriginSlots
from model_agent.agent.resolve_cache import ResolveCache
from tests.support.hostile_json import DEEP
from tests.support.waiting import until
from tests.unit.test_shared_root import LeaseApi

NS = "ome"
URI = "hf://org/model"
COMMIT = "a" * 40
FILES = [{"path": "model.safetensors", "size": 3, "sha256": "b" * 64, "git_sha1": None}]
DEADLINE_S = 5.0


def node_cache(api: LeaseApi, node: str, *, lock_poll_s: float) -> ResolveCache:
    lock = OriginSlots(api, NS, node, 1, lease_s=30, poll_s=lock_poll_s)  # type: ignore[arg-type]
    return ResolveCache(api, NS, lock=lock, poll_s=0.01)  # type: ignore[arg-type]


async def test_a_node_waiting_for_the_lock_takes_the_record_as_soon_as_it_is_written() -> None:
    api = LeaseApi()
    first, second = node_cache(api, "n1", lock_poll_s=0.01), node_cache(api, "n2", lock_poll_s=3600.0)
    second._poll_s = 3600.0  # nor does it poll the record: only its watch can tell it in time
    recorded, leave_lock, hub_answers = asyncio.Event(), asyncio.Event(), asyncio.Event()
    computed: list[str] = []

    async def slow_compute() -> tuple[str, list[dict[str, Any]]]:
        computed.append("n1")
        await hub_answers.wait()
        return COMMIT, FILES

    async def compute_second() -> tuple[str, list[dict[str, Any]]]:
        computed.append("n2")
        return COMMIT, FILES

    # n1 holds the lock, records the answer and keeps the lock a while longer (its release is slow)
    real_put = first.put

    async def put_then_linger(uri: str, commit: str, files: list[dict[str, Any]]) -> None:
        await real_put(uri, commit, files)
        recorded.set()
        await leave_lock.wait()

    first.put = put_then_linger  # type: ignore[method-assign]
    resolving = asyncio.ensure_future(first.resolve(URI, "main", slow_compute))
    await until(lambda: computed == ["n1"], "n1 holding the lock, asking the hub")
    assert api.watches == 0  # n1 took the lock at once: it watches nothing
    # n2 asks for its lock only once an hour: it can finish in time only by hearing of the record n1 writes
    waiting = asyncio.ensure_future(second.resolve(URI, "main", compute_second))
    await until(lambda: api.watches == 1, "n2 watching for the record")
    assert not waiting.done()
    hub_answers.set()
    got = await asyncio.wait_for(waiting, DEADLINE_S)
    assert got == (COMMIT, FILES)
    assert recorded.is_set() and not resolving.done()  # n1 still held the lock when n2 went on
    assert computed == ["n1"]  # n2 never called the hub
    assert "n2" not in api.puts  # nor took the lock
    await until(lambda: not api._watchers, "the watches closed")
    leave_lock.set()
    assert await asyncio.wait_for(resolving, DEADLINE_S) == (COMMIT, FILES)


async def test_a_waiting_node_whose_watch_ends_polls_the_record() -> None:
    api = LeaseApi()
    first, second = node_cache(api, "n1", lock_poll_s=0.01), node_cache(api, "n2", lock_poll_s=3600.0)
    hub_answers, leave_lock = asyncio.Event(), asyncio.Event()

    async def slow_compute() -> tuple[str, list[dict[str, Any]]]:
        await hub_answers.wait()
        return COMMIT, FILES

    async def never() -> tuple[str, list[dict[str, Any]]]:
        raise AssertionError("n2 resolved")

    real_put = first.put

    async def put_then_linger(uri: str, commit: str, files: list[dict[str, Any]]) -> None:
        await real_put(uri, commit, files)
        await leave_lock.wait()

    first.put = put_then_linger  # type: ignore[method-assign]
    resolving = asyncio.ensure_future(first.resolve(URI, "main", slow_compute))
    await until(lambda: api.leases and not api._watchers, "n1 holding the lock")
    watches = api.watches
    waiting = asyncio.ensure_future(second.resolve(URI, "main", never))
    await until(lambda: api.watches == watches + 1, "n2 watching for the record")
    # an event the API server cannot have sent ends the reflector (its errors are a bug's): n2 polls instead
    api._watchers[0][1].put_nowait({"type": "ADDED", "object": {"kind": "ConfigMap"}})
    await until(lambda: not api._watchers, "n2's watch ended")
    hub_answers.set()
    assert await asyncio.wait_for(waiting, DEADLINE_S) == (COMMIT, FILES)
    leave_lock.set()
    assert await asyncio.wait_for(resolving, DEADLINE_S) == (COMMIT, FILES)


async def test_a_node_waiting_for_the_lock_resolves_itself_when_the_holder_records_nothing() -> None:
    api = LeaseApi()
    first, second = node_cache(api, "n1", lock_poll_s=0.01), node_cache(api, "n2", lock_poll_s=0.01)
    release = asyncio.Event()

    async def failing_compute() -> tuple[str, list[dict[str, Any]]]:
        await release.wait()
        raise RuntimeError("hub unavailable")

    async def compute_second() -> tuple[str, list[dict[str, Any]]]:
        return COMMIT, FILES

    resolving = asyncio.ensure_future(first.resolve(URI, "main", failing_compute))
    await until(lambda: api.leases, "n1 holding the lock")
    waiting = asyncio.ensure_future(second.resolve(URI, "main", compute_second))
    release.set()
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(resolving, DEADLINE_S)
    assert await asyncio.wait_for(waiting, DEADLINE_S) == (COMMIT, FILES)
    assert api.puts == ["", "n2", ""]  # n1 released the lock; n2 took it, resolved and released it


FILE = FILES[0]


@pytest.mark.parametrize(
    "files",
    [
        "{}",
        "1",
        '"x"',
        "null",
        "[1]",
        '["x"]',
        "[{}]",
        json.dumps([FILE | {"path": []}]),
        json.dumps([FILE | {"size": "3"}]),
        json.dumps([FILE | {"size": True}]),
        json.dumps([FILE | {"size": -1}]),
        json.dumps([FILE | {"size": 2**64}]),
        json.dumps([FILE | {"sha256": 5}]),
        DEEP,
    ],
    ids=[
        "object",
        "number",
        "string",
        "null",
        "a number",
        "a string",
        "an empty object",
        "path a list",
        "size a string",
        "size a bool",
        "size negative",
        "size beyond int64",
        "sha256 a number",
        "nested past any recursion limit",
    ],
)
async def test_a_record_of_the_wrong_shape_is_ignored_and_the_node_resolves_itself(files: str) -> None:
    api = LeaseApi()
    cache = ResolveCache(api, NS)  # type: ignore[arg-type]
    await cache.put(URI, COMMIT, FILES)
    api.leases[ResolveCache.name(URI)]["data"]["files"] = files

    computed: list[str] = []

    async def compute() -> tuple[str, list[dict[str, Any]]]:
        computed.append(URI)
        return COMMIT, FILES

    async def put(uri: str, commit: str, files: list[dict[str, Any]]) -> None:
        pass  # (the fake has no PATCH; what the record becomes is not the point here)

    assert await cache.get(URI, COMMIT) is None
    cache.put = put  # type: ignore[method-assign]
    assert await cache.resolve(URI, COMMIT, compute) == (COMMIT, FILES)
    assert computed == [URI]


@pytest.mark.parametrize(
    "stored",
    [
        [FILE | {"etag": "e", "mode": 420}],  # fields a newer agent added
        [{"path": FILE["path"], "size": FILE["size"], "sha256": FILE["sha256"]}],  # an older agent's: no git_sha1
    ],
    ids=["newer fields", "missing hash"],
)
async def test_a_record_of_another_version_is_read_in_this_versions_shape(stored: list[dict[str, Any]]) -> None:
    """A mixed fleet keeps sharing records during a rollout: extra fields are dropped, a missing hash is null."""
    api = LeaseApi()
    cache = ResolveCache(api, NS)  # type: ignore[arg-type]
    await cache.put(URI, COMMIT, FILES)
    api.leases[ResolveCache.name(URI)]["data"]["files"] = json.dumps(stored)
    assert await cache.get(URI, COMMIT) == (COMMIT, FILES)


@pytest.mark.parametrize(
    ("age_s", "fresh"),
    [
        (0.0, True),
        (599.0, True),
        (601.0, False),
        (-30.0, True),  # another node's clock a little ahead
        (-601.0, False),  # stamped more than a TTL ahead: fresh for too long
        (float("-inf"), False),  # stamped at infinity: fresh for good
        (float("nan"), False),
    ],
)
async def test_a_branch_record_is_trusted_within_the_ttl_of_its_stamp_and_no_further(age_s: float, fresh: bool) -> None:
    api = LeaseApi()
    cache = ResolveCache(api, NS, ttl_s=600.0)  # type: ignore[arg-type]
    await cache.put(URI, COMMIT, FILES)
    api.leases[ResolveCache.name(URI)]["data"]["at"] = str(time.time() - age_s)
    assert (await cache.get(URI, "main") is not None) == fresh
