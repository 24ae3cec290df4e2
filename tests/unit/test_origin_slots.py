"""Unit tests for the fleet's origin slots: a slot is always released, and a cancellation is never swallowed.

:class:`FakeKubeClient` answers the Lease requests (scripted, no server); a stalled answer lets a test land
a cancellation exactly during the release. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from model_agent.agent.origin_slots import OriginSlots, lease_names
from model_agent.agent.reconciler import Target
from model_agent.kube.client import ApiUnavailable
from model_agent.kube.resources import LEASES
from model_agent.model.resources import ModelObject
from model_agent.model.uris import StorageType
from model_agent.peers.seeding import peer_aware_slots
from model_agent.sources import egress
from tests.support.fake_kube import FakeKubeClient, not_found
from tests.support.waiting import always, until
from tests.unit.test_fetch_cancel import REF, URI, WEIGHTS, Env, env, read_tree  # noqa: F401  (env: the fixture)
from tests.unit.test_peers_fetch import FakeDirectory
from tests.unit.test_shared_root import LeaseApi

DEADLINE_S = 2.0
NS = "ome"
HOLDER = "node-1"
SOURCE = "hf://org/model"
NAME = lease_names(SOURCE, 1)[0]
PATH = LEASES.path(NS, NAME)


def held_lease() -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": NAME, "namespace": NS, "resourceVersion": "7"},
        "spec": {"holderIdentity": HOLDER, "leaseDurationSeconds": 30},
    }


def slots(client: FakeKubeClient) -> OriginSlots:
    return OriginSlots(client, NS, HOLDER, 1, lease_s=30, poll_s=0.01)  # type: ignore[arg-type]


def acquirable(client: FakeKubeClient) -> None:
    client.script("GET", PATH, not_found(NAME, "leases", "coordination.k8s.io"))
    client.script("POST", LEASES.path(NS), held_lease())


async def test_a_cancellation_during_the_release_is_raised_after_it() -> None:
    client = FakeKubeClient()
    acquirable(client)
    releasing = asyncio.Event()
    answer = asyncio.Event()

    async def stalled_get() -> dict[str, Any]:
        releasing.set()
        await answer.wait()
        return held_lease()

    client.script("GET", PATH, stalled_get)
    client.script("PUT", PATH, held_lease())
    after: list[str] = []

    async def fetch() -> None:
        async with slots(client).hold(SOURCE):
            pass  # the download finished
        after.append("published after being cancelled")

    task = asyncio.get_running_loop().create_task(fetch())
    await asyncio.wait_for(releasing.wait(), DEADLINE_S)
    task.cancel()  # a removal cancels the job while the slot is being released
    answer.set()
    done, _ = await asyncio.wait([task], timeout=DEADLINE_S)
    assert task in done and task.cancelled()
    assert after == []
    puts = client.calls_to("PUT", PATH)
    assert len(puts) == 1 and puts[0].body["spec"]["holderIdentity"] == ""  # the slot was still released


async def test_the_slot_is_released_and_a_failed_release_is_not_an_error() -> None:
    client = FakeKubeClient()
    acquirable(client)
    client.script("GET", PATH, ApiUnavailable("connection refused"))
    after: list[str] = []
    async with asyncio.timeout(DEADLINE_S), slots(client).hold(SOURCE) as name:
        assert name == NAME
    after.append("went on")
    assert after == ["went on"]
    assert len(client.calls_to("GET", PATH)) == 2  # acquire, then the release's read


async def test_a_cancelled_body_releases_the_slot_and_stays_cancelled() -> None:
    client = FakeKubeClient()
    acquirable(client)
    client.script("GET", PATH, held_lease())
    client.script("PUT", PATH, held_lease())
    inside = asyncio.Event()

    async def fetch() -> None:
        async with slots(client).hold(SOURCE):
            inside.set()
            await asyncio.Event().wait()

    task = asyncio.get_running_loop().create_task(fetch())
    await asyncio.wait_for(inside.wait(), DEADLINE_S)
    task.cancel()
    await asyncio.wait([task], timeout=DEADLINE_S)
    assert task.cancelled()
    assert len(client.calls_to("PUT", PATH)) == 1


# ------------------------------------------------------------------------- held until peers can see the copy


def holder_of(api: LeaseApi) -> str:
    """Who holds the source's one slot now ("" when free or never taken)."""
    lease = api.leases.get(NAME)
    return (lease or {}).get("spec", {}).get("holderIdentity") or ""


