"""The one destructive path. Every removal of a label, a ConfigMap entry or weights goes through here.

:meth:`Remover.remove` takes a :class:`Candidate` (a model key, the UID the local records hold, the local
manifest, and why it is suspected gone) and:

1. proves absence with :func:`~model_agent.agent.confirm.confirm_absence` (a live read with a deadline);
   an unknown outcome raises :class:`Requeue` (backoff) and an alive object drops the rumour — for a
   "no longer selects this node" candidate the live object is re-evaluated against the live Node;
2. asks the :class:`~model_agent.agent.breaker.Breaker` for a verdict (settle period, mass-removal hold);
3. re-checks the cache: an object of that key with a UID the confirmation did not see, not being deleted,
   means the model was re-created meanwhile — nothing is done, the key is looked at again;
4. acts, in this order: cancel a running fetch (for a deleting or gone object, already before the breaker's
   verdict: stopping a download destroys nothing); record the intent (``removing`` in the manifest); remove
   the node label; remove the ConfigMap entry; move owned weights to the trash; delete the manifest. No
   label says ``Ready`` while the weights are not in place, whenever the process dies; the manifest (the
   record that drives a retry, and after a restart the completion of the recorded intent, which is
   confirmed again first) goes last, and every step is idempotent;
5. tells the breaker the act happened (:meth:`~model_agent.agent.breaker.Breaker.record`) — only now, so a
   removal that fails and is retried (the trash refuses the path, a write fails) is never counted twice.

Weights are never moved when a live successor or another live model uses that path, for ``local://``,
``vendor://`` and ``pvc://`` sources (not owned), nor when the model is reserved
(``models.ome/reserve-model-artifact``): by the live object, by the manifest (recorded when the model was
last published Ready), or by the last state the watch delivered for that UID (:meth:`Remover.note_last_state`
— after a plain delete the live read answers 404 and only the last state still carries the label).

:meth:`Remover.replace_superseded` retires a copy the live spec no longer points at, through the same
breaker (decide, act, record) and in the same order (intent, weights, record); held, it raises
:class:`Requeue` and the old copy stays.

Each decision is counted (``model_agent_delete_confirmations{outcome}``) and each act or refusal is an Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from model_agent.agent.artifact_reuse import parent_of_spec, release_child
from model_agent.agent.breaker import Breaker, Verdict
from model_agent.agent.confirm import Confirmation, Confirmer, Outcome, confirm_absence
from model_agent.agent.node_parts import NodeParts
from model_agent.agent.requeue import Requeue
from model_agent.agent.shared_root import FULL, GUARD_LOST, RemovalPlan, SharedRoots, confirmed_gone
from model_agent.kube import objects
from model_agent.kube.client import ApiError, ApiUnavailable
from model_agent.kube.resources import NODES
from model_agent.local.inventory import delete_discarded, discard
from model_agent.local.layout import Layout, PathRefused, token_for
from model_agent.local.manifest import Manifest
from model_agent.model.keys import RESERVE_MODEL_ARTIFACT_LABEL
from model_agent.model.reasons import EventReason
from model_agent.model.resources import InvalidModel, ModelObject, ModelRef
from model_agent.model.selection import node_selected
from model_agent.ops.events import NORMAL, WARNING, ObjectRef

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A model suspected gone from this node: a rumour to confirm, with the UID and manifest the agent holds."""

    ref: ModelRef
    uid: str
    manifest: Manifest | None
    why: str


@dataclass
class RemovalContext(NodeParts):
    """The collaborators a removal needs (the node's parts and these), handed in once by the agent's wiring."""

    breaker: Breaker
    cached_models: Callable[[], Iterable[dict[str, Any]]]
    confirm_deadline_s: float = 10.0
    # Called with a live object that a confirmation read found alive: the cache had lost it (a phantom
    # delete, a relist that omitted it), and the live read is the freshest state there is. With the time the read
    # started (Confirmation.read_at): the cache takes it only if it heard nothing of the key since.
    repair_cache: Callable[[dict[str, Any], float | None], None] = lambda _obj, _read_at: None
    # Coalesces storms into one LIST per kind; None: one GET per candidate.
    confirmer: Confirmer | None = None
    # Shared models roots (agent/shared_root.py): which steps this node may take; None: every root is private.
    shared_roots: SharedRoots | None = None


