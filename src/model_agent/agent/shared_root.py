"""Shared model roots: one fetch per model and destination for the cluster, and no node takes files away.

Role: where one filesystem (NFS, GPFS, Lustre, CephFS, EFS, ...) serves the models root of many nodes, every
node's agent sees the same weights, staging areas and trash. A root is *shared* when ``--shared-root`` says
so or a marker of another node is in its private area (:mod:`model_agent.local.node_markers`). On a shared
root this module decides, and one actor per decision carries it out:

* **who fetches** (:meth:`SharedRoots.fetch_once`): a Lease per (source, destination) in the agent's
  namespace (the origin-slot Lease mechanics of :mod:`model_agent.agent.origin_slots`, one slot) picks the one
  node that fetches. It fetches into the staging area on the shared root, so a holder killed mid-way leaves
  its part map there and the node that takes the Lease over once it expired resumes from it. After publishing,
  the holder writes a *publication record* (``<root>/.model-agent/shared/<token>.json``: the manifest's text,
  its SHA-256, the node, the time). Every other node shows ``Updating`` with phase ``waiting-for-peer`` and
  adopts the published manifest without downloading and without re-hashing the files: the record's checksum
  must match the manifest's text, the manifest must name the wanted source and destination, and every file
  must have the recorded size and mtime (the full re-hash stays with ``verify``). The bytes a node adopts
  count as ``shared`` in ``model_agent_fetched_bytes_by_source_total`` and as ``sharedRoot`` in its entry's
  ``bytesBySource``: no byte moved, but they are what the node would otherwise have fetched, so origin + peer +
  shared is every byte each node needed, and the origin's share of it is what the fleet saved;
* **what a removal may touch** (:meth:`SharedRoots.removal_turn`, :func:`removal_plan`): a node whose
  selection no longer matches a live model drops only its own label and ConfigMap entry — never the files,
  the staging area or a shared record. Files go to the trash only when the model is confirmed gone (the one
  destructive path, :mod:`model_agent.agent.removal`, still confirms, asks the breaker and acts in order),
  and only by the node that holds the model's trash Lease: once, by one node; another node meanwhile
  requeues and finds nothing left to move;
* **who purges** (:meth:`SharedRoots.as_purge_owner`): the holder of the root's purge Lease, one at a time;
* **who re-hashes** (:meth:`SharedRoots.verify_turn`, :func:`verify_turn`): the scheduled ``verify`` pass
  re-hashes a model on a shared root on one node per interval. A node that re-hashed a model leaves a
  *verification record* (``<root>/.model-agent/shared/verified/<token>.json``: node, time, result, damaged
  files, a digest of the manifest's file list); another node's pass skips a model whose record says its files
  (the same list) verified clean within the interval, and skips one whose verify Lease another node holds
  (it is hashing it now). Who goes first is spread by the passes' own jitter (every node's period is
  jittered by ±10 %); the Lease makes it one node even when two passes coincide. A failure is never a reason
  to skip: the node that found it acts as on a private root (marks the files, an Event, a refetch), and a
  repaired file changes the file list, so the next pass re-hashes it. ``POST /verify`` is never spread.

Contract: every method answers "not shared" quickly for a private root (no API call, one directory listing
at most every :data:`VERDICT_TTL_S`); a root once seen shared stays shared for the life of the process.
Destructive decisions re-read the markers (``fresh``). A Lease that cannot be read or written counts as held
by another node (wait, never proceed alone). The decisions are pure functions, table-tested.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import structlog

from model_agent.agent.confirm import Outcome
from model_agent.agent.origin_slots import DEFAULT_MAX_HOLD_S, OriginSlots
from model_agent.agent.requeue import Requeue
from model_agent.kube.client import KubeClient
from model_agent.local.inventory import idle_s
from model_agent.local.layout import Layout, Root, token_for
from model_agent.local.manifest import Manifest, ManifestStore, fsync_dir, write_atomic
from model_agent.local.node_markers import (
    NETWORK_FS_TYPES,
    SharedVerdict,
    decide_shared,
    fs_type,
    read_markers,
    write_marker,
)
from model_agent.model import json_text
from model_agent.sources.base import Progress
from model_agent.sources.byte_sources import SourcedProgress

log = structlog.get_logger(__name__)

T = TypeVar("T")

WAITING_FOR_PEER = "waiting-for-peer"
PUBLISHED_DIR = "shared"
VERDICT_TTL_S = 5.0
VERIFIED_DIR = "verified"
# A peer's clean verification stands for this share of the interval: a node's passes come 0.9-1.1 intervals
# apart, so a record younger than this was made in the current round and one older is due again.
VERIFY_FRESH_SHARE = 0.8
# A waiting node looks for the publication (a file read) and tries the Lease this often, jittered.
WAIT_POLL_S = 1.0
LONG_WAIT_S = 1800.0  # waiting-for-peer this long without a publication raises an Event (then at 2x, 4x...)
# A shared root's staging area untouched this long has no live fetch on any node (staging_discardable).
SHARED_STAGING_IDLE_S = 1800.0
GUARD_LOST = "this node no longer holds the shared copy's guard"  # (move_refused: the removal tries again)


class FetchTurn(StrEnum):
    """What a node does with a fetch the reconciler asked for."""

    ALONE = "alone"  # a private root: fetch as always
    ADOPT = "adopt"  # a peer published this target: take its manifest, download nothing
    FETCH = "fetch"  # this node holds the target's Lease: fetch (resuming the shared part map), publish
    WAIT = "wait"  # another node holds the Lease: show waiting-for-peer and look again


def _turn(shared: bool, done_elsewhere: bool, holds_lease: bool, turns: tuple[T, T, T, T]) -> T:
    """The rule of both turns; ``turns`` are (a private root, done by another node, this node's, another's)."""
    alone, elsewhere, ours, theirs = turns
    if not shared:
        return alone
    if done_elsewhere:
        return elsewhere
    return ours if holds_lease else theirs


def fetch_turn(shared: bool, published: bool, holds_lease: bool) -> FetchTurn:
    """The turn of one node for one target (``published``: a valid publication of exactly this target)."""
    return _turn(shared, published, holds_lease, (FetchTurn.ALONE, FetchTurn.ADOPT, FetchTurn.FETCH, FetchTurn.WAIT))


@dataclass(frozen=True)
class RemovalPlan:
    """Which steps of a removal this node may carry out (label and entry are always its own to drop)."""

    write_intent: bool = True  # record ``removing`` in the manifest
    move_files: bool = True  # quarantine owned weights into the trash
    remove_staging: bool = True  # delete the key's staging area
    delete_record: bool = True  # delete the manifest
    why_kept: str = ""  # shown in the Removed Event when the files stay
    # remove a shared artifact's link (``spec.storage.path``): shared state like the files, so it goes only
    # where the files may go (the link is what every Ready node serves the model through)
    release_link: bool = True


FULL = RemovalPlan()


def removal_plan(
    shared: bool, gone: bool, holds_turn: bool, records_shared: bool, record_ours: bool = True
) -> RemovalPlan | None:
    """The steps of a removal on this node; None: another node is moving the files now (requeue).

    ``gone``: the model is confirmed gone (not merely no longer selecting this node); ``records_shared``: the
    manifests live on the shared root too (no ``--state-dir``), so the record is the peers' as well;
    ``record_ours``: read under the trash Lease, the record on disk is the one of the object confirmed gone
    (False: none is left — another node moved the files — or a peer restored a re-created object's copy).
    """
    if not shared:
        return FULL
    own_record_only = not records_shared  # a --state-dir record is this node's alone: drop it with the label
    if not gone:
        return RemovalPlan(
            write_intent=False,
            move_files=False,
            remove_staging=False,
            delete_record=own_record_only,
            why_kept=" (weights kept: shared root, other nodes may serve them)",
            release_link=False,
        )
    if not holds_turn:
        return None
    if not record_ours:
        return RemovalPlan(
            write_intent=False,
            move_files=False,
            remove_staging=False,
            delete_record=False,
            why_kept=" (weights not moved: another node already moved or restored them)",
            release_link=False,
        )
    return FULL


def confirmed_gone(outcome: Outcome, live: dict[str, Any] | None, manifest: Manifest | None) -> bool:
    """Is the model whose removal was confirmed really gone, rather than no longer selecting this node?

    Gone: NotFound, being deleted, or re-created with another UID that wants other files. Not gone: the same
    object alive (its selection left this node), or a successor naming the same source and directory (its
    weights are these, and other nodes may serve them).
    """
    if outcome == Outcome.ALIVE_SAME_UID:
        return False
    if outcome == Outcome.RECREATED_NEW_UID and manifest is not None:
        storage = ((live or {}).get("spec") or {}).get("storage") or {}
        path = storage.get("path")
        same_dir = isinstance(path, str) and bool(path) and os.path.realpath(path) == os.path.realpath(manifest.dest)
        if storage.get("storageUri") == manifest.storage_uri and same_dir:
            return False
    return True


def staging_discardable(shared: bool, idle_s: float) -> bool:
    """May this node discard a staging area no job of its own uses (``idle_s``: nothing written into it since)?

    A private root's staging is this node's alone. On a shared root another node may be fetching into it (its
    fetch Lease, not this node's jobs, says who writes there): only an area idle for
    :data:`SHARED_STAGING_IDLE_S` — many Lease periods without a write — is left by a dead or gone fetch.
    """
    return not shared or idle_s >= SHARED_STAGING_IDLE_S


def purge_allowed(shared: bool, holds_lease: bool) -> bool:
    """A private root's trash is this node's; a shared root's is purged by the purge Lease's holder only."""
    return not shared or holds_lease


class VerifyTurn(StrEnum):
    """What a node's scheduled verify pass does with one model."""

    ALONE = "alone"  # a private root: re-hash as always
    VERIFY = "verify"  # a shared root, due, and this node holds the model's verify Lease: re-hash, record
    SKIP = "skip"  # a node verified these very files clean within the interval
    BUSY = "busy"  # another node holds the verify Lease: it is re-hashing them now, its record will say


def verify_turn(shared: bool, verified_recently: bool, holds_lease: bool) -> VerifyTurn:
    """The turn of one node's scheduled pass for one model (``verified_recently``: see :func:`fresh_verification`)."""
    turns = (VerifyTurn.ALONE, VerifyTurn.SKIP, VerifyTurn.VERIFY, VerifyTurn.BUSY)
    return _turn(shared, verified_recently, holds_lease, turns)


def files_digest(manifest: Manifest) -> str:
    """A digest of what a verification vouches for: the destination and every file's size, hashes and mtime.

    A refetched or damaged-marked file changes it (its mtime), so a record of the old list never covers it.
    """
    files = [[f.path, f.size, f.sha256 or "", f.git_sha1 or "", f.mtime_ns] for f in manifest.files]
    return hashlib.sha256(json.dumps([manifest.dest, files]).encode()).hexdigest()


def verification_bytes(digest: str, node: str, now: float, damaged: list[str]) -> bytes:
    """A verification record: who re-hashed which file list when, and what was found."""
    body = {
        "files": digest,
        "node": node,
        "verifiedAt": now,
        "result": "failure" if damaged else "success",
        "damaged": damaged[:50],
    }
    return json.dumps(body, sort_keys=True).encode()


def fresh_verification(data: bytes | None, digest: str, now: float, interval_s: float) -> bool:
    """Does the record say these files (``digest``) verified clean in the current round of ``interval_s``?

    No: no record or an unreadable one, another file list, a failure (never skipped: see the module), older
    than :data:`VERIFY_FRESH_SHARE` of the interval, or dated later than a few seconds from now (a clock ahead
    must not silence the fleet's verification).
    """
    if data is None:
        return False
    try:
        record = json_text.loads(data)
        at = float(record["verifiedAt"])
        same = record["files"] == digest and record["result"] == "success"
    except (ValueError, KeyError, TypeError, OverflowError):  # Overflow: an integer beyond float
        return False
    return same and -5.0 <= now - at < VERIFY_FRESH_SHARE * interval_s


def publication_bytes(manifest_text: str, node: str, now: float) -> bytes:
    """A publication record: the manifest's own text and its checksum, who published it and when."""
    digest = hashlib.sha256(manifest_text.encode()).hexdigest()
    body = {"manifest": manifest_text, "sha256": digest, "node": node, "publishedAt": now}
    return json.dumps(body, sort_keys=True).encode()


def check_publication(
    data: bytes, storage_uri: str, dest: Path, owner: str = "", current: Manifest | None = None
) -> tuple[Manifest | None, str]:
    """The published manifest if it may be adopted for (``storage_uri``, ``dest``), else (None, why not).

    Adoptable: the record parses, its checksum matches the manifest's text, the manifest names this source
    and destination and was fetched for ``owner`` (the adopting model's owner fingerprint: adopting another
    owner's publication would hand its bytes to a model that never showed a credential for them), is not being
    removed, does not describe a file that ``current`` (this key's record) marks damaged at the very mtime it
    has (the copy a re-hash found corrupt: only a refetch repairs it), and every file has the recorded size and
    mtime (stat only).
    """
    try:
        record = json_text.loads(data)
        text = str(record["manifest"])
        claimed = str(record["sha256"])
        encoded = text.encode()  # UnicodeEncodeError, a ValueError: a lone surrogate (JSON "\ud800")
    except (ValueError, KeyError, TypeError):
        return None, "unreadable publication record"
    if hashlib.sha256(encoded).hexdigest() != claimed:
        return None, "publication checksum mismatch"
    try:
        manifest = Manifest.from_json(text)
    except (ValueError, TypeError, KeyError):
        return None, "unreadable published manifest"
    if not _names_target(manifest, storage_uri, dest):
        return None, "published for another source or destination"
    if owner and manifest.owner != owner:
        return None, "published for another owner"
    if current is not None and _still_damaged(manifest, current):
        return None, "publishes a copy a verification found damaged"
    if manifest.removing:
        return None, "being removed"
    if not manifest.files:
        return None, "no files recorded"
    problems = manifest.fast_check()
    if problems:
        return None, f"files changed since publication: {problems[0]}"
    return manifest, ""


def _still_damaged(published: Manifest, current: Manifest) -> bool:
    """Does ``published`` record a file at the mtime ``current`` marks it damaged at?"""
    if not current.damaged or current.storage_uri != published.storage_uri:
        return False
    return any(current.damaged.get(f.path) == f.mtime_ns for f in published.files)


def _names_target(manifest: Manifest, storage_uri: str, dest: Path) -> bool:
    return manifest.storage_uri == storage_uri and (
        Path(manifest.dest) == dest or Path(os.path.realpath(manifest.dest)) == dest
    )


def _record_lease(key: str) -> str:
    """The Lease that guards a key's shared record and directory (removal, restore, adoption)."""
    return f"shared-trash|{key}"


class _Busy(Exception):
    """Raised through :meth:`OriginSlots.hold`'s ``on_wait``: the Lease is another node's (try once, never wait)."""


def _busy() -> None:
    raise _Busy


@dataclass
class _RootState:
    verdict: SharedVerdict
    checked: float
    fs_type: str
    marker_error: str = ""


@dataclass(eq=False)
class SharedRoots:
    """The shared-root rules of one agent (see the module contract)."""

    client: KubeClient
    namespace: str
    node: str
    layout: InitVar[Layout]  # kept as _layout
    manifests: ManifestStore
    _: KW_ONLY
    forced: bool = False
    lease_s: int = 30
    max_hold_s: float = DEFAULT_MAX_HOLD_S
    requeue: Callable[[str], None] = lambda _key: None
    poll_s: float = WAIT_POLL_S
    long_wait_s: float = LONG_WAIT_S
    _layout: Layout = field(init=False, repr=False)
    _leases: OriginSlots = field(init=False, repr=False)
    _roots: dict[Path, _RootState] = field(default_factory=dict, init=False, repr=False)
    _rng: random.Random = field(default_factory=random.Random, init=False, repr=False)

    def __post_init__(self, layout: Layout) -> None:
        """Keep the layout; the one-slot Lease per publication lets one node of the fleet fetch into a shared root."""
        self._layout = layout
        self._leases = OriginSlots(
            self.client,
            self.namespace,
            self.node,
            1,
            lease_s=self.lease_s,
            poll_s=self.poll_s,
            max_hold_s=self.max_hold_s,
        )

    # ----------------------------------------------------------------------------------- detection

    def mark(self) -> None:
        """Leave this node's marker in every root (start-up); a root that refuses it is reported, not fatal."""
        for root in self._layout.roots:
            error = ""
            try:
                write_marker(root.private, self.node)
            except (OSError, ValueError) as exc:
                error = str(exc)
                log.warning(
                    "node marker not written; shared-root detection relies on --shared-root",
                    root=str(root.path),
                    error=error,
                )
            self._roots[root.path] = _RootState(self._scan(root), time.monotonic(), fs_type(root.path), error)
            state = self._roots[root.path]
            if state.verdict.shared:
                log.info("models root is shared", root=str(root.path), why=state.verdict.why, fs_type=state.fs_type)

    def _scan(self, root: Root) -> SharedVerdict:
        nodes, _ = read_markers(root.private)
        return decide_shared(self.forced, self.node, nodes)

    def verdict(self, root: Root, *, fresh: bool = False) -> SharedVerdict:
        """Whether ``root`` is shared; re-read at most every :data:`VERDICT_TTL_S` unless ``fresh``; sticky."""
        state = self._roots.get(root.path)
        now = time.monotonic()
        if state is not None and state.verdict.shared and not fresh:
            return state.verdict
        if state is None or fresh or now - state.checked >= VERDICT_TTL_S:
            verdict = self._scan(root)
            if state is not None and state.verdict.shared and not verdict.shared:
                verdict = state.verdict  # sticky: markers are never taken back
            if state is None:
                state = _RootState(verdict, now, fs_type(root.path))
                self._roots[root.path] = state
            elif verdict.shared and not state.verdict.shared:
                log.info("models root is shared", root=str(root.path), why=verdict.why)
            state.verdict, state.checked = verdict, now
        return state.verdict

    def any_shared(self) -> bool:
        """Is any of this node's roots shared with other nodes (the verdicts as last read)?"""
        return any(self.verdict(root).shared for root in self._layout.roots)

    def shared_for(self, dest: str | Path | None, *, fresh: bool = False) -> tuple[bool, Root]:
        """(is the root of ``dest`` shared, that root); the primary root when ``dest`` is unknown."""
        root = self._layout.record_root(Path(dest)) if dest else self._layout.primary
        return self.verdict(root, fresh=fresh).shared, root

    def may_discard_staging(self, root: Root, staging: Path) -> bool:
        """:func:`staging_discardable` for one staging area on ``root`` (walks it on a shared root: a thread)."""
        shared = self.verdict(root, fresh=True).shared
        return staging_discardable(shared, idle_s(staging, time.time()) if shared else 0.0)

    def peers_record(self, manifest: Manifest | None, alive: bool) -> bool:
        """Is ``manifest`` a shared record of a live model that this node no longer serves (the peers' record)?

        Then it is not this node's to remove: the reconciler sees no local record, and only the node's own label
        and entry (if any) go through the destructive path.
        """
        if manifest is None or not alive:
            return False
        shared, root = self.shared_for(manifest.dest)
        return shared and root.state is None

    def status(self) -> list[dict[str, Any]]:
        """Each root's verdict for ``/status``: shared or not and why, the peers seen, the filesystem type."""
        out = []
        for root in self._layout.roots:
            verdict = self.verdict(root)
            state = self._roots[root.path]
            out.append(
                {
                    "root": str(root.path),
                    "shared": verdict.shared,
                    "why": verdict.why,
                    "peers": list(verdict.peers[:50]),
                    "fsType": state.fs_type,
                    "networkFs": state.fs_type.split(".")[0] in NETWORK_FS_TYPES or state.fs_type.startswith("fuse."),
                    "markerError": state.marker_error,
                }
            )
        return out

    # ----------------------------------------------------------------------------------- leases

    @contextlib.asynccontextmanager
    async def _try_hold(self, name: str) -> AsyncIterator[bool]:
        """Hold the Lease ``name`` for the block if it is free (True) — renewed meanwhile — else False at once."""
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(self._leases.hold(name, _busy))
            except _Busy:
                yield False
                return
            yield True

    # ----------------------------------------------------------------------------------- fetching

    def _publication_path(self, root: Root, storage_uri: str, dest: Path) -> Path:
        return root.private / PUBLISHED_DIR / f"{token_for(f'{storage_uri}|{dest}')}.json"

    def _adoptable(
        self, key: str, storage_uri: str, dest: Path, root: Root, owner: str
    ) -> tuple[Manifest | None, bool]:
        """(a record of this target that can be taken as it is, whether it must be saved as this key's record).

        This key's own record when it is intact (the shared record already says so: the reconciler publishes
        Ready from it), else a peer's (or an earlier) publication that :func:`check_publication` admits for
        ``owner``; (None, False) when there is neither.
        """
        current = self.manifests.load(key)
        if (
            current is not None
            and _names_target(current, storage_uri, dest)
            and current.files
            and not current.removing
            and (not owner or not current.owner or current.owner == owner)
            and not current.fast_check()
        ):
            return current, False
        try:
            data = self._publication_path(root, storage_uri, dest).read_bytes()
        except OSError:
            return None, False
        manifest, why = check_publication(data, storage_uri, dest, owner, current)
        if manifest is None:
            log.debug("publication not adoptable", key=key, why=why)
            return None, False
        manifest.key = key
        return manifest, True

    async def _adopt(self, key: str, storage_uri: str, dest: Path, root: Root, owner: str) -> Manifest | None:
        """The adoptable record of this target (:meth:`_adoptable`), saved as this key's record under the
        key's record guard (:meth:`record_turn`); None when there is none, or another node holds the guard."""
        manifest, save = await asyncio.to_thread(self._adoptable, key, storage_uri, dest, root, owner)
        if manifest is None or not save:
            return manifest
        try:
            async with self.record_turn(key, dest):
                again, _ = await asyncio.to_thread(self._adoptable, key, storage_uri, dest, root, owner)
                if again is None:
                    return None
                await asyncio.to_thread(self.manifests.save, again, root)
                return again
        except Requeue:
            return None  # a removal or restore of this key holds it: look again later

    def _publish(self, key: str, storage_uri: str, dest: Path, root: Root) -> None:
        manifest = self.manifests.load(key)
        if manifest is None or not _names_target(manifest, storage_uri, dest):
            return
        path = self._publication_path(root, storage_uri, dest)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{self.node}.{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            fh.write(publication_bytes(manifest.to_json(), self.node, time.time()))
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
        fsync_dir(path.parent)

    async def fetch_once(
        self,
        job: Any,
        key: str,
        storage_uri: str,
        dest: Path,
        root: Root,
        fetch: Callable[[], Awaitable[None]],
        on_wait: Callable[[Progress], Awaitable[None]] | None = None,
        owner: str = "",
        on_long_wait: Callable[[float], None] | None = None,
    ) -> int:
        """Run ``fetch`` here only if this node is the one to fetch ``(storage_uri, dest)`` for the cluster.

        A private root: ``fetch`` runs as always. A shared root: adopt a valid publication, or take the target's
        Lease and fetch (then publish), or show ``waiting-for-peer`` (``job.progress``, and ``on_wait`` writes it
        to the entry; without it the key is requeued) and look again. Returns when the target is published (by
        anyone); the reconciler then finds the manifest and publishes Ready.

        Returns the bytes this node adopted without a transfer (the adopted manifest's size; 0 when it fetched
        itself): they are what another node fetched for it, counted as ``shared`` in the bytes-by-source metric,
        and ``job.progress`` then says so (:class:`~model_agent.sources.byte_sources.SourcedProgress`).
        ``owner`` (the model's owner fingerprint): only a publication fetched for the same owner is adopted.

        Waiting never holds this node's download slot (``job.outside_slot``), and a wait past ``long_wait_s``
        (then twice as long, and so on) calls ``on_long_wait`` with the seconds waited. The holder is not displaced:
        it renews its Lease, so it is alive by the Lease's own rule, and a second writer is what the Lease
        exists to prevent (a mount that hangs the holder would hang a successor too).
        """
        if not self.verdict(root, fresh=True).shared:
            await fetch()
            return 0
        lease = f"shared-fetch|{storage_uri}|{dest}"
        shown = False
        started, warn_at = time.monotonic(), self.long_wait_s
        while True:
            published = await self._adopt(key, storage_uri, dest, root, owner)
            if fetch_turn(True, published is not None, False) == FetchTurn.ADOPT and published is not None:
                log.info("adopted a peer's publication without downloading", key=key, dest=str(dest))
                return self._adopted(job, published)
            async with self._try_hold(lease) as holding:
                if holding:  # a holder may have published between the look and the Lease
                    published = await self._adopt(key, storage_uri, dest, root, owner)
                turn = fetch_turn(True, published is not None, holding)
                if turn == FetchTurn.ADOPT and published is not None:
                    return self._adopted(job, published)
                if turn == FetchTurn.FETCH:
                    log.info("fetching for the nodes sharing this root", key=key, dest=str(dest))
                    await fetch()
                    await asyncio.to_thread(self._publish, key, storage_uri, dest, root)
                    return 0
            if not shown:
                job.progress = Progress(phase=WAITING_FOR_PEER)
                if on_wait is not None:
                    await on_wait(job.progress)  # Updating with this phase in the node's entry
                else:
                    self.requeue(key)
                shown = True
            waited = time.monotonic() - started
            if on_long_wait is not None and waited >= warn_at:
                on_long_wait(waited)  # a holder that renews its Lease but publishes nothing: tell someone
                warn_at *= 2
            # The wait is outside this node's download slot: a peer's fetch never blocks this node's own work.
            async with job.outside_slot() if hasattr(job, "outside_slot") else contextlib.nullcontext():
                await asyncio.sleep(self.poll_s * (0.5 + self._rng.random()))

    @staticmethod
    def _adopted(job: Any, manifest: Manifest) -> int:
        """The adopted manifest's bytes, also shown as the job's progress (every byte from the shared root)."""
        size, files = manifest.total_bytes, len(manifest.files)
        job.progress = SourcedProgress(
            phase="finalizing",
            total_bytes=size,
            completed_bytes=size,
            total_files=files,
            completed_files=files,
            shared_root_bytes=size,
        )
        return size

    # ----------------------------------------------------------------------------------- removal, purge

    @contextlib.asynccontextmanager
    async def removal_turn(self, key: str, dest: str | None, gone: bool, uid: str = "") -> AsyncIterator[RemovalPlan]:
        """The plan of one removal on this node, holding the model's trash Lease for a shared root's files.

        Raises :class:`Requeue` while another node holds that Lease (it is moving or restoring the files now).
        Under the Lease the record is read again: files move only while it is still the one of ``uid`` (the
        object confirmed gone), never a copy a peer restored for a re-created object meanwhile.
        """
        shared, root = self.shared_for(dest, fresh=True)
        records_shared = root.state is None
        if not shared or not gone:
            plan = removal_plan(shared, gone, False, records_shared)
            assert plan is not None
            yield plan
            return
        async with self._try_hold(_record_lease(key)) as holding:
            fresh = await asyncio.to_thread(self.manifests.load, key) if holding else None
            ours = fresh is not None and (not uid or fresh.uid in (uid, ""))
            plan = removal_plan(True, True, holding, records_shared, ours)
            if plan is None:
                raise Requeue("another node is moving the shared copy to the trash", 2.0)
            yield plan

    @contextlib.asynccontextmanager
    async def record_turn(self, key: str, dest: str | Path) -> AsyncIterator[None]:
        """Hold the key's record guard (its trash Lease) while this node rewrites a record other nodes act on.

        On a shared root whose records are shared (no ``--state-dir``), every writer that changes who a record
        belongs to (a removal, a restore, READY adopting a re-created object's copy, the adoption of a
        publication) holds the same Lease, so a removal's check and its move see one owner. A private root, or a
        node's own ``--state-dir`` record: no Lease. Raises :class:`Requeue` while another node holds it.
        """
        shared, root = self.shared_for(dest, fresh=True)
        if not shared or root.state is not None:
            yield
            return
        async with self._try_hold(_record_lease(key)) as holding:
            if not holding:
                raise Requeue("another node is removing or restoring the shared copy", 1.0)
            yield

    def move_refused(self, key: str, record: Manifest, uids: set[str]) -> str:
        """Why the files of ``record`` must not move now, or "" (called immediately before the rename).

        A private root: "". A shared root: the key's record guard must still be this node's (fenced: a holder
        whose renewals failed stops here), the record on disk must still be the one acted on (the UID confirmed
        gone, the removal intent it wrote), what is at its destination must be the copy it describes (the fast
        check), and no publication of another source may name that destination (a successor's copy, recorded
        in another node's ``--state-dir``).
        """
        shared, root = self.shared_for(record.dest, fresh=True)
        if not shared:
            return ""
        if not self._leases.holds(_record_lease(key)):
            return GUARD_LOST
        current = self.manifests.load(key)
        if current is None or (current.uid and current.uid not in uids) or not current.removing:
            return "another node took the shared record over"
        if (current.storage_uri, current.dest) != (record.storage_uri, record.dest):
            return "the shared record now names another copy"
        if current.fast_check():
            return "the directory no longer holds the copy the record describes"
        if self._published_elsewhere(root, record):
            return "another source is published at this directory"
        return ""

    def _published_elsewhere(self, root: Root, record: Manifest) -> bool:
        """Is a valid publication of another source at ``record.dest`` on ``root``?"""
        directory = root.private / PUBLISHED_DIR
        try:
            names = [n for n in os.listdir(directory) if n.endswith(".json")]
        except OSError:
            return False
        dest = Path(record.dest)
        for name in names:
            try:
                data = (directory / name).read_bytes()
                text = str(json_text.loads(data)["manifest"])
                published = Manifest.from_json(text)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            elsewhere = Path(published.dest) == dest and published.storage_uri != record.storage_uri
            if elsewhere and not published.removing and not published.fast_check():
                return True
        return False

    @contextlib.asynccontextmanager
    async def restore_turn(self, key: str, dest: Path) -> AsyncIterator[None]:
        """Hold the model's trash Lease while restoring into a shared root: one restorer, never during a removal.

        A private root: no Lease. Raises :class:`Requeue` while another node holds it.
        """
        shared, _ = self.shared_for(dest, fresh=True)
        if not shared:
            yield
            return
        async with self._try_hold(_record_lease(key)) as holding:
            if not holding:
                raise Requeue("another node is restoring or removing the shared copy", 1.0)
            yield

    # ----------------------------------------------------------------------------------- verification

    def _verified_path(self, root: Root, manifest: Manifest) -> Path:
        target = f"{manifest.storage_uri}|{manifest.dest}"
        return root.private / PUBLISHED_DIR / VERIFIED_DIR / f"{token_for(target)}.json"

    def _read_verification(self, path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except OSError:
            return None

    @contextlib.asynccontextmanager
    async def verify_turn(self, manifest: Manifest, interval_s: float) -> AsyncIterator[VerifyTurn]:
        """The turn of this node's scheduled pass for ``manifest``; on ``VERIFY`` the verify Lease is held (and
        renewed) for the block, which re-hashes and then calls :meth:`record_verification`.

        A private root: ``ALONE``, no Lease, no record. The record is read again under the Lease: a peer may
        have finished between the first look and the Lease.
        """
        shared, root = self.shared_for(manifest.dest, fresh=True)  # once per model and interval: cheap
        if not shared:
            yield VerifyTurn.ALONE
            return
        digest = files_digest(manifest)
        path = self._verified_path(root, manifest)

        def fresh() -> bool:
            return fresh_verification(self._read_verification(path), digest, time.time(), interval_s)

        if await asyncio.to_thread(fresh):
            yield VerifyTurn.SKIP
            return
        async with self._try_hold(f"shared-verify|{manifest.storage_uri}|{manifest.dest}") as holding:
            recent = await asyncio.to_thread(fresh) if holding else False
            yield verify_turn(True, recent, holding)

    def record_verification(self, manifest: Manifest, damaged: list[str], now: float | None = None) -> None:
        """Leave the verification record of ``manifest`` (a thread: it writes and fsyncs); private roots: none."""
        shared, root = self.shared_for(manifest.dest, fresh=True)
        if not shared:
            return
        path = self._verified_path(root, manifest)
        path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.time() if now is None else now
        write_atomic(path, verification_bytes(files_digest(manifest), self.node, stamp, damaged))

    async def as_purge_owner(self, purge: Callable[[], Awaitable[list[T]]]) -> list[T]:
        """Run ``purge`` if this node may purge now: always on private roots; the purge Lease's holder on shared."""
        shared = any(self.verdict(root, fresh=True).shared for root in self._layout.roots)
        if not shared:
            return await purge()
        async with self._try_hold(f"shared-purge|{self._layout.primary.path}") as holding:
            if not purge_allowed(True, holding):
                return []
            return await purge()
