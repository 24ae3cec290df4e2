"""Who holds a model's files: the peers the cluster says are Ready for a model of the same source.

A holder is a Node (other than this one) whose label for a model with the same ``storageUri`` says
``Ready`` (label keys: :func:`model_agent.model.keys.node_label_key`) and whose agent advertises a peer address
(``host:port``) in the annotation :data:`~model_agent.peers.PEER_ADDRESS_ANNOTATION` of **its node's own status
ConfigMap** (:meth:`PeerDirectory.advertise`), never on the Node. The Node's labels say which models a node has;
anything that may write the Node (its kubelet, under NodeRestriction, may set these labels and any annotation on
its own Node) could claim them. The ConfigMap named after a node is written only by the agent whose pod-bound
token names that node (the chart's ConfigMap admission policy): an address there is bound to the node claim, so a
Node without an agent, or a kubelet pretending, is never asked for bytes and never sees a peer token. Models of any
tenant with the same source count: what a peer serves is addressed by the digest this fetch's own origin listing
promised and verified against it, so sharing a source is sharing public content, never trusting another tenant.

:meth:`PeerDirectory.relaying` lists the Nodes labelled ``Updating`` for such a model: nodes fetching it, which
serve the durable parts of their files (:mod:`.relay`); one that has not started a file answers 404 for it.

Contract: :meth:`PeerDirectory.holders` and :meth:`PeerDirectory.relaying` come from one lookup: one ``LIST`` per
label key with the selector ``<key> in (Ready,Updating)``, cached per source for ``cache_s`` times one per four
label keys (a source many models share costs more requests per lookup, so it is looked up less often: the API
budget of the agent is shared with everything else it does; the LISTs of one lookup run up to
:data:`PARALLEL_LISTS` at once, and callers that find the cache expired while a lookup is under way share it), so
the files of one fetch cost one lookup (``fresh`` skips the cache); the advertised addresses come from one metadata-only
``LIST`` of the status ConfigMaps (:meth:`PeerDirectory.addresses`), cached for ``address_cache_s``. An API error
gives no holders (the origin is used), it never fails the fetch. :meth:`PeerDirectory.ready_here` says whether this
node's own Node is labelled Ready for a model of the source — what the other nodes' directories see — with one
``GET``; an API error answers no.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import structlog

from model_agent.kube.client import METADATA_LIST, ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import CONFIGMAPS, NODES
from model_agent.model.keys import (
    CONFIGMAP_STATUS_LABEL,
    CONFIGMAP_STATUS_LABEL_VALUE,
    configmap_annotations,
    configmap_labels,
    node_label_key,
)
from model_agent.peers import PEER_ADDRESS_ANNOTATION

log = structlog.get_logger(__name__)

MERGE_PATCH = "application/merge-patch+json"
PARALLEL_LISTS = 4  # LISTs of one lookup in flight at once (one per label key of the source)


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
    namespace: str = "ome"  # the agent's: where the nodes' status ConfigMaps are
    cache_s: float = 2.0
    address_cache_s: float = 10.0
    _addresses: tuple[float, dict[str, str]] = field(default=(0.0, {}), init=False, repr=False)
    _cache: dict[str, tuple[float, list[str], list[str]]] = field(default_factory=dict, init=False, repr=False)
    _running: dict[str, asyncio.Future[tuple[list[str], list[str]]]] = field(
        default_factory=dict, init=False, repr=False
    )

    async def holders(self, uri: str, *, fresh: bool = False) -> list[str]:
        """Addresses of other nodes Ready for a model of ``uri`` (sorted; empty when none or unknown)."""
        return (await self._lookup(uri, fresh))[0]

    async def relaying(self, uri: str, *, fresh: bool = False) -> list[str]:
        """Addresses of other nodes fetching a model of ``uri`` (labelled Updating, not Ready for another model
        of it; sorted; empty when none or unknown)."""
        return (await self._lookup(uri, fresh))[1]

    async def _lookup(self, uri: str, fresh: bool) -> tuple[list[str], list[str]]:
        cached = self._cache.get(uri)
        if cached is not None and cached[0] > time.monotonic() and not fresh:
            return cached[1], cached[2]
        running = self._running.get(uri)
        if running is not None and not fresh:
            return await asyncio.shield(running)  # (the files of a fetch whose cache expired at once: one lookup)
        lookup = asyncio.ensure_future(self._list(uri))
        self._running[uri] = lookup

        def ended(done: asyncio.Future[tuple[list[str], list[str]]]) -> None:
            if self._running.get(uri) is done:
                del self._running[uri]

        lookup.add_done_callback(ended)
        return await asyncio.shield(lookup)

    async def _list(self, uri: str) -> tuple[list[str], list[str]]:
        ready: set[str] = set()
        updating: set[str] = set()
        keys = model_label_keys(uri, self.models())
        lists = asyncio.Semaphore(PARALLEL_LISTS)

        async def nodes_of(key: str) -> list[dict[str, Any]]:
            async with lists:
                try:
                    listed = await self.client.request(
                        "GET", NODES.path(), query={"labelSelector": f"{key} in (Ready,Updating)"}
                    )
                except (ApiError, ApiUnavailable) as exc:
                    log.warning("peer directory lookup failed; using the origin", error=str(exc)[:200])
                    return []
            return list(listed.get("items") or [])

        listed = await asyncio.gather(*(nodes_of(k) for k in keys))
        addresses = await self.addresses() if any(listed) else {}
        for key, items in zip(keys, listed, strict=True):
            for node in items:
                meta = node.get("metadata") or {}
                address = addresses.get(str(meta.get("name", "")), "")
                if meta.get("name") != self.node_name and address:
                    state = (meta.get("labels") or {}).get(key)
                    (ready if state == "Ready" else updating).add(address)
        holders, fetching = sorted(ready), sorted(updating - ready)
        ttl = self.cache_s * max(1.0, len(keys) / 4)
        self._cache[uri] = (time.monotonic() + ttl, holders, fetching)
        return holders, fetching

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

    async def addresses(self) -> dict[str, str]:
        """Node name -> the peer address its agent advertises in its status ConfigMap (cached; {} on an API error).

        One ``LIST`` of the ConfigMaps' metadata (``PartialObjectMetadataList``): the annotations without the
        entries. A ConfigMap counts for the node it is named after, the name the admission policy binds to the
        writing agent's node claim.
        """
        expires, known = self._addresses
        if expires > time.monotonic():
            return known
        try:
            listed = await self.client.request(
                "GET",
                CONFIGMAPS.path(self.namespace),
                query={"labelSelector": f"{CONFIGMAP_STATUS_LABEL}={CONFIGMAP_STATUS_LABEL_VALUE}"},
                accept=METADATA_LIST,
            )
        except (ApiError, ApiUnavailable) as exc:
            log.warning("peer addresses not readable; using the origin", error=str(exc)[:200])
            return {}
        found: dict[str, str] = {}
        for item in listed.get("items") or []:
            meta = item.get("metadata") or {}
            address = (meta.get("annotations") or {}).get(PEER_ADDRESS_ANNOTATION)
            if isinstance(address, str) and address and isinstance(meta.get("name"), str):
                found[meta["name"]] = address
        self._addresses = (time.monotonic() + self.address_cache_s, found)
        return found

    async def advertise(self, address: str | None) -> None:
        """Write (or, with None, remove) this node's peer address on its status ConfigMap (created if missing).

        An address an older agent left on the Node is removed: nothing reads it, and it would only mislead.
        """
        path = CONFIGMAPS.path(self.namespace, self.node_name)
        body = {"metadata": {"annotations": {PEER_ADDRESS_ANNOTATION: address}}}
        try:
            await self.client.request("PATCH", path, body=body, content_type=MERGE_PATCH)
        except ApiError as exc:
            if exc.status != 404 or address is None:
                raise
            created = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": self.node_name,
                    "namespace": self.namespace,
                    "labels": configmap_labels(self.node_name),
                    "annotations": {**configmap_annotations(self.node_name), PEER_ADDRESS_ANNOTATION: address},
                },
            }
            try:
                await self.client.request("POST", CONFIGMAPS.path(self.namespace), body=created)
            except ApiError as again:
                if again.status != 409:
                    raise
                await self.client.request("PATCH", path, body=body, content_type=MERGE_PATCH)  # the writer was first
        node = await self.client.request("GET", NODES.path(name=self.node_name))
        if PEER_ADDRESS_ANNOTATION in ((node.get("metadata") or {}).get("annotations") or {}):
            legacy = {"metadata": {"annotations": {PEER_ADDRESS_ANNOTATION: None}}}
            await self.client.request("PATCH", NODES.path(name=self.node_name), body=legacy, content_type=MERGE_PATCH)
