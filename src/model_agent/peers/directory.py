"""Who holds a model's files: the peers the cluster says are Ready for a model of the same source.

A holder is a Node (other than this one) whose label for a model with the same ``storageUri`` says
``Ready`` (label keys: :func:`model_agent.model.keys.node_label_key`) and that carries the annotation
:data:`~model_agent.peers.PEER_ADDRESS_ANNOTATION` (``host:port``), which each agent with the peer service on
writes on its own Node (:meth:`PeerDirectory.advertise`; the chart's admission policy allows exactly that
annotation). Models of any tenant with the same source count: what a peer serves is addressed by the
digest this fetch's own origin listing promised and verified against it, so sharing a source is sharing
public content, never trusting another tenant.

Contract: :meth:`PeerDirectory.holders` lists Nodes with a label selector (one ``LIST`` per label key),
cached for ``cache_s`` per source so the files of one fetch cost one lookup (``fresh`` skips the cache); an
API error gives no holders (the origin is used), it never fails the fetch. :meth:`PeerDirectory.ready_here`
says whether this node's own Node is labelled Ready for a model of the source — what the other nodes'
directories see — with one ``GET``; an API error answers no.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import structlog

from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import NODES
from model_agent.model.keys import node_label_key
from model_agent.peers import PEER_ADDRESS_ANNOTATION

log = structlog.get_logger(__name__)

MERGE_PATCH = "application/merge-patch+json"


def model_label_keys(uri: str, models: Mapping[str, Iterable[dict[str, Any]]]) -> list[str]:
    """The node label keys of every known model (by kind) whose ``spec.storage.storageUri`` is ``uri``."""
    keys: list[str] = []
    for kind, objs in models.items():
        for obj in objs:
            storage = (obj.get("spec") or {}).get("storage") or {}
            if storage.get("storageUri") != uri:
                continue
            meta = obj.get("metadata") or {}
            try:
                keys.append(node_label_key(kind, meta.get("namespace", ""), meta.get("name", "")))
            except ValueError:
                continue
    return sorted(set(keys))


@dataclass(eq=False)
class PeerDirectory:
    """Peer addresses holding a source, from the Nodes' labels and annotations (see the module contract)."""

    client: KubeClient
    node_name: str
    models: Callable[[], Mapping[str, Iterable[dict[str, Any]]]]
    _: KW_ONLY
    cache_s: float = 2.0
    _cache: dict[str, tuple[float, list[str]]] = field(default_factory=dict, init=False, repr=False)

    async def holders(self, uri: str, *, fresh: bool = False) -> list[str]:
        """Addresses of other nodes Ready for a model of ``uri`` (sorted; empty when none or unknown)."""
        cached = self._cache.get(uri)
        if cached is not None and cached[0] > time.monotonic() and not fresh:
            return cached[1]
        found: set[str] = set()
        for key in model_label_keys(uri, self.models()):
            try:
                listed = await self.client.request("GET", NODES.path(), query={"labelSelector": f"{key}=Ready"})
            except (ApiError, ApiUnavailable) as exc:
                log.warning("peer directory lookup failed; using the origin", error=str(exc)[:200])
                continue
            for node in listed.get("items") or []:
                meta = node.get("metadata") or {}
                address = (meta.get("annotations") or {}).get(PEER_ADDRESS_ANNOTATION, "")
                if meta.get("name") != self.node_name and address:
                    found.add(address)
        holders = sorted(found)
        self._cache[uri] = (time.monotonic() + self.cache_s, holders)
        return holders

    async def ready_here(self, uri: str) -> bool:
        """Whether this node's Node is labelled Ready for a model of ``uri`` (what peers' directories read)."""
        keys = model_label_keys(uri, self.models())
        if not keys:
            return False
        try:
            node = await self.client.request("GET", NODES.path(name=self.node_name))
        except (ApiError, ApiUnavailable) as exc:
            log.info("own node not readable; not seen Ready yet", error=str(exc)[:200])
            return False
        labels = (node.get("metadata") or {}).get("labels") or {}
        return any(labels.get(key) == "Ready" for key in keys)

    async def advertise(self, address: str | None) -> None:
        """Write (or, with None, remove) this node's peer address annotation."""
        body = {"metadata": {"annotations": {PEER_ADDRESS_ANNOTATION: address}}}
        await self.client.request("PATCH", NODES.path(name=self.node_name), body=body, content_type=MERGE_PATCH)
