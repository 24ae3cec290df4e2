"""What every object-store source does once it has listed a prefix: plan, reuse, reserve, download, report.

Role: the part of an object-store fetch that does not depend on the store. A source (``s3://``, ``oci://``,
``gs://``, ``az://``) lists the objects under its prefix as :class:`RemoteObject` values (:func:`listed_object`
takes the prefix as a folder and drops folder markers) and hands them to :func:`fetch_listed` with a function
that downloads one object into staging; this module does the rest, the same way for all:

* path safety (:func:`check_paths`): a name that would not be a plain relative path under ``dest`` (``..``,
  ``.``, empty segments, NUL), a name under ``.cache/`` (the staging bookkeeping folder), and two names where
  one is a file and the other a folder of the same name are refused (``UnsafeFilePath``, not retried);
* reuse: a file of the previous manifest at the same path with the same size and ETag that is intact on
  disk is kept without a request; a file in ``dest`` without a record (a kill between publish and manifest)
  is adopted when its MD5 equals the MD5 the store reported for the object;
* staging hygiene (:func:`clean_staging`): stray files and part maps that this fetch will not produce are
  removed first, so they can never be published; partial files this fetch wants are kept and resumed;
* disk: the bytes still to be written are reserved in the capacity registry before any transfer;
* the TensorRT-LLM shape filter (docs/ome-compatibility.md#33-tensorrt-llm-shape-filter), when the request names a
  shape (set for OCI models only);
* progress (``scanning`` → ``downloading`` → ``finalizing``) and the revision, a digest of the listing.

:func:`download_each` then runs the downloads with one shared :class:`RangedDownloader` (and HTTP session),
at most ``max_parallel_files`` objects at once, the largest first, counting bytes into the progress; the
source only says, per object, what to expect and how to GET it (:class:`ObjectGet`: a presigned URL, or a URL
and signed headers).
Presigned URLs are renewed periodically (:class:`SignedUrls`): a URL signed with temporary credentials dies
with them whatever its stated expiry. For a tenant model (``request.owner`` outside the trusted namespaces) the
engine's connections are opened by the model's :class:`~model_agent.sources.egress.Guard`, which refuses a
forbidden resolved address and connects to exactly the address it checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, TypeVar, Unpack

from model_agent.local.capacity import REGISTRY, CapacityRegistry, Reservation, allocated_bytes
from model_agent.local.manifest import FileRecord
from model_agent.model.reasons import Reason
from model_agent.model.uris import InvalidStorageUri
from model_agent.sources.base import (
    FILES_AT_ONCE,
    FetchRequest,
    FetchResult,
    Progress,
    SourceError,
    SourceRules,
    adoption_candidates,
)
from model_agent.sources.egress import guard_for
from model_agent.transfer import (
    CONNECT_GUARD,
    PARTS_DIR,
    Expected,
    HeaderSource,
    RangedConfig,
    UrlSource,
    engine_session,
    file_checksums,
    largest_first,
    part_map_name,
    part_map_path,
    run_all,
)


@dataclass(frozen=True)
class RemoteObject:
    key: str  # the object's full name in the store
    path: str  # relative to dest
    size: int
    etag: str  # as the store sends it (S3: quotes included)
    md5: str | None = None  # lowercase hex MD5 of the whole object, when the listing tells it


_Uri = TypeVar("_Uri")


def parsed_uri(parse: Callable[[str], _Uri], request: FetchRequest) -> _Uri:
    """``parse(request.storage_uri)``; a malformed URI is the model's ``InvalidStorageUri``, not retried."""
    try:
        return parse(request.storage_uri)
    except InvalidStorageUri as exc:
        raise SourceError(exc.code, str(exc), retryable=False) from None


