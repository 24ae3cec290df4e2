"""``publish`` never writes or removes anything outside the destination, whatever was planted on disk.

The destination was confined when the spec was validated; these tests plant symlinks (and files) after
that point, as a hostile user or a race would, and check that publish refuses with ``UnsafePath`` and that
a sentinel tree outside the root is byte-for-byte unchanged.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from model_agent.local.layout import Layout
from model_agent.local.manifest import FileRecord, Manifest
from model_agent.sources.base import FetchRequest, FetchResult, SourceError, publish, sized_files

FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": b"\x00" * 1024,
    "sub/tokenizer.json": b'{"version": "1.0"}',
}


def tree_digest(path: Path) -> dict[str, str]:
    """Every entry below ``path`` (not following symlinks) -> its kind and content hash or link target."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(path))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = "file:" + hashlib.sha256(p.read_bytes()).hexdigest() + f":{oct(p.stat().st_mode)}"
    return out


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = Path(os.path.realpath(tmp_path)) / "models"
    Layout(r).ensure()
    return r


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    s = Path(os.path.realpath(tmp_path)) / "sentinel"
    (s / "sub").mkdir(parents=True)
    (s / "passwd").write_bytes(b"root:x:0:0\n")
    (s / "sub" / "tokenizer.json").write_bytes(b"original tokenizer")
    (s / "config.json").write_bytes(b"original config")
    (s / "old.bin").write_bytes(b"must survive")
    (s / "sub" / "old.bin").write_bytes(b"must survive too")
    return s


def stage(root: Path, files: dict[str, bytes], name: str = "m") -> Path:
    staging = root / ".model-agent" / "staging" / name
    for rel, data in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    return staging


def request(root: Path, dest: Path, staging: Path, previous: Manifest | None = None) -> FetchRequest:
    layout = Layout(root)
    confined_root, confined = layout.confine(str(dest))
    assert confined == dest
    return FetchRequest(
        storage_uri="hf://acme/m", dest=dest, staging=staging, previous=previous, root=confined_root.path
    )


def result(files: dict[str, bytes], staged: list[str] | None = None) -> FetchResult:
    records = [FileRecord(rel, len(data)) for rel, data in files.items()]
    return FetchResult("c0ffee", records, staged=list(files) if staged is None else staged)


def manifest(dest: Path, paths: list[str]) -> Manifest:
    return Manifest("ClusterBaseModel//m", "uid", "hf://acme/m", str(dest), files=[FileRecord(p, 1) for p in paths])


def assert_unsafe(exc: pytest.ExceptionInfo[SourceError]) -> None:
    assert exc.value.reason == "UnsafePath"
    assert exc.value.retryable is False


# ------------------------------------------------------------------------------------------- the normal paths


def test_whole_directory_publish(root: Path) -> None:
    dest = root / "org" / "m"
    staging = stage(root, FILES)
    out = publish(request(root, dest, staging), result(FILES))
    assert {f.path for f in out} == set(FILES)
    assert all(f.mtime_ns for f in out)
    for rel, data in FILES.items():
        assert (dest / rel).read_bytes() == data
    assert not staging.exists()


def test_file_by_file_publish_replaces_and_removes_stale_files(root: Path) -> None:
    dest = root / "m"
    (dest / "sub").mkdir(parents=True)
    (dest / "stale.bin").write_bytes(b"old")
    (dest / "sub" / "stale.bin").write_bytes(b"old")
    (dest / "config.json").write_bytes(b"old config")
    staging = stage(root, FILES)
    previous = manifest(dest, ["stale.bin", "sub/stale.bin", "config.json"])
    publish(request(root, dest, staging, previous), result(FILES))
    for rel, data in FILES.items():
        assert (dest / rel).read_bytes() == data
    assert not (dest / "stale.bin").exists() and not (dest / "sub" / "stale.bin").exists()


# ------------------------------------------------------------------------------------------- planted symlinks


