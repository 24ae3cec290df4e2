"""The checksums a transfer verifies, over the bytes as written: from the receive buffer or page cache, never a copy.

Role: every algorithm a store publishes (:data:`SUPPORTED_CHECKSUMS`) behind one small hasher interface,
the whole-file digest a source uses to check a file it did not download, and the two ways the engine feeds a
file's hashers in file order (:class:`OrderedHash`): from the receive buffer of the part at the hash cursor,
right after those bytes are written (:func:`hash_buffer`), or read back through a mapping for bytes that
landed ahead of the cursor (:func:`hash_mapped`). sha256 is always computed (it is what the manifest keeps).
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import mmap
import os
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

MiB = 1024 * 1024
# git-sha1: a git blob id (sha1 over "blob <size>\0" + the bytes), what the Hugging Face Hub lists for small files
SUPPORTED_CHECKSUMS = frozenset({"md5", "sha1", "sha256", "crc32", "crc32c", "git-sha1"})
HASH_BLOCK = 2 * MiB
HASH_WINDOW = 8 * MiB  # mapped at a time while hashing beside the transfer (counts in RSS while mapped)
HASH_STEP = 16 * MiB  # hashed per thread call: a part's worth, so the transfer's lead over the hash moves smoothly
CRC32C_CHUNK = 256 * 1024  # google-crc32c takes bytes only: fed in copies this small (they stay in cache)


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes | memoryview, /) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


class _Crc32c:
    """CRC32C (Castagnoli), as GCS and S3 publish it; google-crc32c's hardware-assisted C code."""

    def __init__(self) -> None:
        import google_crc32c  # only when a source publishes a CRC32C

        self._extend: Callable[[int, bytes], int] = google_crc32c.extend
        self.value = 0

    def update(self, data: bytes | memoryview, /) -> None:
        view = memoryview(data)
        # it takes bytes only: small copies (measured: 0.18 CPU-s/GB, copies included)
        for start in range(0, len(view), CRC32C_CHUNK):
            self.value = self._extend(self.value, bytes(view[start : start + CRC32C_CHUNK]))

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def new_hasher(algorithm: str, size: int | None = None) -> Hasher:
    """A fresh hasher; ``size`` (the file's) is needed by ``git-sha1``, whose header names it."""
    if algorithm == "crc32":
        return _Crc32()
    if algorithm == "crc32c":
        return _Crc32c()
    if algorithm == "md5":
        return hashlib.md5(usedforsecurity=False)
    if algorithm == "sha1":
        return hashlib.sha1(usedforsecurity=False)
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "git-sha1":
        if size is None:
            raise ValueError("git-sha1 needs the file's size")
        return hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    raise ValueError(f"unsupported checksum algorithm {algorithm!r}")


def file_checksums(path: Path, algorithms: Iterable[str], block: int = HASH_BLOCK) -> dict[str, str]:
    """Hex digests of a whole file (blocking)."""
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        hashers = {alg: new_hasher(alg, size) for alg in algorithms}
        while data := fh.read(block):
            for h in hashers.values():
                h.update(data)
    return {alg: h.hexdigest() for alg, h in hashers.items()}


def b64_to_hex(value: str) -> str | None:
    """A base64 digest (as in S3 ``x-amz-checksum-*`` and ``Content-MD5``) in hex, or None if it is not one."""
    try:
        return base64.b64decode(value, validate=True).hex()
    except (ValueError, TypeError):
        return None


def hash_mapped(fd: int, hasher: Hasher, offset: int, length: int) -> None:
    """Feed ``length`` bytes of the file at ``offset`` to ``hasher`` straight from the page cache.

    A read-only mapping instead of ``pread``: it saves copying every byte once more (measured here: 0.2
    instead of 0.7 CPU-s/GB of system time on top of the hash itself). One window is mapped at a time.
    """
    end = offset + length
    while offset < end:
        step = min(HASH_WINDOW, end - offset)
        _hash_window(fd, hasher, offset, step)
        offset += step


