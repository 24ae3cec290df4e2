"""Prometheus metrics: OME's names, types and labels (docs/ome-compatibility.md#111-prometheus-metrics), plus this
project's safety metrics.

One :class:`Metrics` object owns a private registry (tests create as many agents as they like in one
process without name clashes); ``/metrics`` serves that registry. Label values follow OME: ``model_type``
is ``BaseModel``/``ClusterBaseModel``, ``namespace`` is empty for cluster models.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

MODEL_LABELS = ("model_type", "namespace", "name")
# OME's ten buckets (0.1 s doubling to 51.2 s) and nine more up to 7.3 h: every boundary OME's queries use is
# still there, and an hour-long download no longer lands in +Inf with everything else above a minute.
_DURATION_BUCKETS = tuple(0.1 * 2**k for k in range(19))
_WAIT_BUCKETS = tuple(float(2**k) for k in range(10))
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Every metric of one agent, in a private registry; attribute names are the code's, metric names OME's."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # --- OME's metrics (names are a compatibility contract)
        self.downloads_success = Counter(
            "model_agent_downloads_success", "Successful model downloads", MODEL_LABELS, registry=r
        )
        self.downloads_failed = Counter(
            "model_agent_downloads_failed", "Failed model downloads", MODEL_LABELS, registry=r
        )
        self.verifications = Counter(
            "model_agent_verifications", "Model verifications", (*MODEL_LABELS, "result"), registry=r
        )
        self.md5_failed = Counter("model_agent_md5_checksum_failed", "MD5 checksum failures", MODEL_LABELS, registry=r)
        self.rate_limit = Counter("model_agent_rate_limit", "Rate-limited downloads", MODEL_LABELS, registry=r)
        self.download_duration = Histogram(
            "model_agent_download_duration_seconds",
            "Download duration",
            MODEL_LABELS,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.verification_duration = Histogram(
            "model_agent_verification_duration_seconds",
            "Verification duration",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.download_bytes = Counter("model_agent_download_bytes", "Bytes downloaded", MODEL_LABELS, registry=r)
        self.rate_limit_wait = Histogram(
            "model_agent_rate_limit_wait_seconds",
            "Time waited because of rate limits",
            MODEL_LABELS,
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        # --- this project's
        self.confirmations = Counter(
            "model_agent_delete_confirmations",
            "Live-read confirmations of a removal candidate, by outcome",
            ("outcome",),
            registry=r,
        )
        self.confirmation_reads = Counter(
            "model_agent_confirmation_reads",
            "Live reads made to confirm removal candidates (get: one object; list: a whole kind)",
            ("method",),
            registry=r,
        )
        self.quarantined = Counter("model_agent_quarantined", "Models moved to the trash", registry=r)
        self.restored = Counter("model_agent_restored", "Models restored from the trash", registry=r)
        self.purged = Counter("model_agent_purged", "Trash entries purged", registry=r)
        self.verified_files = Counter("model_agent_verified_files", "Files re-hashed by verification", registry=r)
        self.verifications_skipped = Counter(
            "model_agent_verifications_skipped",
            "Scheduled verifications left to a peer on a shared root (skip: verified this round; busy: under way)",
            ("turn",),
            registry=r,
        )
        self.breaker_open = Gauge("model_agent_delete_breaker_open", "1 while destructive acts are held", registry=r)
        self.breaker_trips = Counter("model_agent_delete_breaker_trips", "Times the breaker opened", registry=r)
        self.drift_repairs = Counter(
            "model_agent_drift_repairs", "Labels/entries/files repaired", ("what",), registry=r
        )
        self.models = Gauge("model_agent_models", "Models on this node by state", ("state",), registry=r)
        self.queue_depth = Gauge("model_agent_workqueue_depth", "Keys waiting in the work queue", registry=r)
        self.queue_latency = Histogram(
            "model_agent_workqueue_wait_seconds", "Time a key waited before processing", registry=r
        )
        self.reconcile_duration = Histogram(
            "model_agent_reconcile_duration_seconds", "Time to reconcile one key", registry=r
        )
        self.relists = Counter("model_agent_relists", "Full LISTs by resource", ("resource",), registry=r)
        self.api_latency = Histogram(
            "model_agent_api_request_duration_seconds",
            "Kubernetes API request latency",
            ("verb", "resource", "code"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.unmanaged = Gauge(
            "model_agent_unmanaged_directories", "Directories under the roots that no manifest explains", registry=r
        )
        self.fetched_bytes = Counter("model_agent_fetched_bytes", "Bytes fetched from sources", registry=r)
        self.unresolved_keys = Gauge(
            "model_agent_unresolved_keys",
            "Node labels and ConfigMap keys that map to no known model (truncated, no real name): left alone",
            ("where",),
            registry=r,
        )
        # The node's model-status ConfigMap against the API server's 1 MiB limit (agent/node_configmap.py).
        self.configmap_bytes = Gauge("model_agent_configmap_bytes", "Data bytes in the node's ConfigMap", registry=r)
        self.configmap_full = Gauge("model_agent_configmap_full", "1 while model entries find no room", registry=r)
        self.configmap_refused = Gauge(
            "model_agent_configmap_refused_entries", "Model entries not written: no room", registry=r
        )
        self.configmap_compacted = Gauge(
            "model_agent_configmap_compacted_entries", "Model entries written without their config for room", registry=r
        )
        self.rbac_denied = Counter(
            "model_agent_rbac_denied", "API requests denied (401/403) by resource", ("resource",), registry=r
        )
        # --- runtime robustness: supervised background tasks and event-loop responsiveness
        self.task_failures = Counter(
            "model_agent_background_task_failures",
            "Unexpected ends of a supervised background task (each is logged and restarted)",
            ("component",),
            registry=r,
        )
        self.tasks_down = Gauge(
            "model_agent_background_tasks_down", "Supervised background tasks down right now", registry=r
        )
        self.loop_lag = Histogram(
            "model_agent_event_loop_lag_seconds",
            "How late the event loop woke for each loop-tick sleep (every 0.1 s): blocking work on the loop",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.loop_lag_max = Gauge(
            "model_agent_event_loop_lag_max_seconds",
            "The worst event-loop lag seen within the last minute",
            registry=r,
        )
        # --- node-to-node distribution (model_agent.peers)
        # origin and peer count bytes transferred (hf:// counts both; other sources count none yet). shared counts
        # the bytes of a model another node fetched and published on a shared root and this node adopted with no
        # transfer: origin + peer + shared is what the node needed, so the origin's share is what the fleet paid.
        self.bytes_by_source = Counter(
            "model_agent_fetched_bytes_by_source",
            "Bytes this node got per model by where they came from: origin and peer (another node's peer server) "
            "transferred; shared adopted without a transfer from another node's publication on a shared root",
            ("source",),
            registry=r,
        )
        self.peers_banned = Counter(
            "model_agent_peers_banned", "Peers banned for serving bytes that failed verification", registry=r
        )
        self.peer_upload_bytes = Counter(
            "model_agent_peer_upload_bytes", "Bytes this node's peer server sent to other nodes", registry=r
        )
        self.peer_upload_rate_limit = Gauge(
            "model_agent_peer_upload_rate_limit_bytes",
            "The peer server's upload cap in bytes/s (0: none); the rate sent is rate(model_agent_peer_upload_bytes)",
            registry=r,
        )

    def observe_api(self, verb: str, resource: str, status: int, seconds: float) -> None:
        """Record one API request's latency; a 401/403 also counts as an RBAC denial of ``resource``."""
        self.api_latency.labels(verb, resource, str(status)).observe(seconds)
        if status in (401, 403):
            self.rbac_denied.labels(resource).inc()

    def render(self) -> bytes:
        """The registry in the Prometheus text format, for ``/metrics``."""
        return generate_latest(self.registry)
