"""This node's ``models.ome.io/*`` labels: the scheduler-facing half of a model's per-node state.

A write is skipped when the watched Node already shows the wanted value, so a steady state costs no
requests. Writes that are needed are coalesced (:class:`~model_agent.agent.batcher.KeyBatcher`) into one
JSON merge patch of ``metadata.labels`` — setting a value, or ``null`` to remove — so a thousand models
becoming Ready cost a handful of PATCHes, and removing a label that is already gone is not an error (OME's
one-operation JSON Patch failed on that). Only keys under ``models.ome.io/`` can be written: the agent owns
nothing else on the Node (the admission policy in ``deploy/`` enforces the same on the server).

:attr:`NodeLabels.written` remembers the last value this process wrote per key, so the Node watch can
tell its own echo from someone else's change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from model_agent.agent.batcher import KeyBatcher
from model_agent.kube import objects
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import NODES
from model_agent.model.keys import MODEL_LABEL_DOMAIN

log = structlog.get_logger(__name__)

MERGE_PATCH = "application/merge-patch+json"


class NodeLabels:
    """Writes this node's ``models.ome.io/*`` labels (see the module contract); ``current_node`` is the watch's."""

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
        self.written: dict[str, str | None] = {}
        self.batcher = KeyBatcher(self._send)

    def labels(self) -> dict[str, str]:
        """A copy of every label of the watched Node, as last heard (selection is evaluated against these)."""
        node = self._current_node() or {}
        labels = objects.labels(node)
        return dict(labels)

    def model_labels(self) -> dict[str, str]:
        """The watched Node's labels under ``models.ome.io/``: the only ones the agent may write."""
        prefix = MODEL_LABEL_DOMAIN + "/"
        return {k: v for k, v in self.labels().items() if k.startswith(prefix)}

    async def ensure(self, key: str, value: str | None) -> bool:
        """Make label ``key`` equal ``value`` (None: absent). True when a write was sent."""
        if not key.startswith(MODEL_LABEL_DOMAIN + "/"):
            raise ValueError(f"refusing to write label {key!r}: the agent owns only {MODEL_LABEL_DOMAIN}/*")
        node = self._current_node()
        if node is None and value is None:
            return False
        labels = objects.labels(node)
        if labels.get(key) == value:
            return False
        await self.batcher.write(key, value)
        self.written[key] = value
        return True

    async def _send(self, batch: dict[str, str | None]) -> None:
        body = {"metadata": {"labels": batch}}
        delay = 0.1
        for attempt in range(1, self._attempts + 1):
            try:
                await self._client.request(
                    "PATCH", NODES.path(name=self.node_name), body=body, content_type=MERGE_PATCH
                )
                return
            except ApiError as exc:
                if exc.status == 404:
                    log.error("cannot label: this agent's Node does not exist", node=self.node_name)
                    return
                retryable = exc.status >= 500 or exc.status in (409, 429)
                if not retryable or attempt == self._attempts:
                    raise
            except ApiUnavailable:
                if attempt == self._attempts:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def close(self) -> None:
        """Stop the write batcher; writes still waiting fail instead of hanging."""
        await self.batcher.close()
