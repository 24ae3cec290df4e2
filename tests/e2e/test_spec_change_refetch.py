"""A spec change is a new target: fetched again, the old copy retired only once the new one is in place (OME #552).

test_local_state covers a new ``storageUri`` at the same path; here the other two changes OME's agent ignored:

* a new ``spec.storage.path`` (same source): the weights are fetched to the new path; the old directory keeps
  its files until the new directory holds the complete new copy (checked on every poll while waiting: the
  weights are always on disk), then goes into the trash;
* a new pinned revision (``hf://repo@<commit1>`` -> ``@<commit2>``): the new commit's bytes replace the old
  ones and the old copy goes into the trash;
* a shared artifact (``ReuseIfExists``) whose ``hf-model-sha`` annotation names a new commit: the new parent is
  fetched, the path's link is re-pointed to it once it is Ready, and the old parent goes into the trash.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.models import tiny_llama
from testbed.servers.olah import add_commit, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"


async def holds(predicate: Any) -> bool:
    """An async probe of a synchronous condition (eventually() polls coroutines)."""
    return bool(predicate())


async def ready(kube: Kube, node: str, name: str) -> bool:
    labels = await kube.node_labels(node)
    entry = await kube.entry(node, configmap_key(CBM, "", name)) or {}
    return labels.get(node_label_key(CBM, "", name)) == "Ready" and entry.get("status") == "Ready"


async def update(kube: Kube, name: str, change: Any) -> None:
    await kube.update_model(CBM, name, change)


def weights(d: Path) -> bytes:
    f = d / "model.safetensors"
    return f.read_bytes() if f.is_file() else b""


class ReadsThrough:
    """Reads the weights through ``link`` over and over in a thread, as a pod starting at any instant would, and
    keeps what each read that found none of the ``allowed`` contents saw (a sample every 0.1 s missed a window
    of a few milliseconds)."""

    def __init__(self, link: Path, allowed: set[bytes]) -> None:
        self.link = link
        self.allowed = allowed
        self.count = 0
        self.bad: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # A read every millisecond until stopped (the wait paces the loop, leaving the agent its share of the cores)
        while not self._stop.wait(0.001):
            found = weights(self.link)
            self.count += 1
            if found not in self.allowed:
                self.bad.append(f"{os.path.realpath(self.link)}: {len(found)} bytes")

    def __enter__(self) -> ReadsThrough:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def trashed(root: Path) -> list[bytes]:
    trash = root / ".model-agent" / "trash"
    return [weights(d / "data") for d in sorted(trash.iterdir())] if trash.is_dir() else []


async def test_new_path_and_new_revision_are_fetched_and_the_old_copy_retired_after(
    kube: Kube, make_agent: AgentFactory, mirrors_root: Path, unique: str
) -> None:
    agent = await make_agent()
    root = agent.models_root
    repo = f"acme/respec-{unique}"
    v1, v2 = tiny_llama(71), tiny_llama(72)
    c1 = await asyncio.to_thread(create_model_repo, mirrors_root, repo, v1)
    c2 = await asyncio.to_thread(add_commit, mirrors_root, repo, v2)
    name = f"respec-{unique}"
    old, new = root / "first", root / "second"
    await kube.apply(cbm(name, f"hf://{repo}@{c1}", str(old)))
    await eventually(lambda: ready(kube, agent.node, name), timeout=60, what="Ready at the first path")

    # A new path: the old directory keeps its files until the new copy is Ready.
    def move(live: dict[str, Any]) -> None:
        live["spec"]["storage"]["path"] = str(new)

    await update(kube, name, move)

    early: list[str] = []  # polls that found no complete copy at either path (eventually() swallows raises)

    async def moved() -> bool:
        done = await ready(kube, agent.node, name) and weights(new) == v1["model.safetensors"]
        if v1["model.safetensors"] not in (weights(old), weights(new)):
            early.append("the old copy went before the new one was in place")
        return done

    await eventually(moved, timeout=60, what="Ready at the new path")
    assert not early, early
    await eventually(
        lambda: holds(lambda: trashed(root) == [v1["model.safetensors"]]), timeout=30, what="the old copy trashed"
    )
    assert not old.exists()

    # A new pinned revision at the same path: its bytes replace the old ones, which go into the trash.
    def bump(live: dict[str, Any]) -> None:
        live["spec"]["storage"]["storageUri"] = f"hf://{repo}@{c2}"

    await update(kube, name, bump)

    async def bumped() -> bool:
        return await ready(kube, agent.node, name) and weights(new) == v2["model.safetensors"]

    await eventually(bumped, timeout=60, what="Ready at the new revision")
    await eventually(lambda: holds(lambda: len(trashed(root)) == 2), timeout=30, what="the old revision trashed")
    assert sorted(trashed(root)) == sorted([v1["model.safetensors"]] * 2)


async def test_a_shared_artifact_follows_its_annotated_commit(
    kube: Kube, make_agent: AgentFactory, mirrors_root: Path, unique: str
) -> None:
    agent = await make_agent()
    root = agent.models_root
    repo = f"acme/shared-respec-{unique}"
    v1, v2 = tiny_llama(73), tiny_llama(74)
    c1 = await asyncio.to_thread(create_model_repo, mirrors_root, repo, v1)
    c2 = await asyncio.to_thread(add_commit, mirrors_root, repo, v2)
    name = f"shared-respec-{unique}"
    link = root / "model"
    body = cbm(name, f"hf://{repo}", str(link), downloadPolicy="ReuseIfExists")
    body["metadata"]["annotations"] = {"hf-model-id": repo, "hf-model-sha": c1}
    await kube.apply(body)
    await eventually(lambda: ready(kube, agent.node, name), timeout=60, what="Ready on the first commit")
    first = root / "_artifacts" / repo / c1
    assert Path(os.path.realpath(link)) == first

    def bump(live: dict[str, Any]) -> None:
        live["metadata"]["annotations"]["hf-model-sha"] = c2

    second = root / "_artifacts" / repo / c2
    with ReadsThrough(link, {v1["model.safetensors"], v2["model.safetensors"]}) as reads:
        await update(kube, name, bump)

        async def followed() -> bool:
            return await ready(kube, agent.node, name) and Path(os.path.realpath(link)) == second

        await eventually(followed, timeout=60, what="the link re-pointed to the new commit")
    assert reads.count > 0 and not reads.bad, (
        f"{len(reads.bad)} of {reads.count} reads found no weights: {reads.bad[:3]}"
    )
    assert weights(link) == v2["model.safetensors"]
    await eventually(lambda: holds(lambda: not first.exists()), timeout=30, what="the first commit's parent retired")
    assert trashed(root) == [v1["model.safetensors"]]