class Remover:
    """The one destructive path (see the module contract): confirm, ask the breaker, act in order, record."""

    def __init__(self, ctx: RemovalContext) -> None:
        self.ctx = ctx
        # (key, uid) of objects whose last state heard from the watch carried reserve-model-artifact. A plain
        # delete leaves the label only there (the live read answers 404); the manifest keeps it across restarts.
        self._last_reserved: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------------------------ entry points

    def wanted(self, key: str) -> None:
        """The model is wanted here again: it is no longer a pending removal the breaker counts."""
        self.ctx.breaker.forget(key)

    def note_last_state(self, key: str, obj: dict[str, Any]) -> None:
        """Fed with every model change: the new state, or for a delete the last state the store held."""
        uid = objects.uid(obj)
        if not uid:
            return
        if _reserved_in(obj):
            self._last_reserved.add((key, uid))
        else:
            self._last_reserved.discard((key, uid))

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
                ctx.repair_cache(confirmation.live, confirmation.read_at)
            await self._void_intent(ref)
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
            manifest.uid = objects.uid(confirmation.live)
            manifest.removing = ""
            await asyncio.to_thread(ctx.manifests.save, manifest, ctx.layout.record_root(Path(manifest.dest)))
            log.info("recreated object adopts the existing weights", key=ref.key)
            return False
        if confirmation.outcome in (Outcome.CONFIRMED_GONE, Outcome.DELETING):
            # Its download stops now, not after the settle period: stopping destroys nothing (staging stays until
            # the act below), and no byte more is fetched for an object whose deletion is proven.
            await ctx.fetcher.cancel(ref.key)
        # A removal decided (and begun) before a restart already passed its settle period.
        recorded = candidate.manifest is not None and bool(candidate.manifest.removing)
        if recorded:
            log.info("completing a removal recorded before a restart", key=ref.key, why=candidate.why)
        held = f"removal from node {ctx.node_name} held by the delete breaker ({candidate.why})"
        self._pass_breaker(ref.key, recorded, self._ref_for_event(ref, candidate, confirmation), held, "")
        # A shared root: a deselected node drops only its label and entry; files move once, by one node. The plan
        # is decided from the record the act works on (the reconciler hands a peers' record over as None) and the
        # root of its destination, never from "no manifest"; with no record at all, from the live spec's path.
        shared = ctx.shared_roots
        on_disk = await asyncio.to_thread(ctx.manifests.load, ref.key) if shared else None
        acted_on = on_disk or candidate.manifest
        dest = acted_on.dest if acted_on is not None else _spec_dest(confirmation.live, ctx.layout)
        gone = confirmed_gone(confirmation.outcome, confirmation.live, candidate.manifest)
        turn = shared.removal_turn(ref.key, dest, gone, candidate.uid) if shared else contextlib.nullcontext(FULL)
        async with turn as plan:
            await self._act(candidate, confirmation, plan)
        ctx.breaker.record(ref.key)
        return True

    async def replace_superseded(
        self, ref: ModelRef, manifest: Manifest, new_target: str, *, from_fetch: bool = False
    ) -> None:
        """The live spec points at another source or path: retire the old copy (to the trash).

        Counted by the breaker like a removal (under a key naming the old copy, so the reconciler forgetting
        the model's own pending removal does not reset it); held or settling, it raises :class:`Requeue` and
        the old copy stays where it is.
        """
        ctx = self.ctx
        confirmation = await self._confirm(ref, manifest.uid)
        if confirmation.outcome == Outcome.READ_FAILED:
            raise Requeue(f"confirmation read failed: {confirmation.detail}")
        live = confirmation.live
        if live is not None and confirmation.outcome == Outcome.ALIVE_SAME_UID:
            storage = (live.get("spec") or {}).get("storage") or {}
            if storage.get("storageUri") == manifest.storage_uri and _same_dir(storage, manifest.dest):
                raise Requeue("cache and server disagree about the spec; waiting for the watch")
        act_key = superseded_key(ref, manifest)
        subject = (
            ObjectRef.of(live)
            if live is not None
            else ObjectRef(ref.kind.value, _API, ref.name, ref.namespace, manifest.uid)
        )
        held = f"retiring the old copy ({manifest.storage_uri}) on node {ctx.node_name} held by the delete breaker"
        self._pass_breaker(act_key, bool(manifest.removing), subject, held, "the old copy")
        if not from_fetch:  # called by the new copy's own fetch job, which must not cancel itself
            await ctx.fetcher.cancel(ref.key)
        # The record on disk may already be the new copy's (saved before this was called): never drop that one.
        current = await asyncio.to_thread(ctx.manifests.load, ref.key)
        still_old = current is not None and (current.storage_uri, current.dest) == (manifest.storage_uri, manifest.dest)
        if current is not None and still_old and not current.removing:
            current.removing = "superseded by a new spec"
            await asyncio.to_thread(ctx.manifests.save, current, ctx.layout.record_root(Path(current.dest)))
        # From a fetch the new copy is complete in staging and replaces the old one even at the same path;
        # otherwise (a local:// or restored copy taking over) the new spec may be using that very directory.
        needed = self._needed_elsewhere(ref, Path(manifest.dest), None if from_fetch else new_target)
        if manifest.owned and not needed:
            await self._quarantine(manifest, "superseded by a new spec")
        if still_old:
            await asyncio.to_thread(ctx.manifests.delete, ref.key)
        ctx.breaker.record(act_key)

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
        labels = objects.labels(node)
        return not node_selected(obj.spec.storage, labels, self.ctx.node_name)

    async def _void_intent(self, ref: ModelRef) -> None:
        """The object is alive after all: a removal intent recorded for it (before a restart) is void."""
        manifest = await asyncio.to_thread(self.ctx.manifests.load, ref.key)
        if manifest is not None and manifest.removing:
            manifest.removing = ""
            await asyncio.to_thread(self.ctx.manifests.save, manifest, self.ctx.layout.record_root(Path(manifest.dest)))

    def _reserved(self, candidate: Candidate, confirmation: Confirmation, manifest: Manifest | None) -> bool:
        """Reserved by the live object, by the manifest, or by the last state heard for one of these UIDs."""
        key = candidate.ref.key
        live = confirmation.live
        # A successor's label speaks for the successor, not for these (the old object's) weights.
        if live is not None and confirmation.outcome != Outcome.RECREATED_NEW_UID and _reserved_in(live):
            return True
        if manifest is not None and manifest.reserved:
            return True
        uids = {candidate.uid, manifest.uid if manifest is not None else ""} - {""}
        return any((key, uid) in self._last_reserved for uid in uids)

    def _pass_breaker(self, key: str, settled: bool, subject: ObjectRef, held: str, what: str) -> None:
        """Ask the delete breaker about removing ``key`` (``what``: ``""`` for the model itself, else the thing
        retired); while it holds, a Warning ``held`` on ``subject`` and :class:`Requeue`; while it settles,
        :class:`Requeue` with no Event."""
        decision = self.ctx.breaker.decide(key, total_models=self._model_count(), settled=settled)
        if decision.verdict == Verdict.HELD:
            self.ctx.events.emit(subject, WARNING, EventReason.REMOVAL_HELD, held)
            raise Requeue(f"delete breaker open; {what} stays" if what else "delete breaker open", decision.delay_s)
        if decision.verdict == Verdict.WAIT:
            raise Requeue(f"settling before {what} is retired" if what else "settling", decision.delay_s)

    def _model_count(self) -> int:
        """The breaker's denominator: this node's models. On a shared root the records are the fleet's (every node
        writes them), so there the node's own model labels count: a node's mass deselection is a large share of
        its own models, however many the fleet has."""
        shared = self.ctx.shared_roots
        if shared is not None and shared.any_shared():
            return len(self.ctx.labels.model_labels())
        return self.ctx.manifests.count()

    def _ref_for_event(self, ref: ModelRef, candidate: Candidate, confirmation: Confirmation) -> ObjectRef:
        if confirmation.live is not None:
            return ObjectRef.of(confirmation.live)
        return ObjectRef(ref.kind.value, _API, ref.name, ref.namespace, candidate.uid)

    def _recreated_in_cache(self, ref: ModelRef, known_uids: set[str]) -> bool:
        """Does the cache now hold an object of this key with a UID the decision did not see, not deleting?"""
        for raw in self.ctx.cached_models():
            if _ref_of(raw) != ref or objects.deleting(raw):
                continue
            uid = objects.uid(raw)
            if uid and uid not in known_uids:
                return True
        return False

    def _keys_of_other_live_models(self, ref: ModelRef) -> set[str]:
        keys: set[str] = set()
        for raw in self.ctx.cached_models():
            other = _ref_of(raw)
            if other is not None and other != ref and not objects.deleting(raw):
                keys.update((other.label_key, other.configmap_key))
        return keys

    def _needed_elsewhere(
        self, ref: ModelRef, dest: Path, new_target: str | None = None, *, successor_of: set[str] | None = None
    ) -> bool:
        """Does another live model (or this model's new spec) use this destination or a path inside it?

        ``successor_of`` (a removal's confirmed-gone UIDs): on a shared root a live object of the same key with
        another UID (a successor, perhaps selecting other nodes only) that names this directory keeps it too:
        its own fetch retires the old copy, under its own control, and another node may be serving it already.
        """
        if new_target is not None and new_target.endswith(f"|{dest}"):
            return True
        for raw in self.ctx.cached_models():
            storage = ((raw.get("spec") or {}).get("storage")) or {}
            path = storage.get("path")
            if not path or objects.deleting(raw):
                continue
            same = _ref_of(raw) == ref
            if same and new_target is None and not self._shared_successor(raw, dest, successor_of):
                continue
            try:
                _, resolved = self.ctx.layout.confine(path)
            except PathRefused:
                continue
            resolved = parent_of_spec(raw, self.ctx.layout) or resolved  # a shared artifact, linked or not yet
            if (not same or new_target is None) and (resolved == dest or dest in resolved.parents):
                return True
        return False

    def _shared_successor(self, raw: dict[str, Any], dest: Path, gone_uids: set[str] | None) -> bool:
        """Is ``raw`` (same key) a successor of the removed object, with ``dest`` on a shared root?"""
        if gone_uids is None or objects.uid(raw) in gone_uids or self.ctx.shared_roots is None:
            return False
        shared, _ = self.ctx.shared_roots.shared_for(dest)
        return shared

    async def _quarantine(self, manifest: Manifest, reason: str) -> None:
        """Move the weights into the trash; :class:`Requeue` when the trash refuses or the move fails."""
        ctx = self.ctx
        try:
            root = ctx.layout.root_of(Path(manifest.dest))
        except PathRefused:
            log.error("refusing to quarantine a path outside the roots", dest=manifest.dest)
            return
        try:
            entry = await asyncio.to_thread(ctx.trash.quarantine, manifest, root, reason)
        except (PathRefused, OSError) as exc:
            log.error("weights could not be moved to the trash; will retry", key=manifest.key, error=str(exc))
            raise Requeue(f"the weights could not be moved to the trash: {exc}") from None
        if entry is not None:
            ctx.metrics.quarantined.inc()
            log.info("weights quarantined", key=manifest.key, dest=manifest.dest, trash=str(entry.directory))

    def _remove_staging(self, key: str) -> None:
        """Discard the key's staging (a rename out of ``staging/``, deleted after): on a shared root only an idle
        area, since another node may be fetching into it for a re-created object."""
        shared = self.ctx.shared_roots
        for root in self.ctx.layout.roots:
            staging = root.staging / token_for(key)
            if not staging.exists():
                continue
            if shared is not None and not shared.may_discard_staging(root, staging):
                continue
            discard(root, staging)
        delete_discarded(self.ctx.layout)

    async def _act(self, candidate: Candidate, confirmation: Confirmation, plan: RemovalPlan = FULL) -> None:
        ctx = self.ctx
        ref = candidate.ref
        live_uid = objects.uid(confirmation.live)
        known_uids = {candidate.uid, live_uid} - {""}
        if self._recreated_in_cache(ref, known_uids):
            self._back_off_for_a_successor(ref)
        await ctx.fetcher.cancel(ref.key)
        ctx.fetcher.clear_failure(ref.key)
        # Re-read the record now that no fetch can publish: one may have finished during the confirmation read.
        on_disk = await asyncio.to_thread(ctx.manifests.load, ref.key)
        manifest = on_disk or candidate.manifest
        if manifest is not None:
            known_uids.add(manifest.uid)
        if self._recreated_in_cache(ref, known_uids - {""}):  # the cancel awaited: look once more
            self._back_off_for_a_successor(ref)
        # The UIDs whose copy this removal may take away: never a live successor's (a re-created object).
        successor = live_uid if confirmation.outcome == Outcome.RECREATED_NEW_UID else ""
        gone_uids = {candidate.uid, manifest.uid if manifest is not None else ""} - {"", successor}
        # 1. The intent: from here on a restart finds this removal decided, and completes it once confirmed again.
        if on_disk is not None and not on_disk.removing and plan.write_intent:
            on_disk.removing = candidate.why or "removal"
            await asyncio.to_thread(ctx.manifests.save, on_disk, ctx.layout.record_root(Path(on_disk.dest)))
        # 2., 3. Label, then entry. A truncated label or ConfigMap key can be shared with (or read back from)
        # another, live model's key: never remove a key that a cached live model owns.
        owned_by_others = self._keys_of_other_live_models(ref)
        if ref.label_key not in owned_by_others:
            await ctx.labels.ensure(ref.label_key, None)
        if ref.configmap_key not in owned_by_others:
            await ctx.configmap.ensure(ref.configmap_key, None)
        # 4. The weights, only now that nothing advertises them: a shared artifact's link first (unless reserved,
        # and only where the plan lets the files go: on a shared root the link is every node's way to the files),
        # then the artifact itself like any weights (kept while another live model resolves to it).
        if plan.release_link and manifest is not None and not self._reserved(candidate, confirmation, manifest):
            await asyncio.to_thread(release_child, ctx.layout, ref.key)
        kept = ""
        if manifest is not None and manifest.owned:
            refused = ""
            if plan.move_files and ctx.shared_roots is not None:  # re-checked immediately before the move
                refused = await asyncio.to_thread(ctx.shared_roots.move_refused, ref.key, manifest, gone_uids)
            if refused == GUARD_LOST:
                raise Requeue(refused)
            if not plan.move_files:
                kept = plan.why_kept
            elif refused:
                kept = f" (weights not moved: {refused})"
                # A record in this node's own --state-dir describes a copy that is no longer there: it goes. A
                # shared record another node took over stays theirs.
                own_record = ctx.layout.record_root(Path(manifest.dest)).state is not None
                plan = dataclasses.replace(plan, delete_record=own_record, remove_staging=False)
            elif self._reserved(candidate, confirmation, manifest):
                kept = " (weights kept: reserve-model-artifact)"
            elif self._needed_elsewhere(ref, Path(manifest.dest), successor_of=gone_uids):
                kept = " (weights kept: another live model uses this path or one inside it)"
            else:
                try:
                    await self._quarantine(manifest, candidate.why)
                except Requeue as exc:
                    ctx.events.emit(
                        self._ref_for_event(ref, candidate, confirmation),
                        WARNING,
                        EventReason.REMOVAL_FAILED,
                        f"label and entry removed from node {ctx.node_name}, weights not moved yet: {exc.why}",
                    )
                    raise
        if plan.remove_staging:
            await asyncio.to_thread(self._remove_staging, ref.key)
        # 5. The record, last.
        if plan.delete_record:
            await asyncio.to_thread(ctx.manifests.delete, ref.key)
        self._last_reserved.difference_update((ref.key, uid) for uid in known_uids)
        ctx.events.emit(
            self._ref_for_event(ref, candidate, confirmation),
            NORMAL,
            EventReason.REMOVED,
            f"removed from node {ctx.node_name} after {confirmation.outcome.value} ({candidate.why}){kept}",
        )
        log.info("model removed", key=ref.key, outcome=confirmation.outcome.value, why=candidate.why)

    def _back_off_for_a_successor(self, ref: ModelRef) -> None:
        """A re-created object reached the cache after the confirming read: it is the reconciler's to handle."""
        self.ctx.breaker.forget(ref.key)
        log.info("removal abandoned: the cache now holds a re-created object", key=ref.key)
        raise Requeue("a re-created object appeared in the cache after the confirmation read")


