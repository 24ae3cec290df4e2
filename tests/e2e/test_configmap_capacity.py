"""The node ConfigMap at its size limit, end to end: 1,100 models on one node, against the real API server.

The API server refuses a ConfigMap whose data exceeds 1 MiB, and with it the whole patch. Another writer's
key takes most of this node's ConfigMap before the agent starts, so the agent's 1,100 entries (``local://``
models sharing one small llama directory, about 840 bytes each with their parsed config and storage fields, 60
without them) do not all fit even in their smallest form. What must hold, sampled all along: no label says
``Ready`` without its entry; and at the end every model has an entry (statuses first: entries give up their
parsed config for room), or is reported as refused (``/status``, the ``model_agent_configmap_*`` gauges, a
``ConfigMapFull`` Event on the Node), and the other writer's key is intact. When that key goes, every model
gets its entry on a later pass, then its parsed config back, and the agent says the ConfigMap has room again.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from model_agent.kube.resources import CONFIGMAPS
from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
# As many models as fit in the ConfigMap with their whole entries (parsed config and storage fields, ~840 bytes each
# here, where the test's weights path appears twice) once the other writer's key is gone, with some room to spare.
MODELS = int(os.environ.get("CAPACITY_MODELS", "1100"))
DATA_LIMIT = 1024 * 1024
FOREIGN_KEY = "other-writer.example.com"
# Leaves the agent room for about two thirds of the entries even in their smallest form (~60 bytes with the
# key; ~840 with the parsed config and the storage fields), so some models must be refused.
FOREIGN_BYTES = DATA_LIMIT - 8 * 1024 - MODELS * 40
CREATE_CONCURRENCY = 32


async def create_all(kube: Kube, objs: list[dict[str, Any]]) -> float:
    """Create every object with at most CREATE_CONCURRENCY requests in flight; seconds taken."""
    slots = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(obj: dict[str, Any]) -> None:
        async with slots:
            await kube.apply(obj)

    started = time.monotonic()
    await asyncio.gather(*(one(o) for o in objs))
    return time.monotonic() - started


async def delete_all(kube: Kube, names: list[str]) -> None:
    slots = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(name: str) -> None:
        async with slots:
            await kube.delete_model(CBM, name)

    await asyncio.gather(*(one(n) for n in names))


async def agent_status(agent: AgentProcess) -> dict[str, Any]:
    code, body = await asyncio.to_thread(agent.http, "/status")
    assert code == 200, body
    status: dict[str, Any] = json.loads(body)
    return status


def data_bytes(data: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in data.items())


class Observed:
    """One look at the node: its labels first, then the ConfigMap (an entry is written before its label,
    so a Ready label seen first must have its entry in the later read)."""

    def __init__(self, labels: dict[str, str], data: dict[str, str]) -> None:
        self.labels = labels
        self.data = data

    @classmethod
    async def take(cls, kube: Kube, node: str) -> Observed:
        labels = await kube.node_labels(node)
        cm = await kube.configmap(node)
        return cls(labels, dict((cm or {}).get("data") or {}))

    def ready_without_entry(self, names: list[str]) -> list[str]:
        return [
            n
            for n in names
            if self.labels.get(node_label_key(CBM, "", n)) == "Ready" and configmap_key(CBM, "", n) not in self.data
        ]

    def with_entry(self, names: list[str]) -> set[str]:
        return {n for n in names if configmap_key(CBM, "", n) in self.data}


async def test_a_full_configmap_of_1100_models_never_shows_a_ready_label_lacking_its_entry(
    kube: Kube, kubeconfig: Path, tmp_path: Path, unique: str
) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    for rel, data in tiny_llama(7).items():
        (weights / rel).write_bytes(data)
    node = f"node-cap-{unique}"
    foreign = "x" * FOREIGN_BYTES
    await kube.c.request(
        "POST",
        CONFIGMAPS.path("ome"),
        body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": node}, "data": {FOREIGN_KEY: foreign}},
    )
    await kube.create_node(node)
    agent = AgentProcess(  # no Hugging Face mirror: every model here is local://
        kubeconfig=kubeconfig,
        node=node,
        models_root=tmp_path / "models",
        log_path=tmp_path / "agent.log",
        args=("--resync-interval", "30", "--api-qps", "50", "--api-burst", "100"),
    )
    agent.start()
    try:
        await asyncio.to_thread(agent.wait_ready)
        await fill_and_free(kube, agent, node, weights, foreign, unique)
    finally:
        if agent.alive():
            agent.stop()


async def fill_and_free(kube: Kube, agent: AgentProcess, node: str, weights: Path, foreign: str, unique: str) -> None:
    names = [f"cap-{unique}-{i:04d}" for i in range(MODELS)]
    created_s = await create_all(kube, [cbm(n, f"local://{weights}", str(weights)) for n in names])
    print(f"created {MODELS} ClusterBaseModels in {created_s:.1f}s")

    violations: list[str] = []
    samples = 0
    started = time.monotonic()

    async def settled() -> bool:
        nonlocal samples
        seen = await Observed.take(kube, node)
        samples += 1
        violations.extend(seen.ready_without_entry(names))
        status = await agent_status(agent)
        refused = set(status["configmap"]["refused"])
        accounted = {n for n in names if configmap_key(CBM, "", n) in refused} | seen.with_entry(names)
        return len(accounted) == MODELS and bool(refused)

    await eventually(settled, timeout=900, interval=1.0, what="every model with an entry or refused")
    print(f"settled in {time.monotonic() - started:.1f}s over {samples} samples")
    assert violations == [], f"Ready labels without an entry: {sorted(set(violations))[:10]}"

    seen = await Observed.take(kube, node)
    status = await eventually(lambda: agent_status(agent), timeout=60, what="/status")  # slow with 1,100 models
    refused = {n for n in names if configmap_key(CBM, "", n) in set(status["configmap"]["refused"])}
    written = seen.with_entry(names)
    assert refused and written and refused.isdisjoint(written) and len(refused | written) == MODELS
    assert seen.data[FOREIGN_KEY] == foreign  # the other writer's key is never touched
    assert data_bytes(seen.data) <= DATA_LIMIT
    compact = sum(1 for n in written if "config" not in json.loads(seen.data[configmap_key(CBM, "", n)]))
    ready_labels = sum(1 for n in names if seen.labels.get(node_label_key(CBM, "", n)) == "Ready")
    print(
        f"entries {len(written)} ({compact} without config), refused {len(refused)}, Ready labels {ready_labels}, "
        f"ConfigMap {data_bytes(seen.data)} bytes"
    )
    assert all(seen.labels.get(node_label_key(CBM, "", n)) != "Ready" for n in refused)
    assert agent.metric("model_agent_configmap_full") == 1
    assert agent.metric("model_agent_configmap_refused_entries") == len(refused)
    events = await kube.events_for(node)
    full = [e for e in events if e.get("reason") == "ConfigMapFull" and e["involvedObject"].get("kind") == "Node"]
    assert full and "full" in full[0]["message"]

    # The other writer's key goes: on a later pass every model gets its entry, and the agent says so.
    await kube.c.request(
        "PATCH",
        CONFIGMAPS.path("ome", node),
        body={"data": {FOREIGN_KEY: None}},
        content_type="application/merge-patch+json",
    )
    freed = time.monotonic()

    async def all_written() -> bool:
        seen = await Observed.take(kube, node)
        violations.extend(seen.ready_without_entry(names))
        return len(seen.with_entry(names)) == MODELS

    await eventually(all_written, timeout=600, interval=2.0, what="every model's entry once there is room")
    print(f"all entries written {time.monotonic() - freed:.1f}s after the room appeared")

    async def configs_back() -> bool:
        seen = await Observed.take(kube, node)
        violations.extend(seen.ready_without_entry(names))
        return all("config" in json.loads(seen.data[configmap_key(CBM, "", n)]) for n in names)

    await eventually(configs_back, timeout=600, interval=2.0, what="every entry with its parsed config again")
    print(f"every entry has its parsed config again {time.monotonic() - freed:.1f}s after the room appeared")
    assert violations == []

    async def room_said() -> bool:
        events = await kube.events_for(node)
        return agent.metric("model_agent_configmap_full") == 0 and any(
            e.get("reason") == "ConfigMapRoom" for e in events
        )

    await eventually(room_said, timeout=60, what="the ConfigMap reported as having room")
    agent.stop()  # before the clean-up: a mass delete would only trip the breaker
    await delete_all(kube, names)
