"""Test-side helpers over the real API server: models, Nodes, the node ConfigMap, Events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from model_agent.kube.client import ApiError, KubeClient
from model_agent.kube.resources import BASEMODELS, CLUSTERBASEMODELS, CONFIGMAPS, EVENTS, NODES, SECRETS
from testbed.servers.controlplane import node_manifest


def cbm(name: str, uri: str, path: str | None = None, **storage: Any) -> dict[str, Any]:
    spec_storage: dict[str, Any] = {"storageUri": uri, **storage}
    if path is not None:
        spec_storage["path"] = path
    return {
        "apiVersion": "ome.io/v1beta1",
        "kind": "ClusterBaseModel",
        "metadata": {"name": name},
        "spec": {"storage": spec_storage},
    }


def bm(namespace: str, name: str, uri: str, path: str | None = None, **storage: Any) -> dict[str, Any]:
    body = cbm(name, uri, path, **storage)
    body["kind"] = "BaseModel"
    body["metadata"]["namespace"] = namespace
    return body


class Kube:
    def __init__(self, client: KubeClient) -> None:
        self.c = client

    async def create_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        try:
            await self.c.request("POST", NODES.path(), body=node_manifest(name, labels))
        except ApiError as exc:
            if exc.status != 409:
                raise

    async def node_labels(self, node: str) -> dict[str, str]:
        obj = await self.c.request("GET", NODES.path(name=node))
        return dict(obj["metadata"].get("labels") or {})

    async def label_node(self, node: str, labels: dict[str, str | None]) -> None:
        await self.c.request(
            "PATCH",
            NODES.path(name=node),
            body={"metadata": {"labels": labels}},
            content_type="application/merge-patch+json",
        )

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = CLUSTERBASEMODELS if obj["kind"] == "ClusterBaseModel" else BASEMODELS
        ns = obj["metadata"].get("namespace")
        return await self.c.request("POST", res.path(ns), body=obj)

    async def get_model(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        res = CLUSTERBASEMODELS if kind == "ClusterBaseModel" else BASEMODELS
        return await self.c.request("GET", res.path(namespace, name))

    async def update_model(
        self, kind: str, name: str, change: Callable[[dict[str, Any]], None], namespace: str | None = None
    ) -> dict[str, Any]:
        """Read the live object, apply ``change`` to it and PUT it back, again on a conflict.

        The agent writes the model too (finalizers), so a read-modify-write can lose the race; like
        client-go's RetryOnConflict this re-reads and re-applies the change instead of failing the test.
        """
        res = CLUSTERBASEMODELS if kind == "ClusterBaseModel" else BASEMODELS
        for _attempt in range(10):
            live = await self.get_model(kind, name, namespace)
            change(live)
            try:
                return await self.c.request("PUT", res.path(namespace, name), body=live)
            except ApiError as exc:
                if exc.status != 409:
                    raise
        raise AssertionError(f"{kind} {name}: still conflicting after 10 read-modify-write attempts")

    async def delete_model(self, kind: str, name: str, namespace: str | None = None) -> None:
        res = CLUSTERBASEMODELS if kind == "ClusterBaseModel" else BASEMODELS
        try:
            await self.c.request("DELETE", res.path(namespace, name))
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def model_gone(self, kind: str, name: str, namespace: str | None = None) -> bool:
        try:
            await self.get_model(kind, name, namespace)
        except ApiError as exc:
            return exc.status == 404
        return False

    async def configmap(self, node: str, namespace: str = "ome") -> dict[str, Any] | None:
        try:
            return await self.c.request("GET", CONFIGMAPS.path(namespace, node))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def entry(self, node: str, key: str, namespace: str = "ome") -> dict[str, Any] | None:
        cm = await self.configmap(node, namespace)
        raw = ((cm or {}).get("data") or {}).get(key)
        return json.loads(raw) if raw else None

    async def events_for(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        items = (await self.c.request("GET", EVENTS.path(namespace)))["items"]
        return [e for e in items if e.get("involvedObject", {}).get("name") == name]

    async def ensure_namespace(self, name: str) -> None:
        try:
            await self.c.request(
                "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            )
        except ApiError as exc:
            if exc.status != 409:
                raise

    async def create_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        import base64

        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
        await self.c.request("POST", SECRETS.path(namespace), body=body)


class LabelHistory:
    """Every value one node label took, as seen on a watch of that Node (no sampling gaps)."""

    def __init__(self, kube: Kube, node: str, label: str) -> None:
        self.kube = kube
        self.node = node
        self.label = label
        self.values: list[str | None] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LabelHistory:
        listing = await self.kube.c.request("GET", NODES.path(), query={"fieldSelector": f"metadata.name={self.node}"})
        rv = listing["metadata"]["resourceVersion"]
        started = asyncio.Event()

        async def run() -> None:
            query = {"watch": "true", "resourceVersion": rv, "fieldSelector": f"metadata.name={self.node}"}
            started.set()
            async for event in self.kube.c.watch_lines(NODES.path(), query=query, read_timeout=300):
                labels = (event.get("object") or {}).get("metadata", {}).get("labels") or {}
                self.values.append(labels.get(self.label))

        self._task = asyncio.create_task(run())
        await started.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
