"""This node's ``models.ome.io/*`` labels: the scheduler-facing half of a model's per-node state.

Writes are JSON Patches of exactly one label (OME's wire format), skipped when the watched Node already
shows the wanted value, so a steady state costs no requests. Only keys under ``models.ome.io/`` can be
written: the agent owns nothing else on the Node.

Contract: :meth:`NodeLabels.ensure` returns whether it wrote; transient API failures are retried
``attempts`` times with a short exponential pause and then raised, so the work queue backs off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import NODES
from model_agent.model.keys import MODEL_LABEL_DOMAIN, node_label_patch_path

JSON_PATCH = "application/json-patch+json"


class NodeLabels:
    def __init__(
        self,
        client: KubeClient,
        node_name: str,
        current_node: Callable[[], dict[str, Any] | None],
        *,
        attempts: int = 5,
    ) -> None:
        self._client = client
        self.node_name = node_name
        self._current_node = current_node
        self._attempts = max(1, attempts)

    def labels(self) -> dict[str, str]:
        node = self._current_node() or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        return dict(labels)

    def model_labels(self) -> dict[str, str]:
        prefix = MODEL_LABEL_DOMAIN + "/"
        return {k: v for k, v in self.labels().items() if k.startswith(prefix)}

    async def ensure(self, key: str, value: str | None) -> bool:
        """Make label ``key`` equal ``value`` (None: absent). True when a patch was sent."""
        if not key.startswith(MODEL_LABEL_DOMAIN + "/"):
            raise ValueError(f"refusing to write label {key!r}: the agent owns only {MODEL_LABEL_DOMAIN}/*")
        labels = self.labels()
        if labels.get(key) == value:
            return False
        if value is None:
            ops: list[dict[str, Any]] = [{"op": "remove", "path": node_label_patch_path(key)}]
        elif self._current_node() is not None and not labels:
            ops = [{"op": "add", "path": "/metadata/labels", "value": {key: value}}]
        else:
            ops = [{"op": "add", "path": node_label_patch_path(key), "value": value}]
        delay = 0.1
        for attempt in range(1, self._attempts + 1):
            try:
                await self._client.request("PATCH", NODES.path(name=self.node_name), body=ops, content_type=JSON_PATCH)
                return True
            except ApiError as exc:
                if value is None and exc.status == 422:
                    return False  # already gone
                if exc.status == 404:
                    return False  # no Node object: nothing to label
                if (exc.status < 500 and exc.status not in (409, 429)) or attempt == self._attempts:
                    raise
            except ApiUnavailable:
                if attempt == self._attempts:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        return False  # pragma: no cover - loop always returns or raises
