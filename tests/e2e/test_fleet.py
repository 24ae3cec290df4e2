"""Fleet behaviour end to end: origin slots (Leases) and cluster-wide resolve records."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from model_agent.agent.origin_slots import lease_names
from model_agent.kube.client import ApiError
from model_agent.kube.resources import LEASES
from model_agent.model.keys import configmap_key, node_label_key
from testbed.models import tiny_llama
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"


async def lease_holder(kube: Kube, name: str) -> str | None:
    try:
        lease = await kube.c.request("GET", LEASES.path("ome", name))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return (lease.get("spec") or {}).get("holderIdentity") or None


async def test_a_killed_slot_holder_lets_another_node_proceed_after_expiry(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    files = tiny_llama(31, padding_bytes=96 << 20)  # big enough that the fetch is still running when killed
    repo = f"acme/slots-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    args = ("--max-concurrent-origin-fetches", "1", "--origin-lease-seconds", "6")
    first = await make_agent(args=args)
    second = await make_agent(args=args)
    name = f"slots-{unique}"
    uri = f"hf://{repo}"
    # Each agent has its own models root here (one machine), so each node gets its own model object with the
    # same source, pinned to it by nodeSelector; the origin slot is per source, shared by both.
    a_name, b_name = f"{name}-a", f"{name}-b"
    await kube.apply(
        cbm(a_name, uri, str(first.models_root / "m"), nodeSelector={"kubernetes.io/hostname": first.node})
    )
    slot = lease_names(uri, 1)[0]

    async def first_holds() -> bool:
        return await lease_holder(kube, slot) == first.node

    await eventually(first_holds, timeout=30, what="the first node holding the origin slot", interval=0.05)
    first.kill()  # mid-fetch: the Lease is not released, it must expire
    await kube.apply(
        cbm(b_name, uri, str(second.models_root / "m"), nodeSelector={"kubernetes.io/hostname": second.node})
    )
    phases: list[str] = []

    async def second_ready() -> bool:
        entry = await kube.entry(second.node, configmap_key(CBM, "", b_name)) or {}
        phase = (entry.get("progress") or {}).get("phase")
        if phase:
            phases.append(phase)
        labels = await kube.node_labels(second.node)
        return labels.get(node_label_key(CBM, "", b_name)) == "Ready"

    await eventually(second_ready, timeout=90, what="the second node Ready after the dead holder's Lease expired")
    assert "queued" in phases, phases
    assert (second.models_root / "m" / "model.safetensors").read_bytes() == files["model.safetensors"]
    # The slot was released after the fetch: nobody holds it now.
    assert await lease_holder(kube, slot) is None
    for n in (a_name, b_name):
        await kube.delete_model(CBM, n)


async def test_one_resolve_per_pinned_model_revision_for_the_fleet(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    """A pinned commit fetched from the origin alone is listed once for the fleet: the shared record's lie could
    only fail a verification (the origin serves that commit's own bytes). A branch is resolved by every node (a
    record for it could name another commit), as is any revision a node takes bytes for from peers."""
    files = tiny_llama(32)
    repo = f"acme/budget-{unique}"
    commit = await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    args = ("--max-concurrent-origin-fetches", "2")
    agents = [await make_agent(args=args) for _ in range(4)]
    olah.reset_stats()
    uri = f"hf://{repo}@{commit}"
    names = []
    for i, agent in enumerate(agents):
        n = f"budget-{unique}-{i}"
        names.append((agent, n))
        await kube.apply(cbm(n, uri, str(agent.models_root / "m"), nodeSelector={"kubernetes.io/hostname": agent.node}))

    async def all_ready() -> bool:
        for agent, n in names:
            if (await kube.node_labels(agent.node)).get(node_label_key(CBM, "", n)) != "Ready":
                return False
        return True

    await eventually(all_ready, timeout=60, what="4 nodes Ready")
    api_calls = olah.request_count(path_contains=f"/api/models/{repo}")
    resolver_calls = olah.request_count(method="GET", path_contains=f"/{repo}/resolve/")
    print(f"hub API calls for 4 nodes: {api_calls}; file downloads: {resolver_calls}")
    assert api_calls <= 2, api_calls  # the tree (it answers with a redirect first), once for the fleet
    assert resolver_calls == 4 * len([f for f in files]) + 4  # one per file per node (+ .gitattributes)
    for _, n in names:
        await kube.delete_model(CBM, n)
