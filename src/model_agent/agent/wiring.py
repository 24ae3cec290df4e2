"""Wiring: every collaborator of one agent process, built once from the settings, in dependency order.

Role: the one place that knows how the layers fit — which reflector feeds which handler, which queue the
fetcher wakes, which breaker the remover asks, which sources the reconciler may use. Nothing here decides or
acts; the objects it builds do. :class:`~model_agent.agent.runtime.Agent` runs them.

Contract:

* Built before the event loop runs anything: no I/O, no tasks (``Agent.start`` starts them).
* The watch callbacks go to :class:`~model_agent.agent.watch_handlers.WatchHandlers`, the Node-level
  warnings (breaker trips, denied requests) to :class:`~model_agent.agent.node_alerts.NodeAlerts`; both are
  given here and reach the collaborators through this object once it is complete (``attach``), so a callback
  never sees a half-built agent: reflectors deliver nothing before ``Agent.start``.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from model_agent.agent.breaker import Breaker
from model_agent.agent.confirm import Confirmer
from model_agent.agent.fetcher import Fetcher
from model_agent.agent.lifecycle import Lane, lane, presence
from model_agent.agent.node_configmap import NodeConfigMap
from model_agent.agent.node_labels import NodeLabels
from model_agent.agent.origin_slots import OriginSlots
from model_agent.agent.reconciler import Context, Reconciler
from model_agent.agent.removal import RemovalContext, Remover
from model_agent.agent.resolve_cache import ResolveCache
from model_agent.agent.settings import Settings
from model_agent.agent.shared_root import SharedRoots
from model_agent.agent.supervisor import Supervisor
from model_agent.kube.client import KubeClient
from model_agent.kube.ratelimit import TokenBucket
from model_agent.kube.reflector import Reflector
from model_agent.kube.resources import BASEMODELS, CLUSTERBASEMODELS, CONFIGMAPS, NODES
from model_agent.kube.workqueue import WorkQueue
from model_agent.local import capacity
from model_agent.local.capacity import DiskReserve
from model_agent.local.layout import Layout, resume_file
from model_agent.local.manifest import ManifestStore
from model_agent.local.trash import Trash
from model_agent.model.keys import ModelKind
from model_agent.model.resources import ModelRef
from model_agent.model.selection import INSTANCE_TYPE_MAP_ENV, parse_instance_type_map
from model_agent.model.uris import StorageType
from model_agent.ops.events import EventRecorder
from model_agent.ops.metrics import Metrics
from model_agent.peers.service import PeerService
from model_agent.sources import egress
from model_agent.sources.cloud import CloudSource
from model_agent.sources.hf import HuggingFaceSource
from model_agent.sources.oci import OciSource
from model_agent.sources.s3 import S3Source

if TYPE_CHECKING:
    from model_agent.agent.node_alerts import NodeAlerts
    from model_agent.agent.watch_handlers import WatchHandlers


class Wiring:
    """The collaborators of one agent, as attributes (``wiring.queue``, ``wiring.reconciler``, ...)."""

    def __init__(self, settings: Settings, client: KubeClient, handlers: WatchHandlers, alerts: NodeAlerts) -> None:
        self.settings = settings
        self.client = client
        self.metrics = Metrics()
        client.observers.append(self.metrics.observe_api)
        client.observers.append(alerts.note_forbidden)
        if settings.api_qps > 0:
            client.before_request = TokenBucket(settings.api_qps, settings.api_burst).acquire
        self.layout = Layout(settings.models_root_dir, list(settings.allowed_roots), settings.state_dir)
        capacity.REGISTRY.configure(DiskReserve.parse(settings.disk_reserve))
        self.manifests = ManifestStore(self.layout)
        self.trash = Trash(self.layout)
        self.queue: WorkQueue[str] = WorkQueue(
            "models",
            on_wait=lambda _k, s: self.metrics.queue_latency.observe(s),
            on_processed=lambda _k, s: self.metrics.reconcile_duration.observe(s),
            urgent=self._urgent,
        )
        node = settings.node_name
        self.models = {
            ModelKind.BASE_MODEL.value: Reflector(client, BASEMODELS, handlers.on_model_change),
            ModelKind.CLUSTER_BASE_MODEL.value: Reflector(client, CLUSTERBASEMODELS, handlers.on_model_change),
        }
        self.node = Reflector(client, NODES, handlers.on_node_change, field_selector=f"metadata.name={node}")
        self.configmap = Reflector(
            client,
            CONFIGMAPS,
            handlers.on_configmap_change,
            namespace=settings.namespace,
            field_selector=f"metadata.name={node}",
        )
        self.reflectors = [*self.models.values(), self.node, self.configmap]
        for reflector in self.reflectors:
            reflector.on_relist = handlers.on_relist
        self.events = EventRecorder(client, host=node)
        self.labels = NodeLabels(client, node, lambda: self.node.store.get(node), attempts=settings.node_label_retry)
        self.node_configmap = NodeConfigMap(
            client,
            settings.namespace,
            node,
            lambda: self.configmap.store.get(f"{settings.namespace}/{node}"),
            events=self.events,
            metrics=self.metrics,
            node_object=lambda: self.node.store.get(node),
        )
        self.fetcher = Fetcher(settings.num_download_worker, self.queue.add)
        # A models root mounted on many nodes: one fetch for all, files removed only once gone (agent/shared_root.py)
        self.shared_roots = SharedRoots(
            client,
            settings.namespace,
            node,
            self.layout,
            self.manifests,
            forced=settings.shared_root,
            lease_s=settings.origin_lease_s,
            max_hold_s=settings.lease_max_hold_s,
            requeue=self.queue.add,
        )
        self.origin = OriginSlots(
            client,
            settings.namespace,
            node,
            settings.max_concurrent_origin_fetches,
            lease_s=settings.origin_lease_s,
            max_hold_s=settings.lease_max_hold_s,
        )
        self.resolve_cache = (
            ResolveCache(
                client,
                settings.namespace,
                # A waiting node looks for the record every 0.5 s and for the lock only every 1-3 s: the lock is
                # needed again only when its holder failed, and each look is an API request from a bucket of
                # 5 a second that the fetch's own requests (label, entry, Leases) share.
                lock=OriginSlots(
                    client,
                    settings.namespace,
                    node,
                    1,
                    lease_s=settings.origin_lease_s,
                    poll_s=2.0,
                    max_hold_s=settings.lease_max_hold_s,
                ),
            )
            if settings.max_concurrent_origin_fetches
            else None
        )
        self.breaker = Breaker(
            ratio=settings.delete_breaker_ratio,
            minimum=settings.delete_breaker_min,
            window_s=settings.delete_breaker_window_s,
            settle_s=settings.delete_settle_s,
            resume_file=resume_file(self.layout.primary.private, node),
            fleet_resume_file=resume_file(self.layout.primary.private, None),
        )
        self.breaker.on_change = alerts.on_breaker_change
        self.confirmer = Confirmer(
            client,
            deadline_s=settings.confirm_timeout_s,
            batch_threshold=settings.confirm_batch_threshold if settings.confirm_batch_threshold >= 0 else None,
            on_read=lambda method: self.metrics.confirmation_reads.labels(method).inc(),
            debounce_s=settings.confirm_debounce_s,
            jitter_s=min(1.0, settings.confirm_debounce_s),
        )
        # What the remover and the reconciler both act on: this node's API client, disk, label and entry
        # writers, downloads, Events and metrics.
        node_state: dict[str, Any] = {
            "client": client,
            "node_name": node,
            "layout": self.layout,
            "manifests": self.manifests,
            "trash": self.trash,
            "labels": self.labels,
            "configmap": self.node_configmap,
            "fetcher": self.fetcher,
            "events": self.events,
            "metrics": self.metrics,
        }
        self.remover = Remover(
            RemovalContext(
                **node_state,
                breaker=self.breaker,
                cached_models=handlers.cached_models,
                confirm_deadline_s=settings.confirm_timeout_s,
                repair_cache=handlers.repair_cache,
                confirmer=self.confirmer,
                shared_roots=self.shared_roots,
            )
        )
        ranged = settings.ranged_config()
        # Node-to-node distribution (model_agent.peers): off unless configured; the chart turns it on.
        peer_config = settings.peer_config()
        self.peers = (
            PeerService(
                peer_config,
                client,
                namespace=settings.namespace,
                node_name=node,
                manifests=self.manifests.all,
                roots=lambda: [root.path for root in self.layout.roots],
                models=lambda: {kind: list(r.store.values()) for kind, r in self.models.items()},
                metrics=self.metrics,
                ranged=ranged,
                by_blob_id=lambda manifest: egress.serves_by_blob_id(manifest.key),
            )
            if peer_config.enabled
            else None
        )
        s3 = S3Source(ranged=ranged)
        cloud = CloudSource(ranged=ranged)  # gs:// and az:// (one instance: stores are cached)
        self.reconciler = Reconciler(
            Context(
                **node_state,
                namespace=settings.namespace,
                remover=self.remover,
                hf=HuggingFaceSource(
                    settings.hf_endpoint,
                    resolve_cache=self.resolve_cache,
                    user_agent=f"model-agent/{node}",
                    ranged=ranged,
                    peers=self.peers.fetcher if self.peers is not None else None,
                    on_origin_bytes=self.peers.on_origin_bytes if self.peers is not None else lambda _n: None,
                ),
                models_store={kind: r.store for kind, r in self.models.items()},
                requeue_after=handlers.requeue_after,
                busy=lambda: self.queue.depth + self.queue.processing_count > 0,
                sources={
                    StorageType.S3: s3,
                    StorageType.OCI: OciSource(ranged=ranged, s3=s3),
                    StorageType.GCS: cloud,
                    StorageType.AZURE: cloud,
                },
                instance_type_map=parse_instance_type_map(os.environ.get(INSTANCE_TYPE_MAP_ENV)),
                origin_slots=self.peers.slots(self.origin.hold, egress.takes_from_peers)
                if self.peers is not None
                else self.origin.hold,
                download_limits=settings.download_limits(),
                max_failed_per_namespace=settings.max_failed_per_namespace,
                max_models_per_namespace=settings.max_models_per_namespace,
                tenant_local_allow=tuple(settings.tenant_local_allow),
                shared_roots=self.shared_roots,
            )
        )
        self.supervisor = Supervisor(on_failure=lambda name: self.metrics.task_failures.labels(name).inc())
        self.started = asyncio.Event()  # set once every cache has synced: nothing is reconciled before

    def _urgent(self, key: str) -> bool:
        """The work queue's lane classifier: a model whose object is deleting or gone from the cache is urgent
        (agent/lifecycle.py), so the removal workers take it before any other key."""
        try:
            ref = ModelRef.from_key(key)
        except ValueError:
            return False
        return lane(presence(self.reconciler.cached_object(ref))) == Lane.URGENT
