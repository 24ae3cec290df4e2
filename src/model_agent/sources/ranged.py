"""Parallel ranged HTTP downloads into a preallocated file, resumable across restarts, verified at the end.

Role: the data path of every source that can address bytes of a remote file over HTTP (S3 presigned URLs,
plain HTTP origins, later others). The listing, credentials and decisions about *which* files to fetch stay
in the source; this module moves the bytes of one file as fast as the link allows, with bounded memory, and
says whether they are the bytes the source promised.

How one file is fetched (:meth:`RangedDownloader.download`):

* The file is cut into parts of ``part_size`` bytes; up to ``concurrency`` parts are in flight across *all*
  downloads of one :class:`RangedDownloader` (a shared slot pool), each one ``GET`` with ``Range`` (a file
  of one part is fetched with a plain ``GET``). A slot is a worker thread's turn and a keep-alive
  connection (:mod:`model_agent.sources.ranged_http`: stdlib ``http.client``, TLS trust and proxies). On a
  plain-HTTP connection (Linux) the body is spliced from the socket into the file through the slot's pipe
  (:mod:`model_agent.sources.ranged_splice`): the bytes never enter Python and are copied once, not twice.
  Otherwise (TLS, chunked bodies, other systems) the thread ``readinto``-s a reused ``write_buffer``-sized
  buffer straight from the socket and ``os.pwrite``-s it at its offset: no allocation and no event-loop
  round trip per chunk, one hand-off per request. Either way one thread writes to a file at a time (a
  lock; parallel writers made the kernel spin on the inode lock), and progress reaches the event loop in
  steps of megabytes. Memory is bounded by ``concurrency x (write_buffer or the 1 MiB pipe)`` plus socket
  buffers, whatever the file or part size. The target is preallocated (``fallocate``, else ``ftruncate``) so a full disk
  shows up before the transfer, not in the middle of it. Writeback is left to the kernel until the
  fdatasync before a record: starting it per buffer (``sync_file_range``, tried until 2026-11-30) kept
  the disk queue shallow and cost the whole model to disk 15-20 % (see the measurements below).
* Progress is persisted in a *part map* (``state_path``, by default ``<file>.parts.json``): JSON with the
  size, part size, the source's validator (e.g. an ETag) and a bitmap of completed parts, replaced
  atomically (temp file + rename). A part is recorded only after its bytes were written and, with
  ``durable`` (default), ``fdatasync``-ed, so after a crash of the process or of the node the map never
  claims bytes that are not on disk. Records are batched (parts that complete while one map write is under
  way go into the next), and a part's slot is given back only once its record is written: parts in flight
  plus parts completed but not yet recorded never exceed ``concurrency``, so a restart after a kill at any
  instant fetches again at most ``concurrency x part_size``. A restart with the same size and validator
  resumes from the recorded parts only and fetches exactly the others; a different validator or size (the
  remote file changed) discards the progress.
* A failed part is retried from the last byte written (not from its start): connection errors, timeouts,
  short bodies, 408 and 5xx with exponential backoff and jitter; 429 and 503 honour ``Retry-After``
  (seconds or HTTP date, capped), and pause every part of this downloader, not only the one that was
  answered. ``max_attempts`` consecutive failures without progress end the download. 401/403, 404, 412
  (the validator no longer matches: sent as ``If-Match``) and 416 are not retried here; they become a
  :class:`~model_agent.sources.base.SourceError` for the caller's own retry policy.
* A server that ignores ``Range`` (200 with the whole body) is detected on the first such answer; the
  download then continues as one sequential stream (not resumable mid-file: each retry restarts at 0).
* Verification: the size always (the preallocated file and every ``Content-Range`` / ``Content-Length``
  must agree with the expected size); then sha256 (always; it is what the manifest keeps) and every
  checksum the source supplied (``md5``, ``sha1``, ``sha256``, ``crc32``, ``crc32c``) over the file. Hashing runs
  beside the transfer, in a thread (hashlib releases the GIL), over the contiguous prefix of completed parts
  read through a read-only mapping of the file (the page cache, not a second copy), so when parts finish
  roughly in order the hash is ready moments after the last byte. A mismatch deletes the file and its map
  and raises ``VerificationFailed``. Then the file is fsynced and the map is rewritten as *complete* with
  the digests, so a later call for the same size and validator returns at once.
* ENOSPC/EDQUOT while preallocating or writing raise ``InsufficientDisk``; the partial file and its map are
  kept for a resume once space is freed.

Cancellation: :meth:`RangedDownloader.download` may be cancelled at any ``await``. It then stops its
requests (a worker thread sees its request's flag after each ``readinto``, and a thread blocked on the
network is woken by shutting its socket down, so this takes milliseconds, not a read timeout), waits for
every thread that may still use the file descriptor, records the parts completed so far, and re-raises.
Messages never contain the URL (presigned URLs carry credentials); they name the ``label`` the caller gives.

Defaults and what they rest on (``bench/ranged.py`` against nginx on loopback, 2 GiB in page cache, sha256
inline, durable; ``bench/results/ranged*.json``; medians of 3, min-max in the files). The 2-core box was
shared with other test runs (load average 4-20), so absolute numbers are low and noisy; ratios measured
side by side hold better:

* part size 8/16/32 MiB x concurrency 2/4/8 (1 MiB buffer, load 6-20): no configuration stood out beyond
  the noise (tmpfs 0.11-0.16 GB/s, disk 0.08-0.11 GB/s, 2.7-3.3 CPU-s/GB). ``DEFAULT_PART_SIZE`` stays
  16 MiB (the resume cost is ``concurrency x part_size``: 128 MiB at the defaults) and
  ``DEFAULT_CONCURRENCY`` 8: on loopback it costs nothing measurable (+4 MiB peak RSS over 4 slots), and
  remote object stores limit each connection, not the client.
* write buffer 1 vs 4 MiB (16 MiB x 4, load 4-7): 4 MiB is faster and cheaper, to disk with fsync 0.28
  vs 0.19 GB/s and 2.6 vs 3.3 CPU-s/GB, on tmpfs 0.33 vs 0.31 GB/s and 2.5 vs 2.6 CPU-s/GB, for 12 MiB
  more RSS: ``DEFAULT_WRITE_BUFFER`` is 4 MiB. Peak RSS stays within 25 MiB over idle at 4 slots.
* the resume bound (a slot held until its part is recorded) costs throughput: to disk with fsync 0.28
  vs 0.42 GB/s (4 MiB buffer) and 0.19 vs 0.32 GB/s (1 MiB) against releasing the slot at completion,
  on tmpfs 0.33 vs 0.41 GB/s. Measured SIGKILL at 50 % of 2 GiB: 52-62 MB fetched again with 16 MiB x 4
  (bound 64 MiB), 32 MiB with 8 MiB x 4 (bound 32 MiB).
* zero-copy receive (2026-11-30, quiet box, 2 GiB from nginx to tmpfs, 16 MiB x 8; CPU of the download
  only, per-thread ``/proc`` times; ``bench/download.py`` repeats it side by side with the peers): the
  copying path 1.66 CPU-s/GB without hashing, 2.79 with sha256; splice + one writer per file 1.1-1.3
  and 2.1-2.3. Of that, tmpfs page allocation is about 0.4 (any writer pays it: ``dd`` to ``/dev/shm``
  costs 0.75), sha256 0.70 (SHA-NI), reading back through the mapping 0.15-0.2, the event loop 0.06. To
  disk with fsync: 0.50-0.55 GB/s at 1.7-1.9 CPU-s/GB with sha256; holding a slot until its part is
  recorded no longer costs throughput (0.50 vs 0.50-0.53 GB/s released at completion). The minimal reader
  of ``docs/performance.md#3-the-minimal-ranged-reader`` (4 threads, readinto + pwrite) costs 1.7 CPU-s/GB on this box
  today (0.95 when
  that table was written), ``curl`` 1.3.
* early writeback (2026-11-30, ``bench/download.py`` W1/W2 to disk with fsync, the disk sampled by
  ``bench/diskstats.py``): ``sync_file_range`` after every buffer kept the disk at 1.3-1.6 MiB per request and
  0.30-0.37 GB/s; left to the kernel until each record's fdatasync, 2.2-2.8 MiB per request and 0.45-0.60
  GB/s while several files are written. Whole model (Hub face) 0.35 -> 0.38-0.45 GB/s, 0.46-0.47 with the
  largest files started first (:func:`largest_first`); one 2 GiB file unchanged (0.43-0.50 either way).
  In the 5-round suite after the change: whole model 0.44 GB/s median (0.42-0.52), rclone 0.44.
* the defaults (16 MiB x 8, 4 MiB buffer; load 4-6): tmpfs 0.29 GB/s (0.28-0.34) at 2.65 CPU-s/GB, disk
  with fsync 0.31 GB/s (0.17-0.34; ``dd conv=fsync`` did 0.29 GB/s then) at 3.4 CPU-s/GB, peak RSS 67 MiB
  (about 41 MiB over idle). The engine before this transport, 16 MiB x 4, tmpfs: 0.23 GB/s at 4.2 CPU-s/GB.
* same runs, other clients on tmpfs without hashing: aria2c ``-x8 -s8`` 0.39-0.51 GB/s at 1.8-2.0
  CPU-s/GB, curl (one stream) 0.49-0.81 GB/s at 1.2 CPU-s/GB.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import email.utils
import errno
import hashlib
import http.client
import json
import mmap
import os
import random
import re
import socket
import ssl
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from model_agent.local.capacity import Reservation, allocated_bytes, is_disk_full
from model_agent.sources.base import SourceError
from model_agent.sources.ranged_http import SlotTransport, tls_context
from model_agent.sources.ranged_splice import (
    FileWriteError,
    SplicePipe,
    SpliceUnsupported,
    plain_socket,
    pwrite_all,
    splice_body,
)

if TYPE_CHECKING:
    import aiohttp

MiB = 1024 * 1024
DEFAULT_PART_SIZE = 16 * MiB
DEFAULT_CONCURRENCY = 8
DEFAULT_WRITE_BUFFER = 4 * MiB
HASH_BLOCK = 2 * MiB
HASH_WINDOW = 8 * MiB  # mapped at a time while hashing beside the transfer (counts in RSS while mapped)
HASH_STEP = 64 * MiB  # hashed per thread call (fewer event-loop round trips; a window at a time)
PROGRESS_STEP = 16 * MiB  # spliced bytes are reported to the event loop in steps this large (fewer wake-ups)
STATE_VERSION = 1
SUPPORTED_CHECKSUMS = frozenset({"md5", "sha1", "sha256", "crc32", "crc32c"})
CRC32C_CHUNK = 256 * 1024  # google-crc32c takes bytes only: fed in copies this small (they stay in cache)

# Where sources keep part maps in a model's staging folder (removed with it when the model is published).
PARTS_DIR = Path(".cache") / "model-agent" / "parts"

UrlSource = str | Callable[[], str] | Callable[[], Awaitable[str]]
# Extra request headers: fixed, or computed per request from its URL (request signing, e.g. OCI's).
HeaderSource = Mapping[str, str] | Callable[[str], Mapping[str, str]]
_T = TypeVar("_T")


class _HasSize(Protocol):
    @property
    def size(self) -> int: ...


_Sized = TypeVar("_Sized", bound=_HasSize)


@dataclass(frozen=True)
class RangedConfig:
    """Tuning of the engine; the defaults were chosen on loopback (see ``bench/ranged.py``)."""

    part_size: int = DEFAULT_PART_SIZE
    concurrency: int = DEFAULT_CONCURRENCY
    write_buffer: int = DEFAULT_WRITE_BUFFER
    max_attempts: int = 8  # consecutive failures of one part without progress
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    retry_after_cap_s: float = 300.0
    connect_timeout_s: float = 30.0
    read_timeout_s: float = 60.0
    durable: bool = True  # fdatasync before a part is recorded as complete
    ca_bundle: str | None = None  # PEM file of trusted CAs for HTTPS (else AWS_CA_BUNDLE, ...: see ranged_http)
    splice: bool = True  # zero-copy receive of plain-HTTP bodies where possible (ranged_splice); False: copy

    def __post_init__(self) -> None:
        if self.part_size < 1 or self.concurrency < 1 or self.write_buffer < 1 or self.max_attempts < 1:
            raise ValueError("part_size, concurrency, write_buffer and max_attempts must be positive")


@dataclass(frozen=True)
class Expected:
    """What the source promises about the file: its size, checksums (lowercase hex) and a validator.

    ``checksums`` maps an algorithm of :data:`SUPPORTED_CHECKSUMS` to its hex digest (``crc32``: 8 hex digits,
    big-endian). ``validator`` (e.g. an ETag, quotes included) is sent as ``If-Match`` and stored in the part
    map: progress recorded under another validator is discarded.
    """

    size: int
    checksums: Mapping[str, str] = field(default_factory=dict)
    validator: str | None = None


@dataclass(frozen=True)
class Downloaded:
    path: Path
    size: int
    digests: dict[str, str]  # sha256 always, plus every algorithm of Expected.checksums
    fetched_bytes: int  # body bytes written in this call
    resumed_bytes: int  # bytes taken from an earlier, interrupted call
    requests: int  # HTTP requests made in this call


class _Hasher(Protocol):
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


def _new_hasher(algorithm: str) -> _Hasher:
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
    raise ValueError(f"unsupported checksum algorithm {algorithm!r}")


def file_checksums(path: Path, algorithms: Iterable[str], block: int = HASH_BLOCK) -> dict[str, str]:
    """Hex digests of a whole file (blocking)."""
    hashers = {alg: _new_hasher(alg) for alg in algorithms}
    with path.open("rb") as fh:
        while data := fh.read(block):
            for h in hashers.values():
                h.update(data)
    return {alg: h.hexdigest() for alg, h in hashers.items()}


def part_map_path(staging: Path, rel: str) -> Path:
    """The part map of staged file ``rel``: named by a hash, so any file name fits and none can escape."""
    return staging / PARTS_DIR / part_map_name(rel)


def part_map_name(rel: str) -> str:
    return hashlib.sha256(rel.encode()).hexdigest()[:32] + ".json"


def b64_to_hex(value: str) -> str | None:
    """A base64 digest (as in S3 ``x-amz-checksum-*`` and ``Content-MD5``) in hex, or None if it is not one."""
    try:
        return base64.b64decode(value, validate=True).hex()
    except (ValueError, TypeError):
        return None


# ----------------------------------------------------------------------------------------------- part map


@dataclass
class _PartMap:
    size: int
    part_size: int
    validator: str | None
    done: bytearray  # one bit per part
    complete: bool = False
    digests: dict[str, str] = field(default_factory=dict)

    @property
    def parts(self) -> int:
        return (self.size + self.part_size - 1) // self.part_size

    def is_done(self, i: int) -> bool:
        return bool(self.done[i >> 3] & (1 << (i & 7)))

    def mark(self, i: int) -> None:
        self.done[i >> 3] |= 1 << (i & 7)

    def done_bytes(self) -> int:
        return sum(min(self.part_size, self.size - i * self.part_size) for i in range(self.parts) if self.is_done(i))

    @classmethod
    def fresh(cls, size: int, part_size: int, validator: str | None) -> _PartMap:
        return cls(size, part_size, validator, bytearray((((size + part_size - 1) // part_size) + 7) // 8))

    def copy(self) -> _PartMap:
        return _PartMap(
            self.size, self.part_size, self.validator, bytearray(self.done), self.complete, dict(self.digests)
        )

    def to_json(self) -> bytes:
        doc = {
            "version": STATE_VERSION,
            "size": self.size,
            "part_size": self.part_size,
            "validator": self.validator,
            "done": base64.b64encode(bytes(self.done)).decode(),
            "complete": self.complete,
            "digests": self.digests,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def load(cls, path: Path) -> _PartMap | None:
        """The map at ``path``, or None when it is missing or unreadable (then nothing is trusted)."""
        try:
            doc = json.loads(path.read_bytes())
            if doc.get("version") != STATE_VERSION:
                return None
            size, part_size = int(doc["size"]), int(doc["part_size"])
            validator = doc.get("validator")
            done = bytearray(base64.b64decode(doc["done"], validate=True))
            digests = {str(k): str(v) for k, v in dict(doc.get("digests") or {}).items()}
            complete = bool(doc.get("complete", False))
        except (OSError, ValueError, TypeError, KeyError):
            return None
        if size < 0 or part_size < 1 or (validator is not None and not isinstance(validator, str)):
            return None
        state = cls(size, part_size, validator, done, complete, digests)
        if len(done) != (state.parts + 7) // 8:
            return None
        return state

    def save(self, path: Path) -> None:
        """Replace the map atomically (a crash leaves the old map or the new one, never a mix)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with tmp.open("wb") as fh:
                fh.write(self.to_json())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


