"""The one destructive path. Every removal of a label, a ConfigMap entry or weights goes through here.

:meth:`Remover.remove` takes a :class:`Candidate` (a model key, the UID the local records hold, the local
manifest, and why it is suspected gone) and:

1. proves absence with :func:`~model_agent.agent.confirm.confirm_absence` (a live read with a deadline);
   an unknown outcome raises :class:`Requeue` (backoff) and an alive object drops the rumour — for a
   "no longer selects this node" candidate the live object is re-evaluated against the live Node;
2. asks the :class:`~model_agent.agent.breaker.Breaker` (settle period, mass-removal hold);
3. acts, in this order: cancel a running fetch; move owned weights to the trash (never the weights a live
   successor or another live model with the same path needs; never for ``reserve-model-artifact``, nor
   for ``local://``/``vendor://``/``pvc://`` sources); remove the node label; remove the ConfigMap entry;
   delete the manifest. A kill between steps is safe: the manifest (the record that drives a retry) goes
   last, and every step is idempotent.

Each decision is counted (``model_agent_delete_confirmations{outcome}``) and each act or refusal is an Event.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from model_agent.agent.breaker import Breaker, Verdict
from model_agent.agent.confirm import Confirmation, Confirmer, Outcome, confirm_absence
from model_agent.agent.fetcher import Fetcher
from model_agent.agent.node_configmap import NodeConfigMap
from model_agent.agent.node_labels import NodeLabels
from model_agent.agent.requeue import Requeue
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import NODES
from model_agent.local.layout import Layout, PathRefused, token_for
from model_agent.local.manifest import Manifest, ManifestStore
from model_agent.local.trash import Trash
from model_agent.model.keys import ModelKind
from model_agent.model.resources import InvalidModel, ModelObject, ModelRef, reserve_artifact
from model_agent.model.selection import node_selected
from model_agent.ops.events import NORMAL, WARNING, EventRecorder, ObjectRef
from model_agent.ops.metrics import Metrics

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Candidate:
    ref: ModelRef
    uid: str
    manifest: Manifest | None
    why: str


@dataclass
class RemovalContext:
    client: KubeClient
    node_name: str
    layout: Layout
    manifests: ManifestStore
    trash: Trash
    labels: NodeLabels
    configmap: NodeConfigMap
    fetcher: Fetcher
    events: EventRecorder
    metrics: Metrics
    breaker: Breaker
    cached_models: Callable[[], Iterable[dict[str, Any]]]
    confirm_deadline_s: float = 10.0
    # Called with a live object that a confirmation read found alive: the cache had lost it (a phantom
    # delete, a relist that omitted it), and the live read is the freshest state there is.
    repair_cache: Callable[[dict[str, Any]], None] = lambda _obj: None
    # Coalesces storms into one LIST per kind; None: one GET per candidate.
    confirmer: Confirmer | None = None


class Remover:
    def __init__(self, ctx: RemovalContext) -> None:
        self.ctx = ctx

    # ------------------------------------------------------------------------------------ entry points

    async def remove(self, candidate: Candidate) -> bool:
        """Remove everything of a model that is proven gone; True when something was removed."""
        ctx = self.ctx
        ref = candidate.ref
        confirmation = await self._confirm(ref, candidate.uid)
        ctx.metrics.confirmations.labels(confirmation.outcome.value).inc()
        if confirmation.outcome == Outcome.READ_FAILED:
            log.warning("absence unproven; will retry", key=ref.key, why=candidate.why, detail=confirmation.detail)
            if confirmation.type_gone:
                ctx.breaker.suspect(ref.key, total_models=self._model_count())
            raise Requeue(f"confirmation read failed: {confirmation.detail}")
        if confirmation.outcome == Outcome.ALIVE_SAME_UID and not await self._deselected(confirmation):
            ctx.breaker.forget(ref.key)
            if confirmation.live is not None:
                ctx.repair_cache(confirmation.live)
            log.info("removal rumour dropped: the object is alive", key=ref.key, why=candidate.why)
            return False
        if (
            confirmation.outcome == Outcome.RECREATED_NEW_UID
            and candidate.manifest is not None
            and _wants(confirmation.live, candidate.manifest.storage_uri, candidate.manifest.dest)
            and not await self._deselected(confirmation)
        ):
            # A successor with the same source and path: its weights are these. Adopt, do not remove.
            ctx.breaker.forget(ref.key)
            manifest = candidate.manifest
            manifest.uid = str(((confirmation.live or {}).get("metadata") or {}).get("uid") or "")
            await asyncio.to_thread(ctx.manifests.save, manifest, ctx.layout.record_root(Path(manifest.dest)))
            log.info("recreated object adopts the existing weights", key=ref.key)
            return False
        reserved = False
        if confirmation.live is not None and confirmation.outcome != Outcome.RECREATED_NEW_UID:
            reserved = self._reserved(ref, confirmation.live)
        decision = ctx.breaker.decide(ref.key, total_models=self._model_count())
        if decision.verdict == Verdict.HELD:
            ctx.events.emit(
                self._ref_for_event(ref, candidate, confirmation),
                WARNING,
                "RemovalHeld",
                f"removal from node {ctx.node_name} held by the delete breaker ({candidate.why})",
            )
            raise Requeue("delete breaker open", decision.delay_s)
        if decision.verdict == Verdict.WAIT:
            raise Requeue("settling", decision.delay_s)
        await self._act(candidate, confirmation, reserved)
        return True

    async def replace_superseded(
        self, ref: ModelRef, manifest: Manifest, new_target: str, *, from_fetch: bool = False
    ) -> None:
        """The live spec points at another source or path: retire the old copy (to the trash)."""
        ctx = self.ctx
        confirmation = await self._confirm(ref, manifest.uid)
        if confirmation.outcome == Outcome.READ_FAILED:
            raise Requeue(f"confirmation read failed: {confirmation.detail}")
        live = confirmation.live
        if live is not None and confirmation.outcome == Outcome.ALIVE_SAME_UID:
            storage = (live.get("spec") or {}).get("storage") or {}
            if storage.get("storageUri") == manifest.storage_uri and (storage.get("path") or "") == manifest.dest:
                raise Requeue("cache and server disagree about the spec; waiting for the watch")
        if not from_fetch:  # called by the new copy's own fetch job, which must not cancel itself
            await ctx.fetcher.cancel(ref.key)
        # From a fetch the new copy is complete in staging and replaces the old one even at the same path;
        # otherwise (a local:// or restored copy taking over) the new spec may be using that very directory.
        needed = self._needed_elsewhere(ref, Path(manifest.dest), None if from_fetch else new_target)
        if manifest.owned and not needed:
            await self._quarantine(manifest, "superseded by a new spec")
        await asyncio.to_thread(ctx.manifests.delete, ref.key)

    # ----------------------------------------------------------------------------------------- helpers

    async def _confirm(self, ref: ModelRef, uid: str) -> Confirmation:
        if self.ctx.confirmer is not None:
            return await self.ctx.confirmer.confirm(ref, uid)
        return await confirm_absence(self.ctx.client, ref, uid, deadline_s=self.ctx.confirm_deadline_s)

    async def _deselected(self, confirmation: Confirmation) -> bool:
        """For an alive object: does it (live) no longer select this node (live)?

        The cached Node answers "still selected" for free (no removal follows from it); only a "no longer
        selected" answer is destructive, so only that one is confirmed with a live read of the Node.
        """
        live = confirmation.live or {}
        try:
            obj = ModelObject.from_dict(str(live.get("kind") or ""), live)
        except InvalidModel:
            return False
        if node_selected(obj.spec.storage, self.ctx.labels.labels(), self.ctx.node_name):
            return False
        try:
            node = await self.ctx.client.request("GET", NODES.path(name=self.ctx.node_name))
        except (ApiError, ApiUnavailable) as exc:
            raise Requeue(f"live read of the Node failed: {exc}") from None
        labels = (node.get("metadata") or {}).get("labels") or {}
        return not node_selected(obj.spec.storage, labels, self.ctx.node_name)

    def _reserved(self, ref: ModelRef, live: dict[str, Any]) -> bool:
        try:
            return reserve_artifact(ModelObject.from_dict(ref.kind, live))
        except InvalidModel:
            return False

    def _model_count(self) -> int:
        return sum(1 for _ in self.ctx.manifests.all())

    def _ref_for_event(self, ref: ModelRef, candidate: Candidate, confirmation: Confirmation) -> ObjectRef:
        if confirmation.live is not None:
            return ObjectRef.of(confirmation.live)
        return ObjectRef(ref.kind.value, "ome.io/v1beta1", ref.name, ref.namespace, candidate.uid)

    def _keys_of_other_live_models(self, ref: ModelRef) -> set[str]:
        keys: set[str] = set()
        for raw in self.ctx.cached_models():
            meta = raw.get("metadata") or {}
            try:
                other = ModelRef(
                    ModelKind(str(raw.get("kind"))), str(meta.get("namespace") or ""), str(meta.get("name"))
                )
            except ValueError:
                continue
            if other != ref and not meta.get("deletionTimestamp"):
                keys.update((other.label_key, other.configmap_key))
        return keys

    def _needed_elsewhere(self, ref: ModelRef, dest: Path, new_target: str | None = None) -> bool:
        """Does another live model (or this model's new spec) use this destination or a path inside it?"""
        if new_target is not None and new_target.endswith(f"|{dest}"):
            return True
        for raw in self.ctx.cached_models():
            meta = raw.get("metadata") or {}
            storage = ((raw.get("spec") or {}).get("storage")) or {}
            path = storage.get("path")
            if not path or meta.get("deletionTimestamp"):
                continue
            same = (str(raw.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name"))) == (
                ref.kind.value,
                ref.namespace,
                ref.name,
            )
            if same and new_target is None:
                continue
            try:
                _, resolved = self.ctx.layout.confine(path)
            except PathRefused:
                continue
            if not same and (resolved == dest or dest in resolved.parents):
                return True
        return False

    async def _quarantine(self, manifest: Manifest, reason: str) -> None:
        ctx = self.ctx
        try:
            root = ctx.layout.root_of(Path(manifest.dest))
        except PathRefused:
            log.error("refusing to quarantine a path outside the roots", dest=manifest.dest)
            return
        entry = await asyncio.to_thread(ctx.trash.quarantine, manifest, root, reason)
        if entry is not None:
            ctx.metrics.quarantined.inc()
            log.info("weights quarantined", key=manifest.key, dest=manifest.dest, trash=str(entry.directory))

    async def _act(self, candidate: Candidate, confirmation: Confirmation, reserved: bool) -> None:
        ctx = self.ctx
        ref = candidate.ref
        await ctx.fetcher.cancel(ref.key)
        ctx.fetcher.clear_failure(ref.key)
        # Re-read the record now that no fetch can publish: one may have finished during the confirmation read.
        manifest = ctx.manifests.load(ref.key) or candidate.manifest
        kept = ""
        if manifest is not None and manifest.owned:
            if reserved:
                kept = " (weights kept: reserve-model-artifact)"
            elif self._needed_elsewhere(ref, Path(manifest.dest)):
                kept = " (weights kept: another live model uses this path or one inside it)"
            else:
                await self._quarantine(manifest, candidate.why)
        for root in ctx.layout.roots:
            shutil.rmtree(root.staging / token_for(ref.key), ignore_errors=True)
        # A truncated label or ConfigMap key can be shared with (or read back from) another, live model's key:
        # never remove a key that a cached live model owns.
        owned_by_others = self._keys_of_other_live_models(ref)
        if ref.label_key not in owned_by_others:
            await ctx.labels.ensure(ref.label_key, None)
        if ref.configmap_key not in owned_by_others:
            await ctx.configmap.ensure(ref.configmap_key, None)
        await asyncio.to_thread(ctx.manifests.delete, ref.key)
        ctx.events.emit(
            self._ref_for_event(ref, candidate, confirmation),
            NORMAL,
            "Removed",
            f"removed from node {ctx.node_name} after {confirmation.outcome.value} ({candidate.why}){kept}",
        )
        log.info("model removed", key=ref.key, outcome=confirmation.outcome.value, why=candidate.why)


def _wants(live: dict[str, Any] | None, storage_uri: str, dest: str) -> bool:
    storage = ((live or {}).get("spec") or {}).get("storage") or {}
    return bool(storage.get("storageUri") == storage_uri and (storage.get("path") or "") == dest)
