"""``hf://`` — Hugging Face repositories through huggingface_hub.

Steps: resolve the revision to a commit and list every file with its size and hashes (LFS sha256, git blob
sha1 for small files); reuse files the previous manifest verified at the same path with the same hash and
that are still intact on disk; download the others into staging pinned to the resolved commit (so a branch
moving mid-fetch cannot mix revisions); verify each against the strongest hash listed; fsync. Publishing is
the shared ``publish`` step.

Two data paths, by file:

* LFS files (the weights; the hub lists their sha256) go through the ranged engine
  (:mod:`model_agent.transfer`): one metadata ``HEAD`` of the resolve URL gives where the bytes are (the
  hub redirects to its CDN; a mirror may serve them itself), then parallel ranged GETs into a preallocated
  file with a part map that survives a kill, sha256 hashed beside the transfer; eight files at a time, the
  largest first. The location is looked up again every ten minutes, since CDN URLs are signed for a limited
  time. The token is sent only to the endpoint's own host, never to the CDN. A server that ignores ``Range``
  (olah does) is fetched as one stream. Why not ``hf_hub_download`` for these: it moves one stream per file
  through httpx into new ``bytes`` objects, measured at about 0.4 GB/s and 2.5 CPU-s/GB on this project's
  reference box against the engine's parallel ranges (``bench/REPORT.md``); Xet-stored files are still served
  by the hub's resolve URL (its bridge answers ranges), so nothing needs ``hf_xet`` here.
* Small files (git blobs: configs, tokenizers) go through the same engine session, one plain GET each of
  the resolve URL itself, checked against their git blob sha1 (``git-sha1``): a hub serves git blobs from
  its own host, so no metadata lookup is made first; one that answers with a redirect (the engine follows
  none) is looked up as an LFS file's location and asked there, the token again only to the endpoint's
  host. They went through ``hf_hub_download`` until 2026-12-02: its per-file cost (a lock file,
  ``.incomplete`` bookkeeping, a second read to verify) made twenty small files take 0.33 s of fetch on the
  reference box.

With peers on (:mod:`model_agent.peers`), every file is first asked from nodes that hold the model Ready or are
fetching it (they relay its durable parts), through a second engine session, against the digest the hub listed
(never one a peer gives): an LFS file's sha256, a small file's git blob sha1. The origin path above is taken for
what no peer gives. So a fleet's requests to the hub do not grow with its size: small files too come from the
origin once (measured: 45 small-file GETs from 15 nodes at once slowed the seed's own first requests to the mirror
from about 0.05 s to 0.5 s; docs/performance.md). Meanwhile this node relays each file it fetches
(:mod:`model_agent.peers.relay`), whether from peers or the origin, in parts of the peers' relay part size. The hub
token never goes to a peer, the peer token never to the hub.

A resolve record shared through the API server (:mod:`model_agent.agent.resolve_cache`) can be written by any
node's agent, so it is a hint, never what bytes are trusted against. A record is used as it is only where its lie
could cost a failed verification and nothing more: a pinned revision (the record's commit must be that revision)
whose files all come from the origin, which serves that commit's own bytes. Where bytes may come from peers, or the
revision is a branch or tag (the record's commit could name another commit of the repository), this node confirms
the record with its own listing from the hub (one tree call per revision for a pinned commit, plus the revision
lookup for a branch) and uses its own answer when the two differ (a warning, and the record is rewritten).

``HF_ENDPOINT`` (or an explicit endpoint) selects the hub or a mirror: the admin's, never a tenant's. Tokens are
resolved by the caller (:mod:`model_agent.agent.credentials`: the platform ``HF_TOKEN`` only for trusted models),
and ``token=False`` is passed when there is none, so huggingface_hub never falls back to ``HF_TOKEN`` itself.
Cancellation takes effect between files (a file already in flight finishes into staging and is resumed or
discarded later); huggingface_hub's blocking calls run in worker threads so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import structlog

from model_agent.local.capacity import REGISTRY, Reservation, is_disk_full
from model_agent.local.manifest import FileRecord, file_digest
from model_agent.model.uris import parse_hf_uri
from model_agent.sources.base import (
    FILES_AT_ONCE,
    FetchRequest,
    FetchResult,
    ResolveRecords,
    SourceError,
    SourceRules,
    adoption_candidates,
)
from model_agent.sources.byte_sources import SourcedProgress
from model_agent.sources.egress import takes_from_peers
from model_agent.transfer import (
    Downloaded,
    Expected,
    RangedConfig,
    RangedDownloader,
    Redirected,
    engine_session,
    gather_or_cancel,
    largest_first,
    part_map_path,
)

if TYPE_CHECKING:
    from model_agent.peers.fetch import PeerFetcher

MAX_PARALLEL_FILES = FILES_AT_ONCE  # as the object stores (sources/base.py says what was measured)
RELAY_ORIGIN_CONCURRENCY = 2  # requests at once per relayed file from the origin (see _download)
METADATA_TIMEOUT_S = 30.0
LOCATION_RENEW_S = 600.0  # CDN URLs are signed for about an hour; look the location up again well before

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None
    git_sha1: str | None


# huggingface_hub is imported where it is used, not here: it costs about 8 MiB of RSS, which a node
# without hf:// models never pays (tests/unit/test_lazy_imports.py checks the runtime does not import it).


def _classify(exc: Exception, repo: str, revision: str) -> SourceError:
    if isinstance(exc, OSError) and is_disk_full(exc):
        return SourceError("InsufficientDisk", f"{repo}: the disk filled up while downloading (partial kept)")
    from huggingface_hub import errors as hf_errors

    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return SourceError("RevisionNotFound", f"revision {revision!r} of {repo} does not exist")
    if isinstance(exc, hf_errors.GatedRepoError):
        return SourceError("Unauthorized", f"{repo} is gated: the token has no access")
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return SourceError("RepositoryNotFound", f"repository {repo} not found (or the token cannot see it)")
    if isinstance(exc, hf_errors.EntryNotFoundError):
        return SourceError("FileNotFound", f"{repo}@{revision}: {exc}")
    if isinstance(exc, hf_errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else 0
        if status == 429:
            return SourceError("RateLimited", f"the hub rate-limited {repo}: {exc}")
        if status in (401, 403):
            return SourceError("Unauthorized", f"{repo}: HTTP {status}")
        return SourceError("SourceError", f"{repo}: HTTP {status}: {str(exc).splitlines()[0]}")
    return SourceError("SourceUnreachable", f"{repo}: {type(exc).__name__}: {str(exc)[:300]}")


class _Location:
    """Where the bytes of one LFS file are served: the resolve URL's redirect target, renewed periodically."""

    def __init__(self, source: HuggingFaceSource, url: str, token: str | None) -> None:
        self.source = source
        self.url = url
        self.token = token
        self.found = ""
        self.at = 0.0
        self.lock = asyncio.Lock()

    async def __call__(self) -> str:
        async with self.lock:
            if not self.found or time.monotonic() - self.at > LOCATION_RENEW_S:
                self.found = await asyncio.to_thread(self._lookup)
                self.at = time.monotonic()
            return self.found

    def _lookup(self) -> str:
        from huggingface_hub import get_hf_file_metadata

        meta = get_hf_file_metadata(
            self.url,
            token=self.token or False,
            timeout=METADATA_TIMEOUT_S,
            user_agent=self.source.user_agent or None,
            endpoint=self.source.endpoint,
        )
        return urljoin(self.url, meta.location) if meta.location else self.url


