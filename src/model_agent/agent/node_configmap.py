"""This node's model-status ConfigMap (``<namespace>/<node name>``): the controller-facing half of state.

Every write touches exactly one data key with a JSON merge patch (``{"data": {key: value}}``, ``null`` to
remove), never a whole-object update, so concurrent writers of other keys are never overwritten or
resurrected (the Go agent's read-modify-write of every key did both). The same patch re-asserts the
identifying label and annotations the OME controller looks for, so a ConfigMap recreated without them is
repaired by the next write. A missing ConfigMap is created with them.

Writes are skipped when the watched ConfigMap already holds the wanted value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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

    def data(self) -> dict[str, str]:
        cm = self._current() or {}
        return dict(cm.get("data") or {})

    def _identity_ok(self) -> bool:
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
        """Make data ``key`` equal ``value`` (None: absent). True when a request was sent."""
        cm = self._current()
        if self.data().get(key) == value and (value is None or self._identity_ok()):
            return False
        if cm is None and value is None:
            return False
        patch = {
            "metadata": {
                "labels": configmap_labels(self.node_name),
                "annotations": configmap_annotations(self.node_name),
            },
            "data": {key: value},
        }
        path = CONFIGMAPS.path(self.namespace, self.node_name)
        try:
            await self._client.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
            return True
        except ApiError as exc:
            if exc.status != 404:
                raise
        if value is None:
            return False
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.node_name,
                "namespace": self.namespace,
                "labels": configmap_labels(self.node_name),
                "annotations": configmap_annotations(self.node_name),
            },
            "data": {key: value},
        }
        try:
            await self._client.request("POST", CONFIGMAPS.path(self.namespace), body=body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            await self._client.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        return True
