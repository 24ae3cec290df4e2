"""The node's collaborators that every actor of the agent acts through, built once by the wiring.

Role: the reconciler's :class:`~model_agent.agent.reconciler.Context` and the remover's
:class:`~model_agent.agent.removal.RemovalContext` both extend :class:`NodeParts`, so the two actors name the
same objects for this node's API client, disk, label and entry writers, downloads, Events and metrics, and a
collaborator added here reaches both.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_agent.agent.fetcher import Fetcher
from model_agent.agent.node_configmap import NodeConfigMap
from model_agent.agent.node_labels import NodeLabels
from model_agent.kube.client import KubeClient
from model_agent.local.layout import Layout
from model_agent.local.manifest import ManifestStore
from model_agent.local.trash import Trash
from model_agent.ops.events import EventRecorder
from model_agent.ops.metrics import Metrics


@dataclass
class NodeParts:
    """This node's API client, roots, records, trash, label and entry writers, fetcher, Events and metrics."""

    client: KubeClient
    node_name: str
    layout: Layout
    manifests: ManifestStore
    trash: Trash
    labels: NodeLabels
    configmap: NodeConfigMap
    fetcher: Fetcher
    events: EventRecorder
    metrics: Metrics
