"""Unit tests for :mod:`model_agent.local.inventory`: unmanaged directories are reported, stale staging is
moved out of ``staging/`` in one rename and deleted later (off the event loop)."""

from __future__ import annotations

from pathlib import Path

from model_agent.local.inventory import delete_discarded, discard, stale_staging, unmanaged_directories
from model_agent.local.layout import Layout


def layout_at(tmp_path: Path) -> Layout:
    layout = Layout(tmp_path / "root")
    layout.primary.ensure()
    return layout


def test_stale_staging_names_the_root_of_each_area(tmp_path: Path) -> None:
    layout = layout_at(tmp_path)
    root = layout.primary
    for token in ("keep", "stale-a", "stale-b"):
        (root.staging / token).mkdir()
    assert stale_staging(layout, {"keep"}) == [(root, root.staging / "stale-a"), (root, root.staging / "stale-b")]


def test_a_discarded_area_leaves_staging_at_once_and_is_deleted_later(tmp_path: Path) -> None:
    layout = layout_at(tmp_path)
    root = layout.primary
    area = root.staging / "stale"
    (area / "sub").mkdir(parents=True)
    (area / "sub" / "part").write_bytes(b"x" * 100)
    moved = discard(root, area)
    assert moved is not None and not area.exists() and (moved / "sub" / "part").exists()
    assert stale_staging(layout, set()) == []  # a download starting now finds no half-deleted directory
    assert discard(root, area) is None  # already gone: nothing to do
    assert delete_discarded(layout) == [moved]
    assert not moved.exists()


def test_the_discard_area_is_private_and_not_reported_as_unmanaged(tmp_path: Path) -> None:
    layout = layout_at(tmp_path)
    root = layout.primary
    (root.staging / "stale").mkdir()
    assert discard(root, root.staging / "stale") is not None
    (root.path / "hand-copied").mkdir()
    assert unmanaged_directories(layout, []) == [root.path / "hand-copied"]


def test_omes_own_records_at_a_root_are_left_alone_and_not_reported(tmp_path: Path) -> None:
    """OME's newer agents keep integrity manifests under ``<root>/.ome/``: not a model, not this agent's."""
    layout = layout_at(tmp_path)
    root = layout.primary
    (root.path / ".ome" / "manifests").mkdir(parents=True)
    (root.path / ".ome" / "manifests" / "m.json").write_text("{}")
    (root.path / "org" / ".ome").mkdir(parents=True)  # only at the root: deeper it is an ordinary directory
    assert unmanaged_directories(layout, []) == [root.path / "org"]
    assert (root.path / ".ome" / "manifests" / "m.json").read_text() == "{}"
