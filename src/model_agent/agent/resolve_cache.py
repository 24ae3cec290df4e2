"""Resolve each model revision once per cluster: the hub's API is a shared, rate-limited budget.

The first node to fetch a Hugging Face model (the first holder of its origin slot) resolves the revision
to a commit and lists the files with their sizes and hashes; it records the answer in a ConfigMap
``model-agent-resolve-<hash>`` in the agent's namespace. Every other node reads that record instead of
calling the hub, so hub API calls per model revision do not grow with the node count (file downloads
remain one request per file per node, or a mirror's).

A node waiting for another to resolve (its first try found the lock taken) watches the record's ConfigMap (a
reflector with a field selector, as the node's own ConfigMap is watched) and goes on the moment the record is
written. It used to poll it every half second: up to 0.5 s late, and two requests a second per waiting node, where
a watch costs two (a LIST and the WATCH) however long the wait. A node that takes the lock at once opens no watch.
Should the reflector end (a bug, an answer of an unexpected shape), the record is polled every ``poll_s``; should
the watch be refused (RBAC without ``watch``; the chart grants it), the node takes the lock once the resolving node
lets it go, and reads the record then.

A record for a revision that is a full commit sha never expires; one for a branch or tag is trusted for
``ttl_s`` (default 10 min), after which the next node resolves again; a stamp more than a TTL ahead of the
reading node's clock, or not a number, is stale. A record that cannot be read or parsed, or whose file list is
not of the shape the Hugging Face source reads, is ignored (the node resolves by itself); failing to write one
is logged, never fatal.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from model_agent.agent.origin_slots import OriginSlots
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.reflector import Reflector
from model_agent.kube.resources import CONFIGMAPS
from model_agent.model import json_text
from model_agent.transfer.aio import enter_or

log = structlog.get_logger(__name__)

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


_HASHES = ("sha256", "git_sha1")


def _file_list(value: object) -> list[dict[str, Any]]:
    """The file list of a record, in the shape the Hugging Face source reads (``sources/hf.py``'s ``RemoteFile``:
    ``path`` a string, ``size`` an integer in 0..2**63-1, ``sha256`` and ``git_sha1`` a string or null, null when
    missing); fields another agent version added are dropped, so a mixed fleet keeps sharing records during a
    rollout. Anything else (a hand edit, a garbled record) is ValueError: ignored like an unparsable record,
    instead of failing the fetch on every node that reads it.
    """
    if not isinstance(value, list):
        raise ValueError(f"files: a list, not {type(value).__name__}")
    files: list[dict[str, Any]] = []
    for item in value:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("path"), str)
            and type(item.get("size")) is int
            and 0 <= item["size"] < 2**63
            and all(item.get(h) is None or isinstance(item[h], str) for h in _HASHES)
        ):
            raise ValueError(f"files: not a file record: {str(item)[:100]}")
        files.append({"path": item["path"], "size": item["size"], **{h: item.get(h) for h in _HASHES}})
    return files


class ResolveCache:
    """The cluster-wide record of resolved revisions (see the module contract); ``hits``/``misses`` are counted."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        *,
        lock: OriginSlots | None = None,
        ttl_s: float = 600.0,
        poll_s: float = 0.5,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._ttl_s = ttl_s
        self._lock = lock  # a one-slot Lease per source: one node of the cluster resolves at a time
        self._poll_s = poll_s  # how often a waiting node polls the record when its watch ended
        self.hits = 0
        self.misses = 0

    async def resolve(
        self, uri: str, revision: str, compute: Callable[[], Awaitable[tuple[str, list[dict[str, Any]]]]]
    ) -> tuple[str, list[dict[str, Any]]]:
        """The commit and file list of ``uri`` at ``revision``: from the record, or from ``compute`` (then recorded).

        With a lock, one node of the cluster computes at a time and the others read its record afterwards: a node
        waiting for the lock watches for the record and stops waiting once it is there.
        """
        found = await self.get(uri, revision)
        if found is not None:
            return found
        if self._lock is None:
            result = await compute()
            await self.put(uri, *result)
            return result
        # While another node holds the lock, its record is watched for: the nodes that queued behind the resolving
        # one go on as soon as it is written, instead of taking the lock one after another to read it.
        busy = asyncio.Event()  # the lock is taken: another node resolves (the lock's first round told)
        lock = self._lock.hold("resolve:" + uri, busy.set)
        holding, recorded = await enter_or(lock, self._written(uri, revision, busy))
        if not holding:
            assert recorded is not None
            return recorded
        try:
            found = await self.get(uri, revision)  # another node may have resolved it while we waited
            if found is not None:
                return found
            result = await compute()
            await self.put(uri, *result)
            return result
        finally:
            await lock.__aexit__(None, None, None)

    @staticmethod
    def name(uri: str) -> str:
        """The record's ConfigMap name for ``uri``: a digest, since a URI is no valid object name."""
        return "model-agent-resolve-" + hashlib.sha256(uri.encode()).hexdigest()[:24]

    async def get(self, uri: str, revision: str) -> tuple[str, list[dict[str, Any]]] | None:
        """The recorded answer for ``uri`` if it is still valid for ``revision``; None for anything unreadable."""
        try:
            cm = await self._client.request("GET", CONFIGMAPS.path(self._namespace, self.name(uri)))
        except (ApiError, ApiUnavailable) as exc:
            self.misses += 1
            if not (isinstance(exc, ApiError) and exc.status == 404):
                log.debug("no usable resolve record", uri=uri, why=str(exc))
            return None
        return self._read(cm, uri, revision)

    def _read(self, cm: dict[str, Any], uri: str, revision: str) -> tuple[str, list[dict[str, Any]]] | None:
        """The answer a record's ConfigMap holds, if it is one for ``uri`` still valid for ``revision``."""
        try:
            data = cm.get("data") or {}
            if data.get("uri") != uri:
                raise ValueError("record for another source")
            if not _COMMIT.match(revision) and not self._fresh(float(data.get("at", "0"))):
                raise ValueError("expired")
            files = _file_list(json_text.loads(data["files"]))
            commit = str(data["commit"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.misses += 1
            log.debug("no usable resolve record", uri=uri, why=str(exc))
            return None
        self.hits += 1
        return commit, files

    async def _written(self, uri: str, revision: str, busy: asyncio.Event) -> tuple[str, list[dict[str, Any]]]:
        """The record of ``uri`` once a usable one is there (see the module contract: watched, else polled), looked
        for once ``busy`` is set: a node that takes the lock at once spends no request on a watch."""
        await busy.wait()
        name = self.name(uri)
        changed = asyncio.Event()
        reflector = Reflector(
            self._client,
            CONFIGMAPS,
            lambda _change, _why: changed.set(),
            namespace=self._namespace,
            field_selector=f"metadata.name={name}",
        )
        watching = asyncio.ensure_future(reflector.run())
        try:
            while not watching.done():
                changed.clear()
                cm = reflector.store.get(f"{self._namespace}/{name}")
                found = self._read(cm, uri, revision) if cm is not None else None
                if found is not None:
                    return found
                waiter = asyncio.ensure_future(changed.wait())
                try:
                    await asyncio.wait([watching, waiter], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
        error = "cancelled" if watching.cancelled() else repr(watching.exception())
        log.warning("the resolve record's watch ended; polling it", uri=uri, error=error)
        while True:
            found = await self.get(uri, revision)
            if found is not None:
                return found
            await asyncio.sleep(self._poll_s)

    def _fresh(self, at: float) -> bool:
        """A record of a branch or tag stamped ``at`` is younger than the TTL. A stamp more than a TTL ahead of this
        node's clock, or not a number (``nan``, ``inf``), would make it fresh for good: such a record is stale, and
        the node resolves again (a few seconds of skew between nodes' clocks only shift the TTL)."""
        return math.isfinite(at) and -self._ttl_s <= time.time() - at <= self._ttl_s

    async def put(self, uri: str, commit: str, files: list[dict[str, Any]]) -> None:
        """Record an answer for the other nodes; a failed write is logged, never raised (they resolve by themselves)."""
        name = self.name(uri)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": self._namespace,
                "labels": {"app.kubernetes.io/managed-by": "model-agent"},
            },
            "data": {"uri": uri, "commit": commit, "files": json.dumps(files), "at": str(time.time())},
        }
        try:
            try:
                await self._client.request("POST", CONFIGMAPS.path(self._namespace), body=body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                await self._client.request(
                    "PATCH",
                    CONFIGMAPS.path(self._namespace, name),
                    body={"data": body["data"]},
                    content_type="application/merge-patch+json",
                )
        except (ApiError, ApiUnavailable) as exc:
            log.warning("resolve record not written", uri=uri, error=str(exc))
