"""Unit tests for node markers: the shared-root verdict (table), atomic markers, and the filesystem type."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_agent.local.node_markers import (
    decide_shared,
    fs_type_from_mountinfo,
    markers_dir,
    read_markers,
    write_marker,
)
from tests.support.hostile_json import DEEP


@pytest.mark.parametrize(
    ("flag", "seen", "shared", "peers"),
    [
        (False, [], False, ()),  # a fresh root: nobody yet
        (False, ["n1"], False, ()),  # only this node's own marker
        (False, ["n1", "n2"], True, ("n2",)),  # another node's marker: shared
        (False, ["n3", "n2", "n1", "n2"], True, ("n2", "n3")),  # peers sorted and once
        (True, [], True, ()),  # --shared-root, before any marker
        (True, ["n1"], True, ()),
        (False, ["", "n1"], False, ()),  # an empty name is no node
    ],
)
def test_the_shared_verdict(flag: bool, seen: list[str], shared: bool, peers: tuple[str, ...]) -> None:
    verdict = decide_shared(flag, "n1", seen)
    assert verdict.shared is shared
    assert verdict.peers == peers
    assert verdict.why


def test_markers_are_written_atomically_and_read_back(tmp_path: Path) -> None:
    private = tmp_path / ".model-agent"
    write_marker(private, "node-a")
    write_marker(private, "node-b")
    write_marker(private, "node-a")  # a refresh replaces, never duplicates
    nodes, unreadable = read_markers(private)
    assert nodes == ["node-a", "node-b"]
    assert unreadable == []
    assert not [p for p in markers_dir(private).iterdir() if p.name.startswith(".")]  # no temporary left


def test_garbled_and_foreign_files_are_not_markers(tmp_path: Path) -> None:
    private = tmp_path / ".model-agent"
    write_marker(private, "node-a")
    directory = markers_dir(private)
    (directory / "node-x").write_text("{not json")
    (directory / "node-y").write_text('{"node": "someone-else"}')  # content disagrees with the name
    (directory / ".node-z.1.tmp").write_text("half")  # a write a kill interrupted
    nodes, unreadable = read_markers(private)
    assert nodes == ["node-a"]
    assert unreadable == ["node-x", "node-y"]


@pytest.mark.parametrize(
    "body",
    ["[]", "1", '"node-x"', "null", '{"node": ["node-x"]}', DEEP],
    ids=["list", "number", "string", "null", "node a list", "deep"],
)
def test_a_marker_of_the_wrong_shape_is_unreadable(tmp_path: Path, body: str) -> None:
    private = tmp_path / ".model-agent"
    write_marker(private, "node-a")
    (markers_dir(private) / "node-x").write_text(body)
    assert read_markers(private) == (["node-a"], ["node-x"])


def test_no_directory_reads_as_no_marker(tmp_path: Path) -> None:
    assert read_markers(tmp_path / "nothing") == ([], [])


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b"])
def test_a_name_that_cannot_be_a_file_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        write_marker(tmp_path, bad)


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /mnt/models rw,relatime shared:2 - nfs4 fs:/export rw,vers=4.2
31 30 0:41 / /mnt/models/scratch rw - tmpfs tmpfs rw
32 22 0:42 / /mnt/my\\040disk rw - gpfs gpfs0 rw
garbage line
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/mnt/models", "nfs4"),
        ("/mnt/models/llama", "nfs4"),
        ("/mnt/models/scratch/x", "tmpfs"),  # the longest mount point wins
        ("/mnt/modelsX", "ext4"),  # a prefix of a name is not a parent
        ("/mnt/my disk/m", "gpfs"),  # octal escapes in mount points
        ("/var", "ext4"),
    ],
)
def test_the_filesystem_type_of_a_path(path: str, fstype: str) -> None:
    assert fs_type_from_mountinfo(MOUNTINFO, path) == fstype


def test_unparseable_mountinfo_gives_no_type() -> None:
    assert fs_type_from_mountinfo("nonsense\n", "/x") == ""
