"""Shared state has one writer per act: what one node must never do to another on a shared root, with the real classes.

Each test drives the real :class:`Remover`, :class:`SharedRoots`, :class:`ManifestStore`, :class:`Trash`,
``publish`` and ``adopt_or_wait`` over a directory that plays a shared root (another node's marker is in it), with
the project's fakes only for the API server (:class:`FakeKubeClient`, the in-memory :class:`LeaseApi`) and the
node's label and entry writers. Each asserts what a node sharing the root sees afterwards: a live model's files,
link and record stay; a damaged copy is fetched again; one owner's publication is never another's.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.artifact_reuse import Adoption, adopt_copy, adopt_or_wait, link_child
from model_agent.agent.breaker import Breaker
from model_agent.agent.fetcher import Fetcher
from model_agent.agent.origin_slots import OriginSlots
from model_agent.agent.removal import Candidate, RemovalContext, Remover
from model_agent.agent.requeue import Requeue
from model_agent.agent.shared_root import (
    SHARED_STAGING_IDLE_S,
    SharedRoots,
    check_publication,
    publication_bytes,
    staging_discardable,
)
from model_agent.local.layout import Layout
from model_agent.local.manifest import FileRecord, Manifest, ManifestStore
from model_agent.local.node_markers import write_marker
from model_agent.local.trash import Trash
from model_agent.local.verify import mark_damaged, verify_manifest
from model_agent.model.resources import ModelKind, ModelRef
from model_agent.ops.metrics import Metrics
from model_agent.sources.base import FetchRequest, FetchResult, publish
from tests.support.fake_kube import FakeKubeClient, not_found
from tests.unit.test_removal import FakeEvents, FakeNodeConfigMap, FakeNodeLabels
from tests.unit.test_shared_root import KEY, URI, FakeJob, LeaseApi, _published, node

DEADLINE_S = 5.0
NODE = "node-1"
REF = ModelRef(ModelKind.CLUSTER_BASE_MODEL, "", "m1")
MODEL_PATH = "/apis/ome.io/v1beta1/clusterbasemodels/m1"
NODE_PATH = f"/api/v1/nodes/{NODE}"
UID = "uid-1"
COMMIT = "a" * 40


def _obj(path: str, uri: str, selector: dict[str, str], *, uid: str = UID, reuse: bool = False) -> dict[str, Any]:
    storage: dict[str, Any] = {"storageUri": uri, "path": path, "nodeSelector": selector}
    if reuse:
        storage["downloadPolicy"] = "ReuseIfExists"
    return {
        "apiVersion": "ome.io/v1beta1",
        "kind": "ClusterBaseModel",
        "metadata": {"name": "m1", "uid": uid, "resourceVersion": "5"},
        "spec": {"storage": storage},
    }


def _node_obj() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"gpu": "h100"}}}


def _shared(layout: Layout, manifests: ManifestStore, api: LeaseApi | None = None) -> SharedRoots:
    shared = SharedRoots(api or LeaseApi(), "ome", NODE, layout, manifests, lease_s=30, poll_s=0.01)  # type: ignore[arg-type]
    shared.mark()
    return shared


def _remover(
    layout: Layout, manifests: ManifestStore, client: FakeKubeClient, shared: SharedRoots, cached: list[dict[str, Any]]
) -> tuple[Remover, FakeNodeLabels]:
    labels = FakeNodeLabels({REF.label_key: "Ready", "gpu": "h100"})
    ctx = RemovalContext(
        client=client,  # type: ignore[arg-type]
        node_name=NODE,
        layout=layout,
        manifests=manifests,
        trash=Trash(layout),
        labels=labels,  # type: ignore[arg-type]
        configmap=FakeNodeConfigMap({REF.configmap_key: '{"status": "Ready"}'}),  # type: ignore[arg-type]
        fetcher=Fetcher(workers=1, on_done=lambda k: None),
        events=FakeEvents(),  # type: ignore[arg-type]
        metrics=Metrics(),
        breaker=Breaker(settle_s=0),
        cached_models=lambda: list(cached),
        confirm_deadline_s=1.0,
        shared_roots=shared,
    )
    return Remover(ctx), labels


def _client(live: dict[str, Any] | None) -> FakeKubeClient:
    client = FakeKubeClient()
    client.always("GET", MODEL_PATH, live if live is not None else not_found("m1", "clusterbasemodels"))
    client.always("GET", NODE_PATH, _node_obj())
    return client


async def test_a_deselected_node_keeps_the_shared_artifact_link_every_other_node_serves_through(
    tmp_path: Path,
) -> None:
    """Node-1 stops being selected; node-2 still serves the model through the link on the shared root."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    write_marker(layout.primary.private, "node-2")
    manifests = ManifestStore(layout)
    parent = layout.primary.path / "models" / "_artifacts" / "org" / "m" / COMMIT
    parent.mkdir(parents=True)
    (parent / "w.bin").write_bytes(b"x" * 100)
    link = layout.primary.path / "models" / "m1"
    link_child(layout, REF.key, link, parent)
    manifests.save(
        Manifest(REF.key, UID, f"hf://org/m@{COMMIT}", str(parent), files=[FileRecord("w.bin", 100)]), layout.primary
    )
    shared = _shared(layout, manifests)
    live = _obj(str(link), f"hf://org/m@{COMMIT}", {"gpu": "a100"}, reuse=True)  # no longer selects node-1
    remover, labels = _remover(layout, manifests, _client(live), shared, [live])
    assert shared.peers_record(manifests.load(REF.key), alive=True)  # the reconciler hands it over as None
    await asyncio.wait_for(remover.remove(Candidate(REF, UID, None, "no longer selects this node")), DEADLINE_S)
    assert REF.label_key not in labels.values  # node-1's own label goes
    assert parent.is_dir() and manifests.load(REF.key) is not None
    assert link.is_symlink() and os.path.realpath(link) == str(parent)  # the link every node serves through stays
    assert (link / "w.bin").read_bytes() == b"x" * 100


