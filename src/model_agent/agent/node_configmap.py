"""This node's model-status ConfigMap (``<namespace>/<node name>``): the controller-facing half of state.

Writes touch only the agent's own data keys, with a JSON merge patch (``{"data": {key: value}}``, ``null``
to remove) — never a whole-object update — so concurrent writers of other keys are never overwritten or
resurrected (OME's read-modify-write of every key did both). Writes of many models are coalesced into one
patch (:class:`~model_agent.agent.batcher.KeyBatcher`). Every patch re-asserts the identifying label and
annotations the OME controller looks for, so a ConfigMap recreated without them is repaired by the next
write; a missing ConfigMap is created with them.

A write is skipped when the watched ConfigMap already holds the wanted value; :attr:`written` remembers the
last value written per key so the ConfigMap watch can tell its own echo from someone else's change.

Size (the API server refuses a ConfigMap over 1 MiB of data, and with it the whole patch): every value is
capped first (:func:`~model_agent.model.entry.cap_entry_json`: the parsed config is trimmed, never the
status); batches are bounded in bytes; and each batch is placed against the object's current size
(:func:`~model_agent.agent.configmap_space.place`, from the newest of the watched object and the last
write's answer). An entry that does not fit whole is written without its config; other entries give up
their config to make room for a status; an entry that does not fit even so is refused:
:meth:`NodeConfigMap.ensure` raises :class:`ConfigMapFull` for it (a
:class:`~model_agent.agent.requeue.Requeue`: the key is retried every minute or so, and a caller that
writes the entry before the label never labels the model ``Ready`` without its entry) while the rest of the
batch is written. A full ConfigMap is said loudly: a Warning Event ``ConfigMapFull`` on the Node, the
gauges ``model_agent_configmap_full``, ``model_agent_configmap_refused_entries``,
``model_agent_configmap_bytes``, and :meth:`NodeConfigMap.usage` (served on ``/status``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import structlog

from model_agent.agent.batcher import KeyBatcher
from model_agent.agent.configmap_space import DATA_LIMIT_BYTES, HEADROOM_BYTES, Placement, entry_bytes, place
from model_agent.agent.configmap_space import data_bytes as _data_bytes
from model_agent.agent.requeue import Requeue
from model_agent.kube import objects
from model_agent.kube.client import ApiError, KubeClient
from model_agent.kube.resources import CONFIGMAPS
from model_agent.model.entry import cap_entry_json, without_config
from model_agent.model.keys import configmap_annotations, configmap_labels, parse_configmap_key
from model_agent.model.reasons import EventReason
from model_agent.ops.events import NORMAL, WARNING, EventRecorder, ObjectRef
from model_agent.ops.metrics import Metrics

log = structlog.get_logger(__name__)

MERGE_PATCH = "application/merge-patch+json"
# One patch's share of the API server's request size limit (3 MiB): batches stay well below it.
MAX_BATCH_BYTES = 256 * 1024


# A refused key is looked at again after this long (jittered), not with the work queue's backoff to 5 min:
# a full ConfigMap is a state that ends when room appears (a model removed, another writer's key gone), and
# each retry is cheap (placed locally; nothing is sent while there is no room).
FULL_RETRY_S = 60.0


class ConfigMapFull(Requeue):
    """No room in the node's ConfigMap for a model's entry, even without its parsed config."""

    def __init__(self, key: str, needed: int, used: int, budget: int) -> None:
        super().__init__(
            f"the node's ConfigMap is full: entry {key} needs {needed} bytes, {used} of {budget} bytes are used",
            FULL_RETRY_S * random.uniform(0.8, 1.2),
        )
        self.key = key
        self.needed = needed
        self.used = used
        self.budget = budget


def _resource_version(obj: dict[str, Any]) -> int:
    try:
        return int(objects.resource_version(obj) or 0)
    except ValueError:
        return 0


def _is_model_key(key: str) -> bool:
    """A model's entry (the agent's to shrink), not another writer's key."""
    return parse_configmap_key(key) is not None