def peer_aware(api: LeaseApi, node: str, directory: FakeDirectory, **kw: Any) -> Any:
    slots = OriginSlots(api, NS, node, 1, lease_s=30, poll_s=0.01)  # type: ignore[arg-type]
    return peer_aware_slots(
        slots.hold,
        directory,  # type: ignore[arg-type]
        takes_from_peers=egress.takes_from_peers,
        poll_s=0.01,
        seen_poll_s=0.01,
        **kw,
    )


async def test_the_slot_is_kept_until_peers_see_the_copy_and_the_waiting_node_takes_it_from_the_peer() -> None:
    api = LeaseApi()
    seen_a, dir_b = FakeDirectory([], ready_here=False), FakeDirectory([])
    keepers: set[asyncio.Task[None]] = set()
    hold_a, hold_b = peer_aware(api, "a", seen_a, keepers=keepers), peer_aware(api, "b", dir_b)
    async with asyncio.timeout(DEADLINE_S), hold_a(SOURCE, lambda: None) as name:
        assert name == NAME and holder_of(api) == "a"
    # a's copy is recorded, but its Node is not labelled Ready yet: the slot stays a's
    queued, got = asyncio.Event(), []

    async def b_fetches() -> None:
        async with hold_b(SOURCE, queued.set) as name_b:
            got.append(name_b)

    b = asyncio.create_task(b_fetches())
    async with asyncio.timeout(DEADLINE_S):
        await queued.wait()

    async def b_waits_while_a_holds() -> bool:
        return not got and holder_of(api) == "a"

    await always(b_waits_while_a_holds, duration=0.3, what="b waiting while a holds the slot")
    seen_a.here, dir_b.list = True, ["a:1"]  # a's Ready label: what b's directory reads
    async with asyncio.timeout(DEADLINE_S):
        await b
    assert got == [""]  # b went to the peer, not to the origin
    await until(lambda: not keepers and holder_of(api) == "", "a's slot released once it was seen Ready")
    assert "b" not in api.puts  # b never held the slot


async def test_a_slot_won_on_a_stale_answer_is_given_back_when_a_fresh_look_shows_a_peer() -> None:
    api = LeaseApi()
    hold = peer_aware(api, "b", FakeDirectory(["a:1"], stale=True))
    async with asyncio.timeout(DEADLINE_S), hold(SOURCE, lambda: None) as name:
        assert name == ""  # the peer serves: no origin slot held for this fetch
        assert holder_of(api) == ""
    assert api.puts == [""]  # taken (created) and given back before the block ran


async def test_a_slot_is_kept_at_most_linger_s_and_a_failed_fetch_releases_it_at_once() -> None:
    api = LeaseApi()
    keepers: set[asyncio.Task[None]] = set()
    never_seen = FakeDirectory([], ready_here=False)
    hold = peer_aware(api, "a", never_seen, keepers=keepers, linger_s=0.05)
    async with asyncio.timeout(DEADLINE_S), hold(SOURCE, lambda: None):
        pass
    assert keepers and holder_of(api) == "a"
    await until(lambda: not keepers and holder_of(api) == "", "the slot released after linger_s")
    with pytest.raises(RuntimeError, match="download failed"):
        async with asyncio.timeout(DEADLINE_S), hold(SOURCE, lambda: None):
            raise RuntimeError("download failed")
    assert not keepers and holder_of(api) == ""  # released before the error reached the caller