# ----------------------------------------------------------------------------------------------- file I/O

_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="ranged-io")
        return _EXECUTOR


class _Io:
    """Blocking file work in threads, tracked so the descriptor is closed only when no thread still uses it."""

    def __init__(self) -> None:
        self._inflight: set[concurrent.futures.Future[Any]] = set()

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        fut = _executor().submit(fn, *args)
        self.track(fut)
        return await asyncio.wrap_future(fut)

    def track(self, fut: concurrent.futures.Future[Any]) -> None:
        """Count ``fut`` (work that may use the descriptor) until it ends."""
        self._inflight.add(fut)
        fut.add_done_callback(self._inflight.discard)

    async def drain(self) -> None:
        while self._inflight:
            await asyncio.to_thread(concurrent.futures.wait, list(self._inflight))


_pwrite_all = pwrite_all  # the copying path's writes (a name of this module: tests fill the disk through it)


def _hash_mapped(fd: int, hasher: _Hasher, offset: int, length: int) -> None:
    """Feed ``length`` bytes of the file at ``offset`` to ``hasher`` straight from the page cache.

    A read-only mapping instead of ``pread``: it saves copying every byte once more (measured here: 0.2
    instead of 0.7 CPU-s/GB of system time on top of the hash itself). One window is mapped at a time.
    """
    end = offset + length
    while offset < end:
        step = min(HASH_WINDOW, end - offset)
        _hash_window(fd, hasher, offset, step)
        offset += step


