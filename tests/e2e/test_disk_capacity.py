"""A full disk: the model that cannot fit fails with InsufficientDisk; models on another root stay Ready."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.models import tiny_llama
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 24 MiB filesystem (tmpfs) to use as a models root."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_full_disk_fails_one_model_and_spares_the_others(
    kube: Kube,
    olah: OlahServer,
    mirrors_root: Path,
    make_agent: AgentFactory,
    unique: str,
    tmp_path: Path,
    small_disk: Path,
) -> None:
    big = tiny_llama(51, padding_bytes=40 << 20)
    small = tiny_llama(52)
    big_repo, small_repo = f"acme/big-{unique}", f"acme/small-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, big_repo, big)
    await asyncio.to_thread(create_model_repo, mirrors_root, small_repo, small)
    other_root = tmp_path / "other-root"
    agent = await make_agent(models_root=small_disk, args=("--allowed-root", str(other_root)))
    big_name, small_name = f"big-{unique}", f"small-{unique}"
    await kube.apply(cbm(big_name, f"hf://{big_repo}", str(small_disk / big_name)))
    await kube.apply(cbm(small_name, f"hf://{small_repo}", str(other_root / small_name)))

    async def outcome() -> bool:
        labels = await kube.node_labels(agent.node)
        entry = await kube.entry(agent.node, configmap_key(CBM, "", big_name)) or {}
        return (
            labels.get(node_label_key(CBM, "", small_name)) == "Ready"
            and labels.get(node_label_key(CBM, "", big_name)) == "Failed"
            and str(entry.get("reason", "")).startswith("InsufficientDisk")
        )

    await eventually(outcome, timeout=60, what="big model Failed/InsufficientDisk, small model Ready")
    entry = await kube.entry(agent.node, configmap_key(CBM, "", big_name))
    print("reason:", entry and entry["reason"])

    async def event() -> bool:
        return any(e["reason"] == "InsufficientDisk" for e in await kube.events_for(big_name))

    await eventually(event, timeout=15, what="InsufficientDisk Event")
    assert (other_root / small_name / "model.safetensors").read_bytes() == small["model.safetensors"]
    assert not (small_disk / big_name).exists()
    assert agent.alive()
    for n in (big_name, small_name):
        await kube.delete_model(CBM, n)
