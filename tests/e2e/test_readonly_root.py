"""A read-only models root (OME issue #787): healthy when the agent needs to write nothing into it.

The root is a real read-only mount (a bind mount remounted ``ro``: the tests run as root, and a mode bit
does not stop root, a read-only mount does). Pre-provisioned ``local://`` models in it are adopted in
place; the agent's records live in ``--state-dir``:

* ``/healthz`` answers 200 and the model is Ready (label and entry), with nothing written into the root;
* a model that would be fetched into the read-only root fails (``PathRefused``, naming the read-only root)
  before anything is listed or written, and the agent stays healthy;
* without ``--state-dir`` the agent refuses to start and says which flag fixes it (it never runs unable to
  record what it adopted).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def readonly_root(tmp_path: Path, unique: str) -> Iterator[Path]:
    """A models root holding one pre-provisioned model (``<root>/llama``), mounted read-only."""
    root = tmp_path / f"ro-models-{unique}"
    weights = root / "llama"
    weights.mkdir(parents=True)
    for file, data in tiny_llama(7).items():
        (weights / file).write_bytes(data)
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(root)], check=True)
        with pytest.raises(OSError):  # the mount really refuses writes, to root too
            (root / "probe").write_bytes(b"x")
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=True)


async def state(kube: Kube, node: str, name: str) -> tuple[str | None, dict[str, Any]]:
    labels = await kube.node_labels(node)
    return labels.get(node_label_key(CBM, "", name)), await kube.entry(node, configmap_key(CBM, "", name)) or {}


async def test_readonly_root_with_local_models_is_healthy_and_ready(
    kube: Kube, make_agent: AgentFactory, readonly_root: Path, tmp_path: Path, unique: str
) -> None:
    before = tree(readonly_root)
    state_dir = tmp_path / f"state-{unique}"
    agent = await make_agent(models_root=readonly_root, args=("--state-dir", str(state_dir)))

    name = f"ro-local-{unique}"
    weights = readonly_root / "llama"
    await kube.apply(cbm(name, f"local://{weights}", str(weights)))

    async def ready() -> bool:
        label, entry = await state(kube, agent.node, name)
        return label == "Ready" and entry.get("status") == "Ready"

    await eventually(ready, timeout=30, what=f"{name} Ready on a read-only root")
    status, body = await asyncio.to_thread(agent.http, "/healthz?verbose")
    assert status == 200, body
    assert list((state_dir / "manifests").glob("*.json")), "the adoption is recorded in --state-dir"

    # A model that would be fetched into the read-only root fails with its reason; the agent stays healthy.
    fetched = f"ro-fetch-{unique}"
    await kube.apply(cbm(fetched, "hf://acme/never-fetched", str(readonly_root / "fetched")))

    async def failed() -> bool:
        label, entry = await state(kube, agent.node, fetched)
        return label == "Failed" and entry.get("status") == "Failed" and bool(entry.get("reason"))

    await eventually(failed, timeout=30, what=f"{fetched} Failed")
    _, entry = await state(kube, agent.node, fetched)
    assert str(entry.get("reason")).startswith("PathRefused: "), entry
    assert "read-only" in str(entry.get("reason")), entry
    status, body = await asyncio.to_thread(agent.http, "/healthz?verbose")
    assert status == 200, body
    assert (await state(kube, agent.node, name))[0] == "Ready"
    assert tree(readonly_root) == before, "nothing is written into a read-only root"
    assert not (readonly_root / ".model-agent").exists()


async def test_readonly_root_without_state_dir_refuses_to_start_and_names_the_flag(
    kube: Kube, kubeconfig: Path, readonly_root: Path, tmp_path: Path, unique: str
) -> None:
    node = f"node-{unique}-ro"
    await kube.create_node(node)
    agent = AgentProcess(
        kubeconfig=kubeconfig, node=node, models_root=readonly_root, log_path=tmp_path / f"agent-{node}.log"
    )
    agent.start()
    try:
        assert agent.proc is not None
        code = await asyncio.to_thread(agent.proc.wait, 60)
        assert code != 0
        assert "--state-dir" in agent.log_text(), agent.tail()
    finally:
        agent.kill()