def _hash_window(fd: int, hasher: _Hasher, offset: int, length: int) -> None:
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


_libc_fallocate: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc_fallocate = _libc.fallocate
        _libc_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _libc_fallocate.restype = ctypes.c_int


def preallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes of disk for ``fd`` and set its length; ENOSPC is raised as OSError.

    Uses ``fallocate(2)`` directly (not glibc's ``posix_fallocate``, which on filesystems without support
    emulates it by writing every block); falls back to ``ftruncate`` (a sparse file) when unsupported.
    """
    if size > 0 and _libc_fallocate is not None:
        if _libc_fallocate(fd, 0, 0, size) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise OSError(err, os.strerror(err))
    os.ftruncate(fd, size)


def _disk_error(label: str, exc: OSError, what: str) -> SourceError:
    if is_disk_full(exc):
        return SourceError(
            "InsufficientDisk",
            f"{label}: the disk filled up while {what} ({exc.strerror}); the"
            " partial download is kept and resumes once space is freed",
        )
    return SourceError("WriteFailed", f"{label}: {what} failed: {exc}")


# ----------------------------------------------------------------------------------------------- HTTP helpers


class _Retry(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _RangeIgnored(Exception):
    """The server answered a ranged GET with the whole body."""


class _Stopped(Exception):
    """A worker thread saw its request's cancellation flag."""