def test_symlinked_subdirectory_inside_dest_pointing_outside_is_refused(root: Path, sentinel: Path) -> None:
    dest = root / "m"
    dest.mkdir()
    (dest / "sub").symlink_to(sentinel / "sub")
    before = tree_digest(sentinel)
    staging = stage(root, FILES)
    req = request(root, dest, staging)
    with pytest.raises(SourceError) as exc:
        publish(req, result(FILES))
    assert_unsafe(exc)
    assert "symlink" in exc.value.message and str(dest / "sub") in exc.value.message
    assert tree_digest(sentinel) == before
    assert (staging / "sub" / "tokenizer.json").exists()  # not moved anywhere


def test_dest_replaced_by_a_symlink_after_validation_is_refused(root: Path, sentinel: Path) -> None:
    dest = root / "m"
    dest.mkdir()
    staging = stage(root, FILES)
    req = request(root, dest, staging)  # validated while dest was a plain directory
    dest.rmdir()
    dest.symlink_to(sentinel)
    before = tree_digest(sentinel)
    with pytest.raises(SourceError) as exc:
        publish(req, result(FILES))
    assert_unsafe(exc)
    assert tree_digest(sentinel) == before
    assert dest.is_symlink()


def test_dest_created_as_a_symlink_after_validation_is_refused(root: Path, sentinel: Path) -> None:
    """dest did not exist at validation (whole-directory case); a symlink appears before the rename."""
    dest = root / "m"
    staging = stage(root, FILES)
    req = request(root, dest, staging)
    dest.symlink_to(sentinel)
    before = tree_digest(sentinel)
    with pytest.raises(SourceError) as exc:
        publish(req, result(FILES))
    assert_unsafe(exc)
    assert tree_digest(sentinel) == before


def test_dest_parent_replaced_by_a_symlink_is_refused_in_the_whole_directory_rename(root: Path, sentinel: Path) -> None:
    dest = root / "org" / "m"
    (root / "org").mkdir()
    staging = stage(root, FILES)
    req = request(root, dest, staging)
    (root / "org").rmdir()
    (root / "org").symlink_to(sentinel)
    before = tree_digest(sentinel)
    with pytest.raises(SourceError) as exc:
        publish(req, result(FILES))
    assert_unsafe(exc)
    assert tree_digest(sentinel) == before
    assert not (sentinel / "m").exists()
    assert staging.is_dir()


def test_a_symlink_above_the_root_is_refused(tmp_path: Path, sentinel: Path) -> None:
    real = Path(os.path.realpath(tmp_path))
    root = real / "models"
    Layout(root).ensure()
    dest = root / "m"
    staging = stage(root, FILES)
    req = request(root, dest, staging)
    # The root's directory is swapped for a link to a look-alike tree elsewhere.
    moved = real / "moved-models"
    root.rename(moved)
    (sentinel / "models").mkdir()
    root.symlink_to(sentinel / "models")
    before = tree_digest(sentinel)
    with pytest.raises(SourceError) as exc:
        publish(FetchRequest(req.storage_uri, dest, moved / staging.relative_to(root), None, root=root), result(FILES))
    assert_unsafe(exc)
    assert tree_digest(sentinel) == before


def test_stale_file_removal_does_not_follow_a_symlinked_subdirectory(root: Path, sentinel: Path) -> None:
    dest = root / "m"
    dest.mkdir()
    (dest / "sub").symlink_to(sentinel / "sub")
    files = {"config.json": FILES["config.json"]}
    staging = stage(root, files)
    previous = manifest(dest, ["config.json", "sub/old.bin"])
    before = tree_digest(sentinel)
    with pytest.raises(SourceError) as exc:
        publish(request(root, dest, staging, previous), result(files))
    assert_unsafe(exc)
    assert tree_digest(sentinel) == before
    assert (sentinel / "sub" / "old.bin").read_bytes() == b"must survive too"