async def test_a_deselected_node_never_moves_weights_on_a_shared_allowed_root(tmp_path: Path) -> None:
    """The primary root is private (local disk), the --allowed-root is shared with node-2 (NFS)."""
    local, nfs = tmp_path / "local", tmp_path / "nfs"
    layout = Layout(local, [nfs])
    layout.ensure()
    write_marker(layout.roots[1].private, "node-2")
    manifests = ManifestStore(layout)
    dest = layout.roots[1].path / "m1"
    dest.mkdir(parents=True)
    (dest / "w.bin").write_bytes(b"x" * 100)
    manifests.save(Manifest(REF.key, UID, "hf://org/m", str(dest), files=[FileRecord("w.bin", 100)]), layout.roots[1])
    shared = _shared(layout, manifests)
    live = _obj(str(dest), "hf://org/m", {"gpu": "a100"})
    remover, labels = _remover(layout, manifests, _client(live), shared, [live])
    await asyncio.wait_for(remover.remove(Candidate(REF, UID, None, "no longer selects this node")), DEADLINE_S)
    assert REF.label_key not in labels.values
    assert (dest / "w.bin").read_bytes() == b"x" * 100
    assert manifests.load(REF.key) is not None
    assert list(Trash(layout).entries()) == []


async def test_a_late_removal_never_moves_a_successors_copy_recorded_in_another_nodes_state_dir(
    tmp_path: Path,
) -> None:
    """--state-dir on a shared root. K (U1, hf://org/old) is re-created as U2 (hf://org/new, same path, node-2
    only); node-2 published U2's copy there. Node-1's late removal of U1 keeps the directory."""
    layout = Layout(tmp_path / "root", state_dir=tmp_path / "state-node-1")
    layout.ensure()
    write_marker(layout.primary.private, "node-2")
    manifests = ManifestStore(layout)
    dest = layout.primary.path / "m1"
    dest.mkdir(parents=True)
    (dest / "w.bin").write_bytes(b"NEW" * 10)
    manifests.save(Manifest(REF.key, UID, "hf://org/old", str(dest), files=[FileRecord("w.bin", 30)]), layout.primary)
    shared = _shared(layout, manifests)
    live = _obj(str(dest), "hf://org/new", {"gpu": "a100"}, uid="uid-2")
    remover, _ = _remover(layout, manifests, _client(live), shared, [live])
    manifest = manifests.load(REF.key)
    await asyncio.wait_for(remover.remove(Candidate(REF, UID, manifest, "no longer selects this node")), DEADLINE_S)
    assert (dest / "w.bin").read_bytes() == b"NEW" * 10
    assert list(Trash(layout).entries()) == []