# Failures of one request that are retried: answers asking for a retry, network and protocol errors. Disk errors
# never reach here as OSError (they become SourceError where they happen).
_TRANSIENT = (_Retry, OSError, http.client.HTTPException)


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


@dataclass
class _Span:
    pos: int
    end: int  # exclusive


@contextlib.asynccontextmanager
async def engine_session(config: RangedConfig) -> AsyncIterator[RangedDownloader]:
    """A :class:`RangedDownloader` for one fetch, its connections and threads closed on exit.

    Bodies are taken as stored (no decompression): the bytes written are the bytes hashed. Proxies come
    from the environment (``HTTPS_PROXY``, ``NO_PROXY``).
    """
    async with RangedDownloader(config=config) as engine:
        yield engine


async def run_all(coros: Iterable[Awaitable[Any]]) -> None:
    """Run the coroutines; on the first exception cancel the others, wait for them, and re-raise it."""
    await gather_or_cancel(coros)


def largest_first(files: Iterable[_Sized]) -> list[_Sized]:
    """The order to start files in when only some run at once: largest first, so what is left at the end is
    small files rather than one large file fetched alone (a whole model to disk: 0.38-0.45 -> 0.46-0.47 GB/s)."""
    return sorted(files, key=lambda f: f.size, reverse=True)


