"""API resource descriptions: the URL of every kind the agent reads or writes.

One frozen :class:`Resource` per kind knows its group, version, plural and scope, and builds collection
and object paths. Nothing here performs I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_agent.kube.client import qs


@dataclass(frozen=True)
class Resource:
    """One API kind: enough to build its URLs and say whether it lives in a namespace."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` its objects carry: ``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """Collection path (``name`` None) or object path; ``namespace`` None lists across namespaces."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{qs(namespace)}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{qs(name)}"
        return base


BASEMODELS = Resource("ome.io", "v1beta1", "basemodels", "BaseModel", namespaced=True)
CLUSTERBASEMODELS = Resource("ome.io", "v1beta1", "clusterbasemodels", "ClusterBaseModel", namespaced=False)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False)

MODEL_RESOURCES = {"BaseModel": BASEMODELS, "ClusterBaseModel": CLUSTERBASEMODELS}