async def test_a_late_removal_never_moves_a_directory_another_source_is_published_at(tmp_path: Path) -> None:
    """With the successor gone from this node's cache: the publication of another source at the path is enough."""
    layout = Layout(tmp_path / "root", state_dir=tmp_path / "state-node-1")
    layout.ensure()
    write_marker(layout.primary.private, "node-2")
    manifests = ManifestStore(layout)
    dest = layout.primary.path / "m1"
    successor = _published(dest)  # (hf://org/model, published by node-2 into the shared publication area)
    mine = Manifest(REF.key, UID, "hf://org/old", str(dest), files=list(successor.files))
    manifests.save(mine, layout.primary)
    shared = _shared(layout, manifests)
    publication = shared._publication_path(layout.primary, URI, dest)
    publication.parent.mkdir(parents=True, exist_ok=True)
    publication.write_bytes(publication_bytes(successor.to_json(), "node-2", 1.0))
    remover, _ = _remover(layout, manifests, _client(None), shared, [])
    await asyncio.wait_for(remover.remove(Candidate(REF, UID, mine, "absent from the cache")), DEADLINE_S)
    assert (dest / "w.bin").read_bytes() == b"weights"
    assert list(Trash(layout).entries()) == []


async def test_a_removal_keeps_a_copy_another_node_re_adopted_while_its_label_write_was_in_flight(
    tmp_path: Path,
) -> None:
    """Node-1 removes K (NotFound) under the record guard; while its label write is in flight, K is re-created
    and node-2's READY takes the record over (uid U2, intent cleared). The re-check before the move sees it."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    write_marker(layout.primary.private, "node-2")
    manifests = ManifestStore(layout)
    dest = layout.primary.path / "m1"
    dest.mkdir(parents=True)
    (dest / "w.bin").write_bytes(b"x" * 100)
    manifests.save(Manifest(REF.key, UID, "hf://org/m", str(dest), files=[FileRecord("w.bin", 100)]), layout.primary)
    shared = _shared(layout, manifests)
    remover, labels = _remover(layout, manifests, _client(None), shared, [])
    in_label_write, go_on = asyncio.Event(), asyncio.Event()
    plain = labels.ensure

    async def slow_ensure(key: str, value: str | None) -> bool:
        in_label_write.set()
        await go_on.wait()
        return await plain(key, value)

    labels.ensure = slow_ensure  # type: ignore[method-assign]
    removal = asyncio.create_task(remover.remove(Candidate(REF, UID, manifests.load(REF.key), "absent from the cache")))
    await asyncio.wait_for(in_label_write.wait(), DEADLINE_S)
    current = manifests.load(REF.key)
    assert current is not None and current.removing
    current.uid, current.removing = "uid-2", ""  # node-2's READY for the re-created object (a writer without the guard)
    manifests.save(current, layout.primary)
    go_on.set()
    await asyncio.wait_for(removal, DEADLINE_S)
    assert (dest / "w.bin").read_bytes() == b"x" * 100
    record = manifests.load(REF.key)
    assert record is not None and record.uid == "uid-2"


async def test_ready_adopting_a_shared_record_waits_for_the_guard_a_removal_holds(tmp_path: Path) -> None:
    """The guard itself: while node-1 holds the key's record guard, node-2's record_turn is refused (requeue)."""
    api = LeaseApi()
    (one, _), (two, _) = node(api, tmp_path, "n1"), node(api, tmp_path, "n2")
    dest = one._layout.primary.path / "m"
    async with one.removal_turn(KEY, str(dest), gone=True):
        with pytest.raises(Requeue):
            async with two.record_turn(KEY, dest):
                raise AssertionError("two writers of one shared record")
    async with two.record_turn(KEY, dest):  # released: node-2 goes on
        pass


async def test_damage_found_on_a_shared_root_is_fetched_again_not_undone_by_the_publication(tmp_path: Path) -> None:
    """The corrupt file keeps its size and mtime; the stale publication must not erase the damage marks."""
    api = LeaseApi()
    (a, manifests), (b, _) = node(api, tmp_path, "a"), node(api, tmp_path, "b")
    root = a._layout.primary
    dest = root.path / "m"
    good = _published(dest)
    good.files[0] = FileRecord("w.bin", 7, hashlib.sha256(b"weights").hexdigest(), None, good.files[0].mtime_ns)
    manifests.save(good, root)
    await asyncio.to_thread(a._publish, KEY, URI, dest, root)
    st = (dest / "w.bin").stat()
    (dest / "w.bin").write_bytes(b"WEIGHTS")
    os.utime(dest / "w.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    damaged = verify_manifest(manifests.load(KEY))  # type: ignore[arg-type]
    assert damaged == ["w.bin"]
    manifests.save(mark_damaged(manifests.load(KEY), damaged), root)  # type: ignore[arg-type]
    fetched: list[bool] = []

    async def fetch() -> None:  # the holder's refetch: a new file (new mtime), a new record
        fetched.append(True)
        repaired = _published(dest)  # writes the file anew
        sha = hashlib.sha256(b"weights").hexdigest()
        repaired.files[0] = FileRecord("w.bin", 7, sha, None, (dest / "w.bin").stat().st_mtime_ns)
        manifests.save(repaired, root)

    async with asyncio.timeout(DEADLINE_S):
        await b.fetch_once(FakeJob(), KEY, URI, dest, root, fetch)
    assert fetched == [True]
    assert verify_manifest(manifests.load(KEY)) == []  # type: ignore[arg-type]
    # And the publication the holder left is the repaired copy: adoptable for others.
    data = b._publication_path(root, URI, dest).read_bytes()
    assert check_publication(data, URI, dest)[0] is not None


def test_a_publication_of_the_damaged_copy_is_refused_and_a_repaired_one_is_not(tmp_path: Path) -> None:
    dest = tmp_path / "m"
    good = _published(dest)
    marked = mark_damaged(good, ["w.bin"])
    assert marked.damaged == {"w.bin": good.files[0].mtime_ns}
    stale = publication_bytes(good.to_json(), "n1", 1.0)
    assert check_publication(stale, URI, dest, current=marked)[1] == "publishes a copy a verification found damaged"
    (dest / "w.bin").unlink()
    (dest / "w.bin").write_bytes(b"weights")  # the refetched file
    later = good.files[0].mtime_ns + 10**9
    os.utime(dest / "w.bin", ns=(later, later))
    repaired = Manifest(KEY, "u1", URI, str(dest), files=[FileRecord("w.bin", 7, None, None, later)])
    fresh = publication_bytes(repaired.to_json(), "n1", 2.0)
    assert check_publication(fresh, URI, dest, current=marked)[0] is not None


def test_a_publication_of_another_owner_is_never_adopted(tmp_path: Path) -> None:
    """A tenant's model names a trusted model's source and path; the publication is the trusted owner's."""
    dest = tmp_path / "m"
    published = _published(dest, owner="cluster-admins")
    data = publication_bytes(published.to_json(), "n1", 1.0)
    assert check_publication(data, URI, dest, "cluster-admins")[0] is not None
    assert check_publication(data, URI, dest, "team-evil")[1] == "published for another owner"


