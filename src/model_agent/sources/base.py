"""The contract every storage source implements, and the publish step they share.

A source turns a :class:`FetchRequest` into verified files in a staging directory and returns the list of
:class:`~model_agent.local.manifest.FileRecord` it produced. It never writes outside ``staging``; the shared
:func:`publish` then renames each staged file into the destination (same filesystem), fsyncs, and removes
files the previous manifest owned that the new revision no longer has. The caller writes the manifest last.

Errors are :class:`SourceError` with a short machine ``reason`` (``RepositoryNotFound``, ``SecretNotFound``,
``VerificationFailed``, ...) and a human message; both end up in the model's ``Failed`` status and Event.
Sources must be cancellable: between files at the least.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import shutil
import stat
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from model_agent.local.manifest import FileRecord, Manifest
from model_agent.model.errors import SourceError as SourceError  # re-exported: its home is model/
from model_agent.model.reasons import Reason

if TYPE_CHECKING:
    from model_agent.sources.egress import Owner


@dataclass
class Progress:
    """What a fetch has done so far, as the ConfigMap entry's ``progress`` and ``/status`` show it."""

    phase: str = "scanning"
    total_bytes: int = 0
    completed_bytes: int = 0
    total_files: int = 0
    completed_files: int = 0

    def start_downloading(self, listed_sizes: Collection[int], kept_sizes: Collection[int]) -> None:
        """Enter the ``downloading`` phase: every listed file in the totals, those kept (already on disk) done."""
        self.phase = "downloading"
        self.total_files, self.total_bytes = len(listed_sizes), sum(listed_sizes)
        self.completed_files, self.completed_bytes = len(kept_sizes), sum(kept_sizes)


ProgressFn = Callable[[Progress], None]

# Files of one model fetched at once, by every source through its one engine (whose slots still bound the
# requests). Measured 2026-12-06 (W2, the whole model to tmpfs, bench/download.py): the Hub face at 4 files moved
# 0.84-0.87 GB/s at 1.68-1.75 CPU-s/GB, at 8 1.01-1.07 GB/s at 1.37-1.44, in alternating invocations.
FILES_AT_ONCE = 8


@dataclass
class FetchRequest:
    """What a source needs for one fetch: where from, where to stage, what the last fetch left, for whom."""

    storage_uri: str
    dest: Path
    staging: Path
    previous: Manifest | None
    token: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    # Decoded data of the Secret named by ``spec.storage.key`` (sources other than hf://), or None.
    secret: dict[str, str] | None = None
    on_progress: ProgressFn = lambda _p: None
    # The allowed root ``dest`` was confined to; when set, publish refuses a ``dest`` not strictly inside it.
    root: Path | None = None
    # TensorRT-LLM serving models from OCI (docs/ome-compatibility.md#33-tensorrt-llm-shape-filter): fetch only objects
    # whose name contains "/{alias}/".
    shape_alias: str | None = None
    # Who the fetch is for (sources/egress.py): a tenant BaseModel gets no ambient credentials and only
    # allow-listed endpoints. None: trusted (callers that predate tenancy).
    owner: Owner | None = None


@dataclass
class FetchResult:
    """What a source fetched: the revision it resolved and every file of the model, staged or reused."""

    revision: str
    files: list[FileRecord]
    # Files already present in ``dest`` (reused from the previous manifest) are listed in ``files`` too.
    staged: list[str] = field(default_factory=list)


def _always(_parameters: Mapping[str, str]) -> bool:
    return True


def _never(_error: SourceError) -> bool:
    return False


@dataclass(frozen=True)
class SourceRules:
    """What the agent must do around one store's fetch, so the reconciler names no scheme.

    * ``wants_token``: the fetch takes a bearer token the agent resolves (Hugging Face: a Secret, the
      parameters, or the platform's ``HF_TOKEN``) instead of the Secret of ``spec.storage.key``;
    * ``reads_secret(parameters)``: whether the fetch reads that Secret (OCI only in its S3-compatible mode);
    * ``counts_listed_bytes``: OME's OCI-only metrics — every listed byte counts as downloaded and each
      fetch records a verification outcome (docs/ome-compatibility.md#111-prometheus-metrics);
    * ``md5_failure(error)``: whether a failed verification was an MD5 mismatch (its own counter);
    * ``shape_filter``: TensorRT-LLM serving models are filtered by the node's shape alias.
    """

    wants_token: bool = False
    reads_secret: Callable[[Mapping[str, str]], bool] = _always
    counts_listed_bytes: bool = False
    md5_failure: Callable[[SourceError], bool] = _never
    shape_filter: bool = False


