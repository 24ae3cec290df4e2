"""``--state-dir`` and read-only roots (OME issue #787): where the records live, and what must be writable.

The read-only mount itself is exercised end to end (tests/e2e/test_readonly_root.py, a real ``ro`` bind
mount); here the layout's rules: the records move, staging and trash stay in the root, a state directory
that overlaps a root is refused, and an unwritable records directory is a start-up error naming the flag.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from model_agent.local.layout import PRIVATE_DIR, Layout, PathRefused, RootsRefused, StateUnwritable
from model_agent.local.manifest import Manifest, ManifestStore


def test_state_dir_holds_the_records_and_the_root_keeps_staging_and_trash(tmp_path: Path) -> None:
    root, state = tmp_path / "models", tmp_path / "state"
    root.mkdir()
    layout = Layout(root, state_dir=state)
    layout.ensure()
    primary = layout.primary
    assert primary.manifests == state / "manifests"
    assert primary.staging == root / PRIVATE_DIR / "staging"  # a publish is a rename on the root's filesystem
    assert primary.trash == root / PRIVATE_DIR / "trash"
    store = ManifestStore(layout)
    store.save(Manifest(key="ClusterBaseModel//m", uid="u", storage_uri="local:///x", dest="/x"), primary)
    assert [p.name for p in (state / "manifests").iterdir()] and not (root / PRIVATE_DIR / "manifests").exists()
    loaded = store.load("ClusterBaseModel//m")
    assert loaded is not None and loaded.uid == "u"


def test_default_state_is_the_private_area(tmp_path: Path) -> None:
    layout = Layout(tmp_path, state_dir=tmp_path / PRIVATE_DIR)
    assert layout.primary.state is None
    assert layout.primary.manifests == tmp_path / PRIVATE_DIR / "manifests"


@pytest.mark.parametrize("inside", ["", "sub", "sub/deeper"])
def test_state_dir_overlapping_a_root_is_refused(tmp_path: Path, inside: str) -> None:
    root = tmp_path / "models"
    (root / inside).mkdir(parents=True, exist_ok=True)
    with pytest.raises(RootsRefused, match="--state-dir"):
        Layout(root, state_dir=root / inside if inside else root)
    with pytest.raises(RootsRefused, match="--state-dir"):
        Layout(root / "sub", state_dir=root)  # a state dir containing the root


def test_local_path_inside_the_state_dir_is_refused(tmp_path: Path) -> None:
    root, state = tmp_path / "models", tmp_path / "state"
    root.mkdir()
    layout = Layout(root, state_dir=state)
    layout.ensure()
    with pytest.raises(PathRefused, match="private area"):
        layout.check_local(str(state / "manifests"))


def test_unwritable_records_directory_is_a_start_up_error_naming_the_flag(tmp_path: Path) -> None:
    # The tests run as root, whom a mode bit does not stop: a file where the private area should be is an
    # honest "cannot write the records there" for anyone.
    root = tmp_path / "models"
    root.mkdir()
    (root / PRIVATE_DIR).write_bytes(b"")
    with pytest.raises(StateUnwritable, match="--state-dir"):
        Layout(root).ensure()
    Layout(root, state_dir=tmp_path / "state").ensure()  # the same root with a state dir starts
