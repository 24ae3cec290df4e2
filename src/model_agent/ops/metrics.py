"""Prometheus metrics: OME's names, types and labels (docs/ome-compatibility.md#111-prometheus-metrics), plus this
project's safety metrics.

One :class:`Metrics` object owns a private registry (tests create as many agents as they like in one
process without name clashes); ``/metrics`` serves that registry. Label values follow OME: ``model_type``
is ``BaseModel``/``ClusterBaseModel``, ``namespace`` is empty for cluster models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

MODEL_LABELS = ("model_type", "namespace", "name")
# OME's ten buckets (0.1 s doubling to 51.2 s) and nine more up to 7.3 h: every boundary OME's queries use is
# still there, and an hour-long download no longer lands in +Inf with everything else above a minute.
_DURATION_BUCKETS = tuple(0.1 * 2**k for k in range(19))
_WAIT_BUCKETS = tuple(float(2**k) for k in range(10))
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class _Declare:
    """Declares the metrics of one registry: one call a metric, by name, help text and label names."""

    registry: CollectorRegistry

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        """A counter (exposed with the ``_total`` suffix)."""
        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge."""
        return Gauge(name, doc, labels, registry=self.registry)

    def histogram(
        self, name: str, doc: str, labels: Sequence[str] = (), *, buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS
    ) -> Histogram:
        """A histogram (prometheus_client's default buckets unless ``buckets`` are given)."""
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)