async def gather_or_cancel(coros: Iterable[Awaitable[_T]]) -> list[_T]:
    """Their results in order; on the first exception the others are cancelled and awaited, then it is raised
    (unlike ``asyncio.gather``, which leaves the others running)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return []
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            error = task.exception() if task in done and not task.cancelled() else None
            if error is not None:
                raise error
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ----------------------------------------------------------------------------------------------- engine


@dataclass
class _Slot:
    """A part slot: its keep-alive connection, and made when first needed, its receive buffer and its pipe."""

    transport: SlotTransport
    buffer_size: int
    pipe: SplicePipe | None = None
    _buffer: bytearray | None = None

    def buffer(self) -> bytearray:
        # Lazily: a slot that only ever splices never pays for (nor holds) write_buffer bytes.
        if self._buffer is None:
            self._buffer = bytearray(self.buffer_size)
        return self._buffer


class RangedDownloader:
    """Downloads files over HTTP with ranged GETs; one instance shares its part slots among its downloads.

    ``session`` is accepted for compatibility and not used (the transport is ``http.client`` in worker
    threads, see :mod:`model_agent.sources.ranged_http`). Create the downloader inside the running event loop;
    :meth:`close` (or ``async with``) closes its connections and threads (otherwise they go when the
    downloader is garbage collected).
    """

    def __init__(self, session: aiohttp.ClientSession | None = None, config: RangedConfig | None = None) -> None:
        self.session = session
        self.config = config or RangedConfig()
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._free: list[_Slot] = []  # slots not in use: buffers and connections reused across parts and files
        self._all: list[_Slot] = []
        self._tls: ssl.SSLContext | None = None
        self._tls_lock = threading.Lock()
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.concurrency, thread_name_prefix="ranged-part"
        )
        self._not_before = 0.0
        self._splice = self.config.splice  # turned off for good when the kernel refuses it once

    async def __aenter__(self) -> RangedDownloader:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close idle connections and let the worker threads end; call when no download is running."""
        for slot in self._all:
            slot.transport.close()
            if slot.pipe is not None:
                slot.pipe.close()
                slot.pipe = None
        self._threads.shutdown(wait=False)

    async def download(
        self,
        url: UrlSource,
        path: Path,
        expected: Expected,
        *,
        headers: HeaderSource | None = None,
        state_path: Path | None = None,
        label: str | None = None,
        on_bytes: Callable[[int], None] | None = None,
        reservation: Reservation | None = None,
    ) -> Downloaded:
        """Fetch ``url`` into ``path`` (resuming from ``state_path``), verify it, fsync it; see the module doc.

        ``url`` may be a callable (plain or async), called for every request (e.g. to renew a presigned URL).
        ``headers`` may be a callable, called with each request's URL for headers to add (e.g. a signature).
        ``on_bytes`` is called (in the event loop) with the size of every write. ``reservation`` is shrunk by
        what the preallocation takes.
        """
        unknown = set(expected.checksums) - SUPPORTED_CHECKSUMS
        if unknown:
            raise ValueError(f"unsupported checksum algorithms: {sorted(unknown)}")
        job = _Job(
            self,
            url,
            Path(path),
            expected,
            headers if callable(headers) else dict(headers or {}),
            Path(state_path) if state_path is not None else Path(f"{path}.parts.json"),
            label or Path(path).name,
            on_bytes or (lambda _n: None),
            reservation,
        )
        return await job.run()

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[_Slot]:
        """A part slot: memory and connections are bounded by the slots, not by the files in progress."""
        async with self._slots:
            slot = self._free.pop() if self._free else self._new_slot()
            try:
                yield slot
            finally:
                self._free.append(slot)

    def _new_slot(self) -> _Slot:
        cfg = self.config
        transport = SlotTransport(self._tls_context, cfg.connect_timeout_s, cfg.read_timeout_s)
        slot = _Slot(transport, cfg.write_buffer)
        self._all.append(slot)
        return slot

    def _tls_context(self) -> ssl.SSLContext:
        """The one TLS context of this downloader, made at the first HTTPS connection (from a worker thread)."""
        with self._tls_lock:
            if self._tls is None:
                try:
                    self._tls = tls_context(self.config.ca_bundle)
                except (OSError, ssl.SSLError) as exc:
                    raise SourceError("TLSError", f"cannot load the trusted CA certificates: {exc}") from None
            return self._tls

    # -- shared pause (Retry-After)
    def _pause(self, seconds: float) -> None:
        self._not_before = max(self._not_before, time.monotonic() + seconds)

    async def _wait_turn(self) -> None:
        delay = self._not_before - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


async def _settle(fut: concurrent.futures.Future[Any]) -> None:
    """Wait until a thread's work has ended, whatever cancellations arrive meanwhile (its buffer is then free)."""
    waiter = asyncio.wrap_future(fut)
    while not fut.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([waiter])
    with contextlib.suppress(BaseException):
        waiter.result()


