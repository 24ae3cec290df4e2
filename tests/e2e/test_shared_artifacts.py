"""Shared Hugging Face artifacts (``downloadPolicy: ReuseIfExists``, OME #734 and follow-ups) end to end.

Two ClusterBaseModels of one repository and commit, created at the same moment — one naming the commit by
the ``hf-model-id`` / ``hf-model-sha`` annotations, the other by a pinned URI — on one agent, against the
real API server and the olah mirror:

* one download: ``model_agent_downloads_success`` counts one fetch, and the second model adopts the verified
  copy; both are Ready (label and entry), each path a relative symlink to ``_artifacts/<id>/<commit>``;
* the entries' ``config.artifact`` is what OME writes for a shared child
  (``{"sha":"","parentPath":null,"childrenPaths":null}``: OME keeps the sharing in its own keys);
* deleting one removes its link only: the other model stays Ready on the same files;
* deleting both moves the artifact into the trash once (one trash entry holding the files), through the one
  destructive path (confirmed, the breaker counting), and leaves no link behind.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
NO_SHARING = {"sha": "", "parentPath": None, "childrenPaths": None}


async def state(kube: Kube, node: str, name: str) -> tuple[str | None, dict[str, Any]]:
    labels = await kube.node_labels(node)
    return labels.get(node_label_key(CBM, "", name)), await kube.entry(node, configmap_key(CBM, "", name)) or {}


async def wait_ready(kube: Kube, node: str, name: str) -> None:
    async def ready() -> bool:
        label, entry = await state(kube, node, name)
        return label == "Ready" and entry.get("status") == "Ready"

    await eventually(ready, timeout=60, what=f"{name} Ready")


async def wait_gone(kube: Kube, node: str, name: str) -> None:
    async def gone() -> bool:
        label, entry = await state(kube, node, name)
        return label is None and not entry

    await eventually(gone, timeout=60, what=f"{name} removed from the node")


def downloads(agent: AgentProcess) -> float:
    return sum(v for k, v in agent.metrics().items() if k.startswith("model_agent_downloads_success_total"))


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


async def test_two_models_of_one_commit_share_one_copy_until_the_last_goes(
    kube: Kube, make_agent: AgentFactory, olah: OlahServer, mirrors_root: Path, unique: str, tmp_path: Path
) -> None:
    repo = f"acme/shared-{unique}"
    files = tiny_llama(19)
    commit = create_model_repo(mirrors_root, repo, files)
    root = tmp_path / f"models-shared-{unique}"
    agent = await make_agent(models_root=root, args=("--trash-grace", "3600"))
    first, second = f"shared-a-{unique}", f"shared-b-{unique}"
    by_annotation = cbm(first, f"hf://{repo}", str(root / "a"), downloadPolicy="ReuseIfExists")
    by_annotation["metadata"]["annotations"] = {"hf-model-id": repo, "hf-model-sha": commit}
    by_uri = cbm(second, f"hf://{repo}@{commit}", str(root / "b"), downloadPolicy="ReuseIfExists")
    await asyncio.gather(kube.apply(by_annotation), kube.apply(by_uri))
    await asyncio.gather(wait_ready(kube, agent.node, first), wait_ready(kube, agent.node, second))

    parent = root / "_artifacts" / repo / commit
    assert downloads(agent) == 1, agent.metrics()
    for link in (root / "a", root / "b"):
        assert link.is_symlink(), f"{link} is not a link"
        assert os.readlink(link) == os.path.relpath(parent, link.parent)  # relative, as OME makes them
        assert Path(os.path.realpath(link)) == parent
    expected = {name: data for name, data in files.items()}
    assert {k: v for k, v in tree(parent).items() if k in expected} == expected
    for name in (first, second):
        _, entry = await state(kube, agent.node, name)
        assert entry["config"]["artifact"] == NO_SHARING, entry

    # One of them goes: its link only; the other stays Ready on the same files.
    await kube.delete_model(CBM, first)
    await wait_gone(kube, agent.node, first)
    assert not os.path.lexists(root / "a")
    assert (root / "b").is_symlink() and parent.is_dir()
    assert {k: v for k, v in tree(root / "b").items() if k in expected} == expected
    assert (await state(kube, agent.node, second))[0] == "Ready"
    trash = root / ".model-agent" / "trash"
    assert not any(trash.iterdir()), "nothing is quarantined while another model uses the artifact"

    # The last one goes: the artifact moves into the trash, once.
    await kube.delete_model(CBM, second)
    await wait_gone(kube, agent.node, second)

    async def quarantined() -> bool:
        return not parent.exists() and len(list(trash.iterdir())) == 1

    await eventually(quarantined, timeout=30, what="the artifact quarantined")
    assert not os.path.lexists(root / "b")
    (entry_dir,) = trash.iterdir()
    assert {k: v for k, v in tree(entry_dir / "data").items() if k in expected} == expected
    assert downloads(agent) == 1
