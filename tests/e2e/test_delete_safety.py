"""Delete safety end to end: rumours of absence never touch a live model; real removals are recoverable.

The agent talks to the real API server through the project's fault proxy, which injects DELETED events,
strips objects from LIST answers, forces relists and fails confirmation reads.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from model_agent.kube.resources import CRDS
from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.proxies.faultproxy import FaultProxy, Rule, by_name, respond, strip_list_items
from testbed.servers import controlplane as cp
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
CBM_PATH = r"/apis/ome\.io/v1beta1/clusterbasemodels"


def confirmations(agent: AgentProcess, outcome: str) -> float:
    return agent.metric("model_agent_delete_confirmations_total", outcome=outcome)


async def snapshot(kube: Kube, agent: AgentProcess, name: str, dest: Path) -> tuple[Any, ...]:
    """Everything a removal would change: label, entry, and the weights' bytes."""
    labels = await kube.node_labels(agent.node)
    entry = await kube.entry(agent.node, configmap_key(CBM, "", name))
    files = {p.name: p.read_bytes() for p in sorted(dest.iterdir())} if dest.exists() else None
    return labels.get(node_label_key(CBM, "", name)), (entry or {}).get("status"), files


async def ready_model(
    kube: Kube, agent: AgentProcess, mirrors_root: Path, name: str, *, seed: int = 0
) -> tuple[Path, dict[str, bytes], str]:
    files = tiny_llama(seed)
    repo = f"acme/{name}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    dest = agent.models_root / name
    await kube.apply(cbm(name, f"hf://{repo}", str(dest)))

    async def ready() -> bool:
        s = await snapshot(kube, agent, name, dest)
        return bool(s[0] == "Ready" and s[1] == "Ready")

    await eventually(ready, timeout=30, what=f"{name} Ready")
    return dest, files, repo


async def test_injected_deletes_for_a_live_model_touch_nothing(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, proxy: FaultProxy, unique: str
) -> None:
    agent = await make_agent(via=proxy.kubeconfig)  # type: ignore[attr-defined]
    name = f"phantom-{unique}"
    dest, _, _ = await ready_model(kube, agent, mirrors_root, name)
    before = await snapshot(kube, agent, name, dest)
    live = await kube.get_model(CBM, name)
    await proxy.await_watches(1, CBM_PATH)
    for i in range(50):
        assert await proxy.ainject_deleted(CBM_PATH, live) >= 1

        async def counted(i: int = i) -> bool:
            # The rumour is dropped (logged) only after the cache holds the live object again: a DELETED
            # injected before that would find nothing to delete, and no rumour would follow it.
            dropped = agent.log_path.read_text(errors="replace").count("removal rumour dropped")
            return confirmations(agent, "alive_same_uid") >= i + 1 and dropped >= i + 1

        await eventually(counted, timeout=15, what=f"confirmation {i + 1}")
    assert confirmations(agent, "alive_same_uid") == 50
    assert confirmations(agent, "confirmed_gone") == 0
    assert await snapshot(kube, agent, name, dest) == before
    assert agent.metric("model_agent_quarantined_total") == 0
    await kube.delete_model(CBM, name)


