"""The part map on disk: what :meth:`PartMap.load` trusts, what :meth:`PartMap.read` tells apart, and the
single-file record :meth:`PartMap.create` writes for a file fetched in one request."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_agent.transfer.partmap import PartMap
from tests.support.hostile_json import DEEP, NOT_OBJECTS

KiB = 1024


def _complete(size: int = 100 * KiB) -> PartMap:
    state = PartMap.fresh(size, 256 * KiB, '"v1"')
    state.mark(0)
    state.complete = True
    state.digests = {"sha256": "ab" * 32}
    return state


def test_a_missing_map_is_told_apart_from_an_unreadable_one(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    with pytest.raises(FileNotFoundError):
        PartMap.read(path)
    assert PartMap.load(path) is None
    path.write_bytes(b'{"version": 1, "size": 10')  # cut short, as a crash mid-write leaves it
    assert PartMap.read(path) is None
    assert PartMap.load(path) is None


@pytest.mark.parametrize(
    "raw",
    [
        *(doc.encode() for doc in NOT_OBJECTS),
        DEEP.encode(),
        b"\x00" * 64,
        b"",
        b'{"version": 1}',
        b'{"version": 1, "size": 1e999, "part_size": 1, "done": ""}',
        b'{"version": 1, "size": 10, "part_size": 4, "done": "AA==", "digests": 5}',
    ],
)
def test_a_map_that_is_not_one_is_trusted_for_nothing(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(raw)
    assert PartMap.load(path) is None


def test_create_writes_a_map_that_loads_back_in_a_new_folder(tmp_path: Path) -> None:
    path = tmp_path / "parts" / "deeper" / "f.json"
    state = _complete()
    state.create(path)
    assert PartMap.load(path) == state
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.json"]  # no temporary left beside it


def test_create_over_an_existing_map_replaces_it(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    PartMap.fresh(100 * KiB, 10 * KiB, '"v0"').save(path)
    state = _complete()
    state.create(path)
    assert PartMap.load(path) == state
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