class Source(Protocol):
    """One store's control plane (see the module contract): turn a request into verified files in staging."""

    rules: SourceRules

    async def fetch(self, request: FetchRequest) -> FetchResult:
        """Fetch ``request`` into its staging directory; raise ``SourceError`` with a reason on failure."""
        ...


class ResolveRecords(Protocol):
    """Where a source finds (or leaves) a revision already resolved by another node of the cluster.

    ``resolve(uri, revision, compute)`` returns ``(commit, files)``: a record when one exists, else the
    result of ``compute()`` — called by one node of the cluster at a time — which is then recorded. A record is
    any node's word: ``put`` replaces one a node found the hub disagreeing with.
    """

    async def put(self, uri: str, commit: str, files: list[dict[str, Any]]) -> None:
        """Record an answer for the other nodes (a failed write is logged, never raised)."""

    async def resolve(
        self,
        uri: str,
        revision: str,
        compute: Callable[[], Awaitable[tuple[str, list[dict[str, Any]]]]],
    ) -> tuple[str, list[dict[str, Any]]]:
        """The recorded ``(commit, files)`` of ``uri`` at ``revision``, else ``compute()``'s, then recorded."""
        ...


def sized_files(candidates: Collection[tuple[Path, int]]) -> list[bool]:
    """Blocking: for each ``(path, size)``, whether a regular file of that size (not a symlink) is there.

    The first test of adopting a file the manifest does not record, made for every candidate in one thread call:
    on a first fetch none is there, and a thread hop per file cost more than the test (20 small files: 2.4 ms).
    Only a file that passes is hashed, one thread call each (so a fetch can be cancelled between them).
    """
    found = []
    for path, size in candidates:
        try:
            st = path.lstat()
        except OSError:
            found.append(False)
            continue
        found.append(stat.S_ISREG(st.st_mode) and st.st_size == size)
    return found


async def adoption_candidates(dest: Path, unrecorded: Collection[tuple[str, int]]) -> set[str]:
    """Which of the files a manifest does not record (``(path below dest, listed size)``) may be adopted: those
    :func:`sized_files` finds, in one thread call for all of them."""
    there = await asyncio.to_thread(sized_files, [(dest / rel, size) for rel, size in unrecorded])
    return {rel for (rel, _size), found in zip(unrecorded, there, strict=True) if found}