_API = "ome.io/v1beta1"


def superseded_key(ref: ModelRef, manifest: Manifest) -> str:
    """The breaker's key for retiring one old copy of a model (its own removal counts under ``ref.key``)."""
    return f"{ref.key}@{manifest.storage_uri}|{manifest.dest}"


def _ref_of(raw: dict[str, Any]) -> ModelRef | None:
    try:
        return ModelRef.from_object(raw)
    except ValueError:
        return None


def _reserved_in(obj: dict[str, Any]) -> bool:
    """:func:`~model_agent.model.resources.reserve_artifact` for a raw object, read from its labels alone.

    Every model change passes here, so the spec is not parsed; an object too malformed to parse still
    keeps its weights when it says so.
    """
    return objects.labels(obj).get(RESERVE_MODEL_ARTIFACT_LABEL, "").lower() == "true"


def _spec_dest(live: dict[str, Any] | None, layout: Layout) -> str | None:
    """The directory a live object's spec names (confined to the roots), or None."""
    path = (((live or {}).get("spec") or {}).get("storage") or {}).get("path")
    if not isinstance(path, str) or not path:
        return None
    try:
        _, resolved = layout.confine(path)
    except PathRefused:
        return None
    return str(resolved)


def _wants(live: dict[str, Any] | None, storage_uri: str, dest: str) -> bool:
    storage = ((live or {}).get("spec") or {}).get("storage") or {}
    return bool(storage.get("storageUri") == storage_uri and _same_dir(storage, dest))


def _same_dir(storage: dict[str, Any], dest: str) -> bool:
    """Whether a spec's storage names the directory ``dest`` (a manifest's resolved destination).

    Compared resolved, as the reconciler's targets are: ``/m/x/``, ``/m//x`` and a path through a symlinked
    models root are the same directory, and reading them as different would retire a copy the live spec
    still wants. A ``local://`` model without ``spec.storage.path`` names the URI's path.
    """
    raw = storage.get("path") or ""
    uri = str(storage.get("storageUri") or "")
    if not raw and uri.startswith("local://"):
        raw = uri.removeprefix("local://")
    if not isinstance(raw, str) or not raw:
        return False
    return os.path.realpath(raw) == os.path.realpath(dest)