def folder_prefix(prefix: str) -> str:
    """The prefix as a folder: ``""`` (the whole bucket) or ending with ``/``."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def listed_object(key: str, size: int, etag: str, prefix: str, md5: str | None = None) -> RemoteObject | None:
    """The object ``key`` listed under the folder ``prefix``, or None for a folder marker (zero bytes, ``.../``)."""
    rel = key[len(prefix) :] if key.startswith(prefix) else key
    if (not rel or rel.endswith("/")) and size == 0:
        return None
    return RemoteObject(key, rel, size, etag, md5)


def shape_filtered(objects: list[RemoteObject], alias: str) -> list[RemoteObject]:
    """The TensorRT-LLM shape filter (docs/ome-compatibility.md#33-tensorrt-llm-shape-filter): the objects whose full
    name contains ``/{alias}/``."""
    needle = f"/{alias}/"
    return [o for o in objects if needle in o.key]


def same_etag(a: str | None, b: str) -> bool:
    """ETags compared without their quotes (some S3-compatible stores quote them in one API and not another)."""
    return a is not None and a.strip('"') == b.strip('"')


def check_paths(objects: Iterable[RemoteObject], label: Callable[[str], str]) -> None:
    """Refuse names that are not plain relative paths, names under ``.cache/``, and file/folder clashes.

    ``label(key)`` names an object in messages (e.g. ``s3://bucket/key``).
    """
    items = list(objects)
    files = {o.path for o in items}
    folders: set[str] = set()
    by_path = {o.path: o.key for o in items}
    for o in items:
        parts = o.path.split("/")
        if any(p in ("", ".", "..") for p in parts) or "\x00" in o.path:
            raise SourceError(
                Reason.UNSAFE_FILE_PATH,
                f"{label(o.key)}: the name is not a plain relative path below the prefix",
                retryable=False,
            )
        if parts[0] == ".cache":
            raise SourceError(
                Reason.UNSAFE_FILE_PATH,
                f"{label(o.key)}: names under .cache/ are reserved for the agent",
                retryable=False,
            )
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    clash = sorted(files & folders)
    if clash:
        raise SourceError(
            Reason.UNSAFE_FILE_PATH,
            f"{label(by_path[clash[0]])} is both an object and a folder of other objects",
            retryable=False,
        )


def status_error(
    status: int, label: str, detail: str, *, suffix: str = "", slow_down: Collection[int] = (429,)
) -> SourceError | None:
    """What a store's HTTP ``status`` alone says about the object ``label``; None for any other status.

    ``detail`` is what the store said (``HTTP 403``, an error code), ``suffix`` follows the message (a request
    id); ``slow_down`` are the statuses this store uses to ask for fewer requests.
    """
    if status == 404:
        return SourceError(
            Reason.OBJECT_NOT_FOUND, f"{label}: not found ({detail}; deleted after the listing?){suffix}"
        )
    if status == 401:
        return SourceError(Reason.UNAUTHORIZED, f"{label}: credentials rejected ({detail}){suffix}")
    if status == 403:
        return SourceError(Reason.ACCESS_DENIED, f"{label}: access denied ({detail}){suffix}")
    if status in slow_down:
        return SourceError(Reason.RATE_LIMITED, f"{label}: the store asked to slow down ({detail}){suffix}")
    return None


def intact(path: Path, old: FileRecord) -> bool:
    """The file of a manifest record is still there, same size and mtime, and not a symlink."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return st.st_size == old.size and (not old.mtime_ns or st.st_mtime_ns == old.mtime_ns) and not os.path.islink(path)


def adopt(path: Path, obj: RemoteObject) -> FileRecord | None:
    """A file already in dest without a record: keep it when its MD5 equals the one the store reported."""
    if obj.md5 is None:
        return None
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size != obj.size:
            return None
    except OSError:
        return None
    sums = file_checksums(path, ("md5", "sha256"))
    if sums["md5"] != obj.md5:
        return None
    return FileRecord(obj.path, obj.size, sums["sha256"], None, path.stat().st_mtime_ns, obj.etag)


def clean_staging(staging: Path, wanted: set[str]) -> None:
    """Remove from staging every file and part map that this fetch will not produce, and empty folders."""
    if not staging.is_dir():
        return
    maps = {part_map_name(p) for p in wanted}
    parts_dir = staging / PARTS_DIR
    for dirpath, dirnames, filenames in os.walk(staging, topdown=False):
        here = Path(dirpath)
        for name in filenames:
            full = here / name
            rel = full.relative_to(staging).as_posix()
            keep = rel in wanted if here != parts_dir else name in maps
            if not keep:
                with contextlib.suppress(FileNotFoundError):
                    full.unlink()
        for name in dirnames:
            sub = here / name
            if sub.is_symlink():
                sub.unlink()
            else:
                with contextlib.suppress(OSError):
                    sub.rmdir()  # only when empty


class SignedUrls:
    """A signed GET URL per key, made by ``sign`` and renewed every ``renew_s`` seconds.

    ``sign`` may refresh temporary credentials over the network first (IRSA, instance roles, workload
    identity), so a source runs blocking signers in a worker thread inside it. A URL signed with temporary
    credentials dies with them whatever its stated expiry, hence a renewal period shorter than the expiry.
    """

    def __init__(self, sign: Callable[[str], Awaitable[str]], renew_s: float) -> None:
        self.sign = sign
        self.renew_s = renew_s
        self._urls: dict[str, tuple[str, float]] = {}

    async def url(self, key: str) -> str:
        cached = self._urls.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[1] < self.renew_s:
            return cached[0]
        url = await self.sign(key)
        self._urls[key] = (url, now)
        return url

    def for_key(self, key: str) -> Callable[[], Awaitable[str]]:
        return lambda: self.url(key)


@dataclass(frozen=True)
class ObjectGet:
    """How to GET one object's bytes: what it must be, its URL (may be renewed per request), extra headers."""

    expected: Expected
    url: UrlSource
    headers: HeaderSource | None = None


# Called per object to be fetched (e.g. a HEAD for its size, checksums and ETag); raises SourceError.
PrepareGet = Callable[[RemoteObject], Awaitable[ObjectGet]]


@dataclass(frozen=True)
class Transfer:
    """The data path of one fetch: engine tuning, parallel files, and the per-object preparation."""

    ranged: RangedConfig
    max_parallel_files: int
    prepare: PrepareGet


async def fetch_listed(
    request: FetchRequest,
    objects: list[RemoteObject],
    *,
    label: Callable[[str], str],
    capacity: CapacityRegistry,
    progress: Progress,
    transfer: Transfer,
) -> FetchResult:
    """Everything after the listing: checks, reuse and adoption, staging clean-up, reservation, downloads.

    ``objects`` must not be empty (the caller words its own ``NoObjects`` error); ``label(key)`` names an
    object in messages and ``label("")`` the prefix. With ``request.shape_alias`` set, only the objects of
    that shape are kept (:func:`shape_filtered`).
    """
    if request.shape_alias is not None:
        objects = shape_filtered(objects, request.shape_alias)
        if not objects:
            raise SourceError(
                Reason.NO_OBJECTS, f"no suitable objects found for shape {request.shape_alias} under {label('')}"
            )
    check_paths(objects, label)
    objects = sorted(objects, key=lambda o: o.path)
    previous = {f.path: f for f in (request.previous.files if request.previous else [])}
    same_dest = request.previous is not None and Path(request.previous.dest) == request.dest
    records: dict[str, FileRecord] = {}
    to_fetch: list[RemoteObject] = []
    unrecorded = [(o.path, o.size) for o in objects if o.md5 is not None and not (same_dest and o.path in previous)]
    adoptable = await adoption_candidates(request.dest, unrecorded)
    for obj in objects:
        old = previous.get(obj.path) if same_dest else None
        dest_file = request.dest / obj.path
        if old is not None and same_etag(old.etag, obj.etag) and old.size == obj.size and intact(dest_file, old):
            records[obj.path] = old
            continue
        if obj.path in adoptable:
            adopted = await asyncio.to_thread(adopt, dest_file, obj)
            if adopted is not None:
                records[obj.path] = adopted
                continue
        to_fetch.append(obj)

    progress.start_downloading([o.size for o in objects], [r.size for r in records.values()])
    request.on_progress(progress)

    staging = request.staging
    await asyncio.to_thread(clean_staging, staging, {o.path for o in to_fetch})
    remaining = sum(max(0, o.size - allocated_bytes(staging / o.path)) for o in to_fetch)
    reservation = capacity.reserve(staging, remaining, label("")) if to_fetch else None
    try:
        fetched = await download_each(to_fetch, request, progress, reservation, label, transfer) if to_fetch else {}
    finally:
        if reservation is not None:
            reservation.release()
    records.update(fetched)
    progress.phase = "finalizing"
    request.on_progress(progress)
    listing = hashlib.sha256("".join(f"{o.key}\0{o.etag}\0{o.size}\n" for o in objects).encode()).hexdigest()
    return FetchResult(
        revision=f"etags-{listing[:40]}",
        files=[records[o.path] for o in objects],
        staged=[o.path for o in to_fetch],
    )


class StoreTuning(TypedDict, total=False):
    """What every object-store source is built with (each optional): the ranged engine's tuning (default: its
    measured defaults), the disk capacity registry it reserves from (default: the process's) and how many files
    of one model it fetches at once (default :data:`~model_agent.sources.base.FILES_AT_ONCE`)."""

    ranged: RangedConfig | None
    capacity: CapacityRegistry | None
    max_parallel_files: int


class ObjectStoreFetch:
    """What the object-store sources share after their listing: their engine tuning, the disk capacity they
    reserve from and how many files they fetch at once (:class:`StoreTuning`, taken by this constructor),
    handed to :func:`fetch_listed` with the per-object preparation of the store."""

    rules = SourceRules()  # the default: the Secret of spec.storage.key, when one is named (OCI has its own)

    def __init__(self, **tuning: Unpack[StoreTuning]) -> None:
        self.ranged: RangedConfig = tuning.get("ranged") or RangedConfig()
        self.capacity: CapacityRegistry = tuning.get("capacity") or REGISTRY
        self.max_parallel_files: int = tuning.get("max_parallel_files", FILES_AT_ONCE)

    async def fetch_objects(
        self,
        request: FetchRequest,
        objects: list[RemoteObject],
        *,
        label: Callable[[str], str],
        progress: Progress,
        prepare: PrepareGet,
    ) -> FetchResult:
        """:func:`fetch_listed` with this source's data path."""
        transfer = Transfer(self.ranged, self.max_parallel_files, prepare)
        return await fetch_listed(
            request, objects, label=label, capacity=self.capacity, progress=progress, transfer=transfer
        )


async def download_each(
    objects: list[RemoteObject],
    request: FetchRequest,
    progress: Progress,
    reservation: Reservation | None,
    label: Callable[[str], str],
    transfer: Transfer,
) -> dict[str, FileRecord]:
    """Fetch every object into staging (at most ``max_parallel_files`` at once) over one session and engine.

    A tenant's engine connects through its guard: set around the engine made here (its slots are made in this
    context), whatever made the call.
    """
    results: dict[str, FileRecord] = {}
    staging = request.staging
    gate = asyncio.Semaphore(transfer.max_parallel_files)
    with _connections_guarded_for(request):
        async with engine_session(transfer.ranged) as engine:

            def on_bytes(n: int) -> None:
                progress.completed_bytes += n
                request.on_progress(progress)

            async def each(obj: RemoteObject) -> None:
                async with gate:
                    get = await transfer.prepare(obj)
                    got = await engine.download(
                        get.url,
                        staging / obj.path,
                        get.expected,
                        headers=get.headers,
                        state_path=part_map_path(staging, obj.path),
                        label=label(obj.key),
                        on_bytes=on_bytes,
                        reservation=reservation,
                    )
                    progress.completed_bytes += got.resumed_bytes
                    progress.completed_files += 1
                    request.on_progress(progress)
                    results[obj.path] = FileRecord(
                        path=obj.path, size=get.expected.size, sha256=got.digests["sha256"], etag=get.expected.validator
                    )

            await run_all(each(o) for o in largest_first(objects))
    return results


@contextlib.contextmanager
def _connections_guarded_for(request: FetchRequest) -> Iterator[None]:
    guard = guard_for(request.owner)
    checked = CONNECT_GUARD.set(guard.create_connection if guard is not None else None)
    try:
        yield
    finally:
        CONNECT_GUARD.reset(checked)
