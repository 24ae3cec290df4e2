"""Reconcile safety end to end: a changed spec never costs the copy a model may come back to.

* a source switch retires the old copy only after the new target is Ready; a new target that cannot be made
  Ready (a missing ``local://`` path) leaves every old copy where it was, and patching back needs no download;
* a spec reverted while the new source is still downloading (A -> B -> A) cancels the obsolete fetch: the
  label leaves ``Ready`` once, the staging area ends empty, A's weights never move — also with a symlinked
  models root and a trailing ``/`` in the path;
* a ``local://`` directory that vanishes (or loses a file) on the host goes ``Failed`` with a reason within one
  resync, and is ``Ready`` again once it is back.

Everything is real: the API server, the Hugging Face mirror (olah), and for slowing a download the project's
fault proxy in front of the mirror.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.proxies.faultproxy import FaultProxy, Rule, stall
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, LabelHistory, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
RESYNC_S = 5
RESYNC = ("--resync-interval", str(RESYNC_S))


async def state(kube: Kube, agent: AgentProcess, name: str) -> tuple[str | None, dict[str, Any] | None]:
    labels = await kube.node_labels(agent.node)
    return labels.get(node_label_key(CBM, "", name)), await kube.entry(agent.node, configmap_key(CBM, "", name))


async def wait_ready(kube: Kube, agent: AgentProcess, name: str, timeout: float = 30) -> None:
    async def ready() -> bool:
        label, entry = await state(kube, agent, name)
        return label == "Ready" and (entry or {}).get("status") == "Ready"

    await eventually(ready, timeout=timeout, what=f"{name} Ready")


async def wait_failed(kube: Kube, agent: AgentProcess, name: str, reason: str, timeout: float) -> None:
    async def failed() -> bool:
        label, entry = await state(kube, agent, name)
        entry = entry or {}
        return label == "Failed" and entry.get("status") == "Failed" and str(entry.get("reason", "")).startswith(reason)

    await eventually(failed, timeout=timeout, what=f"{name} Failed: {reason}")


async def set_storage(kube: Kube, name: str, uri: str, path: str | None) -> None:
    """Replace the model's storage URI and path (a fresh read, retried on a conflict, never a stale write)."""

    def change(live: dict[str, Any]) -> None:
        storage = live["spec"]["storage"]
        storage["storageUri"] = uri
        if path is None:
            storage.pop("path", None)
        else:
            storage["path"] = path

    await kube.update_model(CBM, name, change)


def tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def private(agent: AgentProcess, area: str) -> list[Path]:
    d = agent.models_root / ".model-agent" / area
    return sorted(d.iterdir()) if d.is_dir() else []


def downloads(olah: OlahServer) -> list[str]:
    return [r.path for r in olah.requests() if "/resolve/" in r.path and r.method == "GET"]


def left_ready(history: list[str | None]) -> int:
    """How often the label went from Ready to anything else."""
    return sum(1 for a, b in itertools.pairwise(history) if a == "Ready" and b != "Ready")


