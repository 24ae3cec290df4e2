"""agent/artifact_reuse.py: the sharing decision row by row, the child link, and sibling adoption."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.artifact_reuse import (
    Adoption,
    Identity,
    LinkState,
    SharingFacts,
    Sibling,
    adopt_or_wait,
    link_child,
    plan_sharing,
    release_child,
    shared_target,
    sibling_state,
)
from model_agent.local.artifacts import LinkRecords
from model_agent.local.layout import Layout, PathRefused, token_for
from model_agent.local.manifest import FileRecord, Manifest, ManifestStore
from tests.support.hostile_json import DEEP

SHA = "0e9e39f249a16976918f6564b8830bc894c89659"
OTHER = "1" * 40
BASE = SharingFacts(
    reuse_policy=True,
    hf_source=True,
    cluster_scoped=True,
    path="/mnt/models/llama",
    uri_repo="meta-llama/Llama-3.1-8B",
    uri_revision="",
    annotated_id="meta-llama/Llama-3.1-8B",
    annotated_commit=SHA,
    link=LinkState.ABSENT,
)


@pytest.mark.parametrize(
    ("change", "shared", "why"),
    [
        ({}, Identity("meta-llama/Llama-3.1-8B", SHA), ""),
        ({"annotated_commit": SHA.upper()}, Identity("meta-llama/Llama-3.1-8B", SHA), ""),
        (
            {"annotated_id": "", "annotated_commit": "", "uri_revision": SHA},
            Identity("meta-llama/Llama-3.1-8B", SHA),
            "",
        ),
        ({"annotated_id": ""}, Identity("meta-llama/Llama-3.1-8B", SHA), ""),  # the commit alone, the URI's repo
        ({"uri_revision": SHA}, Identity("meta-llama/Llama-3.1-8B", SHA), ""),  # both agree
        ({"link": LinkState.SYMLINK}, Identity("meta-llama/Llama-3.1-8B", SHA), ""),  # our link (or a stale one)
        ({"reuse_policy": False}, None, "not ReuseIfExists"),
        ({"hf_source": False}, None, "only hf://"),
        ({"cluster_scoped": False}, None, "only ClusterBaseModels"),
        ({"path": ""}, None, "not set"),
        ({"path": "/mnt/models/_artifacts/x"}, None, "'_artifacts' component"),
        ({"link": LinkState.OCCUPIED}, None, "already exists"),
        ({"annotated_id": "meta-llama/Other"}, None, "names 'meta-llama/Other'"),
        ({"annotated_commit": "main"}, None, "not a 40-character"),
        ({"uri_revision": OTHER}, None, "different commits"),
        ({"annotated_commit": "", "uri_revision": "main"}, None, "no commit"),
        ({"annotated_commit": "", "uri_revision": ""}, None, "no commit"),
        ({"annotated_id": "", "uri_repo": "a/b/c"}, None, "not a Hugging Face model id"),
        ({"annotated_id": "", "uri_repo": "a/.."}, None, "not a Hugging Face model id"),
        ({"annotated_id": "", "uri_repo": ""}, None, "not a Hugging Face model id"),
    ],
)
def test_plan_sharing(change: dict[str, object], shared: Identity | None, why: str) -> None:
    plan = plan_sharing(dataclasses.replace(BASE, **change))  # type: ignore[arg-type]
    assert plan.identity == shared
    assert why in plan.why_not


def test_identity_layout_and_pinned_source() -> None:
    identity = Identity("meta-llama/Llama-3.1-8B", SHA)
    assert identity.pinned_uri == f"hf://meta-llama/Llama-3.1-8B@{SHA}"
    assert identity.parent_next_to(Path("/mnt/models/x")) == Path(
        f"/mnt/models/_artifacts/meta-llama/Llama-3.1-8B/{SHA}"
    )


def cluster_model(path: str, uri: str = f"hf://acme/m@{SHA}") -> dict[str, object]:
    return {
        "kind": "ClusterBaseModel",
        "metadata": {"name": "m"},
        "spec": {"storage": {"storageUri": uri, "path": path, "downloadPolicy": "ReuseIfExists"}},
    }


def test_link_child_is_relative_replaces_only_links_and_release_removes_only_its_own(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.ensure()
    target = shared_target(cluster_model(str(tmp_path / "a")), layout, cluster_scoped=True)
    assert target is not None and target.link == tmp_path / "a"
    target.parent.mkdir(parents=True)
    (tmp_path / "a").symlink_to("/etc")  # a stale link: replaced, never written through
    link_child(layout, "k", target.link, target.parent)
    assert os.readlink(tmp_path / "a") == f"_artifacts/acme/m/{SHA}"
    link_child(layout, "k", target.link, target.parent)  # idempotent
    (tmp_path / "c").mkdir()
    with pytest.raises(PathRefused):
        link_child(layout, "k2", tmp_path / "c", target.parent)
    assert (tmp_path / "c").is_dir()
    release_child(layout, "k")
    assert not os.path.lexists(tmp_path / "a") and target.parent.is_dir()
    release_child(layout, "k")  # idempotent
    # A link re-pointed by someone else is not ours to remove.
    link_child(layout, "k", target.link, target.parent)
    (tmp_path / "a").unlink()
    (tmp_path / "a").symlink_to("/etc")
    release_child(layout, "k")
    assert (tmp_path / "a").is_symlink()


@pytest.mark.parametrize(
    "body",
    ["[]", "1", '"k"', "null", '{"key": "k", "link": "/a"}', DEEP],
    ids=["list", "number", "string", "null", "no parent", "nested past any recursion limit"],
)
def test_a_link_record_of_the_wrong_shape_reads_as_none_and_releases_nothing(tmp_path: Path, body: str) -> None:
    layout = Layout(tmp_path)
    layout.ensure()
    parent = tmp_path / "_artifacts" / "p"
    parent.mkdir(parents=True)
    link_child(layout, "k", tmp_path / "a", parent)
    (LinkRecords(layout).directory / f"{token_for('k')}.json").write_text(body)
    assert LinkRecords(layout).load("k") is None
    release_child(layout, "k")
    assert (tmp_path / "a").is_symlink()  # no record: the link is left alone


def test_a_real_directory_at_the_path_means_an_ordinary_fetch(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    (tmp_path / "a").mkdir()
    assert shared_target(cluster_model(str(tmp_path / "a")), layout, cluster_scoped=True) is None
    assert shared_target(cluster_model(str(tmp_path / "b")), layout, cluster_scoped=False) is None


async def _nothing(*_args: object) -> None:
    return None


def _adopt(
    store: ManifestStore,
    layout: Layout,
    uri: str,
    parent: Path,
    *,
    key: str,
    uid: str,
    generation: int = 1,
    manifest: Manifest | None = None,
    retire: Callable[[Manifest], Awaitable[None]] = _nothing,
    relink: Callable[[], Awaitable[None]] = _nothing,
) -> Coroutine[Any, Any, Adoption]:
    """``adopt_or_wait`` for model ``key`` of owner "o", with no fetch running."""
    return adopt_or_wait(
        store,
        retire,
        relink,
        key=key,
        uid=uid,
        owner="o",
        generation=generation,
        storage_uri=uri,
        parent=parent,
        root=layout.primary,
        manifest=manifest,
        fetching=set,
    )


def test_siblings_adopt_a_verified_copy_and_wait_for_a_running_fetch(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.ensure()
    store = ManifestStore(layout)
    parent = tmp_path / "_artifacts" / "acme" / "m" / SHA
    parent.mkdir(parents=True)
    (parent / "w").write_bytes(b"x")
    uri = f"hf://acme/m@{SHA}"
    assert sibling_state("B", uri, parent, store, set()) == (Sibling.NONE, None)
    assert sibling_state("B", uri, parent, store, {"A"})[0] == Sibling.FETCHING
    record = FileRecord("w", 1, mtime_ns=(parent / "w").stat().st_mtime_ns)
    store.save(Manifest("A", "ua", uri, str(parent), revision=SHA, files=[record]), layout.primary)
    state, sibling = sibling_state("B", uri, parent, store, set())
    assert state == Sibling.COPY and sibling is not None and sibling.key == "A"

    async def no_retire(_old: Manifest) -> None:
        raise AssertionError("nothing to retire")

    adoption = asyncio.run(_adopt(store, layout, uri, parent, key="B", uid="ub", generation=2, retire=no_retire))
    assert not adoption.wait and adoption.manifest is not None
    mine = store.load("B")
    assert mine is not None and (mine.uid, mine.dest, mine.owner, mine.files) == ("ub", str(parent), "o", [record])
    # A damaged copy is nobody's to adopt.
    (parent / "w").write_bytes(b"yy")
    assert sibling_state("C", uri, parent, store, set())[0] == Sibling.NONE


def test_two_models_at_once_one_claims_the_fetch_the_other_waits(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.ensure()
    store = ManifestStore(layout)
    parent = tmp_path / "_artifacts" / "acme" / "claims" / SHA
    uri = f"hf://acme/claims@{SHA}"

    async def both() -> tuple[bool, bool]:
        a, b = await asyncio.gather(*(_adopt(store, layout, uri, parent, key=k, uid=k) for k in "AB"))
        return a.wait, b.wait

    assert sorted(asyncio.run(both())) == [False, True]


def test_a_model_moving_to_a_siblings_commit_is_linked_there_before_its_old_copy_is_retired(tmp_path: Path) -> None:
    """The model's link must lead to weights at every instant: it is pointed at the sibling's verified copy of the
    new commit first, and only then is the old commit's copy retired (to the trash, when nobody else uses it)."""
    layout = Layout(tmp_path)
    layout.ensure()
    store = ManifestStore(layout)
    uri = f"hf://acme/move@{SHA}"
    parent = tmp_path / "_artifacts" / "acme" / "move" / SHA
    parent.mkdir(parents=True)
    (parent / "w").write_bytes(b"x")
    record = FileRecord("w", 1, mtime_ns=(parent / "w").stat().st_mtime_ns)
    store.save(Manifest("A", "ua", uri, str(parent), revision=SHA, files=[record]), layout.primary)
    old_parent = tmp_path / "_artifacts" / "acme" / "move" / ("1" * 40)
    mine = Manifest("B", "ub", f"hf://acme/move@{'1' * 40}", str(old_parent), revision="1" * 40)
    acts: list[str] = []

    async def retire(old: Manifest) -> None:
        acts.append(f"retire {Path(old.dest).name}")

    async def relink() -> None:
        acts.append("link")

    adoption = asyncio.run(
        _adopt(store, layout, uri, parent, key="B", uid="ub", generation=3, manifest=mine, retire=retire, relink=relink)
    )
    assert acts == ["link", f"retire {'1' * 40}"]
    assert adoption.manifest is not None and adoption.manifest.dest == str(parent)
