"""Unit tests for :func:`model_agent.local.listing.list_local_files` and the fast check over its records: a
``local://`` directory that vanishes, or loses a file, is noticed by stat alone."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from model_agent.local.listing import list_local_files
from model_agent.local.manifest import Manifest


def make_dir(base: Path) -> Path:
    d = base / "weights"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"w" * 100)
    (d / "sub" / "extra.bin").write_bytes(b"e" * 7)
    (d / ".cache").mkdir()
    (d / ".cache" / "lock").write_text("x")
    return d


def manifest_of(d: Path) -> Manifest:
    return Manifest(key="k", uid="u", storage_uri=f"local://{d}", dest=str(d), owned=False, files=list_local_files(d))


def test_lists_files_with_sizes_and_mtimes_sorted_and_skips_dot_entries(tmp_path: Path) -> None:
    d = make_dir(tmp_path)
    records = list_local_files(d)
    assert [(r.path, r.size) for r in records] == [("config.json", 2), ("model.safetensors", 100), ("sub/extra.bin", 7)]
    assert all(r.mtime_ns == (d / r.path).stat().st_mtime_ns for r in records)
    assert all(r.sha256 is None for r in records)


def test_listing_is_bounded(tmp_path: Path) -> None:
    d = tmp_path / "many"
    d.mkdir()
    for i in range(50):
        (d / f"f{i:03d}").write_bytes(b"")
    assert [r.path for r in list_local_files(d, max_files=10)] == [f"f{i:03d}" for i in range(10)]
    deep = tmp_path / "deep"
    p = deep
    for i in range(20):
        p = p / f"d{i}"
    p.mkdir(parents=True)
    (p / "leaf").write_bytes(b"x")
    assert list_local_files(deep, max_dirs=5) == []  # gave up before reaching the leaf


def test_directory_symlinks_are_not_followed_but_file_symlinks_are(tmp_path: Path) -> None:
    d = make_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"b" * 9)
    os.symlink(outside, d / "linked-dir")
    os.symlink(outside / "big", d / "linked-file")
    os.symlink(tmp_path / "nowhere", d / "dangling")
    paths = {r.path: r.size for r in list_local_files(d)}
    assert paths["linked-file"] == 9
    assert "linked-dir/big" not in paths and "dangling" not in paths


def test_missing_directory_lists_nothing(tmp_path: Path) -> None:
    assert list_local_files(tmp_path / "absent") == []


def test_fast_check_notices_a_vanished_directory_and_a_removed_file_and_recovers(tmp_path: Path) -> None:
    d = make_dir(tmp_path)
    manifest = manifest_of(d)
    assert manifest.fast_check() == []
    (d / "sub" / "extra.bin").unlink()
    assert manifest.fast_check() == ["sub/extra.bin: missing"]
    (d / "sub" / "extra.bin").write_bytes(b"e" * 7)
    recorded = next(r.mtime_ns for r in manifest.files if r.path == "sub/extra.bin")
    os.utime(d / "sub" / "extra.bin", ns=(recorded, recorded + 10**9))  # rewritten a second later
    assert manifest.fast_check() == ["sub/extra.bin: modified"]  # same size, another mtime
    manifest = manifest_of(d)
    moved = tmp_path / "moved"
    d.rename(moved)
    assert sorted(manifest.fast_check()) == [
        f"{p}: missing" for p in ("config.json", "model.safetensors", "sub/extra.bin")
    ]
    moved.rename(d)  # a rename keeps mtimes: the same directory back is intact again
    assert manifest.fast_check() == []
    shutil.rmtree(d)
    assert len(manifest.fast_check()) == 3
