"""Watch handlers: what a change seen by a reflector means for the work queue — and nothing more.

Role: the "watching → queueing" seam. Each reflector calls one handler per change; the handler only
enqueues model keys (a change never removes anything: "look at key K again", never "K is gone"):

* a model change enqueues that model, records the store's last state of a delete for the remover (the only
  place a plain delete leaves the reserve label) and tells the confirmer a newer read is needed;
* a change of the Node's non-model labels enqueues every model (selection may have changed); a change of a
  model label someone else made enqueues that label's model (our own writes' echoes are ignored);
* a ConfigMap change enqueues the models whose entries changed, or every model when the ConfigMap was
  deleted or lost the label the controller needs;
* a relist of a model kind tells the confirmer that LISTs begun earlier cannot speak for objects it lacks.

It also owns the mapping from labels and entries back to models (:meth:`known_keys`): a truncated key parsed
on its own names a model that never existed, whose 404 would "prove" it gone; what maps to no real name is
left alone, logged once and counted (``model_agent_unresolved_keys``).

Handlers run on the event loop and never block: no API call, no disk walk beyond the manifest index.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from model_agent.agent.late_wiring import LateWiring
from model_agent.kube import objects
from model_agent.kube.store import Change, object_key
from model_agent.model import key_owners
from model_agent.model.keys import MODEL_LABEL_DOMAIN
from model_agent.model.resources import ModelRef

if TYPE_CHECKING:
    from model_agent.agent.wiring import Wiring

log = structlog.get_logger(__name__)

REPAIR_REFUSED_RECHECK_S = 1.0


class WatchHandlers(LateWiring):
    """The reflectors' change handlers and the key bookkeeping they need; see the module docstring."""

    def __init__(self) -> None:
        self._on_full_pass: Callable[[set[str]], None] = lambda _keys: None
        self.label_index: dict[str, str] = {}  # node label key -> model key, for changes of one label
        # (where, key) of labels and ConfigMap keys that map to no known model, each logged once.
        self.unresolved: dict[tuple[str, str], key_owners.Unresolved] = {}

    def attach(self, wiring: Wiring, on_full_pass: Callable[[set[str]], None]) -> None:
        """Bind the built collaborators; ``on_full_pass`` gets the keys of every full enqueue (inventory)."""
        self._w = wiring
        self._on_full_pass = on_full_pass

    # ------------------------------------------------------------------------------------ handlers

    def on_model_change(self, change: Change, _source: str) -> None:
        """A BaseModel or ClusterBaseModel changed (or was reported deleted): look at it again."""
        obj = change.new or change.old or {}
        try:
            ref = ModelRef.from_object(obj)
        except ValueError:
            return
        self.label_index[ref.label_key] = ref.key
        # For a delete this is the store's last state: the only place a plain delete leaves the reserve label.
        self.w.remover.note_last_state(ref.key, obj)
        self.w.confirmer.heard(ref.key)  # a removal candidate from now on needs a read newer than this
        self.w.queue.add(ref.key)

    def on_relist(self, resource: str) -> None:
        """A reflector listed again: count it; for a model kind, older LISTs no longer prove absence."""
        self.w.metrics.relists.labels(resource).inc()
        for kind, reflector in self.w.models.items():
            if reflector.name == resource:
                self.w.confirmer.relisted(kind)  # LISTs begun earlier cannot speak for objects this one lacks

    def on_node_change(self, change: Change, _source: str) -> None:
        """The Node changed: re-evaluate selection (other labels) or repair a model label someone changed."""
        old, new = objects.labels(change.old), objects.labels(change.new)
        changed = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
        prefix = MODEL_LABEL_DOMAIN + "/"
        if any(not k.startswith(prefix) for k in changed):
            self.enqueue_all()  # selection may have changed for every model
            return
        for label_key in changed:
            if new.get(label_key) == self.w.labels.written.get(label_key):
                continue  # the echo of our own write
            key = self.label_index.get(label_key)
            if key is not None:
                self.w.queue.add(key)

    def on_configmap_change(self, change: Change, _source: str) -> None:
        """The node's ConfigMap changed: repair the entries someone else changed, or all when it was lost."""
        old = (change.old or {}).get("data") or {}
        new = (change.new or {}).get("data") or {}
        if change.new is None or not self.w.node_configmap.identity_ok():
            self.enqueue_all()  # deleted, or stripped of the label the controller needs
            return
        changed = {
            key: new.get(key) or old.get(key) or ""  # a removed entry's last value still names its model
            for key in set(old) | set(new)
            if old.get(key) != new.get(key) and new.get(key) != self.w.node_configmap.written.get(key)
        }
        if not changed:
            return
        owners = key_owners.resolve(self.real_keys(), changed, ())
        for model_keys in owners.by_configmap_key.values():
            for model_key in model_keys:
                self.w.queue.add(model_key)
        self.note_unresolved(owners.unresolved, complete=False)

    # ------------------------------------------------------------------------ callbacks of others

    def repair_cache(self, live: dict[str, Any], read_at: float | None) -> None:
        """Put back an object a confirmation read found alive while the cache had lost it (a phantom delete, a
        relist that omitted it) — only if that read started after everything the cache heard of the key: a
        DELETED heard meanwhile is newer than the read, and the pre-deletion object must not come back."""
        reflector = self.w.models.get(str(live.get("kind") or ""))
        if reflector is None or read_at is None:
            return
        key = object_key(live)
        if reflector.store.repair(live, read_at):
            log.info("cache repaired from a live read", key=key)
        elif key not in reflector.store:
            heard = reflector.store.heard(key)
            log.info(
                "cache not repaired: the key was heard of after the read began",
                key=key,
                heard_deleted=heard.deleted if heard else None,
                heard_ago_s=round(time.monotonic() - heard.at, 3) if heard else None,
            )
            # The read is older than what the cache knows: look at the model again, with a fresh read.
            with contextlib.suppress(ValueError):
                self.w.queue.add_after(ModelRef.from_object(live).key, REPAIR_REFUSED_RECHECK_S)

    def requeue_after(self, key: str, delay_s: float) -> None:
        """Look at ``key`` again after ``delay_s`` (now when it is not positive)."""
        if delay_s <= 0:
            self.w.queue.add(key)
        else:
            self.w.queue.add_after(key, delay_s)

    # ------------------------------------------------------------------------------ key bookkeeping

    def cached_models(self) -> list[dict[str, Any]]:
        """Every model object in the caches (both kinds)."""
        return [obj for r in self.w.models.values() for obj in r.store.values()]

    def cached_refs(self) -> list[ModelRef]:
        """The cached models' references (objects without a valid kind or name are skipped)."""
        refs = []
        for obj in self.cached_models():
            with contextlib.suppress(ValueError):
                refs.append(ModelRef.from_object(obj))
        return refs

    def real_keys(self) -> set[str]:
        """Models known to be real: cached objects and local records (each holds the model's whole name)."""
        keys = {r.key for r in self.cached_refs()}
        keys.update(m.key for m in self.w.manifests.all())
        return keys

    def known_keys(self) -> set[str]:
        """Every model to look at: real ones, and those the node's labels and ConfigMap entries belong to.

        A label or entry is mapped back through the real models and the entries' names first
        (:mod:`~model_agent.model.key_owners`): a truncated key parsed on its own names a model that never
        existed, whose 404 would "prove" it gone and count toward the breaker. What maps to no real name is
        left alone, logged and counted (``model_agent_unresolved_keys``): no read can prove it an orphan.
        """
        keys = self.real_keys()
        owners = key_owners.resolve(keys, self.w.node_configmap.data(), self.w.labels.model_labels())
        keys.update(owners.keys())
        self.note_unresolved(owners.unresolved, complete=True)
        return keys

    def note_unresolved(self, unresolved: list[key_owners.Unresolved], *, complete: bool) -> None:
        """Log each label or entry that maps to no model once (until it resolves or goes), and count them.

        ``complete``: these are all of them (a whole pass), not just those of one change.
        """
        current: dict[tuple[str, str], key_owners.Unresolved] = {(u.where, u.key): u for u in unresolved}
        for ident, item in current.items():
            if ident not in self.unresolved:
                log.warning(
                    "label or ConfigMap key maps to no known model; left alone",
                    where=item.where,
                    key=item.key,
                    why=item.why,
                )
        if complete:
            self.unresolved = current
        else:
            self.unresolved.update(current)
        for where in ("label", "configmap"):
            self.w.metrics.unresolved_keys.labels(where).set(sum(1 for w, _ in self.unresolved if w == where))

    def enqueue_all(self) -> None:
        """Look at every known model again (resync, selection changes); then take an inventory."""
        if not self.w.started.is_set():
            return
        keys = self.known_keys()
        for key in keys:
            self.label_index[ModelRef.from_key(key).label_key] = key
            self.w.queue.add(key)
        self._on_full_pass(keys)