def _too_large(exc: ApiError) -> bool:
    text = f"{exc.reason} {exc.message}".lower()
    return exc.status in (413, 422, 500) and ("must have at most" in text or "too large" in text or "too long" in text)


@dataclass(eq=False)
class NodeConfigMap:
    """The writer of this node's ConfigMap (see the module contract); ``current`` returns the watched object."""

    client: KubeClient
    namespace: str
    node_name: str
    current: Callable[[], dict[str, Any] | None]
    _: KW_ONLY
    budget_bytes: int = DATA_LIMIT_BYTES - HEADROOM_BYTES
    events: EventRecorder | None = None
    metrics: Metrics | None = None
    node_object: Callable[[], dict[str, Any] | None] = lambda: None
    written: dict[str, str | None] = field(default_factory=dict, init=False)
    # the object as the last write's answer had it
    _latest: dict[str, Any] | None = field(default=None, init=False, repr=False)
    # keys with no room -> bytes their smallest form needs
    refused: dict[str, int] = field(default_factory=dict, init=False)
    # keys written without their parsed config for lack of room
    compacted: set[str] = field(default_factory=set, init=False)
    used_bytes: int = field(default=0, init=False)
    batcher: KeyBatcher = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """The batcher that carries this writer's key writes."""
        self.batcher = KeyBatcher(self._send, max_bytes=MAX_BATCH_BYTES)

    def data(self) -> dict[str, str]:
        """A copy of the watched ``data``: what the ConfigMap held as last heard."""
        cm = self.current() or {}
        return dict(cm.get("data") or {})

    def get(self, key: str) -> str | None:
        """The watched value of ``key``, or None."""
        cm = self.current() or {}
        value = (cm.get("data") or {}).get(key)
        return value if isinstance(value, str) else None

    def identity_ok(self) -> bool:
        """Whether the watched ConfigMap carries the label and annotations OME's controller finds it by."""
        cm = self.current()
        if cm is None:
            return False
        labels = objects.labels(cm)
        annotations = objects.annotations_of(cm)
        want_labels = configmap_labels(self.node_name)
        want_ann = configmap_annotations(self.node_name)
        return all(labels.get(k) == v for k, v in want_labels.items()) and all(
            annotations.get(k) == v for k, v in want_ann.items()
        )

    @property
    def full(self) -> bool:
        """True while some model's entry could not be written for lack of room."""
        return bool(self.refused)

    def usage(self) -> dict[str, Any]:
        """Room in the ConfigMap, for ``/status``."""
        return {
            "bytes": self.used_bytes,
            "budgetBytes": self.budget_bytes,
            "full": self.full,
            "refused": sorted(self.refused),
            "compacted": len(self.compacted),
        }

    async def ensure(self, key: str, value: str | None) -> bool:
        """Make data ``key`` equal ``value`` (None: absent), capped in size. True when a write was sent.

        Raises :class:`ConfigMapFull` when there is no room for the entry even without its parsed config (the
        key keeps its previous value, if any); an entry kept in that smallest form for lack of room is not
        rewritten until the whole one fits.
        """
        if value is None:
            self._settled(key)
        else:
            value = cap_entry_json(value)
        cm = self.current()
        if cm is None and value is None:
            return False
        current = self.get(key)
        identity = self.identity_ok()
        if current == value and (value is None or identity):
            self.refused.pop(key, None)
            return False
        kept_small = value is not None and current is not None and current == without_config(value)
        if kept_small and identity and value is not None and not self._room_for(key, value):
            return False
        await self.batcher.write(key, value)
        return True

    def _settled(self, key: str) -> None:
        self.refused.pop(key, None)
        self.compacted.discard(key)

    def _base(self) -> dict[str, str]:
        """The object's data as last known: the newer of the watched object and the last write's answer."""
        watched, latest = self.current(), self._latest
        newest = (
            latest
            if watched is None or (latest is not None and _resource_version(latest) >= _resource_version(watched))
            else watched
        )
        return dict((newest or {}).get("data") or {})

    def _room_for(self, key: str, value: str) -> bool:
        base = self._base()
        grown = _data_bytes(base) + entry_bytes(key, value) - entry_bytes(key, base.get(key))
        return grown <= self.budget_bytes

    def _identity(self) -> dict[str, Any]:
        return {
            "labels": configmap_labels(self.node_name),
            "annotations": configmap_annotations(self.node_name),
        }

    async def _send(self, batch: dict[str, str | None]) -> dict[str, BaseException]:
        path = CONFIGMAPS.path(self.namespace, self.node_name)
        placement = place(self._base(), batch, self.budget_bytes, without_config, _is_model_key)
        try:
            await self._write(placement.write)
        except ApiError as exc:
            if not _too_large(exc):
                raise
            # The server counted more than the agent knew of (another writer's keys): read it and place again.
            log.warning("ConfigMap refused as too large; re-reading it", error=str(exc))
            self._latest = await self.client.request("GET", path)
            placement = place(self._base(), batch, self.budget_bytes, without_config, _is_model_key)
            await self._write(placement.write)
        self._record(placement)
        return {
            k: ConfigMapFull(k, needed, placement.used_bytes, self.budget_bytes)
            for k, needed in placement.refused.items()
        }

    def _record(self, placement: Placement) -> None:
        was_full = self.full
        newly_refused = len(set(placement.refused) - set(self.refused))
        for key in placement.write:
            self._settled(key)
        self.compacted.update(placement.compacted)
        self.refused.update(placement.refused)
        self.used_bytes = placement.used_bytes
        if placement.compacted:
            log.warning(
                "ConfigMap nearly full: entries written without their parsed config", keys=len(placement.compacted)
            )
        if placement.refused:
            # A warning when keys are newly refused; their retries (with backoff) only at debug level.
            (log.warning if newly_refused else log.debug)(
                "ConfigMap full: entries not written",
                keys=sorted(placement.refused)[:5],
                refused=len(placement.refused),
                used_bytes=placement.used_bytes,
                budget_bytes=self.budget_bytes,
            )
        if self.metrics is not None:
            self.metrics.configmap_bytes.set(self.used_bytes)
            self.metrics.configmap_full.set(1 if self.full else 0)
            self.metrics.configmap_refused.set(len(self.refused))
            self.metrics.configmap_compacted.set(len(self.compacted))
        if self.full != was_full and self.events is not None:
            node = self.node_object() or {"kind": "Node", "apiVersion": "v1", "metadata": {"name": self.node_name}}
            where = f"ConfigMap {self.namespace}/{self.node_name}"
            if self.full:
                message = (
                    f"{where} is full ({self.used_bytes} of {self.budget_bytes} bytes): {len(self.refused)} model "
                    "entries cannot be written, and those models are not labelled Ready here until they are"
                )
                self.events.emit(ObjectRef.of(node), WARNING, EventReason.CONFIGMAP_FULL, message)
            else:
                self.events.emit(
                    ObjectRef.of(node), NORMAL, EventReason.CONFIGMAP_ROOM, f"{where} has room for every entry again"
                )

    async def _write(self, batch: dict[str, str | None]) -> None:
        if not batch:
            return
        for key, value in batch.items():
            self.written[key] = value  # before the request: its echo on the watch may arrive first
        path = CONFIGMAPS.path(self.namespace, self.node_name)
        patch = {"metadata": self._identity(), "data": batch}
        try:
            self._latest = await self.client.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
            return
        except ApiError as exc:
            if exc.status != 404:
                raise
        data = {k: v for k, v in batch.items() if v is not None}
        if not data:
            return
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": self.node_name, "namespace": self.namespace, **self._identity()},
            "data": data,
        }
        try:
            self._latest = await self.client.request("POST", CONFIGMAPS.path(self.namespace), body=body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            self._latest = await self.client.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def close(self) -> None:
        """Stop the write batcher; writes still waiting fail instead of hanging."""
        await self.batcher.close()