async def test_the_reconciler_holds_the_slot_until_the_copy_is_published_and_recorded(env: Env) -> None:  # noqa: F811
    at_release: list[tuple[bool, bool]] = []

    @contextlib.asynccontextmanager
    async def recording_slot(_source: str, _on_wait: Any, **_kw: Any) -> AsyncIterator[str]:
        try:
            yield "origin-0"
        finally:  # what a waiting node could see when this slot frees
            at_release.append((read_tree(env.dest) == WEIGHTS, env.manifests.load(REF.key) is not None))

    env.reconciler.ctx.origin_slots = recording_slot
    obj = ModelObject.from_dict(REF.kind, env.raw)
    target = Target(URI, env.dest, env.layout.primary, StorageType.S3)
    assert await env.fetcher.submit(REF.key, target.id, lambda job: env.reconciler._fetch(job, REF, obj, target, None))
    await until(lambda: env.fetcher.job(REF.key) is None, "the fetch done", timeout=DEADLINE_S)
    assert at_release == [(True, True)]  # published and recorded before the slot was released


# ------------------------------------------------------------------------------------------ the hold bound


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def renew_as(api: LeaseApi, holder: str, name: str) -> None:
    """A holder (a stuck node, or a stolen token) renewing: a new renewTime, the same acquisition."""
    lease = await api.request("GET", LEASES.path(NS, name))
    lease["spec"]["holderIdentity"] = holder
    lease["spec"]["renewTime"] = f"2026-12-07T00:00:{len(api.puts) % 60:02d}.000000Z"
    await api.request("PUT", LEASES.path(NS, name), body=lease)


async def test_a_lease_renewed_past_the_hold_bound_is_taken_over_by_a_waiter() -> None:
    api, clock = LeaseApi(), Clock()
    thief = OriginSlots(api, NS, "node-stolen", 1, lease_s=10, max_hold_s=100, clock=clock)  # type: ignore[arg-type]
    assert await thief._try(NAME)
    waiter = OriginSlots(api, NS, "node-2", 1, lease_s=10, max_hold_s=100, clock=clock)  # type: ignore[arg-type]
    looks = 0
    while not await waiter._try(NAME):  # every 5 s: the thief renews, the waiter looks
        assert looks < 30, "never taken over"
        looks += 1
        clock.now += 5
        await renew_as(api, "node-stolen", NAME)
    assert 100 / 5 <= looks <= 100 / 5 + 2, looks  # once the same acquisition has been seen held for 100 s
    assert (await api.request("GET", LEASES.path(NS, NAME)))["spec"]["holderIdentity"] == "node-2"


async def test_a_new_acquisition_restarts_the_waiters_clock() -> None:
    api, clock = LeaseApi(), Clock()
    holder = OriginSlots(api, NS, "node-1", 1, lease_s=10, max_hold_s=100, clock=clock)  # type: ignore[arg-type]
    waiter = OriginSlots(api, NS, "node-2", 1, lease_s=10, max_hold_s=100, clock=clock)  # type: ignore[arg-type]
    assert await holder._try(NAME)
    for _ in range(15):
        clock.now += 5
        await renew_as(api, "node-1", NAME)
        assert not await waiter._try(NAME)
    lease = await api.request("GET", LEASES.path(NS, NAME))
    lease["spec"]["acquireTime"] = "2026-12-07T01:00:00.000000Z"  # released and taken again: a new acquisition
    await api.request("PUT", LEASES.path(NS, NAME), body=lease)
    for _ in range(15):
        clock.now += 5
        await renew_as(api, "node-1", NAME)
        assert not await waiter._try(NAME)


async def test_the_holder_fences_itself_one_duration_before_the_bound_and_keeps_its_acquire_time() -> None:
    api, clock = LeaseApi(), Clock()
    holder = OriginSlots(api, NS, "node-1", 1, lease_s=10, max_hold_s=100, clock=clock)  # type: ignore[arg-type]
    assert await holder._try(NAME)
    acquired = (await api.request("GET", LEASES.path(NS, NAME)))["spec"]["acquireTime"]
    holder._renewed[NAME] = clock.now
    assert holder.holds(SOURCE)
    clock.now += 89
    holder._renewed[NAME] = clock.now  # renewed just now
    assert holder.holds(SOURCE)
    clock.now += 1  # 90 s = the bound less one duration
    holder._renewed[NAME] = clock.now
    assert not holder.holds(SOURCE)
    assert await holder._try(NAME)  # taking its own Lease again (a restart, another fetch) keeps the acquisition
    assert (await api.request("GET", LEASES.path(NS, NAME)))["spec"]["acquireTime"] == acquired