async def test_four_models_patched_to_missing_local_path_keep_weights(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent(args=RESYNC)
    names = [f"typo-{unique}-{i}" for i in range(4)]
    before: dict[str, dict[str, bytes]] = {}
    for i, name in enumerate(names):
        repo = f"acme/{name}"
        await asyncio.to_thread(create_model_repo, mirrors_root, repo, tiny_llama(70 + i))
        await kube.apply(cbm(name, f"hf://{repo}", str(agent.models_root / name)))
    for name in names:
        await wait_ready(kube, agent, name)
        before[name] = tree(agent.models_root / name)

    missing = f"/nonexistent-{unique}/wrong"
    await asyncio.gather(*(set_storage(kube, n, f"local://{missing}", None) for n in names))
    for name in names:
        await wait_failed(kube, agent, name, "LocalPathNotFound", timeout=20)
    for name in names:
        assert tree(agent.models_root / name) == before[name], f"{name}: weights moved"
    assert private(agent, "trash") == []
    assert agent.metric("model_agent_quarantined_total") == 0

    olah.reset_stats()
    await asyncio.gather(*(set_storage(kube, n, f"hf://acme/{n}", str(agent.models_root / n)) for n in names))
    for name in names:
        await wait_ready(kube, agent, name, timeout=20)
        assert tree(agent.models_root / name) == before[name]
    assert downloads(olah) == [], "patching back must not download anything"
    assert private(agent, "trash") == []
    for name in names:
        await kube.delete_model(CBM, name)


@pytest.mark.parametrize("spelling", ["plain", "trailing-slash", "symlinked-root"])
async def test_spec_revert_does_not_flap(
    kube: Kube,
    olah: OlahServer,
    mirrors_root: Path,
    make_agent: AgentFactory,
    unique: str,
    tmp_path: Path,
    spelling: str,
) -> None:
    async with FaultProxy(olah.endpoint) as slow_hub:
        models_root: Path | None = None
        if spelling == "symlinked-root":
            real = tmp_path / "real-models"
            real.mkdir()
            models_root = tmp_path / "models-link"
            os.symlink(real, models_root)
        agent = await make_agent(args=RESYNC, models_root=models_root, env={"HF_ENDPOINT": slow_hub.url})
        name = f"revert-{unique}"
        repo_a, repo_b = f"acme/{name}-a", f"acme/{name}-b"
        await asyncio.to_thread(create_model_repo, mirrors_root, repo_a, tiny_llama(81))
        await asyncio.to_thread(create_model_repo, mirrors_root, repo_b, tiny_llama(82))
        dest = agent.models_root / name
        path = str(dest) + ("/" if spelling == "trailing-slash" else "")
        await kube.apply(cbm(name, f"hf://{repo_a}", path))
        await wait_ready(kube, agent, name)
        weights_a = tree(dest)
        # B's files are held at the proxy for a while, then served: a slow download that would complete.
        held = slow_hub.add_rule(Rule(rf"/{repo_b}/resolve/", stall(8.0)))

        async with LabelHistory(kube, agent.node, node_label_key(CBM, "", name)) as history:
            await set_storage(kube, name, f"hf://{repo_b}", path)
            await eventually(lambda: _fired(held), timeout=20, what="B's download under way")
            await set_storage(kube, name, f"hf://{repo_a}", path)
            await wait_ready(kube, agent, name, timeout=20)

            async def b_settled() -> bool:  # every held request of B answered or abandoned: B is over either way
                return all(r.outcome != "pending" for r in slow_hub.requests(path_contains=f"/{repo_b}/resolve/"))

            await eventually(b_settled, timeout=30, what="B's held requests settled")

            async def settled() -> bool:  # A's first fetch ended, and B's (cancelled, or whatever it came to)
                label, entry = await state(kube, agent, name)
                ended = agent.log_text().count("fetch ended") >= 2
                return ended and label == "Ready" and (entry or {}).get("status") == "Ready"

            await eventually(settled, timeout=20, what="A Ready and B's fetch ended")
            # B, had it run on, would have reached publish by now: the staging area is empty, A untouched.
            assert private(agent, "staging") == [], "an obsolete download left its copy in staging"
        # The watch starts with A Ready; every Node event after that is in the history.
        assert left_ready(["Ready", *history.values]) <= 1, f"the label flapped: {history.values}"
        assert history.values[-1:] == ["Ready"], history.values
        assert tree(dest) == weights_a
        assert private(agent, "trash") == []
        await kube.delete_model(CBM, name)


async def _fired(handle: Any) -> bool:
    return bool(handle.fired)


async def test_vanished_local_directory_fails_then_recovers(
    kube: Kube, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    agent = await make_agent(args=RESYNC)
    name = f"vanish-{unique}"
    d = tmp_path / "host-weights" / name
    d.mkdir(parents=True)
    for file, data in tiny_llama(91).items():
        (d / file).write_bytes(data)
    await kube.apply(cbm(name, f"local://{d}", str(d)))
    await wait_ready(kube, agent, name)

    # The directory removed on the host (kept aside by a rename, so it can come back unchanged).
    aside = tmp_path / "aside"
    d.rename(aside)
    await wait_failed(kube, agent, name, "LocalPathNotFound", timeout=RESYNC_S + 10)
    aside.rename(d)
    await wait_ready(kube, agent, name, timeout=RESYNC_S + 10)

    # One file of it removed: Failed again, with the file named; back in place: Ready.
    weights = d / "model.safetensors"
    weights.rename(aside)
    await wait_failed(kube, agent, name, "LocalFilesChanged", timeout=RESYNC_S + 10)
    _, entry = await state(kube, agent, name)
    assert "model.safetensors" in str((entry or {}).get("reason")), entry
    aside.rename(weights)
    await wait_ready(kube, agent, name, timeout=RESYNC_S + 10)
    assert tree(d) == tiny_llama(91), "local:// files are never written"
    shutil.rmtree(d)
    await kube.delete_model(CBM, name)