def _hash_window(fd: int, hasher: Hasher, offset: int, length: int) -> None:
    base = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        mapped = mmap.mmap(fd, length + offset - base, prot=mmap.PROT_READ, offset=base)
    except OSError:  # a filesystem that cannot map files: read (one more copy)
        hasher.update(os.pread(fd, length, offset))
        return
    with mapped:
        mapped.madvise(mmap.MADV_WILLNEED)  # fault the window in in a few large steps, not page by page
        with memoryview(mapped) as view:
            hasher.update(view[offset - base :])


def hash_buffer(hasher: Hasher, data: bytes | memoryview) -> None:
    """Feed bytes the caller holds in memory (a receive buffer just written to the file) to ``hasher``.

    hashlib releases the GIL for updates this large, so a receive thread hashing its buffer runs beside the
    other receive threads. From a buffer instead of the mapping: no mapping, no page faults (measured on
    tmpfs, ``bench/hash_path.py``-style micro runs: 0.57-0.61 instead of 0.69-0.75 CPU-s/GB for sha256).
    """
    hasher.update(data)


class OrderedHash:
    """A file's hashers and the prefix ``[0, pos)`` they have consumed; fed strictly in file order.

    Two kinds of feeder take turns at the cursor, one at a time: a receive thread offers bytes it has just
    written (:meth:`offer`, hashed from its buffer), and the job's hash loop reads back bytes that landed
    ahead of the cursor (:meth:`claim` a range, hash it, :meth:`advance`). Every byte is hashed exactly once,
    at its offset, and only after it is in the file: what the digest covers is what the file holds.
    ``on_advance(pos)`` is called (in the advancing thread) after every move of the cursor.

    Memory: nothing is held here; a receive buffer is hashed before it is reused, so the bound stays the
    slots' buffers (``concurrency x write_buffer``), independent of the file's size.
    """

    def __init__(self, hashers: Sequence[Hasher], on_advance: Callable[[int], None]) -> None:
        self.hashers = list(hashers)
        self.pos = 0
        self._on_advance = on_advance
        self._cond = threading.Condition()
        self._busy_until: int | None = None  # the end of the range a feeder is hashing now

    @property
    def busy(self) -> bool:
        return self._busy_until is not None

    def claim(self, offset: int, length: int) -> bool:
        """Take ``[offset, offset + length)`` to hash, if it starts at the cursor and no one holds it; never waits."""
        with self._cond:
            if self._busy_until is not None or offset != self.pos or length <= 0:
                return False
            self._busy_until = offset + length
            return True

    def advance(self, length: int) -> None:
        """The claimed range is hashed: move the cursor past it and let the next feeder in."""
        with self._cond:
            self.pos += length
            self._busy_until = None
            pos = self.pos
            self._cond.notify_all()
        self._on_advance(pos)

    def advance_when_done(self, futures: Sequence[concurrent.futures.Future[Any]], length: int) -> None:
        """Advance past the claimed range once every one of ``futures`` (its hashing threads) has ended.

        From the threads' done callbacks, not from the caller: a cancelled caller must not leave the cursor
        claimed, since a receive thread may be waiting for exactly this range.
        """
        left = [len(futures)]
        lock = threading.Lock()

        def one_done(_fut: concurrent.futures.Future[Any]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self.advance(length)

        if not futures:
            self.advance(length)
        for fut in futures:
            fut.add_done_callback(one_done)

    def offer(self, offset: int, data: bytes | memoryview) -> bool:
        """Receive thread: hash ``data`` (just written at ``offset``) if it is next in file order; True if hashed.

        Waits only while another feeder hashes the bytes that end exactly at ``offset`` (at most one hash
        step); bytes anywhere else are left to be read back once their part is complete.
        """
        with self._cond:
            while self._busy_until == offset:
                self._cond.wait()
            if self._busy_until is not None or offset != self.pos or not data:
                return False
            self._busy_until = offset + len(data)
        try:
            for hasher in self.hashers:
                hash_buffer(hasher, data)
        finally:
            self.advance(len(data))
        return True