async def test_a_tenant_on_a_shared_root_fetches_with_its_own_credentials_instead_of_adopting(tmp_path: Path) -> None:
    """Through fetch_once: the tenant's node never takes the trusted owner's publication."""
    api = LeaseApi()
    (a, manifests), (b, _) = node(api, tmp_path, "a"), node(api, tmp_path, "b")
    root = a._layout.primary
    dest = root.path / "m"
    manifests.save(_published(dest, owner="cluster-admins"), root)
    await asyncio.to_thread(a._publish, KEY, URI, dest, root)
    manifests.delete(KEY)
    fetched: list[str] = []

    async def fetch() -> None:
        fetched.append("with the tenant's credentials")
        manifests.save(_published(dest, owner="team-evil", key="BaseModel/team-evil/steal"), root)

    async with asyncio.timeout(DEADLINE_S):
        await b.fetch_once(FakeJob(), "BaseModel/team-evil/steal", URI, dest, root, fetch, owner="team-evil")
    assert fetched == ["with the tenant's credentials"]


async def _converge_sibling_b(
    manifests: ManifestStore, layout: Layout, uri: str, parent: Path, record: Manifest
) -> Adoption:
    """adopt_or_wait for sibling B's record of ``parent`` (nothing may be retired or relinked on the way)."""

    async def never(*_a: Any) -> None:
        raise AssertionError("nothing is retired or relinked")

    return await adopt_or_wait(
        manifests,
        never,
        never,
        key="ClusterBaseModel//b",
        uid="ub",
        owner="owner",
        generation=1,
        storage_uri=uri,
        parent=parent,
        root=layout.primary,
        manifest=record,
        fetching=set,
    )