class Metrics:
    """Every metric of one agent, in a private registry; attribute names are the code's, metric names OME's."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        m = _Declare(self.registry)
        # --- OME's metrics (names are a compatibility contract)
        self.downloads_success = m.counter("model_agent_downloads_success", "Successful model downloads", MODEL_LABELS)
        self.downloads_failed = m.counter("model_agent_downloads_failed", "Failed model downloads", MODEL_LABELS)
        self.verifications = m.counter("model_agent_verifications", "Model verifications", (*MODEL_LABELS, "result"))
        self.md5_failed = m.counter("model_agent_md5_checksum_failed", "MD5 checksum failures", MODEL_LABELS)
        self.rate_limit = m.counter("model_agent_rate_limit", "Rate-limited downloads", MODEL_LABELS)
        self.download_duration = m.histogram(
            "model_agent_download_duration_seconds", "Download duration", MODEL_LABELS, buckets=_DURATION_BUCKETS
        )
        self.verification_duration = m.histogram(
            "model_agent_verification_duration_seconds", "Verification duration", buckets=_DURATION_BUCKETS
        )
        self.download_bytes = m.counter("model_agent_download_bytes", "Bytes downloaded", MODEL_LABELS)
        self.rate_limit_wait = m.histogram(
            "model_agent_rate_limit_wait_seconds",
            "Time waited because of rate limits",
            MODEL_LABELS,
            buckets=_WAIT_BUCKETS,
        )
        # --- this project's
        self.confirmations = m.counter(
            "model_agent_delete_confirmations",
            "Live-read confirmations of a removal candidate, by outcome",
            ("outcome",),
        )
        self.confirmation_reads = m.counter(
            "model_agent_confirmation_reads",
            "Live reads made to confirm removal candidates (get: one object; list: a whole kind)",
            ("method",),
        )
        self.quarantined = m.counter("model_agent_quarantined", "Models moved to the trash")
        self.restored = m.counter("model_agent_restored", "Models restored from the trash")
        self.purged = m.counter("model_agent_purged", "Trash entries purged")
        self.verified_files = m.counter("model_agent_verified_files", "Files re-hashed by verification")
        self.verifications_skipped = m.counter(
            "model_agent_verifications_skipped",
            "Scheduled verifications left to a peer on a shared root (skip: verified this round; busy: under way)",
            ("turn",),
        )
        self.breaker_open = m.gauge("model_agent_delete_breaker_open", "1 while destructive acts are held")
        self.breaker_trips = m.counter("model_agent_delete_breaker_trips", "Times the breaker opened")
        self.drift_repairs = m.counter("model_agent_drift_repairs", "Labels/entries/files repaired", ("what",))
        self.models = m.gauge("model_agent_models", "Models on this node by state", ("state",))
        self.queue_depth = m.gauge("model_agent_workqueue_depth", "Keys waiting in the work queue")
        self.queue_latency = m.histogram("model_agent_workqueue_wait_seconds", "Time a key waited before processing")
        self.reconcile_duration = m.histogram("model_agent_reconcile_duration_seconds", "Time to reconcile one key")
        self.relists = m.counter("model_agent_relists", "Full LISTs by resource", ("resource",))
        self.api_latency = m.histogram(
            "model_agent_api_request_duration_seconds",
            "Kubernetes API request latency",
            ("verb", "resource", "code"),
            buckets=_LATENCY_BUCKETS,
        )
        self.unmanaged = m.gauge(
            "model_agent_unmanaged_directories", "Directories under the roots that no manifest explains"
        )
        self.fetched_bytes = m.counter("model_agent_fetched_bytes", "Bytes fetched from sources")
        self.unresolved_keys = m.gauge(
            "model_agent_unresolved_keys",
            "Node labels and ConfigMap keys that map to no known model (truncated, no real name): left alone",
            ("where",),
        )
        # The node's model-status ConfigMap against the API server's 1 MiB limit (agent/node_configmap.py).
        self.configmap_bytes = m.gauge("model_agent_configmap_bytes", "Data bytes in the node's ConfigMap")
        self.configmap_full = m.gauge("model_agent_configmap_full", "1 while model entries find no room")
        self.configmap_refused = m.gauge("model_agent_configmap_refused_entries", "Model entries not written: no room")
        self.configmap_compacted = m.gauge(
            "model_agent_configmap_compacted_entries", "Model entries written without their config for room"
        )
        self.rbac_denied = m.counter(
            "model_agent_rbac_denied", "API requests denied (401/403) by resource", ("resource",)
        )
        # --- runtime robustness: supervised background tasks and event-loop responsiveness
        self.task_failures = m.counter(
            "model_agent_background_task_failures",
            "Unexpected ends of a supervised background task (each is logged and restarted)",
            ("component",),
        )
        self.tasks_down = m.gauge("model_agent_background_tasks_down", "Supervised background tasks down right now")
        self.loop_lag = m.histogram(
            "model_agent_event_loop_lag_seconds",
            "How late the event loop woke for each loop-tick sleep (every 0.1 s): blocking work on the loop",
            buckets=_LAG_BUCKETS,
        )
        self.loop_lag_max = m.gauge(
            "model_agent_event_loop_lag_max_seconds", "The worst event-loop lag seen within the last minute"
        )
        # --- node-to-node distribution (model_agent.peers)
        # origin and peer count bytes transferred (hf:// counts both; other sources count none yet). shared counts
        # the bytes of a model another node fetched and published on a shared root and this node adopted with no
        # transfer: origin + peer + shared is what the node needed, so the origin's share is what the fleet paid.
        self.bytes_by_source = m.counter(
            "model_agent_fetched_bytes_by_source",
            "Bytes this node got per model by where they came from: origin and peer (another node's peer server) "
            "transferred; shared adopted without a transfer from another node's publication on a shared root",
            ("source",),
        )
        self.listener_refused = m.counter(
            "model_agent_listener_connections_refused",
            "Connections a listener closed at a limit: total, per-source (too many open), slow-head (no complete "
            "request head in time)",
            ("listener", "why"),
        )
        self.peers_banned = m.counter(
            "model_agent_peers_banned", "Peers banned for serving bytes that failed verification"
        )
        self.peer_upload_bytes = m.counter(
            "model_agent_peer_upload_bytes", "Bytes this node's peer server sent to other nodes"
        )
        self.peer_requests = m.counter(
            "model_agent_peer_requests",
            "Requests this node's peer server answered, by method (HEAD: a probe, GET: bytes) and HTTP status",
            ("method", "code"),
        )
        self.peer_upload_rate_limit = m.gauge(
            "model_agent_peer_upload_rate_limit_bytes",
            "The peer server's upload cap in bytes/s (0: none); the rate sent is rate(model_agent_peer_upload_bytes)",
        )

    def observe_api(self, verb: str, resource: str, status: int, seconds: float) -> None:
        """Record one API request's latency; a 401/403 also counts as an RBAC denial of ``resource``."""
        self.api_latency.labels(verb, resource, str(status)).observe(seconds)
        if status in (401, 403):
            self.rbac_denied.labels(resource).inc()

    def render(self) -> bytes:
        """The registry in the Prometheus text format, for ``/metrics``."""
        return generate_latest(self.registry)
