"""Unit tests for :meth:`ManifestStore.count`: current whoever writes the manifests directory.

On a shared root without ``--state-dir`` every node's agent writes the same manifests directory; the delete
breaker divides by this count, so a count that missed a peer's delete would make it open too late.
"""

from __future__ import annotations

import os
from pathlib import Path

from model_agent.local.layout import Layout
from model_agent.local.manifest import Manifest, ManifestStore

URI = "hf://org/model"


def _manifest(i: int, root: Path) -> Manifest:
    return Manifest(key=f"ClusterBaseModel//m{i}", uid=f"u{i}", storage_uri=URI, dest=str(root / f"m{i}"))


def _layout(root: Path) -> Layout:
    layout = Layout(root)
    layout.ensure()
    return layout


def test_the_count_follows_another_nodes_saves_and_deletes_on_a_shared_manifests_directory(tmp_path: Path) -> None:
    layout = _layout(tmp_path / "shared")
    here, peer = ManifestStore(layout), ManifestStore(_layout(tmp_path / "shared"))
    for i in range(5):
        here.save(_manifest(i, tmp_path), layout.primary)
    assert here.count() == 5
    for i in range(3):  # another node's agent trashes three models: their manifests go
        peer.delete(f"ClusterBaseModel//m{i}")
    assert here.count() == 2
    peer.save(_manifest(9, tmp_path), peer.layout.primary)
    assert here.count() == 3


def test_a_listing_taken_in_the_same_timestamp_tick_as_a_change_is_not_trusted(tmp_path: Path) -> None:
    layout = _layout(tmp_path / "root")
    store = ManifestStore(layout)
    store.save(_manifest(0, tmp_path), layout.primary)
    directory = layout.primary.manifests
    before = directory.stat()
    assert store.count() == 1
    # A coarse-timestamp filesystem: a second save within the same tick leaves the directory's mtime as it was.
    ManifestStore(layout).save(_manifest(1, tmp_path), layout.primary)
    os.utime(directory, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert store.count() == 2


def test_a_settled_listing_is_reused_and_a_missing_directory_counts_nothing(tmp_path: Path) -> None:
    layout = _layout(tmp_path / "root")
    store = ManifestStore(layout)
    store.save(_manifest(0, tmp_path), layout.primary)
    directory = layout.primary.manifests
    old = directory.stat().st_mtime_ns - 60_000_000_000
    os.utime(directory, ns=(old, old))  # the last change was a minute ago: a listing now is settled
    assert store.count() == 1
    (directory / "stray.json").write_text("{}")
    os.utime(directory, ns=(old, old))  # a change the mtime does not show (never happens on a real fs)
    assert store.count() == 1  # the settled listing is reused: one stat, no listing
    os.utime(directory, None)
    assert store.count() == 2
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    assert store.count() == 0
