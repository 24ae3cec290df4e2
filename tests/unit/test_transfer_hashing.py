"""The transfer's checksums: each algorithm against a reference, and the mapped read over window boundaries."""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path

import google_crc32c
import pytest

from model_agent.transfer import hashing


def test_crc32c_is_the_castagnoli_check_value() -> None:
    # The CRC-32C check value of "123456789" (RFC 3720, B.4), through the engine's hasher in uneven pieces.
    hasher = hashing.new_hasher("crc32c")
    data = b"123456789" * (hashing.CRC32C_CHUNK // 3)
    hasher.update(memoryview(data)[:5])
    hasher.update(memoryview(data)[5:])
    assert hasher.hexdigest() == google_crc32c.Checksum(data).digest().hex()  # type: ignore[no-untyped-call]
    one = hashing.new_hasher("crc32c")
    one.update(b"123456789")
    assert one.hexdigest() == "e3069283"


def test_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        hashing.new_hasher("sha512")


@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, 0), (0, 1), (4095, 2), (hashing.HASH_WINDOW - 3, 7), (12345, 2 * hashing.HASH_WINDOW + 17)],
)
def test_mapped_hash_of_a_range_equals_the_hash_of_its_bytes(tmp_path: Path, offset: int, length: int) -> None:
    # Offsets off the page grain and ranges across windows: the mapping must feed exactly these bytes.
    data = os.urandom(3 * hashing.HASH_WINDOW)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        hasher = hashing.new_hasher("sha256")
        hashing.hash_mapped(fd, hasher, offset, length)
    finally:
        os.close(fd)
    assert hasher.hexdigest() == hashlib.sha256(data[offset : offset + length]).hexdigest()


def test_file_checksums_of_every_supported_algorithm(tmp_path: Path) -> None:
    data = os.urandom(5 * hashing.HASH_BLOCK // 2)
    path = tmp_path / "f"
    path.write_bytes(data)
    got = hashing.file_checksums(path, sorted(hashing.SUPPORTED_CHECKSUMS))
    assert got == {
        "md5": hashlib.md5(data).hexdigest(),
        "sha1": hashlib.sha1(data).hexdigest(),
        "sha256": hashlib.sha256(data).hexdigest(),
        "crc32": f"{zlib.crc32(data):08x}",
        "crc32c": google_crc32c.Checksum(data).digest().hex(),  # type: ignore[no-untyped-call]
        "git-sha1": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
    }


def test_git_blob_id_needs_the_size() -> None:
    with pytest.raises(ValueError, match="size"):
        hashing.new_hasher("git-sha1")
    hasher = hashing.new_hasher("git-sha1", 0)
    assert hasher.hexdigest() == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's id of the empty blob


def test_b64_digest_to_hex() -> None:
    assert hashing.b64_to_hex("1B2M2Y8AsgTpgAmY7PhCfg==") == hashlib.md5(b"").hexdigest()
    assert hashing.b64_to_hex("not base64!") is None
