"""The level-triggered reconciler: make one model's state on this node agree with its resource.

``reconcile(key)`` never trusts what event brought it here; it compares

* desired: the cached object (if any), whether it is being deleted, and whether it selects this node;
* actual: the manifest on disk (and its fast stat check), a running or failed fetch, the trash, the
  node label and the ConfigMap entry;

and acts: publish ``Ready`` for an intact manifest of the wanted source, start (or keep) a fetch and show
``Updating``, show ``Failed`` with a reason, restore from the trash, or hand a removal candidate to the
one destructive path, :class:`~model_agent.agent.removal.Remover`. Restarting the agent therefore needs no
special code: a Ready model with an intact manifest stays Ready without a download and without an
``Updating`` flip, and half-done work is picked up from local records.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from model_agent.agent.artifact_reuse import ARTIFACTS_DIR, adopt_or_wait, link_child, shared_target
from model_agent.agent.converge import Act, Facts, FailureFact, JobFact, LocalDir, ManifestFact, TargetKind, decide
from model_agent.agent.crash_record import QUARANTINED, CrashRecords, Step
from model_agent.agent.credentials import model_owner, read_storage_secret, resolve_hf_token
from model_agent.agent.download_limits import DownloadLimits, run_within_limits
from model_agent.agent.fetcher import Job
from model_agent.agent.lifecycle import Step as LifeStep
from model_agent.agent.lifecycle import gate, presence
from model_agent.agent.namespace_quota import (
    DEFAULT_FAILED_PER_NAMESPACE,
    DEFAULT_MODELS_PER_NAMESPACE,
    MODELS_OVER_QUOTA,
    OVER_QUOTA,
    NamespaceQuota,
    failed_quota,
    models_quota,
)
from model_agent.agent.node_parts import NodeParts
from model_agent.agent.ownership import (
    Claim,
    ClaimCache,
    Mode,
    find_conflict,
    normalise,
    owner_of_model,
    restorable_by,
    restorable_to,
)
from model_agent.agent.removal import Candidate, Remover
from model_agent.agent.requeue import Requeue
from model_agent.agent.shared_root import SharedRoots
from model_agent.agent.tenant_local import admin_allows
from model_agent.kube import objects
from model_agent.kube.client import ApiError, ApiUnavailable
from model_agent.kube.resources import MODEL_RESOURCES
from model_agent.local.inventory import delete_discarded, discard
from model_agent.local.layout import PathRefused, Root, token_for
from model_agent.local.listing import list_local_files
from model_agent.local.manifest import FileRecord, Manifest
from model_agent.local.metadata_files import parse_model_dir
from model_agent.model.entry import DownloadProgress, ModelConfig, ModelEntry, rfc3339
from model_agent.model.keys import ModelState
from model_agent.model.metadata import MetadataError, ParsedMetadata
from model_agent.model.reasons import EventReason, Reason
from model_agent.model.resources import InvalidModel, ModelObject, ModelRef, reserve_artifact, skip_config_parsing
from model_agent.model.selection import DEFAULT_INSTANCE_TYPE_MAP, instance_shape_alias, node_selected
from model_agent.model.uris import (
    InvalidStorageUri,
    StorageType,
    parse_local_uri,
    parse_storage_uri,
    storage_type,
)
from model_agent.ops.events import NORMAL, WARNING, ObjectRef
from model_agent.sources.base import FetchRequest, Progress, Source, SourceError, publish
from model_agent.sources.byte_sources import by_source
from model_agent.sources.hf import HuggingFaceSource

log = structlog.get_logger(__name__)

PROGRESS_INTERVAL_S = 30.0
# Sources whose files the agent fetched itself, and may therefore quarantine.
OWNED_TYPES = {StorageType.HUGGINGFACE, StorageType.OCI, StorageType.S3, StorageType.GCS, StorageType.AZURE}
FETCHABLE_TYPES = {StorageType.HUGGINGFACE}
# A fetch that completed but could not retire the old copy yet (confirmation read failed, breaker held).
SWITCH_DEFERRED = "SwitchDeferred"


@dataclass(frozen=True)
class Target:
    """What a model wants on disk: the identity a manifest must match to count as 'the same'."""

    storage_uri: str
    dest: Path
    root: Root
    storage_type: StorageType
    # A shared artifact's child (agent/artifact_reuse.py): spec.storage.path, a symlink to ``dest`` once Ready.
    link: Path | None = None

    @property
    def id(self) -> str:
        return f"{self.storage_uri}|{self.dest}"

    def matches(self, manifest: Manifest) -> bool:
        # ``dest`` is resolved (symlinks, '//', a trailing '/'); a record written from another spelling of the
        # same directory (an older agent, a symlinked root) is resolved the same way before comparing.
        if manifest.storage_uri != self.storage_uri:
            return False
        return Path(manifest.dest) == self.dest or Path(os.path.realpath(manifest.dest)) == self.dest


class Invalid(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Context(NodeParts):
    """Everything the reconciler reads and writes (the node's parts and these), built once by the agent."""

    namespace: str
    remover: Remover
    hf: HuggingFaceSource
    models_store: dict[str, Any]  # kind -> Store
    requeue_after: Any  # Callable[[str, float], None]
    busy: Callable[[], bool] = lambda: False
    # An async context manager factory: (source, on_wait, owner=) -> holds one of the fleet's origin slots.
    origin_slots: Callable[..., Any] = lambda _source, _on_wait, **_kw: contextlib.nullcontext()
    # Sources by storage type besides ``hf`` (which serves HUGGINGFACE); a type listed here is fetchable.
    sources: dict[StorageType, Source] = field(default_factory=dict)
    # INSTANCE_TYPE_MAP (docs/ome-compatibility.md#31-node-facts): node instance type -> shape alias, for the
    # TensorRT-LLM filter.
    instance_type_map: Mapping[str, str] = field(default_factory=lambda: DEFAULT_INSTANCE_TYPE_MAP)
    # --download-timeout / --download-min-rate: a whole fetch's deadlines (agent/download_limits.py).
    download_limits: DownloadLimits = field(default_factory=DownloadLimits)
    # --max-failed-per-namespace: Failed entries and labels one namespace may show here (agent/namespace_quota.py).
    max_failed_per_namespace: int = DEFAULT_FAILED_PER_NAMESPACE
    # --max-models-per-namespace: Ready and Updating models one namespace may show here (agent/namespace_quota.py).
    max_models_per_namespace: int = DEFAULT_MODELS_PER_NAMESPACE
    # --tenant-local-allow: directories besides the roots where tenants' local:// paths may lie (agent/tenant_local.py).
    tenant_local_allow: tuple[str, ...] = ()
    # Shared models roots (agent/shared_root.py): one fetch for the cluster; None: every root is private.
    shared_roots: SharedRoots | None = None


def _store_key(ref: ModelRef) -> str:
    return f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name


class Reconciler:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        # Made on first use (_fail): its counter registers in the agent's metrics registry.
        self._failed_quota: NamespaceQuota | None = None
        self._models_quota: NamespaceQuota | None = None
        self._progress_written: dict[str, float] = {}
        self._enriched: set[str] = set()
        self._enrich_slots = asyncio.Semaphore(4)
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ reading desired and actual state

    def cached_object(self, ref: ModelRef) -> dict[str, Any] | None:
        store = self.ctx.models_store[ref.kind.value]
        obj: dict[str, Any] | None = store.get(_store_key(ref))
        return obj

    def node_labels(self) -> dict[str, str]:
        return self.ctx.labels.labels()

    def target_of(self, obj: ModelObject) -> Target:
        uri = obj.spec.storage.storage_uri
        try:
            stype = storage_type(uri)
            parse_storage_uri(uri)
        except InvalidStorageUri as exc:
            raise Invalid(exc.code, str(exc)) from None
        raw_path = obj.spec.storage.path or ""
        if stype == StorageType.LOCAL and not raw_path:
            raw_path = parse_local_uri(uri).path
        if stype == StorageType.VENDOR and not raw_path:
            return Target(uri, Path("/"), self.ctx.layout.primary, stype)
        if stype == StorageType.LOCAL:
            # Local paths are read, never written or deleted: they need not be under the models root. The
            # resolved path is the identity, as for every other target: a record and a spec that spell one
            # directory differently are the same target, and a re-pointed symlink is a new one.
            try:
                tenant = bool(obj.ref.namespace) and not admin_allows(raw_path, self.ctx.tenant_local_allow)
                path = Path(os.path.realpath(self.ctx.layout.check_local(raw_path, tenant=tenant)))
            except PathRefused as exc:
                raise Invalid("InvalidPath", str(exc)) from None
            if tenant and (ARTIFACTS_DIR in Path(raw_path).parts or ARTIFACTS_DIR in path.parts):
                # Shared artifacts are fetched for their owners; a tenant reads none of them in place (the reason
                # names no snapshot: it tells the tenant nothing about what is there).
                raise Invalid("InvalidPath", f"a namespaced model's local:// path may not lie in {ARTIFACTS_DIR}/")
            conflict = self._older_claim(obj, uri, raw_path, path)
            if conflict is not None:
                raise Invalid("PathConflict", f"local path {conflict}")
            return Target(uri, path, self.ctx.layout.primary, stype)
        try:
            root, dest = self.ctx.layout.confine(raw_path)
        except PathRefused as exc:
            raise Invalid("PathRefused", str(exc)) from None
        if stype in OWNED_TYPES:
            # downloadPolicy ReuseIfExists: one copy per snapshot, the path a link to it (agent/artifact_reuse.py)
            raw_obj = self.cached_object(obj.ref) or {}
            shared = shared_target(raw_obj, self.ctx.layout, cluster_scoped=not obj.ref.namespace)
            if shared is None and ARTIFACTS_DIR in dest.parts:
                raise Invalid("PathRefused", f"spec.storage.path {raw_path!r} lies in a shared artifact ({dest})")
            conflict = self._older_claim(obj, uri, raw_path, shared.link if shared else dest)
            if conflict is not None:
                raise Invalid("PathConflict", f"spec.storage.path {conflict}")
            if shared is not None:
                return Target(shared.identity.pinned_uri, shared.parent, root, stype, link=shared.link)
            if self._shape_filtered_on_shared_root(obj, stype, root):
                raise Invalid(
                    "PathRefused",
                    f"{dest} is on a models root shared with other nodes, and this TensorRT-LLM serving model's files "
                    "are chosen by each node's shape: nodes of other shapes would serve this node's files. Give it a "
                    "path on a root only this node uses",
                )
        return Target(uri, dest, root, stype)

    def _shape_filtered_on_shared_root(self, obj: ModelObject, stype: StorageType, root: Root) -> bool:
        """Does ``obj`` fetch files by this node's shape (the target identity does not name it) onto a shared root?"""
        shared = self.ctx.shared_roots
        source = self.ctx.sources.get(stype)
        if shared is None or source is None or not source.rules.shape_filter or not self._shape_filter(obj):
            return False
        return shared.verdict(root).shared

    def _older_claim(self, obj: ModelObject, uri: str, raw_path: str, dest: Path) -> str | None:
        """Why a live model of another owner that came first keeps this one out of ``dest``, or None.

        One owner per directory tree (:mod:`model_agent.agent.ownership`): the same directory, a parent or a
        child of another model's (written or read) is refused; the model that already holds it here keeps
        it, else the older (creationTimestamp, then key). The other models' claims are derived once per
        object version and indexed, so this stays cheap with thousands of models; manifests are read only
        for claims that overlap.
        """
        cache: ClaimCache | None = self.__dict__.get("_claim_cache")
        if cache is None:  # made on first use: the claims and their index are agent/ownership.py's
            cache = self.__dict__["_claim_cache"] = ClaimCache(self.ctx.layout)
        own = self.cached_object(obj.ref) or {}
        written = normalise(raw_path) or str(dest)
        local = storage_type(uri) == StorageType.LOCAL
        mine = Claim(
            obj.ref.key,
            owner_of_model(obj),
            tuple(dict.fromkeys((written, str(dest)))),
            Mode.READ if local else Mode.WRITE,
            str(objects.meta(own).get("creationTimestamp") or ""),
        )

        def live_here(claim: Claim) -> bool:
            """Does the claim's model use this node's view of its directory: it selects this node, or the directory
            is on a shared root (every node sharing the root sees that model's files, whichever it selects)."""
            try:
                ref = ModelRef.from_key(claim.key)
                other = ModelObject.from_dict(ref.kind, self.cached_object(ref))
            except (ValueError, InvalidModel):
                return False
            if node_selected(other.spec.storage, self.node_labels(), self.ctx.node_name):
                return True
            return self._on_shared_root(claim.paths)

        def holds(claim: Claim) -> bool:  # its manifest records this directory: it has published here
            manifest = self.ctx.manifests.load(claim.key)
            return manifest is not None and normalise(manifest.dest) in claim.paths

        conflict = find_conflict(mine, cache.index(self.ctx.models_store), live_here=live_here, holds=holds)
        return conflict.message if conflict is not None else None

    def _on_shared_root(self, paths: tuple[str, ...]) -> bool:
        """Is any of ``paths`` inside an allowed root that is shared with other nodes?"""
        shared = self.ctx.shared_roots
        if shared is None:
            return False
        for path in paths:
            try:
                root = self.ctx.layout.root_of(Path(path))
            except PathRefused:
                continue
            if shared.verdict(root).shared:
                return True
        return False

    # ------------------------------------------------------------------------------------- the loop body

    async def reconcile(self, key: str) -> None:
        ref = ModelRef.from_key(key)
        raw = self.cached_object(ref)
        manifest = self.ctx.manifests.load(key)
        if raw is None:
            await self._candidate(ref, manifest, None, "absent from the cache")
            return
        try:
            obj = ModelObject.from_dict(ref.kind, raw)
        except InvalidModel as exc:
            await self._fail(ref, raw, "InvalidModel", exc.reason)
            return
        if obj.deleting:
            await self._candidate(ref, manifest, obj, "deletionTimestamp set")
            return
        if not node_selected(obj.spec.storage, self.node_labels(), self.ctx.node_name):
            await self._candidate(ref, manifest, obj, "no longer selects this node")
            return
        try:
            target = self.target_of(obj)
        except Invalid as exc:
            await self._fail(ref, raw, exc.reason, exc.message)
            return
        if not await self._admitted(ref, raw):
            return
        crashed = self.crash_records.verdict(ref.key, obj.metadata.uid, obj.metadata.generation)
        if crashed.quarantined:  # the agent died on this spec's steps before: not until probation (crash_record.py)
            await self._fail(ref, raw, QUARANTINED, crashed.message)
            self.ctx.requeue_after(ref.key, crashed.retry_in_s)
            return
        await self._converge(ref, obj, raw, target, manifest)

    async def _admitted(self, ref: ModelRef, raw: dict[str, Any]) -> bool:
        """The namespace's cap of Ready and Updating models here (agent/namespace_quota.py): over it, the model is not
        fetched and shows ``Failed: ModelQuotaExceeded`` (bounded in turn by the Failed cap), retried every minute."""
        ctx = self.ctx
        if self._models_quota is None:
            self._models_quota = models_quota(ctx.max_models_per_namespace, ctx.metrics.registry)
        room = self._models_quota.decide(ref, ctx.labels.labels().get(ref.label_key), ctx.configmap.data())
        if room.admitted:
            return True
        message = (
            f"namespace {ref.namespace} already has {self._models_quota.limit} models Ready or Updating on node "
            f"{ctx.node_name} (--max-models-per-namespace); this one is not fetched here until one of them goes"
        )
        await self._fail(ref, raw, MODELS_OVER_QUOTA, message)
        ctx.requeue_after(ref.key, 60.0)
        return False

    @property
    def crash_records(self) -> CrashRecords:
        """Durable attempt records of the risky steps (made on first use, next to the manifests)."""
        records: CrashRecords | None = self.__dict__.get("_crash_records")
        if records is None:
            # One directory per node: on a shared root the records area is every node's (agent/crash_record.py).
            records = CrashRecords(
                self.ctx.layout.primary.manifests.parent / "attempts" / token_for(self.ctx.node_name)
            )
            self.__dict__["_crash_records"] = records
        return records

    async def _candidate(self, ref: ModelRef, manifest: Manifest | None, obj: ModelObject | None, why: str) -> None:
        has_label = ref.label_key in self.ctx.labels.model_labels()
        has_entry = ref.configmap_key in self.ctx.configmap.data()
        shared = self.ctx.shared_roots
        if shared is not None and shared.peers_record(manifest, obj is not None and not obj.deleting):
            manifest = None  # a shared root's record of a live model: the peers', not this node's to remove
        if manifest is None and not has_label and not has_entry and self.ctx.fetcher.job(ref.key) is None:
            if self.crash_records.get(ref.key) is not None:  # its attempt record outlived everything else
                await asyncio.to_thread(self.crash_records.forget, ref.key)
            return  # nothing of this model here: nothing to do
        uid = manifest.uid if manifest else (obj.metadata.uid if obj else "")
        removed = await self.ctx.remover.remove(Candidate(ref, uid, manifest, why))
        if removed and self._models_quota is not None:
            self._models_quota.release(ref)

    async def _link(self, ref: ModelRef, target: Target) -> None:
        """Point a shared artifact's link (its ``spec.storage.path``) at its parent; PathRefused when it cannot."""
        assert target.link is not None
        try:
            await asyncio.to_thread(link_child, self.ctx.layout, ref.key, target.link, target.dest)
        except OSError as exc:
            raise PathRefused(f"linking {target.link} to the shared artifact {target.dest}: {exc}") from exc

    # ------------------------------------------------------------------------------------ converge

    async def _converge(
        self, ref: ModelRef, obj: ModelObject, raw: dict[str, Any], target: Target, manifest: Manifest | None
    ) -> None:
        """Gather the facts for one wanted model, :func:`~model_agent.agent.converge.decide`, and act."""
        ctx = self.ctx
        ctx.remover.wanted(ref.key)  # not a pending removal any more
        if target.link is not None:  # a shared artifact: adopt a sibling's verified copy, or wait for its fetch
            try:
                adoption = await adopt_or_wait(
                    ctx.manifests,
                    lambda old: ctx.remover.replace_superseded(ref, old, target.id),
                    lambda: self._link(ref, target),
                    key=ref.key,
                    uid=obj.metadata.uid,
                    owner=owner_of_model(obj).fingerprint,
                    generation=obj.metadata.generation,
                    storage_uri=target.storage_uri,
                    parent=target.dest,
                    root=target.root,
                    manifest=manifest,
                    fetching=lambda: {j.key for j in ctx.fetcher.jobs() if j.target == target.id},
                )
            except PathRefused as exc:  # (the link, before the old copy is retired: that copy stays)
                await self._fail(ref, raw, "PathRefused", str(exc))
                ctx.requeue_after(ref.key, 30.0)
                return
            if adoption.wait:
                await self._publish_state(ref, obj, ModelState.UPDATING, progress=Progress(phase="queued"))
                ctx.requeue_after(ref.key, 2.0)
                return
            manifest = adoption.manifest
        facts, problems = self._converge_facts(ref, target, manifest)
        if facts.manifest == ManifestFact.DAMAGED:
            log.warning("manifest check failed", key=ref.key, problems=problems[:5])
            ctx.metrics.drift_repairs.labels("files").inc()
        decision = decide(facts)
        # While the new target is not Ready the old copy stays in place with its manifest (it no longer matches
        # the spec, so it is "superseded"); patching the spec back makes it match, and Ready, again.
        superseded = manifest if decision.superseded else None
        current = manifest if facts.manifest in (ManifestFact.INTACT, ManifestFact.DAMAGED) else None
        if decision.cancel_job:
            job = ctx.fetcher.job(ref.key)
            log.info("cancelling a fetch the spec no longer wants", key=ref.key, job=job.target if job else None)
            await ctx.fetcher.cancel(ref.key)
        if decision.clean_staging and decision.act != Act.RESTORE:
            await self._clean_staging(ref)
        if decision.act == Act.READY:
            assert current is not None
            reserved = reserve_artifact(obj)
            if (current.uid, current.reserved, current.removing) != (obj.metadata.uid, reserved, ""):
                # On a shared root another node may be removing this record's copy: rewrite it only under the
                # key's record guard, and from the record as it is then (Requeue while another node holds it).
                guard = ctx.shared_roots.record_turn(ref.key, current.dest) if ctx.shared_roots else None
                async with guard or contextlib.nullcontext():
                    again = await asyncio.to_thread(ctx.manifests.load, ref.key)
                    if again is None or (again.storage_uri, again.dest) != (current.storage_uri, current.dest):
                        raise Requeue("the record changed while it was adopted", 0.5)
                    current = again
                    current.uid = obj.metadata.uid  # same source and path, recreated object: adopt
                    current.reserved = reserved  # a removal honours it even once the object is gone
                    current.removing = ""  # wanted and intact: a removal recorded before a restart is void
                    await asyncio.to_thread(ctx.manifests.save, current, target.root)
            if target.link is not None:  # the model's path becomes a link to the shared artifact, then Ready
                try:
                    await self._link(ref, target)
                except PathRefused as exc:
                    await self._fail(ref, raw, "PathRefused", str(exc))
                    ctx.requeue_after(ref.key, 30.0)
                    return
            await self._publish_state(ref, obj, ModelState.READY, manifest=current)
            self._enrich_spec_later(ref, obj, raw, current)
            return
        if decision.act == Act.FAIL_LOCAL:
            await self._fail(ref, raw, decision.reason, _local_failure_message(target, problems, decision.reason))
            ctx.requeue_after(ref.key, 30.0)
            return
        if decision.act == Act.ADOPT:
            await self._adopt_in_place(ref, obj, raw, target, superseded)
            return
        if decision.act == Act.RESTORE:
            shared = ctx.shared_roots  # a shared root: one node restores, never while another removes
            async with shared.restore_turn(ref.key, target.dest) if shared else contextlib.nullcontext():
                restored = await self._restore_from_trash(ref, obj, target, superseded)
            if restored:
                await self._clean_staging(ref)
                ctx.requeue_after(ref.key, 0)
                return
            decision = decide(dataclasses.replace(facts, restorable=False, job=JobFact.NONE))
        await self._ensure_fetch(ref, obj, raw, target, decision.act, current, superseded)

    def _converge_facts(self, ref: ModelRef, target: Target, manifest: Manifest | None) -> tuple[Facts, list[str]]:
        """The facts :func:`decide` needs, read from the manifest, the disk, the trash and the fetcher."""
        ctx = self.ctx
        problems: list[str] = []
        if manifest is None:
            manifest_fact = ManifestFact.NONE
        elif not target.matches(manifest):
            manifest_fact = ManifestFact.SUPERSEDED
        else:
            problems = manifest.fast_check()
            manifest_fact = ManifestFact.DAMAGED if problems else ManifestFact.INTACT
        if target.storage_type == StorageType.LOCAL:
            kind = TargetKind.LOCAL
        elif target.storage_type == StorageType.VENDOR:
            kind = TargetKind.VENDOR
        elif target.storage_type in FETCHABLE_TYPES or target.storage_type in ctx.sources:
            kind = TargetKind.FETCHED
        else:
            kind = TargetKind.UNSUPPORTED
        local = LocalDir.NOT_LOCAL
        if kind == TargetKind.LOCAL:
            if not target.dest.is_dir():
                local = LocalDir.MISSING
            elif any(p.endswith(": missing") for p in problems):
                local = LocalDir.FILES_MISSING
            else:
                local = LocalDir.PRESENT
        restorable = (
            manifest_fact != ManifestFact.INTACT
            and kind in (TargetKind.FETCHED, TargetKind.UNSUPPORTED)
            and not target.dest.exists()
            and ctx.trash.find_restorable(
                target.storage_uri, str(target.dest), accept=restorable_to(ref.key, self.cached_object(ref))
            )
            is not None
        )
        job = ctx.fetcher.job(ref.key)
        job_fact = JobFact.NONE
        if job is not None:
            job_fact = JobFact.THIS_TARGET if job.target == target.id else JobFact.OTHER_TARGET
        failure = ctx.fetcher.failure(ref.key, target.id)
        failure_fact = FailureFact.NONE
        if failure is not None:
            due = failure.retry_at - time.monotonic() <= 0
            if not failure.retryable:
                failure_fact = FailureFact.FINAL
            elif due:
                failure_fact = FailureFact.RETRY_DUE
            elif failure.reason == SWITCH_DEFERRED:
                failure_fact = FailureFact.SWITCH_DEFERRED
            else:
                failure_fact = FailureFact.BACKING_OFF
        facts = Facts(manifest_fact, kind, local, restorable, job_fact, failure_fact)
        return facts, problems

    async def _clean_staging(self, ref: ModelRef) -> None:
        """Remove this key's staging: no job of the wanted target uses it (an obsolete or deferred fetch's copy).

        Staging is the agent's scratch space, never a model's published weights. On a shared root only an idle area
        goes (:func:`~model_agent.agent.shared_root.staging_discardable`). As the inventory does, the area
        is renamed out of ``staging/`` at once (a fetch starting a moment later finds no half-deleted directory)
        and deleted in a thread.
        """
        discarded = False
        shared = self.ctx.shared_roots
        for root in self.ctx.layout.roots:
            staging = root.staging / token_for(ref.key)
            if not staging.exists():
                continue
            if shared is not None and not await asyncio.to_thread(shared.may_discard_staging, root, staging):
                continue  # a shared root: another node's fetch may be writing into it
            if discard(root, staging) is not None:
                log.info("removed staging no fetch owns", key=ref.key, staging=str(staging))
                discarded = True
        if discarded:
            await asyncio.to_thread(delete_discarded, self.ctx.layout)

    async def _ensure_fetch(
        self,
        ref: ModelRef,
        obj: ModelObject,
        raw: dict[str, Any],
        target: Target,
        act: Act,
        manifest: Manifest | None,
        superseded: Manifest | None = None,
    ) -> None:
        ctx = self.ctx
        if act == Act.UNSUPPORTED:
            await self._fail(
                ref,
                raw,
                "UnsupportedStorage",
                f"{target.storage_type.value} sources are not supported by this agent version",
            )
            return
        if target.root.read_only():  # OME #787: a read-only root serves local:// models; nothing lands in it
            await self._fail(
                ref,
                raw,
                "PathRefused",
                f"{target.dest} is under the read-only models root {target.root.path}: nothing can be fetched "
                "into it (a read-only root serves local:// models; give this model a path on a writable root)",
            )
            ctx.requeue_after(ref.key, 30.0)
            return
        job = ctx.fetcher.job(ref.key)
        if act == Act.WAIT and job is not None and job.target == target.id:
            await self._publish_state(ref, obj, ModelState.UPDATING, progress=job.progress)
            return
        failure = ctx.fetcher.failure(ref.key, target.id)
        if act == Act.WAIT and failure is not None:
            # A deferred switch: the new copy waits in staging until the old one can be retired. Not a failure.
            await self._publish_state(ref, obj, ModelState.UPDATING, progress=Progress(phase="switching"))
            ctx.requeue_after(ref.key, max(0.0, failure.retry_at - time.monotonic()))
            return
        if act == Act.FAIL and failure is not None:
            remaining = failure.retry_at - time.monotonic()
            await self._fail(ref, raw, failure.reason, failure.message)
            if failure.retryable:
                ctx.requeue_after(ref.key, max(0.0, remaining))
            return
        await self._publish_state(ref, obj, ModelState.UPDATING, progress=Progress(phase="scanning"))
        shared = ctx.shared_roots

        async def body(job: Job) -> None:
            async def fetch() -> None:
                await self._fetch(job, ref, obj, target, manifest, superseded)

            if shared is None:
                await fetch()
            else:  # a shared root: one node fetches for all, the others adopt its publication
                adopted = await shared.fetch_once(
                    job,
                    ref.key,
                    target.storage_uri,
                    target.dest,
                    target.root,
                    fetch,
                    lambda p: self._write_progress(ref, obj, p, time.monotonic()),
                    owner_of_model(obj).fingerprint,
                    lambda waited: ctx.events.emit(
                        ObjectRef.of(raw),
                        WARNING,
                        EventReason.WAITING_FOR_PEER,
                        f"node {ctx.node_name} has waited {waited / 60:.0f} min for another node sharing "
                        f"{target.root.path} to fetch this model; that node holds the fetch but has published nothing",
                    ),
                )
                ctx.metrics.bytes_by_source.labels("shared").inc(adopted)  # what another node fetched for this one

        submitted = await ctx.fetcher.submit(ref.key, target.id, body)
        if not submitted:
            raise Requeue("the fetcher is stopping")

    async def _fetch(
        self,
        job: Job,
        ref: ModelRef,
        obj: ModelObject,
        target: Target,
        previous: Manifest | None,
        superseded: Manifest | None = None,
        slot: contextlib.AsyncExitStack | None = None,
    ) -> None:
        """The body of a fetch job: download, verify, publish, parse, record. Runs in the fetcher pool.

        The fleet's origin slot (``ctx.origin_slots``) is taken before the download into ``slot`` (a stack
        made here when not given) and left only when this returns: once the copy is published and recorded
        (this node's peer server serves it from the manifest), or on failure. Left between the download and the
        publish, it would let a waiting node start a second origin fetch while no peer can serve the first
        one's bytes yet.
        """
        if slot is None:
            async with contextlib.AsyncExitStack() as held:
                previous, superseded = await self._records_now(ref, target, previous, superseded)
                await self._fetch(job, ref, obj, target, previous, superseded, held)
            return
        ctx = self.ctx
        started = time.monotonic()
        labels = _metric_labels(ref)
        source = ctx.sources.get(target.storage_type, ctx.hf)
        rules = source.rules
        token = None
        if rules.wants_token:
            resolved = await resolve_hf_token(ctx.client, obj, ctx.namespace)
            token = resolved.token
            if resolved.origin == "parameters":
                ctx.events.emit(
                    ObjectRef.of(self.cached_object(ref) or {}),
                    WARNING,
                    "PlaintextToken",
                    "spec.storage.parameters.token holds a plain-text token; use a Secret via spec.storage.key",
                )
        secret = None
        if rules.reads_secret(obj.spec.storage.parameters):
            secret = await read_storage_secret(ctx.client, obj, ctx.namespace)
        staging = target.root.staging / token_for(ref.key)
        last_write = [0.0]
        pending: list[asyncio.Task[None]] = []

        crashes = self.crash_records
        listing_open = [False]

        def on_progress(p: Progress) -> None:
            job.progress = p
            if listing_open[0] and p.phase not in ("scanning", "queued"):  # the listing is over: close its step
                listing_open[0] = False
                pending.append(asyncio.get_running_loop().create_task(asyncio.to_thread(crashes.end, ref.key)))
            now = time.monotonic()
            if now - last_write[0] >= PROGRESS_INTERVAL_S:
                last_write[0] = now
                pending.append(asyncio.get_running_loop().create_task(self._write_progress(ref, obj, p, started)))

        request = FetchRequest(
            storage_uri=target.storage_uri,
            dest=target.dest,
            root=target.root.path,
            staging=staging,
            previous=previous,
            token=token,
            secret=secret,
            parameters=dict(obj.spec.storage.parameters),
            on_progress=on_progress,
            shape_alias=self._shape_filter(obj) if rules.shape_filter else None,
            owner=model_owner(obj),  # tenancy: a BaseModel outside the trusted namespaces (sources/egress.py)
        )

        def queued() -> None:
            job.progress = Progress(phase="queued")
            pending.append(
                asyncio.get_running_loop().create_task(self._write_progress(ref, obj, job.progress, started))
            )

        try:
            # Left by _fetch. The owner: a tenant takes no bytes from peers, so it never skips the queue for them.
            await slot.enter_async_context(ctx.origin_slots(target.storage_uri, queued, owner=request.owner))
            if not self._may(LifeStep.START_DOWNLOAD, ref, obj):  # after the slot waits: the cache as it is now
                raise SourceError("Obsolete", "not downloading: the object is being deleted, gone or re-created")
            try:
                uid, generation = obj.metadata.uid, obj.metadata.generation
                await asyncio.to_thread(crashes.begin, ref.key, uid, generation, Step.LISTING)
                listing_open[0] = True
                result = await run_within_limits(
                    source.fetch(request),
                    lambda: job.progress,
                    ctx.download_limits,
                )
            except SourceError as exc:
                if rules.counts_listed_bytes and exc.reason == Reason.VERIFICATION_FAILED:
                    ctx.metrics.verifications.labels(*labels, "failure").inc()
                    if rules.md5_failure(exc):
                        ctx.metrics.md5_failed.labels(*labels).inc()
                raise
            finally:
                if listing_open[0]:  # ended (or failed) while listing, and this process lives: close the step
                    listing_open[0] = False
                    await asyncio.shield(asyncio.to_thread(crashes.end, ref.key))
            try:  # ownership again before publish: a model that comes first may have claimed the directory since
                self.target_of(obj)
            except Invalid as exc:
                raise SourceError(exc.reason, exc.message) from None
            if not self._still_wanted(ref, target):
                # The spec moved on while this copy was fetched (A -> B -> A): neither retire the copy the spec
                # wants again nor publish over it. The staging left behind is cleaned by the next reconcile.
                raise SourceError("Obsolete", "the spec no longer wants this source and path; not switching to it")
            # An old copy in the same directory must leave it before the new one is published there; one elsewhere
            # (a new path) is retired only once the new copy is in place (below), so the weights are always on disk.
            retire_first = superseded is not None and ctx.layout.resolve(superseded.dest) == str(target.dest)
            if superseded is not None and retire_first:
                try:
                    await ctx.remover.replace_superseded(ref, superseded, target.id, from_fetch=True)
                except Requeue as exc:
                    raise SourceError(SWITCH_DEFERRED, f"the old copy cannot be retired yet: {exc.why}") from None
            job.commit()  # publishing: from here a cancel waits until the manifest records what was published
            files = await job.in_thread(publish, request, result)
        finally:
            for task in pending:  # progress writes finish before the outcome is reported
                await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(crashes.begin, ref.key, obj.metadata.uid, obj.metadata.generation, Step.METADATA)
        try:
            metadata = await job.in_thread(self._parse_metadata, obj, target.dest, sum(f.size for f in files))
        finally:
            await asyncio.shield(asyncio.to_thread(crashes.end, ref.key))
        manifest = Manifest(
            key=ref.key,
            uid=obj.metadata.uid,
            storage_uri=target.storage_uri,
            dest=str(target.dest),
            revision=result.revision,
            generation=obj.metadata.generation,
            source_type=target.storage_type.value,
            owned=True,
            reserved=reserve_artifact(obj),
            files=files,
            metadata=metadata,
            owner=owner_of_model(obj).fingerprint,
        )
        manifest.verified_at = time.time()
        if superseded is not None and not retire_first:  # the new copy is published: now the old one may go
            if target.link is not None:  # ... once the shared artifact's link leads to the new copy, not before
                try:
                    await self._link(ref, target)
                except PathRefused as exc:
                    raise SourceError("PathRefused", str(exc)) from None
            try:
                await ctx.remover.replace_superseded(ref, superseded, target.id, from_fetch=True)
            except Requeue as exc:
                raise SourceError(SWITCH_DEFERRED, f"the old copy cannot be retired yet: {exc.why}") from None
        await asyncio.to_thread(ctx.manifests.save, manifest, target.root)
        await asyncio.to_thread(crashes.finished, ref.key)
        ctx.metrics.downloads_success.labels(*labels).inc()
        ctx.metrics.download_duration.labels(*labels).observe(time.monotonic() - started)
        fetched = sum(f.size for f in files if f.path in set(result.staged))
        ctx.metrics.fetched_bytes.inc(fetched)
        # OME's OCI-only metrics (docs/ome-compatibility.md#111-prometheus-metrics): every listed byte counts
        if rules.counts_listed_bytes:
            ctx.metrics.verifications.labels(*labels, "success").inc()
            ctx.metrics.download_bytes.labels(*labels).inc(manifest.total_bytes)
        ctx.events.emit(
            ObjectRef.of(self.cached_object(ref) or {}),
            NORMAL,
            "Fetched",
            f"{len(files)} files ({manifest.total_bytes} bytes, {fetched} fetched) at revision "
            f"{result.revision[:12]} on node {ctx.node_name}",
        )

    async def _records_now(
        self, ref: ModelRef, target: Target, previous: Manifest | None, superseded: Manifest | None
    ) -> tuple[Manifest | None, Manifest | None]:
        """The key's record as it is when the fetch starts: (the previous copy of this target, a copy to retire).

        On a shared root the fetch may start long after the reconciler decided it — after a wait for another node's
        fetch Lease, whose holder may have published, retired the old copy or died half-way — so the record is read
        again under the Lease: a stale ``superseded`` would retire the new copy that now stands in the directory.
        A private root: as decided (this node is the record's only writer).
        """
        shared = self.ctx.shared_roots
        if shared is None or not shared.shared_for(target.dest)[0]:
            return previous, superseded
        current = await asyncio.to_thread(self.ctx.manifests.load, ref.key)
        if current is None or current.removing:
            return None, None
        if target.matches(current):
            return current, None
        return None, current

    def _still_wanted(self, ref: ModelRef, target: Target) -> bool:
        """Does the cached object still want exactly this target (same source, same resolved path)?"""
        raw = self.cached_object(ref)
        if raw is None:
            return False
        try:
            return self.target_of(ModelObject.from_dict(ref.kind, raw)).id == target.id
        except (InvalidModel, Invalid):
            return False

    def _shape_filter(self, obj: ModelObject) -> str | None:
        """Spec 3.3: the node's shape alias for TensorRT-LLM serving models (of a source with a shape filter).

        Taken from the Node's current labels (OME computes it once at start-up).
        """
        fmt = obj.spec.model_format.name if obj.spec.model_format is not None else None
        if fmt != "tensorrtllm" or obj.spec.additional_metadata.get("type", "Serving") != "Serving":
            return None
        return instance_shape_alias(self.node_labels(), self.ctx.instance_type_map)

    async def _write_progress(self, ref: ModelRef, obj: ModelObject, p: Progress, started: float) -> None:
        try:
            await self._publish_state(ref, obj, ModelState.UPDATING, progress=p, started=started)
        except (ApiError, ApiUnavailable) as exc:
            log.warning("progress write failed", key=ref.key, error=str(exc))

    def _parse_metadata(self, obj: ModelObject, dest: Path, total: int) -> dict[str, Any] | None:
        if skip_config_parsing(obj):
            return None
        try:
            parsed = parse_model_dir(dest, total_size_bytes=total)
        except MetadataError as exc:
            log.info("no model metadata", dest=str(dest), reason=exc.reason)
            return None
        return _metadata_record(parsed)

    async def _adopt_in_place(
        self,
        ref: ModelRef,
        obj: ModelObject,
        raw: dict[str, Any],
        target: Target,
        superseded: Manifest | None = None,
    ) -> None:
        """local:// and vendor://: nothing to fetch; record and parse, never own the files.

        A ``local://`` directory's files (bounded listing: path, size, mtime) go into the manifest, so the fast
        check notices when they vanish. The superseded copy, if any, is retired only now that the new target is
        known to be there, and before the new record replaces the old one (one manifest per key).
        """
        ctx = self.ctx
        metadata: dict[str, Any] | None = None
        files: list[FileRecord] = []
        if target.storage_type == StorageType.LOCAL:
            if not target.dest.is_dir():
                await self._fail(ref, raw, "LocalPathNotFound", _local_failure_message(target, [], "LocalPathNotFound"))
                ctx.requeue_after(ref.key, 30.0)
                return
            uid, generation = obj.metadata.uid, obj.metadata.generation
            await asyncio.to_thread(self.crash_records.begin, ref.key, uid, generation, Step.METADATA)
            try:
                files = await asyncio.to_thread(list_local_files, target.dest)
                metadata = await asyncio.to_thread(self._parse_metadata, obj, target.dest, 0)
            finally:
                await asyncio.shield(asyncio.to_thread(self.crash_records.end, ref.key))
        manifest = Manifest(
            key=ref.key,
            uid=obj.metadata.uid,
            storage_uri=target.storage_uri,
            dest=str(target.dest),
            generation=obj.metadata.generation,
            source_type=target.storage_type.value,
            owned=False,
            files=files,
            metadata=metadata,
        )
        manifest.verified_at = time.time()
        if superseded is not None:
            await ctx.remover.replace_superseded(ref, superseded, target.id)
        await asyncio.to_thread(ctx.manifests.save, manifest, target.root)
        await asyncio.to_thread(self.crash_records.finished, ref.key)
        ctx.metrics.downloads_success.labels(*_metric_labels(ref)).inc()
        await self._publish_state(ref, obj, ModelState.READY, manifest=manifest)
        self._enrich_spec_later(ref, obj, raw, manifest)

    async def _restore_from_trash(
        self, ref: ModelRef, obj: ModelObject, target: Target, superseded: Manifest | None = None
    ) -> bool:
        """Rename a trashed copy of the target back; the superseded copy is retired only once it checks out."""
        ctx = self.ctx
        if target.dest.exists():
            return False
        entry = ctx.trash.find_restorable(target.storage_uri, str(target.dest), accept=restorable_by(obj))
        if entry is None:  # none, or only another owner's copy: that one stays in the trash, this one fetches
            return False
        manifest = entry.manifest
        await asyncio.to_thread(ctx.trash.restore, entry)
        manifest.key = ref.key
        manifest.uid = obj.metadata.uid
        if manifest.fast_check():
            log.warning("restored copy failed its check; fetching", key=ref.key)
            return False
        if superseded is not None:
            try:
                await ctx.remover.replace_superseded(ref, superseded, target.id)
            except Requeue:
                # The old copy cannot be retired yet (settling, breaker, unproven read) and keeps the key's only
                # record: put the restored copy back into the trash, where it was recorded, rather than leave it
                # at its path with no manifest (the next pass would fetch it again). The next pass restores it.
                await asyncio.to_thread(ctx.trash.quarantine, manifest, target.root, "restore deferred")
                raise
        await asyncio.to_thread(ctx.manifests.save, manifest, target.root)
        ctx.metrics.restored.inc()
        ctx.events.emit(
            ObjectRef.of(self.cached_object(ref) or {}),
            NORMAL,
            "Restored",
            f"weights restored from the trash on node {ctx.node_name} without a download",
        )
        return True

    # ----------------------------------------------------------------------------- publishing state

    async def _publish_state(
        self,
        ref: ModelRef,
        obj: ModelObject,
        state: ModelState,
        *,
        manifest: Manifest | None = None,
        progress: Progress | None = None,
        started: float | None = None,
        reason: str | None = None,
    ) -> None:
        """Write the ConfigMap entry and the node label; for ``Ready`` the entry first, the label after it.

        A ``Ready`` label sends inference pods to this node, so it must never say more than the entry does: the
        label is written only after the entry write succeeded (a failed entry write raises, and the label keeps
        its old value). Other states leave ``Ready`` and are written together.

        ``Ready`` and ``Updating`` pass the lifecycle gate first (agent/lifecycle.py): for an object whose
        deletion began since the reconcile read it, or a write of an earlier incarnation (a late progress write),
        nothing is written; the key's next reconcile hands it to the removal.
        """
        ctx = self.ctx
        step = {ModelState.READY: LifeStep.WRITE_READY, ModelState.UPDATING: LifeStep.WRITE_UPDATING}.get(state)
        if step is not None and not self._may(step, ref, obj):
            return
        current = ModelEntry.from_json(ctx.configmap.data().get(ref.configmap_key, "") or "")
        config = _config_from_record(manifest.metadata) if manifest is not None and manifest.metadata else None
        if config is None and current is not None and state != ModelState.READY:
            config = current.config
        entry_progress = None
        sources = None
        if state == ModelState.UPDATING and progress is not None:
            elapsed = max(1e-6, time.monotonic() - started) if started else 0.0
            entry_progress = DownloadProgress(
                phase=progress.phase,
                total_bytes=progress.total_bytes,
                completed_bytes=progress.completed_bytes,
                total_files=progress.total_files,
                completed_files=progress.completed_files,
                speed_bytes_per_sec=round(progress.completed_bytes / elapsed, 1) if elapsed else 0.0,
                last_updated=rfc3339(_utcnow()),
            )
            sources = by_source(progress)
            if current is not None and current.status == state and current.progress is not None and not started:
                entry_progress = current.progress  # keep the last progress write; no churn
                sources = current.bytes_by_source
        elif state == ModelState.READY:  # where the Ready copy's bytes came from: its fetch's counts, else kept
            sources = ctx.fetcher.bytes_by_source(ref.key)
            if sources is None and current is not None and current.status == ModelState.READY:
                sources = current.bytes_by_source
        entry = ModelEntry(
            name=ref.name,
            status=state.value,
            config=config,
            progress=entry_progress,
            reason=(reason or "") if state == ModelState.FAILED else "",
            bytes_by_source=sources,
        )
        entry = _with_storage(entry, self.cached_object(ref) or {})
        value = entry.to_json()
        if state == ModelState.READY:
            await ctx.configmap.ensure(ref.configmap_key, value)
            if self._may(LifeStep.WRITE_READY, ref, obj):  # again: the deletion may have begun during the entry write
                await ctx.labels.ensure(ref.label_key, state.value)
            return
        # Leaving Ready (or never there): both writes are level-triggered and batched; together halves latency.
        await asyncio.gather(
            ctx.labels.ensure(ref.label_key, state.value), ctx.configmap.ensure(ref.configmap_key, value)
        )

    def _may(self, step: LifeStep, ref: ModelRef, obj: ModelObject) -> bool:
        """The lifecycle gate (agent/lifecycle.py) for ``step`` of ``obj``'s incarnation, on the cache now."""
        now = presence(self.cached_object(ref), obj.metadata.uid)
        if gate(step, now):
            return True
        log.info("not done: the object is not wanted now", key=ref.key, step=step.value, now=now.value)
        return False

    async def _fail(self, ref: ModelRef, raw: dict[str, Any], reason: str, message: str) -> None:
        ctx = self.ctx
        if self._failed_quota is None:
            self._failed_quota = failed_quota(ctx.max_failed_per_namespace, ctx.metrics.registry)
        if self._models_quota is not None and reason != MODELS_OVER_QUOTA:
            self._models_quota.release(ref)  # it shows Failed now: its Ready/Updating place is free
        quota = self._failed_quota
        room = quota.decide(ref, ctx.labels.labels().get(ref.label_key), ctx.configmap.data())
        if not room.admitted:  # the namespace's failing models fill their share of this node: no label, no entry
            await asyncio.gather(ctx.labels.ensure(ref.label_key, None), ctx.configmap.ensure(ref.configmap_key, None))
            if room.newly_refused:
                note = (
                    f"{message} (not shown on node {ctx.node_name}: {OVER_QUOTA}, namespace {ref.namespace} already "
                    f"shows {quota.limit} failed models here, --max-failed-per-namespace)"
                )
                ctx.events.emit(ObjectRef.of(raw), WARNING, reason, note)
                log.warning("model failed", key=ref.key, reason=reason, message=message, shown=False, rule=OVER_QUOTA)
            return
        already = ctx.labels.labels().get(ref.label_key) == ModelState.FAILED.value
        current = ModelEntry.from_json(ctx.configmap.data().get(ref.configmap_key, "") or "")
        entry = ModelEntry(
            name=ref.name,
            status=ModelState.FAILED.value,
            config=current.config if current else None,
            reason=f"{reason}: {message}",
        )
        entry = _with_storage(entry, raw)
        value = entry.to_json()
        changed_entry = ctx.configmap.data().get(ref.configmap_key) != value
        await ctx.labels.ensure(ref.label_key, ModelState.FAILED.value)
        await ctx.configmap.ensure(ref.configmap_key, value)
        if not already or changed_entry:
            ctx.metrics.downloads_failed.labels(*_metric_labels(ref)).inc()
            if reason == "RateLimited":  # OME's pair: a count and a (nominal 30 s) wait observation
                ctx.metrics.rate_limit.labels(*_metric_labels(ref)).inc()
                ctx.metrics.rate_limit_wait.labels(*_metric_labels(ref)).observe(30)
            ctx.events.emit(ObjectRef.of(raw), WARNING, reason, message)
            log.warning("model failed", key=ref.key, reason=reason, message=message)

    async def stop_background(self) -> None:
        """Cancel spec enrichment still waiting or running (informational; the next start retries it)."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _enrich_spec_later(self, ref: ModelRef, obj: ModelObject, raw: dict[str, Any], manifest: Manifest) -> None:
        """Spec enrichment is informational: run it beside the reconcile loop, a few at a time."""
        if obj.metadata.uid in self._enriched or not manifest.metadata:
            return
        task = asyncio.get_running_loop().create_task(self._enrich_spec(ref, obj, raw, manifest))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _enrich_spec(self, ref: ModelRef, obj: ModelObject, raw: dict[str, Any], manifest: Manifest) -> None:
        """Fill empty spec fields from parsed metadata, once per UID, with a merge patch of only those fields.

        OME's agent rewrote ``modelConfiguration`` with a full Update from every node; here a field that is
        set is never touched, so after the first node nothing is written at all.
        """
        if obj.metadata.uid in self._enriched or not manifest.metadata:
            return
        spec = raw.get("spec") or {}
        wanted: dict[str, Any] = manifest.metadata.get("spec") or {}
        patch = {k: v for k, v in wanted.items() if v not in (None, "", [], {}) and not _is_set(spec.get(k))}
        if "modelFormat" in patch and isinstance(spec.get("modelFormat"), dict) and spec["modelFormat"].get("name"):
            del patch["modelFormat"]
        self._enriched.add(obj.metadata.uid)
        if not patch:
            return
        resource = MODEL_RESOURCES[ref.kind.value]
        while self.ctx.busy():  # noqa: ASYNC110 - labels and entries first: scheduling waits for them
            await asyncio.sleep(0.5)
        try:
            async with self._enrich_slots:
                await self.ctx.client.request(
                    "PATCH",
                    resource.path(ref.namespace or None, ref.name),
                    body={"metadata": {"uid": obj.metadata.uid}, "spec": patch},
                    content_type="application/merge-patch+json",
                )
        except (ApiError, ApiUnavailable) as exc:
            log.info("spec enrichment skipped", key=ref.key, error=str(exc))


def _with_storage(entry: ModelEntry, raw: Mapping[str, Any]) -> ModelEntry:
    """``entry`` with ``storageUri`` and ``storagePath``: the spec its state was computed for (the URI as written; the
    path as written, or a ``local://`` URI's own path). Read from the raw object, so a spec that failed to
    validate still names what failed; a value of the wrong type is left out."""
    spec = raw.get("spec")
    storage = spec.get("storage") if isinstance(spec, Mapping) else None
    if not isinstance(storage, Mapping):
        return entry
    uri = storage.get("storageUri")
    path = storage.get("path")
    uri = uri if isinstance(uri, str) else ""
    if not (isinstance(path, str) and path):
        path = ""
        if uri.startswith("local://"):
            with contextlib.suppress(InvalidStorageUri):
                path = parse_local_uri(uri).path
    return dataclasses.replace(entry, storage_uri=uri, storage_path=path)


def _local_failure_message(target: Target, problems: list[str], reason: str) -> str:
    if reason == "LocalFilesChanged":
        missing = [p.rsplit(": ", 1)[0] for p in problems if p.endswith(": missing")]
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return (
            f"{len(missing)} files that {target.dest} held when it was adopted are gone ({shown}); restore them, "
            "or re-create the model to adopt the directory as it is now"
        )
    return f"{target.dest} does not exist on this node"


def _is_set(value: Any) -> bool:
    return value not in (None, "", [], {})


def _metric_labels(ref: ModelRef) -> tuple[str, str, str]:
    return (ref.kind.value, ref.namespace, ref.name)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _metadata_record(parsed: ParsedMetadata) -> dict[str, Any]:
    """What a manifest keeps of parsed metadata: the ConfigMap ``config`` and the spec enrichment."""
    spec: dict[str, Any] = {
        "modelType": parsed.model_type,
        "modelArchitecture": parsed.model_architecture,
        "modelFramework": parsed.model_framework.to_json(),
        "modelParameterSize": parsed.model_parameter_size,
        "modelCapabilities": list(parsed.capabilities),
        "quantization": parsed.quantization,
        "modelConfiguration": dict(parsed.decoded_configuration),
        "modelFormat": parsed.model_format.to_json(),
    }
    if parsed.diffusion_pipeline is not None:
        spec["diffusionPipeline"] = parsed.diffusion_pipeline.to_spec()
    return {"config": parsed.to_config_entry(), "spec": spec}


def _config_from_record(metadata: dict[str, Any]) -> ModelConfig | None:
    """The entry ``config`` a manifest recorded for the model (None when it holds none, or a malformed one)."""
    return ModelConfig.from_document(metadata.get("config"))