class _Job:
    def __init__(
        self,
        dl: RangedDownloader,
        url: UrlSource,
        path: Path,
        expected: Expected,
        headers: HeaderSource,
        state_path: Path,
        label: str,
        on_bytes: Callable[[int], None],
        reservation: Reservation | None,
    ) -> None:
        self.dl = dl
        self.cfg = dl.config
        self.url = url
        self.path = path
        self.expected = expected
        self.size = expected.size
        self.headers = headers
        self.state_path = state_path
        self.label = label
        self.on_bytes = on_bytes
        self.reservation = reservation
        self.algorithms = sorted({"sha256", *expected.checksums})
        self.io = _Io()
        self.fd = -1
        self.state = _PartMap.fresh(self.size, self.cfg.part_size, expected.validator)
        self.recorded = self.state.copy()  # what the map on disk says
        self.persist_progress = False
        self.queue: deque[int] = deque()
        self.fetched = 0
        self.resumed = 0
        self.requests = 0
        self.frontier = 0  # parts [0, frontier) are all done
        self.part_event = asyncio.Event()
        self.unrecorded: set[int] = set()
        self.flusher: asyncio.Task[None] | None = None
        self.flushed = asyncio.Event()  # set after every map write (or its failure)
        self.flush_error: BaseException | None = None
        self.sequential = False  # single-stream mode (the server ignores Range)
        self.next_sequential = 0
        self.loop = asyncio.get_running_loop()
        # One writer to the file at a time: parallel writers contend for the inode lock and the kernel spins on
        # it (measured: 1.7 -> 1.6 CPU-s/GB copying to tmpfs, and most of the gain of splice on ext4).
        self.write_lock = threading.Lock()

    # ------------------------------------------------------------------ open / state

    def _open(self) -> bool:
        """Load or reset the part map, open and preallocate the file. True when the file is already complete."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        old = _PartMap.load(self.state_path)
        try:
            on_disk = self.path.stat().st_size
        except FileNotFoundError:
            on_disk = -1
        usable = (
            old is not None
            and old.size == self.size
            and old.validator == self.expected.validator
            and on_disk == self.size
        )
        if usable and old is not None and old.complete:
            if all(alg in old.digests for alg in self.algorithms):
                self.state = old
                return True
            usable = False  # complete, but without a digest we now need: fetch again
        if usable and old is not None:
            self.state = old
            self.recorded = old.copy()
            flags = os.O_RDWR
        else:
            self.state = _PartMap.fresh(self.size, self.cfg.part_size, self.expected.validator)
            self.recorded = self.state.copy()
            # Forget old progress before touching the data, so no map ever describes bytes we overwrite.
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()
            flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
        self.persist_progress = self.state.parts > 1
        try:
            self.fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise _disk_error(self.label, exc, "creating the file") from exc
        before = allocated_bytes(self.path)
        try:
            preallocate(self.fd, self.size)
        except OSError as exc:
            os.close(self.fd)
            self.fd = -1
            raise _disk_error(self.label, exc, f"preallocating {self.size} bytes") from exc
        if self.reservation is not None:
            self.reservation.consume(allocated_bytes(self.path) - before)
        if self.persist_progress and not usable:
            try:
                self.state.save(self.state_path)
            except OSError as exc:
                raise _disk_error(self.label, exc, "writing the part map") from exc
        self.resumed = self.state.done_bytes()
        self.queue.extend(i for i in range(self.state.parts) if not self.state.is_done(i))
        self._advance_frontier()
        return False

    def _advance_frontier(self) -> None:
        while self.frontier < self.state.parts and self.state.is_done(self.frontier):
            self.frontier += 1

    def _frontier_bytes(self) -> int:
        return min(self.size, self.frontier * self.state.part_size)

    # ------------------------------------------------------------------ run

    async def run(self) -> Downloaded:
        try:
            already = await self.io.run(self._open)
        except BaseException:
            await self._close()
            raise
        if already:
            return Downloaded(self.path, self.size, self._digests(self.state.digests), 0, self.size, 0)
        try:
            digests = await self._transfer_and_hash()
            await self._verify(digests)
            return Downloaded(self.path, self.size, digests, self.fetched, self.resumed, self.requests)
        finally:
            cleanup = asyncio.ensure_future(self._shutdown())
            await asyncio.shield(cleanup)

    def _digests(self, found: Mapping[str, str]) -> dict[str, str]:
        return {alg: found[alg] for alg in self.algorithms}

    async def _transfer_and_hash(self) -> dict[str, str]:
        hasher = asyncio.ensure_future(self._hash_loop())
        try:
            if self.queue:
                workers = min(len(self.queue), self.cfg.concurrency)
                try:
                    await run_all(self._worker() for _ in range(workers))
                except _RangeIgnored:
                    await self._single_stream()
            await self._flush_now()
            self.part_event.set()
            return await hasher
        finally:
            if not hasher.done():
                hasher.cancel()
            await asyncio.gather(hasher, return_exceptions=True)

    async def _shutdown(self) -> None:
        """After success, failure or cancellation: no thread uses the fd, the map is current, the fd closed."""
        await self.io.drain()
        if self.fd >= 0 and not self.state.complete:
            with contextlib.suppress(Exception):
                await self._flush_now()
            await self.io.drain()
        await self._close()

    async def _close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    # ------------------------------------------------------------------ parts and the part map

    async def _worker(self) -> None:
        while self.queue:
            i = self.queue.popleft()
            # The slot is held until the part is durably recorded: parts in flight plus parts completed but not
            # yet in the map never exceed the slots, so a kill at any instant refetches <= concurrency parts.
            async with self.dl._slot() as slot:
                await self._fetch_part(i, slot)
                self._part_done(i)
                await self._recorded(i)

    def _part_done(self, i: int) -> None:
        self.state.mark(i)
        self._advance_frontier()
        self.part_event.set()
        if self.flush_error is not None:
            raise self.flush_error
        if self.persist_progress:
            self.unrecorded.add(i)
            if self.flusher is None or self.flusher.done():
                self.flusher = asyncio.ensure_future(self._flush_loop())

    async def _recorded(self, i: int) -> None:
        """Return once part ``i`` is in the map on disk (after the fdatasync of its bytes when durable)."""
        while self.persist_progress and not self.recorded.is_done(i):
            if self.flush_error is not None:
                raise self.flush_error
            self.flushed.clear()
            await self.flushed.wait()

    async def _flush_loop(self) -> None:
        try:
            while self.unrecorded:
                batch = set(self.unrecorded)
                self.unrecorded.clear()
                if self.cfg.durable:
                    await self.io.run(os.fdatasync, self.fd)
                for i in batch:
                    self.recorded.mark(i)
                snapshot = self.recorded.copy()
                await self.io.run(snapshot.save, self.state_path)
                self.flushed.set()
        except asyncio.CancelledError:
            raise
        except OSError as exc:
            self.flush_error = _disk_error(self.label, exc, "recording progress")
        except Exception as exc:
            self.flush_error = exc
        finally:
            self.flushed.set()

    async def _flush_now(self) -> None:
        """Wait for a running map write, then record whatever is still unrecorded."""
        if self.flusher is not None and not self.flusher.done():
            await asyncio.shield(self.flusher)
        if self.persist_progress and self.unrecorded and self.fd >= 0:
            self.flusher = asyncio.ensure_future(self._flush_loop())
            await asyncio.shield(self.flusher)
        if self.flush_error is not None:
            raise self.flush_error

    # ------------------------------------------------------------------ requests

    async def _fetch_part(self, i: int, slot: _Slot) -> None:
        start = i * self.state.part_size
        span = _Span(start, min(self.size, start + self.state.part_size))
        failures = 0
        while span.pos < span.end:
            await self.dl._wait_turn()
            before = span.pos
            try:
                await self._stream(span, slot, whole=(span.pos == 0 and span.end == self.size))
            except _TRANSIENT as exc:
                if span.pos >= span.end:
                    return
                failures = 1 if span.pos > before else failures + 1
                if failures >= self.cfg.max_attempts:
                    raise SourceError(
                        "DownloadFailed",
                        f"{self.label}: bytes {span.pos}-{span.end - 1}: {failures} attempts in a row failed; "
                        f"last: {_describe(exc)}",
                    ) from None
                await asyncio.sleep(self._retry_delay(exc, failures))

    async def _request_url(self) -> str:
        if isinstance(self.url, str):
            return self.url
        url = self.url()
        return url if isinstance(url, str) else await url

    async def _stream(self, span: _Span, slot: _Slot, *, whole: bool) -> None:
        """One GET for ``span`` in the slot's thread; advances ``span.pos`` past every byte written."""
        self.requests += 1
        url = await self._request_url()
        headers = dict(self.headers(url) if callable(self.headers) else self.headers)
        if not whole:
            headers["Range"] = f"bytes={span.pos}-{span.end - 1}"
        if self.expected.validator:
            headers["If-Match"] = self.expected.validator
        stop = threading.Event()
        fut = self.dl._threads.submit(self._request, slot, url, headers, span, whole, stop)
        self.io.track(fut)
        try:
            await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            # The thread notices within one buffer (the flag) or at once when blocked on the socket (shutdown).
            stop.set()
            slot.transport.abort()
            await _settle(fut)
            raise

    def _request(
        self, slot: _Slot, url: str, headers: dict[str, str], span: _Span, whole: bool, stop: threading.Event
    ) -> None:
        """Worker thread: send the GET, check the answer, copy the body to the file."""
        try:
            key = slot.transport.key_of(url)
            resp = slot.transport.get(url, headers)
        except ssl.SSLCertVerificationError as exc:  # (also a ValueError: first)
            raise SourceError("TLSError", f"{self.label}: certificate not trusted ({exc.verify_message})") from None
        except ValueError as exc:
            raise SourceError("BadRequest", f"{self.label}: {exc}") from None
        reusable = False
        try:
            self._check(resp, span, whole=whole)
            sock = plain_socket(resp, slot.transport.active_socket()) if self.dl._splice else None
            if sock is not None:
                self._splice_body(resp, sock, span, slot, stop)
            if span.pos < span.end:  # (after a complete splice there is nothing to copy: no buffer is made)
                self._copy_body(resp, span, slot.buffer(), stop)
            reusable = resp.isclosed()  # read to its end: the connection can carry the next request
        finally:
            if not reusable:
                slot.transport.drop(key)

    def _copy_body(
        self,
        resp: http.client.HTTPResponse,
        span: _Span,
        buf: bytearray,
        stop: threading.Event,
        until: int | None = None,
    ) -> None:
        """Worker thread: copy the body into the file through the slot's buffer, to ``until`` or the span's end."""
        end = span.end if until is None else until
        view = memoryview(buf)
        while span.pos < end:
            if stop.is_set():
                raise _Stopped()  # the awaiting task was cancelled and waits for this thread to let go
            # readinto fills the buffer straight from the socket; never past the span, whatever the server sends.
            n = resp.readinto(view[: min(len(view), end - span.pos)])
            if not n:
                break
            self._write_at(view[:n], span)
        if span.pos < end:
            raise _Retry(f"the response ended {span.end - span.pos} bytes early")

    def _splice_body(
        self, resp: http.client.HTTPResponse, sock: socket.socket, span: _Span, slot: _Slot, stop: threading.Event
    ) -> None:
        """Worker thread: the body straight from the socket into the file (see ranged_splice), as far as it goes.

        Returns with ``span`` advanced past what is in the file; :meth:`_copy_body` then does the rest, if any
        (nothing, unless the kernel refused the splice).
        """
        # What http.client read past the headers is in its buffer, not in the socket: that goes first, copied.
        if not resp.length or span.pos >= span.end:
            return  # (peek on an empty body would wait for bytes that never come)
        head = min(len(resp.fp.peek(1)), span.end - span.pos, resp.length)
        if head:
            self._write_at(memoryview(resp.read(head)), span)  # a few KiB at most: no system call
        count = min(resp.length or 0, span.end - span.pos)
        if count <= 0:
            return
        if slot.pipe is None:
            try:
                slot.pipe = SplicePipe()
            except OSError:
                return  # no pipe to be had (descriptors exhausted?): copy this body
        unreported = 0

        def written(pos: int, n: int) -> None:
            nonlocal unreported
            span.pos = pos + n
            unreported += n
            if unreported >= PROGRESS_STEP:
                self._report(span.pos - unreported, unreported)
                unreported = 0

        try:
            moved = splice_body(
                sock,
                slot.pipe,
                self.fd,
                span.pos,
                count,
                write_lock=self.write_lock,
                stopped=stop.is_set,
                timeout_s=self.cfg.read_timeout_s,
                on_written=written,
            )
        except SpliceUnsupported:
            self.dl._splice = False
            return
        except FileWriteError as exc:
            raise _disk_error(self.label, exc.cause, "writing") from exc.cause
        finally:
            if unreported:
                self._report(span.pos - unreported, unreported)
            if slot.pipe is not None and not slot.pipe.file_writes_ok:
                self.dl._splice = False
        if stop.is_set():
            raise _Stopped()
        if moved == resp.length:
            resp.length = 0
            resp.read()  # nothing left to read: marks the response complete, so the connection is reused

    def _write_at(self, data: memoryview, span: _Span) -> None:
        """Worker thread: write ``data`` at ``span.pos`` and advance it."""
        try:
            with self.write_lock:
                _pwrite_all(self.fd, data, span.pos)
        except OSError as exc:
            raise _disk_error(self.label, exc, "writing") from exc
        self._report(span.pos, len(data))
        span.pos += len(data)

    def _report(self, start: int, n: int) -> None:
        """Worker thread: ``n`` bytes from ``start`` are in the file."""
        self.loop.call_soon_threadsafe(self._wrote, n, start + n)

    def _wrote(self, n: int, pos: int) -> None:
        self.fetched += n
        self.on_bytes(n)
        if self.sequential:
            self._passed(pos)

    def _check(self, resp: http.client.HTTPResponse, span: _Span, *, whole: bool) -> None:
        status = resp.status
        if status == 206:
            m = _CONTENT_RANGE.fullmatch((resp.getheader("Content-Range") or "").strip())
            if m is None:
                raise SourceError("BadResponse", f"{self.label}: 206 without a usable Content-Range")
            first, last, total = int(m[1]), int(m[2]), m[3]
            if total != "*" and int(total) != self.size:
                raise SourceError(
                    "SourceChanged", f"{self.label}: the remote file is {total} bytes now, {self.size} were listed"
                )
            if first != span.pos or last != span.end - 1:
                raise SourceError(
                    "BadResponse", f"{self.label}: asked for bytes {span.pos}-{span.end - 1}, got {first}-{last}"
                )
            return
        if status == 200:
            if not whole:
                raise _RangeIgnored()
            length = resp.length
            if length is not None and length != self.size:
                raise SourceError(
                    "SourceChanged", f"{self.label}: the remote file is {length} bytes now, {self.size} were listed"
                )
            return
        if status in (429, 503):
            raise _Retry(f"HTTP {status}", parse_retry_after(resp.getheader("Retry-After")))
        if status == 408 or status >= 500:
            raise _Retry(f"HTTP {status}")
        if status in (412, 416):
            raise SourceError(
                "SourceChanged", f"{self.label}: the remote file changed since it was listed (HTTP {status})"
            )
        if status in (401, 403):
            raise SourceError("AccessDenied", f"{self.label}: access denied (HTTP {status})")
        if status == 404:
            raise SourceError("ObjectNotFound", f"{self.label}: not found (HTTP 404)")
        raise SourceError("HttpError", f"{self.label}: unexpected HTTP {status}")

    async def _single_stream(self) -> None:
        """The server ignores Range: fetch the whole body in one stream, recording parts as it passes them."""
        failures = 0
        self.sequential = True
        while True:
            await self.dl._wait_turn()
            span = _Span(0, self.size)
            try:
                async with self.dl._slot() as slot:
                    await self._stream(span, slot, whole=True)
                return
            except _TRANSIENT as exc:
                failures = 1 if span.pos > 0 else failures + 1
                if failures >= self.cfg.max_attempts:
                    raise SourceError(
                        "DownloadFailed", f"{self.label}: {failures} attempts in a row failed; last: {_describe(exc)}"
                    ) from None
                await asyncio.sleep(self._retry_delay(exc, failures))

    def _retry_delay(self, exc: BaseException, failures: int) -> float:
        retry_after = exc.retry_after if isinstance(exc, _Retry) else None
        if retry_after is not None:
            delay = min(retry_after, self.cfg.retry_after_cap_s)
            self.dl._pause(delay)  # the server asked everyone to wait, not only this request
            return delay
        delay = min(self.cfg.backoff_cap_s, self.cfg.backoff_base_s * 2.0 ** (failures - 1))
        return delay * random.uniform(0.5, 1.0)

    def _passed(self, pos: int) -> None:
        """Single-stream mode: every part that ends at or before ``pos`` is complete."""
        part_size = self.state.part_size
        while self.next_sequential < self.state.parts and min(self.size, (self.next_sequential + 1) * part_size) <= pos:
            if not self.state.is_done(self.next_sequential):
                self._part_done(self.next_sequential)
            self.next_sequential += 1

    # ------------------------------------------------------------------ hashing and verification

    async def _hash_loop(self) -> dict[str, str]:
        hashers = [_new_hasher(alg) for alg in self.algorithms]
        hashed = 0
        while hashed < self.size:
            limit = self._frontier_bytes()
            if hashed >= limit:
                self.part_event.clear()
                await self.part_event.wait()
                continue
            length = min(HASH_STEP, limit - hashed)
            # each update releases the GIL: several algorithms use both cores
            await asyncio.gather(*(self.io.run(_hash_mapped, self.fd, h, hashed, length) for h in hashers))
            hashed += length
        return {alg: h.hexdigest() for alg, h in zip(self.algorithms, hashers, strict=True)}

    async def _verify(self, digests: dict[str, str]) -> None:
        problems = []
        on_disk = os.fstat(self.fd).st_size
        if on_disk != self.size:
            problems.append(f"size {on_disk} != {self.size}")
        for alg, want in sorted(self.expected.checksums.items()):
            if digests.get(alg) != want.lower():
                problems.append(f"{alg} {digests.get(alg)} != expected {want.lower()}")
        if problems:
            await self.io.drain()
            self.state.complete = True  # nothing left to record: the file is discarded below
            for p in (self.path, self.state_path):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            raise SourceError("VerificationFailed", f"{self.label}: " + "; ".join(problems))
        await self.io.run(os.fsync, self.fd)
        self.state.complete = True
        self.state.digests = dict(digests)
        try:
            await self.io.run(self.state.save, self.state_path)
        except OSError as exc:
            raise _disk_error(self.label, exc, "recording completion") from exc
