"""Unit tests for the quarantine (trash): rename in, find, restore by rename, purge after the grace period."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from model_agent.local import trash as trash_module
from model_agent.local.layout import Layout, PathRefused, Root
from model_agent.local.manifest import FileRecord, Manifest
from model_agent.local.trash import Trash
from tests.support.hostile_json import DEEP

FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "model-00001-of-00002.safetensors": bytes(range(256)) * 64,
    "nested/tokenizer/tokenizer.json": b'{"version": "1.0"}',
}


class WallClock:
    """Stands in for the ``time`` module inside ``model_agent.local.trash`` (only ``time()`` is used)."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> WallClock:
    clock = WallClock()
    monkeypatch.setattr(trash_module, "time", SimpleNamespace(time=clock.time))
    return clock


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = Layout(tmp_path / "root")
    layout.primary.ensure()
    return layout


@pytest.fixture
def root(layout: Layout) -> Root:
    return layout.primary


@pytest.fixture
def trash(layout: Layout) -> Trash:
    return Trash(layout)


def write_model(dest: Path) -> None:
    for rel, data in FILES.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)


def read_tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def manifest_for(root: Root, name: str, *, uri: str | None = None, revision: str = "rev-1") -> Manifest:
    dest = root.path / "models" / name
    return Manifest(
        key=f"ClusterBaseModel//{name}",
        uid=f"uid-{name}",
        storage_uri=uri or f"hf://org/{name}",
        dest=str(dest),
        revision=revision,
        files=[FileRecord(rel, len(data)) for rel, data in FILES.items()],
    )


def model_on_disk(root: Root, name: str, **kwargs: str) -> Manifest:
    manifest = manifest_for(root, name, **kwargs)
    write_model(Path(manifest.dest))
    return manifest


def test_quarantine_renames_the_directory_into_the_trash(trash: Trash, root: Root) -> None:
    manifest = model_on_disk(root, "m1")
    dest = Path(manifest.dest)
    inode = (dest / "config.json").stat().st_ino
    entry = trash.quarantine(manifest, root, "confirmed_gone")
    assert entry is not None
    assert not dest.exists()
    assert entry.directory.parent == root.trash
    assert read_tree(entry.data) == FILES
    # A rename on the same filesystem, not a copy: the file is the same inode.
    assert (entry.data / "config.json").stat().st_ino == inode
    record = json.loads((entry.directory / "entry.json").read_text())
    assert record["reason"] == "confirmed_gone"
    assert record["quarantinedAt"] == entry.quarantined_at
    assert Manifest.from_json(json.dumps(record["manifest"])) == manifest
    assert [e.id for e in trash.entries()] == [entry.id]
    assert entry.to_json()["bytes"] == sum(len(d) for d in FILES.values())


def test_quarantine_of_a_missing_destination_returns_none(trash: Trash, root: Root) -> None:
    manifest = manifest_for(root, "never-fetched")
    assert trash.quarantine(manifest, root, "gone") is None
    assert list(root.trash.iterdir()) == []
    assert list(trash.entries()) == []


def test_find_restorable_matches_source_and_destination(trash: Trash, root: Root) -> None:
    manifest = model_on_disk(root, "m1")
    other = model_on_disk(root, "m2")
    entry = trash.quarantine(manifest, root, "gone")
    assert trash.quarantine(other, root, "gone") is not None
    assert entry is not None
    found = trash.find_restorable(manifest.storage_uri, manifest.dest)
    assert found is not None
    assert found.id == entry.id
    assert trash.find_restorable(manifest.storage_uri, manifest.dest, revision="rev-1") is not None
    assert trash.find_restorable(manifest.storage_uri, manifest.dest, revision="rev-2") is None
    assert trash.find_restorable("hf://org/another", manifest.dest) is None
    assert trash.find_restorable(manifest.storage_uri, other.dest) is None


def test_find_restorable_prefers_the_newest_entry(trash: Trash, root: Root, wall: WallClock) -> None:
    first = model_on_disk(root, "m1", revision="rev-1")
    older = trash.quarantine(first, root, "gone")
    wall.now += 60
    second = model_on_disk(root, "m1", revision="rev-2")
    newer = trash.quarantine(second, root, "gone")
    assert older is not None
    assert newer is not None
    found = trash.find_restorable(first.storage_uri, first.dest)
    assert found is not None
    assert found.id == newer.id
    assert found.manifest.revision == "rev-2"


def test_the_same_model_quarantined_twice_within_a_second(trash: Trash, root: Root, wall: WallClock) -> None:
    # Removed, re-fetched and removed again (or superseded, then removed) within the same wall-clock second.
    first = model_on_disk(root, "m1", revision="rev-1")
    assert trash.quarantine(first, root, "superseded") is not None
    second = model_on_disk(root, "m1", revision="rev-2")
    entry = trash.quarantine(second, root, "gone")
    assert entry is not None
    assert not Path(second.dest).exists()
    assert len(list(trash.entries())) == 2