async def test_a_reuse_sibling_takes_the_siblings_fresh_record_instead_of_refetching(tmp_path: Path) -> None:
    """A's refetch replaced w.bin in the parent (a new inode and mtime); B's record no longer matches. B adopts
    A's new record, so the two never refetch each other's files."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    manifests = ManifestStore(layout)
    parent = layout.primary.path / "models" / "_artifacts" / "org" / "m" / COMMIT
    parent.mkdir(parents=True)
    (parent / "w.bin").write_bytes(b"x" * 100)
    st = (parent / "w.bin").stat()
    uri = f"hf://org/m@{COMMIT}"
    a = Manifest(
        "ClusterBaseModel//a", "ua", uri, str(parent), files=[FileRecord("w.bin", 100, mtime_ns=st.st_mtime_ns)]
    )
    manifests.save(a, layout.primary)
    b = adopt_copy(a, "ClusterBaseModel//b", "ub", "owner", 1)
    manifests.save(b, layout.primary)
    staging = layout.primary.staging / "tok-a"
    staging.mkdir(parents=True)
    (staging / "w.bin").write_bytes(b"x" * 100)
    os.utime(staging / "w.bin", ns=(st.st_mtime_ns + 10**9, st.st_mtime_ns + 10**9))
    req = FetchRequest(storage_uri=uri, dest=parent, staging=staging, previous=a, root=layout.primary.path)
    files = publish(req, FetchResult(revision=COMMIT, files=[FileRecord("w.bin", 100)], staged=["w.bin"]))
    manifests.save(Manifest(a.key, "ua", uri, str(parent), files=files), layout.primary)  # A's new record
    stale = manifests.load("ClusterBaseModel//b")
    assert stale is not None and stale.fast_check() == ["w.bin: modified"]

    adoption = await _converge_sibling_b(manifests, layout, uri, parent, stale)
    assert adoption.manifest is not None and adoption.manifest.fast_check() == []
    assert not adoption.wait
    again = manifests.load("ClusterBaseModel//b")
    assert again is not None and again.fast_check() == [] and again.owner == "owner"


async def test_a_reuse_sibling_marked_damaged_refetches_rather_than_adopt_the_siblings_record(tmp_path: Path) -> None:
    """The other side: a record a re-hash marked damaged is never refreshed from a sibling (it would undo it)."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    manifests = ManifestStore(layout)
    parent = layout.primary.path / "p"
    parent.mkdir(parents=True)
    (parent / "w.bin").write_bytes(b"x" * 100)
    st = (parent / "w.bin").stat()
    a = Manifest(
        "ClusterBaseModel//a", "ua", URI, str(parent), files=[FileRecord("w.bin", 100, mtime_ns=st.st_mtime_ns)]
    )
    manifests.save(a, layout.primary)
    b = mark_damaged(adopt_copy(a, "ClusterBaseModel//b", "ub", "owner", 1), ["w.bin"])

    adoption = await _converge_sibling_b(manifests, layout, URI, parent, b)
    assert adoption.manifest is b  # DAMAGED: the reconciler fetches the marked file again


# ------------------------------------------------------------------------------------------ fencing


async def test_a_lease_is_expired_only_after_its_record_stayed_unchanged_for_its_duration_here() -> None:
    """A holder whose clock is far behind (renewTime years ago) but which renews is never taken over."""
    api = LeaseApi()
    now = [1000.0]
    holder = OriginSlots(api, "ome", "n1", 1, lease_s=10, clock=lambda: now[0])  # type: ignore[arg-type]
    other = OriginSlots(api, "ome", "n2", 1, lease_s=10, clock=lambda: now[0])  # type: ignore[arg-type]
    assert await holder._try("l")
    api.leases["l"]["spec"]["renewTime"] = "2001-01-01T00:00:00.000000Z"  # its clock is behind ours by years
    assert not await other._try("l")  # first sighting: the clock starts here
    now[0] += 9
    assert not await other._try("l")
    api.leases["l"]["spec"]["renewTime"] = "2001-01-01T00:00:09.000000Z"  # it renewed (by its clock)
    api.version += 1
    api.leases["l"]["metadata"]["resourceVersion"] = str(api.version)
    now[0] += 9
    assert not await other._try("l")  # a changed record starts the clock again
    now[0] += 10.5
    assert await other._try("l")  # unchanged for longer than its duration, timed here: expired


async def test_a_holder_whose_renewals_fail_is_fenced_before_the_next_destructive_step() -> None:
    api = LeaseApi()
    now = [0.0]
    slots = OriginSlots(api, "ome", "n1", 1, lease_s=30, clock=lambda: now[0])  # type: ignore[arg-type]
    assert await slots._try(_lease_name("src"))
    assert slots.holds("src")
    now[0] += 19.9
    assert slots.holds("src")
    now[0] += 0.2  # two renewals missed: more than 2/3 of the duration since the last success
    assert not slots.holds("src")