async def test_relists_that_omit_live_objects_touch_nothing(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, proxy: FaultProxy, unique: str
) -> None:
    agent = await make_agent(via=proxy.kubeconfig)  # type: ignore[attr-defined]
    name = f"omitted-{unique}"
    dest, _, _ = await ready_model(kube, agent, mirrors_root, name)
    before = await snapshot(kube, agent, name, dest)
    for i in range(20):
        relists = agent.metric("model_agent_relists_total", resource="clusterbasemodels")
        strip = proxy.add_rule(Rule(CBM_PATH + "$", strip_list_items(by_name(name)), verb="list", times=1))
        # A 410 on the next watch makes the reflector relist (the relist then lacks the object).
        proxy.add_rule(Rule(CBM_PATH + "$", respond(410), watch=True, times=1))
        # End the current watch so the reflector re-watches and meets the 410.
        await proxy.ainject_watch_event(
            CBM_PATH, {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
        )

        async def relisted(relists: float = relists, strip: Any = strip) -> bool:
            after = agent.metric("model_agent_relists_total", resource="clusterbasemodels")
            return strip.fired == 1 and after > relists

        await eventually(relisted, timeout=30, what=f"relist {i + 1} without the object")
        assert await snapshot(kube, agent, name, dest) == before
    # Whether a vanished key was confirmed (alive) or a later relist brought it back first depends on timing;
    # either way nothing was ever removed, and the reads that happened all proved it alive.
    assert confirmations(agent, "alive_same_uid") >= 1
    assert await snapshot(kube, agent, name, dest) == before
    assert confirmations(agent, "confirmed_gone") == 0
    await kube.delete_model(CBM, name)


async def test_crd_server_side_applies_while_running_touch_nothing(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent()
    name = f"ssa-agent-{unique}"
    dest, _, _ = await ready_model(kube, agent, mirrors_root, name)
    before = await snapshot(kube, agent, name, dest)
    original = next(d for d in cp.crd_documents() if d["metadata"]["name"] == "clusterbasemodels.ome.io")
    try:
        for i in range(10):
            changed: dict[str, Any] = {**original, "spec": {**original["spec"]}}
            version = dict(original["spec"]["versions"][0])
            version["additionalPrinterColumns"] = [
                *version["additionalPrinterColumns"],
                {"name": f"Extra{i}", "type": "string", "jsonPath": ".spec.vendor"},
            ]
            changed["spec"]["versions"] = [version]
            await cp.apply_crd(kube.c, changed)
            assert await snapshot(kube, agent, name, dest) == before
    finally:
        await cp.apply_crd(kube.c, original)
    # Events after the applies are still processed.
    after = f"after-ssa-{unique}"
    await ready_model(kube, agent, mirrors_root, after, seed=5)
    assert await snapshot(kube, agent, name, dest) == before
    assert confirmations(agent, "confirmed_gone") == 0
    for n in (name, after):
        await kube.delete_model(CBM, n)


async def test_confirmation_outage_defers_a_real_removal(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, proxy: FaultProxy, unique: str
) -> None:
    agent = await make_agent(via=proxy.kubeconfig)  # type: ignore[attr-defined]
    name = f"outage-{unique}"
    dest, _, _ = await ready_model(kube, agent, mirrors_root, name)
    before = await snapshot(kube, agent, name, dest)
    outage = proxy.add_rule(Rule(CBM_PATH + f"/{name}$", respond(503), verb="get"))
    await kube.delete_model(CBM, name)  # a real delete, requested during the outage
    loop = asyncio.get_running_loop()
    end = loop.time() + 120
    while loop.time() < end:  # two minutes of failing confirmation reads: nothing may move
        assert await snapshot(kube, agent, name, dest) == before
        await asyncio.sleep(1)
    assert confirmations(agent, "read_failed_requeued") >= 3
    assert confirmations(agent, "confirmed_gone") == 0
    outage.remove()

    async def removed() -> bool:
        s = await snapshot(kube, agent, name, dest)
        return s[0] is None and s[1] is None and s[2] is None

    await eventually(removed, timeout=90, what="removal after the outage")
    assert confirmations(agent, "confirmed_gone") >= 1  # once more after the settle period


async def test_real_delete_quarantines_and_recreate_restores_without_download(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent()
    name = f"real-{unique}"
    dest, files, repo = await ready_model(kube, agent, mirrors_root, name)
    await kube.delete_model(CBM, name)
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def gone() -> bool:
        s = await snapshot(kube, agent, name, dest)
        return s[0] is None and s[1] is None

    await eventually(gone, timeout=10, what="label and entry removed")
    assert loop.time() - t0 < 5
    trash_root = agent.models_root / ".model-agent" / "trash"

    async def quarantined() -> list[Path]:
        # The weights move after the label and the entry (nothing may advertise them while they move).
        entries = list(trash_root.iterdir()) if trash_root.is_dir() else []
        return entries if not dest.exists() and entries and (entries[0] / "data").is_dir() else []

    trash = await eventually(quarantined, timeout=10, what="the weights moved to the trash")
    assert len(trash) == 1 and (trash[0] / "data" / "model.safetensors").read_bytes() == files["model.safetensors"]

    requests = olah.request_count(path_contains=repo)
    await kube.apply(cbm(name, f"hf://{repo}", str(dest)))

    async def ready_again() -> bool:
        s = await snapshot(kube, agent, name, dest)
        return bool(s[0] == "Ready" and s[1] == "Ready")

    await eventually(ready_again, timeout=30, what="restored from the trash")
    assert olah.request_count(path_contains=repo) == requests
    assert (dest / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert agent.metric("model_agent_restored_total") == 1

    # Recreated with a different source at the same path: the old weights are not restored into it.
    await kube.delete_model(CBM, name)
    await eventually(gone, timeout=10, what="removed again")
    other = tiny_llama(99)
    other_repo = f"acme/{name}-v2"
    await asyncio.to_thread(create_model_repo, mirrors_root, other_repo, other)
    await kube.apply(cbm(name, f"hf://{other_repo}", str(dest)))
    await eventually(ready_again, timeout=30, what="Ready from the new source")
    assert (dest / "model.safetensors").read_bytes() == other["model.safetensors"]
    assert agent.metric("model_agent_restored_total") == 1
    await kube.delete_model(CBM, name)


async def test_crd_deletion_trips_the_breaker_and_recreation_restores_everything(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent(args=("--trash-grace", "1"))
    names = [f"mass-{unique}-{i}" for i in range(4)]
    models = {}
    for i, name in enumerate(names):
        models[name] = await ready_model(kube, agent, mirrors_root, name, seed=10 + i)
    specs = {n: (await kube.get_model(CBM, n))["spec"] for n in names}
    before = {n: await snapshot(kube, agent, n, models[n][0]) for n in names}
    requests = olah.request_count()
    original = next(d for d in cp.crd_documents() if d["metadata"]["name"] == "clusterbasemodels.ome.io")
    await kube.c.request("DELETE", CRDS.path(name="clusterbasemodels.ome.io"))
    try:

        async def tripped() -> bool:
            return agent.metric("model_agent_delete_breaker_open") == 1

        await eventually(tripped, timeout=60, what="the breaker to trip")
        for n in names:  # nothing removed, nothing purged
            assert await snapshot(kube, agent, n, models[n][0]) == before[n]
        assert not list((agent.models_root / ".model-agent" / "trash").iterdir())

        async def warned() -> bool:  # the Event is sent in the background, after the breaker trips
            return any(e["reason"] == "DeleteBreakerOpen" for e in await kube.events_for(agent.node))

        await eventually(warned, timeout=30, what="the DeleteBreakerOpen Event")
    finally:

        async def crd_gone() -> bool:
            try:
                await kube.c.request("GET", CRDS.path(name="clusterbasemodels.ome.io"))
            except Exception:
                return True
            return False

        await eventually(crd_gone, timeout=60, what="CRD deletion to finish")
        await cp.apply_crd(kube.c, original)
    for n in names:
        await kube.apply({"apiVersion": "ome.io/v1beta1", "kind": CBM, "metadata": {"name": n}, "spec": specs[n]})

    async def all_ready() -> bool:
        for n in names:
            s = await snapshot(kube, agent, n, models[n][0])
            if s[0] != "Ready" or s[1] != "Ready":
                return False
        return agent.metric("model_agent_delete_breaker_open") == 0

    await eventually(all_ready, timeout=60, what="all Ready again and the breaker closed")
    assert olah.request_count() == requests  # no download
    for n in names:
        assert await snapshot(kube, agent, n, models[n][0]) == before[n]
        await kube.delete_model(CBM, n)


async def test_kill_9_during_removals_never_loses_a_live_model(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent()
    keeper = f"keeper-{unique}"
    keep_dest, keep_files, _ = await ready_model(kube, agent, mirrors_root, keeper, seed=50)
    rng = random.Random(1234)
    for i in range(20):
        name = f"victim-{unique}-{i}"
        dest, _, _ = await ready_model(kube, agent, mirrors_root, name, seed=100 + i)
        await kube.delete_model(CBM, name)
        await asyncio.sleep(rng.uniform(0.0, 1.2))  # a random instant during the removal (not a sync point)
        agent.kill()
        agent.start()
        await asyncio.to_thread(agent.wait_ready)

        async def converged(name: str = name, dest: Path = dest) -> bool:
            s = await snapshot(kube, agent, name, dest)
            return s == (None, None, None)

        await eventually(converged, timeout=30, what=f"victim {i} removed after kill -9")
        k = await snapshot(kube, agent, keeper, keep_dest)
        assert k[0] == "Ready" and k[1] == "Ready", k
        assert all((keep_dest / rel).read_bytes() == data for rel, data in keep_files.items())
    await kube.delete_model(CBM, keeper)