def publish(request: FetchRequest, result: FetchResult) -> list[FileRecord]:
    """Move staged files into place and return the final records (with the published mtimes).

    When the destination does not exist yet, the whole staging directory (every file verified) is renamed
    into place in one step, so the model appears complete or not at all; otherwise file by file.

    The destination was confined (inside an allowed root, symlinks resolved) when the spec was validated,
    which may be long ago. So every directory written into here is reached by walking from ``/`` one
    component at a time with ``O_NOFOLLOW`` (creating missing ones), and every rename and unlink is
    relative to a directory descriptor from that walk: a symlink planted meanwhile anywhere between ``/``
    and a file is refused (``UnsafePath``), never followed, and nothing is written or removed outside.
    """
    dest = request.dest
    _check_destination(request)
    touched: dict[tuple[str, ...], int] = {}  # directories written into, by path below dest; we own the fds
    staging_dirs: dict[tuple[str, ...], int] = {}
    try:
        parent_fd = _open_dir(dest.parent, create=True, floor=request.root)
        touched[("..",)] = parent_fd
        whole = not _exists_at(parent_fd, dest.name) and len(result.staged) == len(result.files)
        if whole:
            shutil.rmtree(request.staging / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
            staging_parent_fd = _open_dir(request.staging.parent, create=False)
            try:
                os.rename(request.staging.name, dest.name, src_dir_fd=staging_parent_fd, dst_dir_fd=parent_fd)
            finally:
                os.close(staging_parent_fd)
            os.fsync(parent_fd)
            return [_published(dest, f) for f in result.files]
        dest_fd = _open_dir(dest, create=True, floor=request.root)
        touched[()] = dest_fd
        staging_fd = staging_dirs[()] = _open_dir(request.staging, create=False)
        for rel in result.staged:
            *dirs, name = _parts(rel)
            src_fd = _subdir(staging_fd, tuple(dirs), staging_dirs, create=False, shown=request.staging)
            dst_fd = _subdir(dest_fd, tuple(dirs), touched, create=True, shown=dest)
            os.replace(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        wanted = {f.path for f in result.files}
        if request.previous is not None and Path(request.previous.dest) == dest:
            for old in request.previous.files:
                if old.path in wanted:
                    continue
                *dirs, name = _parts(old.path)
                with contextlib.suppress(FileNotFoundError):
                    dir_fd = _subdir(dest_fd, tuple(dirs), touched, create=False, shown=dest)
                    os.unlink(name, dir_fd=dir_fd)
        for fd in touched.values():
            os.fsync(fd)
    finally:
        for fd in [*touched.values(), *staging_dirs.values()]:
            os.close(fd)
    final = [_published(dest, f) for f in result.files]
    shutil.rmtree(request.staging, ignore_errors=True)
    return final


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _unsafe(message: str) -> SourceError:
    return SourceError(Reason.UNSAFE_PATH, message, retryable=False)


def _check_destination(request: FetchRequest) -> None:
    dest = request.dest
    if not dest.is_absolute() or any(p in (".", "..") for p in dest.parts):
        raise _unsafe(f"destination {str(dest)!r} is not a normalised absolute path")
    if request.root is not None and request.root not in dest.parents:
        raise _unsafe(f"destination {str(dest)!r} is not inside its root {str(request.root)!r}")


def _parts(rel: str) -> list[str]:
    """The components of a file path relative to the destination; refused unless plain names."""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise _unsafe(f"file path {rel!r} is not a plain relative path")
    return parts


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _open_dir(path: Path, *, create: bool, floor: Path | None = None) -> int:
    """A descriptor of the directory ``path``, reached from ``/`` without following any symlink.

    With ``create``, missing directories are made, but only below ``floor`` (when given): nothing is ever
    created outside the root.
    """
    fd = os.open("/", _DIR_FLAGS)
    try:
        if floor is not None and (floor == path or floor in path.parents):
            below = _walk(fd, floor.parts[1:], create=False, shown=Path("/"))
            try:
                return _walk(below, path.parts[len(floor.parts) :], create=create, shown=floor)
            finally:
                os.close(below)
        return _walk(fd, path.parts[1:], create=create, shown=Path("/"))
    finally:
        os.close(fd)


def _subdir(
    base_fd: int, dirs: tuple[str, ...], cache: dict[tuple[str, ...], int], *, create: bool, shown: Path
) -> int:
    """The descriptor of ``dirs`` below ``base_fd`` (cached; the cache owns the descriptors)."""
    if dirs in cache:
        return cache[dirs]
    fd = _walk(base_fd, dirs, create=create, shown=shown)
    cache[dirs] = fd
    return fd


def _walk(base_fd: int, parts: tuple[str, ...] | list[str], *, create: bool, shown: Path) -> int:
    """Open ``parts`` one by one below ``base_fd`` with O_NOFOLLOW; return a new descriptor (caller closes)."""
    fd = os.dup(base_fd)
    here = shown
    try:
        for part in parts:
            here = here / part
            try:
                nxt = _open_child(fd, part, create=create)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise
                if _is_symlink_at(fd, part):
                    raise _unsafe(f"{str(here)!r} is a symlink; refusing to write through it") from None
                if exc.errno in (errno.ENOTDIR, errno.EEXIST):
                    raise _unsafe(f"{str(here)!r} exists and is not a directory") from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_child(fd: int, name: str, *, create: bool) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # created meanwhile: the open below checks what it is
        os.mkdir(name, 0o777, dir_fd=fd)
    return os.open(name, _DIR_FLAGS, dir_fd=fd)


def _is_symlink_at(fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=fd).st_mode)
    except OSError:
        return False


def _published(dest: Path, f: FileRecord) -> FileRecord:
    st = (dest / f.path).stat()
    return dataclasses.replace(f, mtime_ns=st.st_mtime_ns)