class HuggingFaceSource:
    """The ``hf://`` source; one instance serves every Hugging Face model of the agent."""

    # The agent resolves the token (Secret, parameters or the platform's HF_TOKEN); no storage Secret is read.
    rules = SourceRules(wants_token=True, reads_secret=lambda _parameters: False)

    def __init__(
        self,
        endpoint: str | None = None,
        resolve_cache: ResolveRecords | None = None,
        *,
        user_agent: str = "",
        ranged: RangedConfig | None = None,
        peers: PeerFetcher | None = None,
        on_origin_bytes: Callable[[int], None] = lambda _n: None,
    ) -> None:
        # Peers (model_agent.peers): an LFS file is asked from nodes that hold it first, verified against the
        # hub's sha256; the origin gives what they cannot. None: every byte from the origin.
        self.peers = peers
        self.on_origin_bytes = on_origin_bytes
        self.endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
        self.user_agent = user_agent  # e.g. "model-agent/node-17": lets mirrors and hubs see who fetches
        self.resolve_cache = resolve_cache
        self.ranged = ranged or RangedConfig()
        self.api_calls = 0  # hub API calls made (revision + tree), for the fleet budget

    def _resolve(self, repo: str, revision: str, token: str | None) -> tuple[str, list[RemoteFile]]:
        """Resolve the revision to a commit, then list every file of that commit with sizes and hashes."""
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        api = HfApi(endpoint=self.endpoint, token=token or False)
        if is_commit(revision):
            commit = revision  # already a commit: the tree listing alone (an unknown one answers 404 there)
        else:
            self.api_calls += 1
            info = api.model_info(repo, revision=revision, timeout=METADATA_TIMEOUT_S)
            commit = info.sha or revision
        self.api_calls += 1
        files: list[RemoteFile] = []
        for item in api.list_repo_tree(repo, revision=commit, recursive=True):
            if not isinstance(item, RepoFile):
                continue
            lfs: Any = item.lfs
            sha256 = getattr(lfs, "sha256", None) if lfs is not None else None
            # For an LFS file the blob id is the pointer's; only the LFS sha256 describes the content.
            files.append(RemoteFile(item.path, int(item.size), sha256, None if lfs is not None else item.blob_id))
        return commit, files

    async def fetch(self, request: FetchRequest) -> FetchResult:
        uri = parse_hf_uri(request.storage_uri)
        repo, revision, token = uri.repo_id, uri.revision, request.token
        progress = SourcedProgress(phase="scanning")  # counts where the bytes come from (the entry shows it)
        request.on_progress(progress)

        resolved_here: list[bool] = []

        async def resolve() -> tuple[str, list[dict[str, Any]]]:
            try:
                commit, found = await asyncio.to_thread(self._resolve, repo, revision, token)
            except SourceError:
                raise
            except Exception as exc:
                raise _classify(exc, repo, revision) from exc
            resolved_here.append(True)
            return commit, [dataclasses.asdict(f) for f in found]

        if self.resolve_cache is not None:
            commit, listed = await self.resolve_cache.resolve(request.storage_uri, revision, resolve)
            peered = self.peers is not None and takes_from_peers(request.storage_uri, request.owner)
            if not resolved_here and record_needs_confirming(revision, commit, peered):
                commit, listed = await self._confirmed(request.storage_uri, revision, (commit, listed), resolve)
        else:
            commit, listed = await resolve()
        remote_files = [RemoteFile(**f) for f in listed]
        _refuse_unsafe_paths(repo, remote_files)

        previous = {f.path: f for f in (request.previous.files if request.previous else [])}
        same_dest = request.previous is not None and Path(request.previous.dest) == request.dest
        records: list[FileRecord] = []
        to_fetch: list[RemoteFile] = []
        unrecorded = [
            (f.path, f.size)
            for f in remote_files
            if (f.sha256 or f.git_sha1) and not (same_dest and f.path in previous)
        ]
        adoptable = await adoption_candidates(request.dest, unrecorded)
        for remote in remote_files:
            old = previous.get(remote.path) if same_dest else None
            if old is not None and _same_content(old, remote) and _intact(request.dest / remote.path, old):
                records.append(old)
                continue
            if remote.path in adoptable:
                # No record of this file, yet it may be there (a kill between publish and manifest, weights
                # left by another agent): adopt it if its bytes hash to what the hub lists.
                adopted = await asyncio.to_thread(_adoptable, request.dest / remote.path, remote)
                if adopted is not None:
                    records.append(adopted)
                    continue
            to_fetch.append(remote)

        progress.start_downloading([f.size for f in remote_files], [f.size for f in records])
        request.on_progress(progress)
        request.staging.mkdir(parents=True, exist_ok=True)

        # Refuse what cannot fit before writing a byte (counting other downloads in flight on this disk).
        reservation = REGISTRY.reserve(request.staging, sum(r.size for r in to_fetch), request.storage_uri)
        try:
            fetched = await self._download(repo, commit, to_fetch, request, progress, reservation)
        finally:
            reservation.release()
        progress.phase = "finalizing"
        request.on_progress(progress)
        by_path = {r.path: r for r in [*records, *fetched]}
        ordered = [by_path[f.path] for f in remote_files]
        return FetchResult(revision=commit, files=ordered, staged=[r.path for r in to_fetch])

    async def _download(
        self,
        repo: str,
        commit: str,
        files: list[RemoteFile],
        request: FetchRequest,
        progress: SourcedProgress,
        reservation: Reservation,
    ) -> list[FileRecord]:
        """Every file through one engine session: LFS files in parallel ranges against their sha256, small files
        in one GET each against their git blob sha1; resumable part maps, eight files at a time, largest first."""
        if not files:
            return []
        from huggingface_hub import constants as hf_constants  # (light: the download helpers are imported below)

        token = request.token
        endpoint = self.endpoint or hf_constants.ENDPOINT
        endpoint_host = urlsplit(endpoint).netloc
        headers = {"User-Agent": self.user_agent} if self.user_agent else {}
        with_token = {**headers, "Authorization": f"Bearer {token}"} if token else headers

        def headers_for(url: str) -> dict[str, str]:  # the token never leaves the endpoint's host
            return with_token if urlsplit(url).netloc == endpoint_host else headers

        gate = asyncio.Semaphore(MAX_PARALLEL_FILES)
        # Peers hold what the platform fetched, gated repos included: only a trusted owner (a ClusterBaseModel, a
        # --trusted-namespace BaseModel: who may use the platform's HF_TOKEN) may take bytes from them, or a tenant
        # who knows a digest would get weights its own credentials cannot read.
        from_peers = takes_from_peers(request.storage_uri, request.owner)
        peers = self.peers if from_peers else None
        # With peers, a file this node fetches is served to them by its durable parts while it is fetched (its
        # digest came from the hub's listing): registered in a relay scope. From the origin it then comes through
        # its own engine session in parts of the relay part size, at most RELAY_ORIGIN_CONCURRENCY at once: a
        # server that ignores Range (a mirror) answers each of those requests with the whole file until the engine
        # reads it as one stream, and more of them would only cost origin bytes.
        relayed = (
            dataclasses.replace(peers.relay_ranged(self.ranged), concurrency=RELAY_ORIGIN_CONCURRENCY)
            if peers is not None
            else None
        )
        with contextlib.ExitStack() as stack:
            scope = stack.enter_context(peers.relays.scope()) if peers is not None else None
            async with engine_session(self.ranged) as engine, self._peer_session() as peer_engine:

                def on_bytes(n: int) -> None:
                    progress.completed_bytes += n
                    request.on_progress(progress)

                async def one(remote: RemoteFile) -> FileRecord:
                    # the strongest hash the hub lists: an LFS file's sha256, else a git blob's sha1
                    if remote.sha256:
                        checks = {"sha256": remote.sha256}
                    elif remote.git_sha1:
                        checks = {"git-sha1": remote.git_sha1}
                    else:
                        checks = {}
                    label = f"{repo}@{commit[:12]}/{remote.path}"
                    staged = request.staging / remote.path
                    state_path = part_map_path(request.staging, remote.path)
                    # peers serve and are asked for a file by the digest the hub listed, which names its algorithm
                    digest = remote.sha256 or remote.git_sha1
                    relay = None
                    if scope is not None and digest:
                        relay = scope.start(digest, remote.size, staged, state_path)
                    async with gate:
                        try:
                            got = None
                            if peer_engine is not None and peers is not None and digest:
                                got = await peers.fetch(
                                    peer_engine,
                                    request.storage_uri,
                                    digest,
                                    remote.size,
                                    staged,
                                    state_path=state_path,
                                    label=label,
                                    on_bytes=on_bytes,
                                    reservation=reservation,
                                    relay=relay,
                                )
                                if got is not None:
                                    progress.peer_bytes += got.fetched_bytes
                            if got is None:
                                # A small file is asked from its resolve URL directly (one GET, no metadata HEAD):
                                # a hub serves git blobs itself. A redirect is looked up and followed by _from_origin.
                                url = _resolve_url(repo, remote.path, commit, endpoint)
                                where: Any = url if not remote.sha256 else _Location(self, url, token)
                                origin_args = (where, token, staged, Expected(remote.size, checks))
                                origin_kw: dict[str, Any] = {
                                    "headers": headers_for,
                                    "state_path": state_path,
                                    "label": label,
                                    "on_bytes": on_bytes,
                                    "reservation": reservation,
                                }
                                if relay is not None and peers is not None and relayed is not None:
                                    peers.relays.fed_by(relay, ())  # from the origin: the head of a chain
                                    origin_kw["on_written"] = relay.writer()  # relayed as its bytes land
                                    async with engine_session(relayed) as own:
                                        got = await self._from_origin(own, *origin_args, **origin_kw)
                                else:
                                    got = await self._from_origin(engine, *origin_args, **origin_kw)
                                progress.origin_bytes += got.fetched_bytes
                            if relay is not None and peers is not None:
                                peers.relays.verified(relay)  # servable a little longer once the fetch ends
                        except BaseException as exc:
                            if relay is not None and peers is not None:
                                peers.relays.failed(relay)  # the file may be deleted: never served again
                            if isinstance(exc, SourceError) or not isinstance(exc, Exception):
                                raise
                            raise _classify(exc, repo, commit) from exc
                    progress.completed_bytes += got.resumed_bytes
                    progress.completed_files += 1
                    request.on_progress(progress)
                    git_sha1 = None if remote.sha256 else got.digests.get("git-sha1")
                    return FileRecord(remote.path, remote.size, got.digests["sha256"], git_sha1)

                return await gather_or_cancel(one(r) for r in largest_first(files))

    async def _confirmed(
        self,
        uri: str,
        revision: str,
        recorded: tuple[str, list[dict[str, Any]]],
        resolve: Callable[[], Any],
    ) -> tuple[str, list[dict[str, Any]]]:
        """This node's own answer from the hub for a record it may not take on trust (see the module doc)."""
        own: tuple[str, list[dict[str, Any]]] = await resolve()
        if own != recorded:
            log.warning(
                "a resolve record disagrees with the hub; using the hub's listing",
                uri=uri,
                revision=revision,
                recorded_commit=recorded[0],
                hub_commit=own[0],
            )
            assert self.resolve_cache is not None
            await self.resolve_cache.put(uri, *own)
        return own

    @contextlib.asynccontextmanager
    async def _peer_session(self) -> AsyncIterator[RangedDownloader | None]:
        """The peers' own engine session (quick to give up on a peer), or None without peers."""
        if self.peers is None:
            yield None
            return
        async with self.peers.session(MAX_PARALLEL_FILES) as engine:
            yield engine

    async def _from_origin(
        self, engine: RangedDownloader, where: Any, token: str | None, *args: Any, **kwargs: Any
    ) -> Downloaded:
        """One file from the origin; a resolve URL asked directly that answers with a redirect is asked again at
        the location a metadata lookup finds (huggingface_hub's, which sends the token only to the hub)."""
        try:
            got = await engine.download(where, *args, **kwargs)
        except Redirected:
            if not isinstance(where, str):
                raise
            got = await engine.download(_Location(self, where, token), *args, **kwargs)
        self.on_origin_bytes(got.fetched_bytes)
        return got