def test_a_symlink_in_place_of_a_file_is_replaced_not_followed(root: Path, sentinel: Path) -> None:
    dest = root / "m"
    dest.mkdir()
    (dest / "config.json").symlink_to(sentinel / "config.json")
    staging = stage(root, FILES)
    before = tree_digest(sentinel)
    publish(request(root, dest, staging), result(FILES))
    assert tree_digest(sentinel) == before
    assert not (dest / "config.json").is_symlink()
    assert (dest / "config.json").read_bytes() == FILES["config.json"]


def test_a_stale_symlink_is_unlinked_not_its_target(root: Path, sentinel: Path) -> None:
    dest = root / "m"
    dest.mkdir()
    (dest / "old.bin").symlink_to(sentinel / "old.bin")
    staging = stage(root, FILES)
    before = tree_digest(sentinel)
    publish(request(root, dest, staging, manifest(dest, ["old.bin"])), result(FILES))
    assert tree_digest(sentinel) == before
    assert not (dest / "old.bin").exists() and not (dest / "old.bin").is_symlink()


def test_a_symlinked_staging_area_is_refused(root: Path, sentinel: Path) -> None:
    """Files are taken from staging without following links: nothing outside is moved into the root."""
    dest = root / "m"
    dest.mkdir()
    staging = root / ".model-agent" / "staging" / "m"
    staging.symlink_to(sentinel)
    before = tree_digest(sentinel)
    with pytest.raises(SourceError) as exc:
        publish(request(root, dest, staging), result({"passwd": b"root:x:0:0\n"}))
    assert_unsafe(exc)
    assert tree_digest(sentinel) == before


# ------------------------------------------------------------------------------------------- other refusals


def test_a_file_in_the_way_is_refused(root: Path) -> None:
    dest = root / "m"
    dest.mkdir()
    (dest / "sub").write_bytes(b"a file, not a directory")
    staging = stage(root, FILES)
    with pytest.raises(SourceError) as exc:
        publish(request(root, dest, staging), result(FILES))
    assert_unsafe(exc)
    assert "not a directory" in exc.value.message
    assert (dest / "sub").read_bytes() == b"a file, not a directory"


def test_dest_outside_its_root_is_refused(root: Path, sentinel: Path) -> None:
    staging = stage(root, FILES)
    before = tree_digest(sentinel)
    for dest in (sentinel / "m", root, root / ".." / "x"):
        req = FetchRequest("hf://acme/m", dest, staging, None, root=root)
        with pytest.raises(SourceError) as exc:
            publish(req, result(FILES))
        assert_unsafe(exc)
    assert tree_digest(sentinel) == before


def test_unsafe_file_paths_from_a_source_are_refused(root: Path, sentinel: Path) -> None:
    dest = root / "m"
    dest.mkdir()
    staging = stage(root, FILES)
    before = tree_digest(sentinel)
    for rel in ("../escape", "a/../../escape", "/abs", "a//b", "./a"):
        with pytest.raises(SourceError) as exc:
            publish(request(root, dest, staging), FetchResult("c", [FileRecord(rel, 1)], staged=[rel]))
        assert_unsafe(exc)
    assert tree_digest(sentinel) == before


def test_nothing_is_created_above_a_missing_root(tmp_path: Path) -> None:
    real = Path(os.path.realpath(tmp_path))
    root = real / "models"
    Layout(root).ensure()
    staging = stage(root, FILES)
    req = request(root, root / "m", staging)
    moved = real / "elsewhere"
    shutil.move(str(root), str(moved))
    req = FetchRequest(req.storage_uri, req.dest, moved / staging.relative_to(root), None, root=root)
    with pytest.raises(OSError):
        publish(req, result(FILES))
    assert not root.exists()


def test_adoption_candidates_are_regular_files_of_the_listed_size(tmp_path: Path) -> None:
    (tmp_path / "right").write_bytes(b"x" * 10)
    (tmp_path / "short").write_bytes(b"x" * 9)
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "right")  # never adopted through a link, whatever it points at
    names = ["right", "short", "dir", "link", "missing"]
    assert sized_files([(tmp_path / n, 10) for n in names]) == [True, False, False, False, False]