def test_restore_puts_identical_bytes_back(trash: Trash, root: Root) -> None:
    manifest = model_on_disk(root, "m1")
    entry = trash.quarantine(manifest, root, "gone")
    assert entry is not None
    found = trash.find_restorable(manifest.storage_uri, manifest.dest)
    assert found is not None
    trash.restore(found)
    assert read_tree(Path(manifest.dest)) == FILES
    assert not entry.directory.exists()
    assert list(trash.entries()) == []
    assert trash.find_restorable(manifest.storage_uri, manifest.dest) is None


def test_restore_recreates_missing_parent_directories(trash: Trash, root: Root) -> None:
    manifest = model_on_disk(root, "m1")
    entry = trash.quarantine(manifest, root, "gone")
    assert entry is not None
    shutil.rmtree(Path(manifest.dest).parent)
    trash.restore(entry)
    assert read_tree(Path(manifest.dest)) == FILES


def test_purge_expired_deletes_only_expired_entries(trash: Trash, root: Root, wall: WallClock) -> None:
    old = trash.quarantine(model_on_disk(root, "old"), root, "gone")
    wall.now += 1800
    young = trash.quarantine(model_on_disk(root, "young"), root, "gone")
    assert old is not None
    assert young is not None
    # One hour after the first quarantine: only the first is past a one-hour grace period.
    purged = trash.purge_expired(3600, now=old.quarantined_at + 3600)
    assert [e.id for e in purged] == [old.id]
    assert not old.directory.exists()
    assert read_tree(young.data) == FILES
    assert [e.id for e in trash.entries()] == [young.id]
    # Nothing expired yet for the second one.
    assert trash.purge_expired(3600, now=young.quarantined_at + 3599) == []
    assert young.directory.exists()


def test_an_entry_whose_data_is_missing_is_cleaned_and_nothing_else(trash: Trash, root: Root) -> None:
    # A kill between writing entry.json and the rename leaves an entry without data, and the weights in place.
    manifest = model_on_disk(root, "m1")
    entry = trash.quarantine(manifest, root, "gone")
    assert entry is not None
    Path(entry.data).rename(Path(manifest.dest))  # the data never left its place
    assert trash.find_restorable(manifest.storage_uri, manifest.dest) is None
    purged = trash.purge_expired(3600, now=entry.quarantined_at + 3600)
    assert [e.id for e in purged] == [entry.id]
    assert not entry.directory.exists()
    assert read_tree(Path(manifest.dest)) == FILES  # the weights in place were not touched


def test_unreadable_entries_are_skipped(trash: Trash, root: Root) -> None:
    (root.trash / "garbage").mkdir()
    (root.trash / "garbage" / "entry.json").write_text("{not json")
    (root.trash / "no-entry").mkdir()
    entry = trash.quarantine(model_on_disk(root, "m1"), root, "gone")
    assert entry is not None
    assert [e.id for e in trash.entries()] == [entry.id]