def is_commit(revision: str) -> bool:
    """Is ``revision`` a full commit id (40 hex digits), rather than a branch or tag?"""
    return len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)


def record_needs_confirming(revision: str, recorded_commit: str, from_peers: bool) -> bool:
    """Must a node confirm a shared resolve record with the hub before fetching (see the module doc)?

    No only for a pinned revision whose record names that very commit and whose bytes all come from the origin.
    """
    return from_peers or not is_commit(revision) or recorded_commit != revision


def _resolve_url(repo: str, path: str, commit: str, endpoint: str) -> str:
    """The hub's resolve URL of one file, asked only when the file goes to the origin: huggingface_hub's download
    helpers are about a hundred modules (0.05-0.3 CPU-s to import), which a node whose files all come from peers
    never needs; a fleet's nodes would otherwise all import them in the same second a model appears."""
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo, path, revision=commit, endpoint=endpoint)


def _refuse_unsafe_paths(repo: str, files: list[RemoteFile]) -> None:
    for f in files:
        parts = f.path.split("/")
        if f.path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in f.path:
            raise SourceError("UnsafeFilePath", f"{repo} lists a file with an unsafe path: {f.path!r}", retryable=False)


def _same_content(old: FileRecord, remote: RemoteFile) -> bool:
    if old.size != remote.size:
        return False
    if remote.sha256:
        return old.sha256 == remote.sha256
    if remote.git_sha1:
        return old.git_sha1 == remote.git_sha1
    return False


def _adoptable(path: Path, remote: RemoteFile) -> FileRecord | None:
    if not (remote.sha256 or remote.git_sha1):
        return None
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size != remote.size:
            return None
    except OSError:
        return None
    sha256, git_sha1 = file_digest(path)
    if (remote.sha256 and sha256 != remote.sha256) or (remote.git_sha1 and git_sha1 != remote.git_sha1):
        return None
    return FileRecord(remote.path, remote.size, sha256, git_sha1, path.stat().st_mtime_ns)


def _intact(path: Path, old: FileRecord) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_size == old.size and (not old.mtime_ns or st.st_mtime_ns == old.mtime_ns)
