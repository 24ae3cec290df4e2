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
  refetching each other's files forever (one agent: the siblings' records are private-root records);
* each node keeping its records in its own ``--state-dir``: a node that comes back after its model was replaced by
  one of another commit at the same path (selecting the other node only) removes its label and entry, and leaves
  the successor's weights where the other node serves them Ready;
* a removal whose label write stalls while the model is created again with the same spec: the re-created model's
  weights never leave their path, though the removal was decided before the re-create.
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
from testbed.proxies.faultproxy import FaultProxy, Rule, stall
from testbed.servers.olah import OlahServer, add_commit, create_model_repo
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


class PathWatcher:
    """A pod reading the model through its path the whole time: records every moment a file is not there."""

    def __init__(self, path: Path, files: dict[str, bytes]) -> None:
        self.path, self.names = path, sorted(files)
        self.misses: list[str] = []
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name in self.names:
                if not (self.path / name).is_file():
                    self.misses.append(name)
            self.reads += 1
            self._stop.wait(0.005)

    def __enter__(self) -> PathWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


async def test_a_node_back_from_downtime_leaves_a_successors_weights_when_records_live_in_each_state_dir(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    """Both nodes keep their records in their own ``--state-dir``. While node one is down, the model is replaced by
    one of a newer commit at the same path that selects node two only (a GitOps replace pinning a new commit). Node
    two fetches it; node one comes back with only its own record of the old commit, removes its label and entry,
    and never moves the successor's weights."""
    files = tiny_llama(71)
    repo = f"acme/statedir-{unique}"
    first = await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    newer = dict(files, **{"config.json": files["config.json"].replace(b"{", b'{"_rev": 2, ', 1)})
    second = await asyncio.to_thread(add_commit, mirrors_root, repo, newer)
    shared = tmp_path / "shared-models"
    group = {"state-dir-test": unique}
    one = await make_agent(models_root=shared, labels=group, args=("--state-dir", str(tmp_path / "state-1")))
    two = await make_agent(models_root=shared, labels=group, args=("--state-dir", str(tmp_path / "state-2")))
    await kube.label_node(two.node, {"state-dir-second": unique})
    name = f"statedir-{unique}"
    dest = shared / "m"
    await kube.apply(cbm(name, f"hf://{repo}@{first}", str(dest), nodeSelector=group))
    await asyncio.gather(wait_label(kube, one.node, name, "Ready"), wait_label(kube, two.node, name, "Ready"))
    one.kill()
    await kube.delete_model(CBM, name)

    async def gone() -> bool:
        return await kube.model_gone(CBM, name)

    await eventually(gone, timeout=30, what="the old object deleted")
    await kube.apply(cbm(name, f"hf://{repo}@{second}", str(dest), nodeSelector={"state-dir-second": unique}))

    async def successor_ready() -> bool:
        labels = await kube.node_labels(two.node)
        return (
            labels.get(node_label_key(CBM, "", name)) == "Ready"
            and (dest / "config.json").read_bytes() == newer["config.json"]
        )

    await eventually(successor_ready, timeout=120, what="node two Ready with the newer commit")
    retired = trash_entries(shared)  # node two's retirement of the old commit's copy, before its fetch
    with PathWatcher(dest, newer) as watcher:
        one.start()
        await asyncio.to_thread(one.wait_ready)
        await wait_label(kube, one.node, name, None)

        async def settled() -> bool:  # node one's removal has run its course: its entry is gone too
            return await kube.entry(one.node, configmap_key(CBM, "", name)) is None

        await eventually(settled, timeout=60, what="node one's entry removed")
    assert watcher.misses == [], watcher.misses[:5]
    assert {p: (dest / p).read_bytes() for p in newer} == newer
    assert trash_entries(shared) == retired  # node one moved nothing
    assert (await kube.node_labels(two.node)).get(node_label_key(CBM, "", name)) == "Ready"
    assert not any((tmp_path / "state-1" / "manifests").glob("*.json"))  # its stale record of the old copy went
    await kube.delete_model(CBM, name)


async def test_a_removal_stalled_while_the_model_is_created_again_never_moves_its_weights(
    kube: Kube,
    olah: OlahServer,
    mirrors_root: Path,
    make_agent: AgentFactory,
    unique: str,
    tmp_path: Path,
    proxy: FaultProxy,
) -> None:
    """Node one talks to the API server through a proxy that holds each PATCH of its Node for 10 s: once its
    removal has confirmed the model gone, it holds the shared guard and is writing its label (held) when the model
    is applied again with the same spec. Node two (a slower settle) sees the re-created object. The weights never
    leave the path, both nodes end Ready for the new object, and the shared record names it."""
    files = tiny_llama(73)
    repo = f"acme/readopt-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    shared = tmp_path / "shared-models"
    group = {"readopt-test": unique}
    via = proxy.kubeconfig  # type: ignore[attr-defined]
    one = await make_agent(models_root=shared, labels=group, via=via)
    two = await make_agent(models_root=shared, labels=group, args=("--delete-settle", "6"))
    name = f"readopt-{unique}"
    dest = shared / "m"
    body = cbm(name, f"hf://{repo}", str(dest), nodeSelector=group)
    await kube.apply(body)
    await asyncio.gather(wait_label(kube, one.node, name, "Ready"), wait_label(kube, two.node, name, "Ready"))
    held = proxy.add_rule(Rule(rf"/api/v1/nodes/{one.node}$", stall(10.0), method="PATCH", name="label"))

    before = proxy.count(method="PATCH", path_contains=f"/nodes/{one.node}")

    def label_write_held() -> bool:  # node one's removal decided and is removing its label (held by the proxy)
        return proxy.count(method="PATCH", path_contains=f"/nodes/{one.node}") > before

    with PathWatcher(dest, files) as watcher:
        await kube.delete_model(CBM, name)
        await proxy.await_for(label_write_held, timeout=60, what="node one's label removal")
        await kube.apply(body)  # while node one's label write (every PATCH of its Node) is held for 10 s
        uid = (await kube.get_model(CBM, name))["metadata"]["uid"]

        async def removal_ended() -> bool:  # node one's removal of the old object ran its course after the stall
            text = one.log_text()
            return "model removed" in text or "removal abandoned" in text

        await eventually(removal_ended, timeout=90, what="node one's removal of the old object ended")
        await asyncio.gather(
            wait_label(kube, one.node, name, "Ready", timeout=120), wait_label(kube, two.node, name, "Ready")
        )

        async def recorded() -> bool:  # the shared record names the re-created object
            for entry in os.scandir(shared / ".model-agent" / "manifests"):
                if entry.name.endswith(".json") and uid in Path(entry.path).read_text():
                    return True
            return False

        await eventually(recorded, timeout=60, what="the shared record of the re-created object")
    held.remove()
    assert watcher.misses == [], watcher.misses[:5]
    assert {p: (dest / p).read_bytes() for p in files} == files
    await kube.delete_model(CBM, name)
