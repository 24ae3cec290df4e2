"""Unit tests for the fleet's origin slots: a slot is always released, and a cancellation is never swallowed.

:class:`FakeKubeClient` answers the Lease requests (scripted, no server); a stalled answer lets a test land
a cancellation exactly during the release. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
from typing import Any

from model_agent.agent.origin_slots import OriginSlots, lease_names
from model_agent.kube.client import ApiUnavailable
from model_agent.kube.resources import LEASES
from tests.support.fake_kube import FakeKubeClient, not_found

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
