"""Shared state has one writer per act, end to end: what a node sharing a models root must never do to another.

Two agents (subprocesses, one Node each) against the real API server and the olah mirror, sharing one directory:

* a node whose selection stops matching a ``ReuseIfExists`` model keeps the shared link: a reader going through
  ``spec.storage.path`` on the other node never misses the weights, and that node stays Ready (the link is shared
  state like the files; only a removal that may move the files removes it);
* a private primary root per node and one shared ``--allowed-root``: a deselected node drops its label and entry
  only; the live model's weights stay where the other node serves them, and nothing goes to the trash;
* a file that rots in place (size and mtime kept) on the shared root is found by a node's re-hash and fetched from
  the origin again: the earlier publication is never taken in place of the refetch;
* two ``ReuseIfExists`` siblings whose shared parent changed settle (one takes the other's fresh record) instead of
  refetching each other's files forever (one agent: the siblings' records are private-root records).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.request
from pathlib import Path

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.models import tiny_llama
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import always, eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"


async def wait_label(kube: Kube, node: str, name: str, value: str | None, timeout: float = 120) -> None:
    label = node_label_key(CBM, "", name)

    async def there() -> bool:
        return (await kube.node_labels(node)).get(label) == value

    await eventually(there, timeout=timeout, what=f"{node}: {name} label {value}")


def trash_entries(root: Path) -> list[Path]:
    trash = root / ".model-agent" / "trash"
    return sorted(trash.iterdir()) if trash.is_dir() else []


async def test_a_deselected_node_keeps_the_shared_artifact_link_the_other_node_serves_through(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    files = tiny_llama(53)
    repo = f"acme/linked-{unique}"
    commit = await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    shared = tmp_path / "shared-models"
    group = {"shared-link-test": unique}
    one = await make_agent(models_root=shared, labels=group)
    two = await make_agent(models_root=shared, labels=group)
    name = f"linked-{unique}"
    link = shared / "m"
    await kube.apply(cbm(name, f"hf://{repo}@{commit}", str(link), nodeSelector=group, downloadPolicy="ReuseIfExists"))
    await asyncio.gather(wait_label(kube, one.node, name, "Ready"), wait_label(kube, two.node, name, "Ready"))
    assert link.is_symlink()
    misses: list[str] = []
    reads = [0]
    stop = threading.Event()

    def reader() -> None:  # a pod on node two, opening the model through its path the whole time
        while not stop.is_set():
            try:
                (link / "config.json").read_bytes()
            except OSError as exc:
                misses.append(str(exc))
            reads[0] += 1
            stop.wait(0.002)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        await kube.label_node(one.node, {"shared-link-test": None})  # node one is no longer selected
        await wait_label(kube, one.node, name, None)

        async def read_on() -> bool:  # the reader keeps going well past node one's removal
            return reads[0] > 500

        await eventually(read_on, timeout=60, what="reads through the link after the deselection")
    finally:
        stop.set()
        thread.join(10)
    assert misses == [], misses[:3]
    assert link.is_symlink() and (link / "config.json").read_bytes() == files["config.json"]
    assert (await kube.node_labels(two.node)).get(node_label_key(CBM, "", name)) == "Ready"
    assert trash_entries(shared) == []
    await kube.delete_model(CBM, name)


async def test_a_deselected_node_never_moves_a_live_models_weights_on_a_shared_allowed_root(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    files = tiny_llama(59)
    repo = f"acme/mixed-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    nfs = tmp_path / "nfs-models"  # shared by both nodes; each node's primary root is its own local disk
    group = {"mixed-roots-test": unique}
    args = ("--allowed-root", str(nfs))
    one = await make_agent(labels=group, args=args)
    two = await make_agent(labels=group, args=args)
    name = f"mixed-{unique}"
    dest = nfs / "m"
    await kube.apply(cbm(name, f"hf://{repo}", str(dest), nodeSelector=group))
    await asyncio.gather(wait_label(kube, one.node, name, "Ready"), wait_label(kube, two.node, name, "Ready"))
    await kube.label_node(one.node, {"mixed-roots-test": None})
    await wait_label(kube, one.node, name, None)

    async def settled() -> bool:  # node one's removal has run its course: its entry is gone too
        return await kube.entry(one.node, configmap_key(CBM, "", name)) is None

    await eventually(settled, timeout=60, what="node one's entry removed")
    assert {p: (dest / p).read_bytes() for p in files} == files
    assert trash_entries(nfs) == [] and trash_entries(one.models_root) == []
    assert (await kube.node_labels(two.node)).get(node_label_key(CBM, "", name)) == "Ready"
    assert any(os.scandir(nfs / ".model-agent" / "manifests"))  # the shared record stays for node two
    await kube.delete_model(CBM, name)


async def test_damage_found_on_a_shared_root_is_fetched_again_from_the_origin(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    """A byte of a Ready model's file flips in place on the shared root, its size and mtime kept (bit rot, a
    storage fault): node one's re-hash finds it, and the file is fetched from the origin again. The publication
    the fetching node left before is never taken in place of that refetch."""
    files = tiny_llama(61)
    repo = f"acme/rot-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    shared = tmp_path / "shared-models"
    group = {"shared-rot-test": unique}
    one = await make_agent(models_root=shared, labels=group)
    two = await make_agent(models_root=shared, labels=group)
    name = f"rot-{unique}"
    dest = shared / "m"
    await kube.apply(cbm(name, f"hf://{repo}", str(dest), nodeSelector=group))
    await asyncio.gather(wait_label(kube, one.node, name, "Ready"), wait_label(kube, two.node, name, "Ready"))
    victim = dest / "model.safetensors"
    stat = victim.stat()
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    olah.reset_stats()
    request = urllib.request.Request(f"http://127.0.0.1:{one.port}/verify", method="POST", data=b"")
    with await asyncio.to_thread(urllib.request.urlopen, request, timeout=60) as answer:
        report = json.loads(answer.read())
    assert any("model.safetensors" in damaged for damaged in report.values()), report

    async def repaired() -> bool:
        return victim.read_bytes() == files["model.safetensors"]

    await eventually(repaired, timeout=60, what="the damaged file fetched again")
    fetched = [r for r in olah.requests() if r.method == "GET" and r.path.endswith("/model.safetensors")]
    assert fetched, "the file was not fetched from the origin again"
    await asyncio.gather(wait_label(kube, one.node, name, "Ready"), wait_label(kube, two.node, name, "Ready"))
    await kube.delete_model(CBM, name)


async def test_two_reuse_siblings_settle_after_their_parent_changes_instead_of_refetching_each_other(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    """Two ``ReuseIfExists`` models of one commit share a parent; a weights file in it is touched (a new mtime, as
    a refetch's publish leaves). Each sibling's record stops matching; after at most a refetch each, one takes the
    other's fresh record, and both stay Ready with no further origin traffic over several resyncs."""
    files = tiny_llama(67)
    repo = f"acme/siblings-{unique}"
    commit = await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    root = tmp_path / "models"
    agent = await make_agent(models_root=root, args=("--resync-interval", "2"))
    names = [f"sib-a-{unique}", f"sib-b-{unique}"]
    for name in names:
        await kube.apply(cbm(name, f"hf://{repo}@{commit}", str(root / name), downloadPolicy="ReuseIfExists"))
    await asyncio.gather(*(wait_label(kube, agent.node, n, "Ready") for n in names))
    weights = root / "_artifacts" / repo / commit / "model.safetensors"
    later = weights.stat().st_mtime_ns + 10**9
    os.utime(weights, ns=(later, later))
    olah.reset_stats()

    def weight_bytes() -> int:
        return sum(r.bytes_sent for r in olah.requests() if r.method == "GET" and r.path.endswith("/model.safetensors"))

    async def settled() -> bool:  # the change was noticed (a refetch), and both are Ready again
        labels = await kube.node_labels(agent.node)
        ready = all(labels.get(node_label_key(CBM, "", n)) == "Ready" for n in names)
        return ready and weight_bytes() > 0

    await eventually(settled, timeout=60, what="a refetch, then both siblings Ready again", interval=0.05)
    before = weight_bytes()

    async def quiet() -> bool:
        labels = await kube.node_labels(agent.node)
        ready = all(labels.get(node_label_key(CBM, "", n)) == "Ready" for n in names)
        return ready and weight_bytes() == before

    await always(quiet, duration=12, what="both Ready with no more origin GETs of the weights", interval=0.2)
    size = len(files["model.safetensors"])
    assert before <= 2.2 * size, (before, size)  # at most one refetch per sibling, never a loop
    for name in names:
        await kube.delete_model(CBM, name)