def _lease_name(source: str) -> str:
    from model_agent.agent.origin_slots import lease_names

    return lease_names(source, 1)[0]


# ------------------------------------------------------------------------------------------ staging


@pytest.mark.parametrize(
    ("shared", "idle", "discardable"),
    [
        (False, 0.0, True),  # a private root's staging is this node's: no job of its own, nobody's
        (True, 0.0, False),  # a shared root: another node may be fetching into it right now
        (True, SHARED_STAGING_IDLE_S - 1, False),
        (True, SHARED_STAGING_IDLE_S, True),  # untouched for many Lease periods: a dead fetch's leftovers
    ],
)
def test_staging_discardable(shared: bool, idle: float, discardable: bool) -> None:
    assert staging_discardable(shared, idle) is discardable


async def test_another_nodes_running_fetch_staging_is_left_alone_and_an_idle_one_goes(tmp_path: Path) -> None:
    """Node-1 fetches into the shared staging; node-2 has no job of its own for it. Every path that discards
    staging (READY's clean-up, the inventory, a removal) asks this rule: the live area stays, a long-idle one goes."""
    api = LeaseApi()
    node(api, tmp_path, "n1")
    two, _ = node(api, tmp_path, "n2")
    root = two._layout.primary
    live = root.staging / "tok-live"
    (live / ".cache").mkdir(parents=True)
    (live / ".cache" / "w.bin.parts").write_bytes(b"{}")  # node-1's part map, written seconds ago
    old = root.staging / "tok-old"
    old.mkdir(parents=True)
    (old / "w.bin").write_bytes(b"x")
    long_ago = time.time() - SHARED_STAGING_IDLE_S - 60
    for path in (old / "w.bin", old):
        os.utime(path, (long_ago, long_ago))
    assert not await asyncio.to_thread(two.may_discard_staging, root, live)
    assert await asyncio.to_thread(two.may_discard_staging, root, old)


def test_the_breaker_counts_this_nodes_models_on_a_shared_root_not_the_fleets_records(tmp_path: Path) -> None:
    """100 records on the shared root (the fleet's), 4 models labelled on this node: the breaker's denominator
    is 4, so this node's mass deselection (3 of its 4) is held, whatever the fleet holds."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    manifests = ManifestStore(layout)
    for i in range(100):
        manifests.save(
            Manifest(f"ClusterBaseModel//m{i}", f"u{i}", URI, str(layout.primary.path / f"m{i}")), layout.primary
        )
    private, _ = _remover(layout, manifests, _client(None), _shared(layout, manifests), [])
    assert private._model_count() == 100  # a private root: this node's records are its models
    write_marker(layout.primary.private, "node-2")
    remover, labels = _remover(layout, manifests, _client(None), _shared(layout, manifests), [])
    labels.values.update({f"models.ome.io/clusterbasemodel.m{i}": "Ready" for i in range(10, 13)})
    assert len(labels.model_labels()) == 4
    assert remover._model_count() == 4


async def test_a_takeover_fetch_reads_the_record_again_and_never_retires_the_new_copy(tmp_path: Path) -> None:
    """The reconciler decided "fetch the new source, retire the old copy"; by the time this node holds the fetch
    Lease, the dead holder had already published the new copy and retired the old one. The fetch plans from the
    record as it is now: nothing to retire, the new copy as its previous."""
    from model_agent.agent.reconciler import Target
    from model_agent.model.uris import StorageType
    from tests.unit.test_ownership import _reconciler

    layout = Layout(tmp_path / "root")
    layout.ensure()
    write_marker(layout.primary.private, "node-2")
    dest = layout.primary.path / "m1"
    reconciler = _reconciler(layout, {"BaseModel": {}, "ClusterBaseModel": {}}, _shared(layout, ManifestStore(layout)))
    manifests = reconciler.ctx.manifests
    stale_old = Manifest(REF.key, UID, "hf://org/old", str(dest), files=[FileRecord("w.bin", 7)])
    target = Target("hf://org/new", dest, layout.primary, StorageType.HUGGINGFACE)
    new_copy = _published(dest, key=REF.key, storage_uri="hf://org/new")
    manifests.save(new_copy, layout.primary)  # what the dead holder left: the new copy, recorded
    previous, superseded = await reconciler._records_now(REF, target, None, stale_old)
    assert superseded is None and previous is not None and previous.storage_uri == "hf://org/new"
    manifests.delete(REF.key)  # nothing recorded any more (retired, and the new one not yet recorded)
    assert await reconciler._records_now(REF, target, None, stale_old) == (None, None)