def test_quarantine_refuses_a_parent_swapped_for_a_symlink_out_of_the_root(
    trash: Trash, root: Root, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    (outside / "model").mkdir(parents=True)
    (outside / "model" / "keep.bin").write_bytes(b"not ours")
    manifest = manifest_for(root, "model")
    manifest.dest = str(root.path / "org" / "model")
    # After validation, someone replaces the directory above the destination with a link out of the root.
    (root.path / "org").symlink_to(outside)
    with pytest.raises(PathRefused):
        trash.quarantine(manifest, root, "test")
    assert (outside / "model" / "keep.bin").read_bytes() == b"not ours"
    assert list(root.trash.iterdir()) == []


# ------------------------------------------------------------- purge off the event loop, restore lookups


def test_a_purge_after_a_restore_won_the_race_touches_nothing_restored(trash: Trash, root: Root) -> None:
    # The purge runs in a thread beside the event loop: a restore that renamed the data out first must keep
    # every file (a plain rmtree of the old path could go on deleting inside the renamed directory).
    manifest = model_on_disk(root, "m1")
    entry = trash.quarantine(manifest, root, "gone")
    assert entry is not None
    stale_view = trash_module.TrashEntry(entry.id, root, entry.manifest, entry.quarantined_at, entry.reason)
    trash.restore(entry)
    trash.purge(stale_view)  # the purge had listed the entry before the restore
    assert read_tree(Path(manifest.dest)) == FILES
    assert not stale_view.directory.exists()


def test_a_purged_entry_is_not_restorable_from_the_moment_its_data_moves(trash: Trash, root: Root) -> None:
    manifest = model_on_disk(root, "m1")
    entry = trash.quarantine(manifest, root, "gone")
    assert entry is not None
    (entry.directory / trash_module.PURGING).mkdir()  # a purge killed mid-delete leaves this behind
    shutil.move(str(entry.data), str(entry.directory / trash_module.PURGING / "data"))
    assert trash.find_restorable(manifest.storage_uri, manifest.dest) is None
    purged = trash.purge_expired(0.0)
    assert [e.id for e in purged] == [entry.id]
    assert list(root.trash.iterdir()) == []


def test_purge_expired_stops_when_told_to(trash: Trash, root: Root, wall: WallClock) -> None:
    for name in ("m1", "m2", "m3"):
        assert trash.quarantine(model_on_disk(root, name), root, "gone") is not None
    wall.now += 3600
    asked = 0

    def keep_going() -> bool:
        nonlocal asked
        asked += 1
        return asked <= 1  # the breaker opens after the first entry

    purged = trash.purge_expired(60, keep_going=keep_going)
    assert len(purged) == 1
    assert len(list(trash.entries())) == 2


def test_find_restorable_reads_an_entry_file_only_when_it_is_new_or_changed(
    trash: Trash, root: Root, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = [model_on_disk(root, f"m{i}") for i in range(5)]
    for m in manifests:
        assert trash.quarantine(m, root, "gone") is not None
    loads: list[str] = []
    real_load = Trash._load

    def counting_load(r: Root, directory: Path) -> trash_module.TrashEntry | None:
        loads.append(directory.name)
        return real_load(r, directory)

    monkeypatch.setattr(Trash, "_load", staticmethod(counting_load))
    assert trash.find_restorable(manifests[0].storage_uri, manifests[0].dest) is not None
    first = len(loads)
    loads.clear()
    for _ in range(10):  # a decision per reconcile: no entry file read but the chosen one
        assert trash.find_restorable(manifests[0].storage_uri, manifests[0].dest) is not None
    assert first == 6  # five summaries and the chosen entry
    assert len(loads) == 10
    newer = model_on_disk(root, "m9")
    assert trash.quarantine(newer, root, "gone") is not None
    assert trash.find_restorable(newer.storage_uri, newer.dest) is not None  # a new entry is seen at once


def test_find_restorable_rereads_an_entry_rewritten_under_the_same_name(trash: Trash, root: Root) -> None:
    manifest = model_on_disk(root, "m1")
    entry = trash.quarantine(manifest, root, "gone")
    assert entry is not None
    assert trash.find_restorable(manifest.storage_uri, manifest.dest) is not None
    record = json.loads((entry.directory / "entry.json").read_text())
    record["manifest"]["storage_uri"] = "hf://org/switched"
    (entry.directory / "entry.json.tmp").write_text(json.dumps(record))
    (entry.directory / "entry.json.tmp").rename(entry.directory / "entry.json")
    assert trash.find_restorable(manifest.storage_uri, manifest.dest) is None
    assert trash.find_restorable("hf://org/switched", manifest.dest) is not None


def _entry(manifest: object, quarantined_at: object = 1.0) -> str:
    return json.dumps({"manifest": manifest, "quarantinedAt": quarantined_at, "reason": "gone"})


@pytest.mark.parametrize(
    "garble",
    [
        lambda m: "[]",
        lambda m: "null",
        lambda m: _entry("x"),
        lambda m: _entry(None),
        lambda m: _entry(1),
        lambda m: _entry(m | {"dest": []}),
        lambda m: _entry(m | {"files": [{"path": "a", "size": "3"}]}),
        lambda m: _entry(m | {"files": "x"}),
        lambda m: _entry(m, 10**400),  # float(10**400)
        lambda m: _entry(DEEP),
        lambda m: DEEP,
    ],
    ids=[
        "list",
        "null",
        "manifest a string",
        "manifest null",
        "manifest a number",
        "dest a list",
        "size a string",
        "files a string",
        "quarantinedAt huge",
        "manifest deep",
        "deep",
    ],
)
def test_an_entry_file_of_the_wrong_shape_is_skipped(
    trash: Trash, root: Root, garble: Callable[[dict[str, Any]], str]
) -> None:
    manifest = model_on_disk(root, "m1")
    entry = trash.quarantine(manifest, root, "gone")
    assert entry is not None
    record = json.loads((entry.directory / "entry.json").read_text())
    (entry.directory / "entry.json").write_text(garble(record["manifest"]))
    assert list(trash.entries()) == []
    assert trash.find_restorable(manifest.storage_uri, manifest.dest) is None
