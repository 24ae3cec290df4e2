"""This node's model-status ConfigMap (``<namespace>/<node name>``): the controller-facing half of state.

Writes touch only the agent's own data keys, with a JSON merge patch (``{"data": {key: value}}``, ``null``
to remove) — never a whole-object update — so concurrent writers of other keys are never overwritten or
resurrected (OME's read-modify-write of every key did both). Writes of many models are coalesced into one
patch (:class:`~model_agent.agent.batcher.KeyBatcher`). Every patch re-asserts the identifying label and
annotations the OME controller looks for, so a ConfigMap recreated without them is repaired by the next
write; a missing ConfigMap is created with them.

A write is skipped when the watched ConfigMap already holds the wanted value; :attr:`written` remembers the
last value written per key so the ConfigMap watch can tell its own echo from someone else's change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from model_agent.agent.batcher import KeyBatcher
from model_agent.kube.client import ApiError, KubeClient
from model_agent.kube.resources import CONFIGMAPS
from model_agent.model.keys import configmap_annotations, configmap_labels

MERGE_PATCH = "application/merge-patch+json"


class NodeConfigMap:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        node_name: str,
        current: Callable[[], dict[str, Any] | None],
    ) -> None:
        self._client = client
        self.namespace = namespace
        self.node_name = node_name
        self._current = current
        self.written: dict[str, str | None] = {}
        self.batcher = KeyBatcher(self._send)

    def data(self) -> dict[str, str]:
        cm = self._current() or {}
        return dict(cm.get("data") or {})

    def get(self, key: str) -> str | None:
        cm = self._current() or {}
        value = (cm.get("data") or {}).get(key)
        return value if isinstance(value, str) else None

    def identity_ok(self) -> bool:
        cm = self._current()
        if cm is None:
            return False
        meta = cm.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        want_labels = configmap_labels(self.node_name)
        want_ann = configmap_annotations(self.node_name)
        return all(labels.get(k) == v for k, v in want_labels.items()) and all(
            annotations.get(k) == v for k, v in want_ann.items()
        )

    async def ensure(self, key: str, value: str | None) -> bool:
        """Make data ``key`` equal ``value`` (None: absent). True when a write was sent."""
        cm = self._current()
        if cm is None and value is None:
            return False
        if self.get(key) == value and (value is None or self.identity_ok()):
            return False
        await self.batcher.write(key, value)
        self.written[key] = value
        return True

    def _identity(self) -> dict[str, Any]:
        return {
            "labels": configmap_labels(self.node_name),
            "annotations": configmap_annotations(self.node_name),
        }

    async def _send(self, batch: dict[str, str | None]) -> None:
        path = CONFIGMAPS.path(self.namespace, self.node_name)
        patch = {"metadata": self._identity(), "data": batch}
        try:
            await self._client.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
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
            await self._client.request("POST", CONFIGMAPS.path(self.namespace), body=body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            await self._client.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def close(self) -> None:
        await self.batcher.close()
