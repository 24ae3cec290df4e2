"""The agent process: wires watching → queueing → processing, and shuts it down in order.

Layers (each in its own module):

* watching — four reflectors: BaseModels, ClusterBaseModels, this node's Node and this node's ConfigMap
  (both by field selector, so their watches carry one object each). Their change handlers only enqueue
  model keys: a model change enqueues that model; a change of the Node's labels, or of the ConfigMap's
  data, enqueues the models it concerns (that is how relabelling re-evaluates selection without a restart,
  and how a label or entry changed by someone else is repaired);
* queueing — one :class:`~model_agent.kube.workqueue.WorkQueue` of model keys (``Kind/namespace/name``);
* processing — ``workers`` tasks running :meth:`Reconciler.reconcile`, and the fetcher pool beside them.

Nothing is reconciled before every cache has synced once (an empty cache would make every local record
look orphaned; confirmation would save the weights, but the churn is pointless). A periodic resync
enqueues every known key; a periodic purge empties expired trash.

Every background task — the reflectors, resync, purge, verify and the loop tick — runs under a
:class:`~model_agent.agent.supervisor.Supervisor`: an unexpected end is logged with its traceback, counted
(``model_agent_background_task_failures_total``), restarts the component with backoff and turns ``/healthz``
red until it works again; a failed periodic pass is reported the same way. The loop tick wakes every
``LOOP_TICK_S`` and records how late it woke (``model_agent_event_loop_lag_seconds``): blocking work on
the event loop shows there first.

Shutdown order (docs/design.md#35-shutdown-order): stop the reflectors; drain the queue briefly and stop the
workers; stop the fetcher pool (partial downloads stay for resume); flush events; close the API client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from model_agent.agent.breaker import Breaker
from model_agent.agent.confirm import Confirmer
from model_agent.agent.fetcher import Fetcher
from model_agent.agent.node_configmap import NodeConfigMap
from model_agent.agent.node_labels import NodeLabels
from model_agent.agent.origin_slots import OriginSlots
from model_agent.agent.reconciler import Context, Reconciler
from model_agent.agent.removal import RemovalContext, Remover
from model_agent.agent.requeue import Requeue
from model_agent.agent.resolve_cache import ResolveCache
from model_agent.agent.settings import Settings
from model_agent.agent.supervisor import Recovered, Supervisor
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.ratelimit import TokenBucket
from model_agent.kube.reflector import Reflector
from model_agent.kube.resources import BASEMODELS, CLUSTERBASEMODELS, CONFIGMAPS, NODES
from model_agent.kube.store import Change, object_key
from model_agent.kube.workqueue import ShutDown, WorkQueue
from model_agent.local import capacity
from model_agent.local.capacity import DiskReserve
from model_agent.local.inventory import delete_discarded, discard, stale_staging, unmanaged_directories
from model_agent.local.layout import Layout, token_for
from model_agent.local.manifest import ManifestStore
from model_agent.local.trash import Trash
from model_agent.local.verify import mark_damaged, verify_manifest
from model_agent.model import key_owners
from model_agent.model.keys import MODEL_LABEL_DOMAIN, ModelKind
from model_agent.model.resources import ModelRef
from model_agent.model.selection import INSTANCE_TYPE_MAP_ENV, parse_instance_type_map
from model_agent.model.uris import StorageType
from model_agent.ops.events import WARNING, EventRecorder, ObjectRef
from model_agent.ops.looplag import LagWindow
from model_agent.ops.metrics import Metrics
from model_agent.sources.cloud import CloudSource
from model_agent.sources.hf import HuggingFaceSource
from model_agent.sources.oci import OciSource
from model_agent.sources.s3 import S3Source

log = structlog.get_logger(__name__)

SHUTDOWN_DRAIN_S = 3.0
REPAIR_REFUSED_RECHECK_S = 1.0
LOOP_TICK_S = 0.1  # fine enough to catch a 100 ms stall of the event loop, cheap enough to run always


class Agent:
    def __init__(self, settings: Settings, client: KubeClient) -> None:
        self.settings = settings
        self.client = client
        self.metrics = Metrics()
        client.observers.append(self.metrics.observe_api)
        self.forbidden: dict[str, float] = {}  # resource -> last 401/403 (monotonic), for /healthz
        client.observers.append(self._note_forbidden)
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
        )
        node = settings.node_name
        self.models = {
            ModelKind.BASE_MODEL.value: Reflector(client, BASEMODELS, self._on_model_change),
            ModelKind.CLUSTER_BASE_MODEL.value: Reflector(client, CLUSTERBASEMODELS, self._on_model_change),
        }
        self.node = Reflector(client, NODES, self._on_node_change, field_selector=f"metadata.name={node}")
        self.configmap = Reflector(
            client,
            CONFIGMAPS,
            self._on_configmap_change,
            namespace=settings.namespace,
            field_selector=f"metadata.name={node}",
        )
        self.reflectors = [*self.models.values(), self.node, self.configmap]
        for reflector in self.reflectors:
            reflector.on_relist = self._on_relist
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
        self.origin = OriginSlots(
            client, settings.namespace, node, settings.max_concurrent_origin_fetches, lease_s=settings.origin_lease_s
        )
        self.resolve_cache = (
            ResolveCache(
                client,
                settings.namespace,
                lock=OriginSlots(client, settings.namespace, node, 1, lease_s=settings.origin_lease_s, poll_s=0.5),
            )
            if settings.max_concurrent_origin_fetches
            else None
        )
        self.breaker = Breaker(
            ratio=settings.delete_breaker_ratio,
            minimum=settings.delete_breaker_min,
            window_s=settings.delete_breaker_window_s,
            settle_s=settings.delete_settle_s,
            resume_file=self.layout.primary.private / "resume",
        )
        self.breaker.on_change = self._on_breaker_change
        self.confirmer = Confirmer(
            client,
            deadline_s=settings.confirm_timeout_s,
            batch_threshold=settings.confirm_batch_threshold if settings.confirm_batch_threshold >= 0 else None,
            on_read=lambda method: self.metrics.confirmation_reads.labels(method).inc(),
            debounce_s=settings.confirm_debounce_s,
            jitter_s=min(1.0, settings.confirm_debounce_s),
        )
        self.remover = Remover(
            RemovalContext(
                client=client,
                node_name=node,
                layout=self.layout,
                manifests=self.manifests,
                trash=self.trash,
                labels=self.labels,
                configmap=self.node_configmap,
                fetcher=self.fetcher,
                events=self.events,
                metrics=self.metrics,
                breaker=self.breaker,
                cached_models=self._cached_models,
                confirm_deadline_s=settings.confirm_timeout_s,
                repair_cache=self._repair_cache,
                confirmer=self.confirmer,
            )
        )
        s3 = S3Source(ranged=settings.ranged_config())
        cloud = CloudSource(ranged=settings.ranged_config())  # gs:// and az:// (one instance: stores are cached)
        self.reconciler = Reconciler(
            Context(
                client=client,
                node_name=node,
                namespace=settings.namespace,
                layout=self.layout,
                manifests=self.manifests,
                trash=self.trash,
                labels=self.labels,
                configmap=self.node_configmap,
                fetcher=self.fetcher,
                events=self.events,
                metrics=self.metrics,
                remover=self.remover,
                hf=HuggingFaceSource(
                    settings.hf_endpoint,
                    resolve_cache=self.resolve_cache,
                    user_agent=f"model-agent/{node}",
                    ranged=settings.ranged_config(),
                ),
                models_store={kind: r.store for kind, r in self.models.items()},
                requeue_after=self._requeue_after,
                busy=lambda: self.queue.depth + self.queue.processing_count > 0,
                sources={
                    StorageType.S3: s3,
                    StorageType.OCI: OciSource(ranged=settings.ranged_config(), s3=s3),
                    StorageType.GCS: cloud,
                    StorageType.AZURE: cloud,
                },
                instance_type_map=parse_instance_type_map(os.environ.get(INSTANCE_TYPE_MAP_ENV)),
                origin_slots=self.origin.hold,
                download_limits=settings.download_limits(),
                max_failed_per_namespace=settings.max_failed_per_namespace,
            )
        )
        self._label_index: dict[str, str] = {}
        self.unmanaged: list[Path] = []
        self._inventory_keys: set[str] | None = None  # the next inventory pass's keys, while one is due
        self._inventory_task: asyncio.Task[None] | None = None
        # (where, key) of labels and ConfigMap keys that map to no known model, each logged once.
        self._unresolved: dict[tuple[str, str], key_owners.Unresolved] = {}
        self.supervisor = Supervisor(on_failure=lambda name: self.metrics.task_failures.labels(name).inc())
        self._workers: list[asyncio.Task[None]] = []
        self.started = asyncio.Event()
        self.last_loop_tick = time.monotonic()

    # --------------------------------------------------------------------------------- event handlers

    def _on_model_change(self, change: Change, _source: str) -> None:
        obj = change.new or change.old or {}
        kind = str(obj.get("kind") or "")
        meta = obj.get("metadata") or {}
        try:
            ref = ModelRef(ModelKind(kind), str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        except ValueError:
            return
        self._label_index[ref.label_key] = ref.key
        # For a delete this is the store's last state: the only place a plain delete leaves the reserve label.
        self.remover.note_last_state(ref.key, obj)
        self.confirmer.heard(ref.key)  # a removal candidate from now on needs a read newer than this
        self.queue.add(ref.key)

    def _on_relist(self, resource: str) -> None:
        self.metrics.relists.labels(resource).inc()
        for kind, reflector in self.models.items():
            if reflector.name == resource:
                self.confirmer.relisted(kind)  # LISTs begun earlier cannot speak for objects this one lacks

    def _on_node_change(self, change: Change, _source: str) -> None:
        old = ((change.old or {}).get("metadata") or {}).get("labels") or {}
        new = ((change.new or {}).get("metadata") or {}).get("labels") or {}
        changed = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
        prefix = MODEL_LABEL_DOMAIN + "/"
        if any(not k.startswith(prefix) for k in changed):
            self.enqueue_all()  # selection may have changed for every model
            return
        for label_key in changed:
            if new.get(label_key) == self.labels.written.get(label_key):
                continue  # the echo of our own write
            key = self._label_index.get(label_key)
            if key is not None:
                self.queue.add(key)

    def _on_configmap_change(self, change: Change, _source: str) -> None:
        old = (change.old or {}).get("data") or {}
        new = (change.new or {}).get("data") or {}
        if change.new is None or not self.node_configmap.identity_ok():
            self.enqueue_all()  # deleted, or stripped of the label the controller needs
            return
        changed = {
            key: new.get(key) or old.get(key) or ""  # a removed entry's last value still names its model
            for key in set(old) | set(new)
            if old.get(key) != new.get(key) and new.get(key) != self.node_configmap.written.get(key)
        }
        if not changed:
            return
        owners = key_owners.resolve(self._real_keys(), changed, ())
        for model_keys in owners.by_configmap_key.values():
            for model_key in model_keys:
                self.queue.add(model_key)
        self._note_unresolved(owners.unresolved, complete=False)

    def _on_breaker_change(self, opened: bool, message: str) -> None:
        self.metrics.breaker_open.set(1 if opened else 0)
        if opened:
            self.metrics.breaker_trips.inc()
        node = self.node.store.get(self.settings.node_name) or {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": self.settings.node_name},
        }
        self.events.emit(ObjectRef.of(node), WARNING, "DeleteBreakerOpen" if opened else "DeleteBreakerClosed", message)
        log.warning("delete breaker", open=opened, message=message)

    def _note_forbidden(self, verb: str, resource: str, status: int, _seconds: float) -> None:
        if status in (401, 403):
            first = resource not in self.forbidden
            self.forbidden[resource] = time.monotonic()
            if first and self.started.is_set():
                node = self.node.store.get(self.settings.node_name) or {
                    "kind": "Node",
                    "apiVersion": "v1",
                    "metadata": {"name": self.settings.node_name},
                }
                self.events.emit(
                    ObjectRef.of(node),
                    WARNING,
                    "Forbidden",
                    f"the agent may not {verb} {resource} (HTTP {status}): check its RBAC; removals that need a "
                    "confirmation read are held until it can",
                )

    def rbac_problem(self, window_s: float = 600.0) -> str | None:
        """A /healthz check: any request denied within the window names its resource here."""
        now = time.monotonic()
        denied = sorted(r for r, t in self.forbidden.items() if now - t < window_s)
        return f"requests denied (401/403) for: {', '.join(denied)}" if denied else None

    def _repair_cache(self, live: dict[str, Any], read_at: float | None) -> None:
        """Put back an object a confirmation read found alive while the cache had lost it (a phantom delete, a
        relist that omitted it) — only if that read started after everything the cache heard of the key: a
        DELETED heard meanwhile is newer than the read, and the pre-deletion object must not come back."""
        reflector = self.models.get(str(live.get("kind") or ""))
        if reflector is None or read_at is None:
            return
        key = object_key(live)
        if reflector.store.repair(live, read_at):
            log.info("cache repaired from a live read", key=key)
        elif key not in reflector.store:
            heard = reflector.store.heard(key)
            log.info(
                "cache not repaired: the key was heard of after the read began",
                key=key,
                heard_deleted=heard.deleted if heard else None,
                heard_ago_s=round(time.monotonic() - heard.at, 3) if heard else None,
            )
            # The read is older than what the cache knows: look at the model again, with a fresh read.
            meta = live.get("metadata") or {}
            with contextlib.suppress(ValueError):
                ref = ModelRef(
                    ModelKind(str(live.get("kind"))), str(meta.get("namespace") or ""), str(meta.get("name"))
                )
                self.queue.add_after(ref.key, REPAIR_REFUSED_RECHECK_S)

    def _requeue_after(self, key: str, delay_s: float) -> None:
        if delay_s <= 0:
            self.queue.add(key)
        else:
            self.queue.add_after(key, delay_s)

    def _cached_models(self) -> list[dict[str, Any]]:
        return [obj for r in self.models.values() for obj in r.store.values()]

    def _cached_refs(self) -> list[ModelRef]:
        refs = []
        for obj in self._cached_models():
            meta = obj.get("metadata") or {}
            with contextlib.suppress(ValueError):
                refs.append(
                    ModelRef(ModelKind(str(obj.get("kind"))), str(meta.get("namespace") or ""), str(meta.get("name")))
                )
        return refs

    def _real_keys(self) -> set[str]:
        """Models known to be real: cached objects and local records (each holds the model's whole name)."""
        keys = {r.key for r in self._cached_refs()}
        keys.update(m.key for m in self.manifests.all())
        return keys

    def known_keys(self) -> set[str]:
        """Every model to look at: real ones, and those the node's labels and ConfigMap entries belong to.

        A label or entry is mapped back through the real models and the entries' names first
        (:mod:`~model_agent.model.key_owners`): a truncated key parsed on its own names a model that never
        existed, whose 404 would "prove" it gone and count toward the breaker. What maps to no real name is
        left alone, logged and counted (``model_agent_unresolved_keys``): no read can prove it an orphan.
        """
        keys = self._real_keys()
        owners = key_owners.resolve(keys, self.node_configmap.data(), self.labels.model_labels())
        keys.update(owners.keys())
        self._note_unresolved(owners.unresolved, complete=True)
        return keys

    def _note_unresolved(self, unresolved: list[key_owners.Unresolved], *, complete: bool) -> None:
        """Log each label or entry that maps to no model once (until it resolves or goes), and count them.

        ``complete``: these are all of them (a whole pass), not just those of one change.
        """
        current: dict[tuple[str, str], key_owners.Unresolved] = {(u.where, u.key): u for u in unresolved}
        for ident, item in current.items():
            if ident not in self._unresolved:
                log.warning(
                    "label or ConfigMap key maps to no known model; left alone",
                    where=item.where,
                    key=item.key,
                    why=item.why,
                )
        if complete:
            self._unresolved = current
        else:
            self._unresolved.update(current)
        for where in ("label", "configmap"):
            self.metrics.unresolved_keys.labels(where).set(sum(1 for w, _ in self._unresolved if w == where))

    def enqueue_all(self) -> None:
        if not self.started.is_set():
            return
        keys = self.known_keys()
        for key in keys:
            self._label_index[ModelRef.from_key(key).label_key] = key
            self.queue.add(key)
        self._inventory(keys)

    def _inventory(self, keys: set[str]) -> None:
        """Start an inventory pass in the background; one runs at a time, a request meanwhile runs one more."""
        self._inventory_keys = keys
        if self._inventory_task is None or self._inventory_task.done():
            self._inventory_task = asyncio.get_running_loop().create_task(self._run_inventory(), name="inventory")

    async def _run_inventory(self) -> None:
        while self._inventory_keys is not None:
            keys, self._inventory_keys = self._inventory_keys, None
            try:
                await self._inventory_pass(keys)
            except Exception as exc:
                self.supervisor.report("inventory", exc)
            else:
                self.supervisor.ok("inventory")

    async def _inventory_pass(self, keys: set[str]) -> None:
        """Report unmanaged directories; delete staging areas no model or download owns.

        The walks and deletes run in threads; the decision which staging is stale is taken on the loop from
        the model keys and downloads of that instant, and each stale area is renamed away right then.
        """
        self.unmanaged = await asyncio.to_thread(
            lambda: unmanaged_directories(self.layout, [m.dest for m in self.manifests.all()])
        )
        self.metrics.unmanaged.set(len(self.unmanaged))
        # Fresh facts for the destructive part: the keys known now (a model may have appeared during the walk).
        known = keys | {r.key for r in self._cached_refs()}
        keep = {token_for(k) for k in known} | {token_for(j.key) for j in self.fetcher.jobs()}
        for root, stale in stale_staging(self.layout, keep):
            if discard(root, stale) is not None:
                log.info("stale staging area removed", path=str(stale))
        await asyncio.to_thread(delete_discarded, self.layout)  # these, and whatever a kill left mid-delete

    # ------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.layout.ensure()
        if self.settings.startup_jitter_s > 0:
            # Deterministic per node, so a DaemonSet restart spreads its LISTs across the fleet.
            spread = zlib.crc32(self.settings.node_name.encode()) % 1000 / 1000 * self.settings.startup_jitter_s
            await asyncio.sleep(spread)
        # The tick first: /livez speaks for the loop while the first LISTs are still running.
        self.supervisor.spawn("loop tick", self._tick)
        for reflector in self.reflectors:
            self.supervisor.spawn(f"reflector {reflector.name}", reflector.run, recovered=_progressed_since(reflector))
        await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
        if self.node.store.get(self.settings.node_name) is None:
            log.error("this agent's Node does not exist", node=self.settings.node_name)
        self.started.set()
        for i in range(self.settings.workers):
            self._workers.append(asyncio.create_task(self._worker(), name=f"worker {i}"))
        self._spawn_periodic("resync", self.settings.resync_interval_s, self._resync)
        self._spawn_periodic("purge", min(60.0, max(1.0, self.settings.trash_grace_s / 10)), self._purge)
        self._spawn_periodic("verify", self.settings.verify_interval_s, self._verify_pass)
        self.enqueue_all()
        log.info("agent started", node=self.settings.node_name, models=len(self.known_keys()))

    async def _tick(self) -> None:
        """Every ``LOOP_TICK_S``: record how late the loop woke (its lag); every second the queue depth and
        supervision gauges, every five the model counts."""
        window = LagWindow(60.0)
        last_gauges = last_states = 0.0
        self.last_loop_tick = time.monotonic()
        while True:
            before = time.monotonic()
            await asyncio.sleep(LOOP_TICK_S)
            now = time.monotonic()
            self.last_loop_tick = now
            lag = max(0.0, now - before - LOOP_TICK_S)
            self.metrics.loop_lag.observe(lag)
            self.metrics.loop_lag_max.set(window.add(now, lag))
            if now - last_gauges >= 1.0:
                last_gauges = now
                self.metrics.queue_depth.set(self.queue.depth + self.queue.delayed_count)
                self.metrics.tasks_down.set(len(self.supervisor.down()))
            if now - last_states >= 5.0:
                last_states = now
                self._count_states()

    def _count_states(self) -> None:
        """``model_agent_models{state}``: this node's model labels by value."""
        counts = {"Ready": 0, "Updating": 0, "Failed": 0}
        for value in self.labels.model_labels().values():
            counts[value] = counts.get(value, 0) + 1
        for state, n in counts.items():
            self.metrics.models.labels(state).set(n)

    def _spawn_periodic(self, name: str, interval_s: float, one_pass: Callable[[], Awaitable[None]]) -> None:
        self.supervisor.spawn(name, lambda: self._periodic(name, interval_s, one_pass))

    async def _periodic(self, name: str, interval_s: float, one_pass: Callable[[], Awaitable[None]]) -> None:
        """Run ``one_pass`` every ``interval_s`` (jittered ±10 %); a failed pass is reported to the supervisor
        (logged with its traceback, counted, ``/healthz`` red until a pass succeeds) and the next one runs on
        schedule."""
        rng = random.Random()
        while True:
            await asyncio.sleep(interval_s * (0.9 + 0.2 * rng.random()))
            try:
                await one_pass()
            except Exception as exc:
                self.supervisor.report(name, exc)
            else:
                self.supervisor.ok(name)

    async def _resync(self) -> None:
        self.enqueue_all()

    async def verify(self, keys: list[str] | None = None) -> dict[str, list[str]]:
        """Re-hash the files of the given models (all when None); damaged ones are refetched. Path -> damage."""
        report: dict[str, list[str]] = {}
        for manifest in list(self.manifests.all()):
            if keys is not None and manifest.key not in keys:
                continue
            if not manifest.owned or not manifest.files:
                continue
            started = time.monotonic()
            damaged = await asyncio.to_thread(
                verify_manifest, manifest, rate_bytes_s=self.settings.verify_rate_bytes_s or None
            )
            self.metrics.verification_duration.observe(time.monotonic() - started)
            ref = ModelRef.from_key(manifest.key)
            result = "failure" if damaged else "success"
            self.metrics.verifications.labels(ref.kind.value, ref.namespace, ref.name, result).inc()
            report[manifest.key] = damaged
            if damaged:
                current = self.manifests.load(manifest.key)
                if current is not None and current.storage_uri == manifest.storage_uri:
                    root = self.layout.record_root(Path(current.dest))
                    await asyncio.to_thread(self.manifests.save, mark_damaged(current, damaged), root)
                self.metrics.drift_repairs.labels("corrupt").inc()
                obj = self.models[ref.kind.value].store.get(
                    f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name
                )
                if obj is not None:
                    self.events.emit(
                        ObjectRef.of(obj),
                        WARNING,
                        "Corrupted",
                        f"{len(damaged)} file(s) failed verification on node {self.settings.node_name}: "
                        f"{', '.join(damaged[:5])}; fetching them again",
                    )
                log.warning("verification failed", key=manifest.key, damaged=damaged[:20])
                self.queue.add(manifest.key)
            else:
                current = self.manifests.load(manifest.key)
                if current is not None and current.files == manifest.files:
                    current.verified_at = time.time()
                    await asyncio.to_thread(self.manifests.save, current, self.layout.record_root(Path(current.dest)))
        return report

    async def _verify_pass(self) -> None:
        """The scheduled re-hash of every model (in the supervised periodic task: a failure is logged)."""
        await self.verify()

    async def _purge(self) -> None:
        """Delete expired trash, in a thread (whole models: seconds of rmtree that must not stall the loop).

        The breaker is asked before each entry: a breaker that opens while a purge runs stops it, since a
        held mass removal must stay recoverable."""
        if self.breaker.is_open:
            return
        purged = await asyncio.to_thread(
            self.trash.purge_expired, self.settings.trash_grace_s, keep_going=lambda: not self.breaker.is_open
        )
        for entry in purged:
            self.metrics.purged.inc()
            log.info("trash purged", key=entry.manifest.key, dest=entry.manifest.dest)

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            try:
                await self.reconciler.reconcile(key)
                self.queue.forget(key)
            except Requeue as exc:
                if exc.delay_s is None:
                    self.queue.add_rate_limited(key)
                else:
                    self.queue.add_after(key, exc.delay_s)
            except (ApiError, ApiUnavailable) as exc:
                delay = self.queue.add_rate_limited(key)
                log.warning("reconcile failed; retrying", key=key, error=str(exc), retry_in=round(delay, 1))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconcile crashed; retrying", key=key)
                self.queue.add_rate_limited(key)
            finally:
                self.queue.done(key)

    async def stop(self) -> None:
        await self.supervisor.stop()
        if self._inventory_task is not None:
            self._inventory_task.cancel()
            await asyncio.gather(self._inventory_task, return_exceptions=True)
        drained = await self.queue.shutdown_with_drain(SHUTDOWN_DRAIN_S)
        if not drained:
            log.info("stopping with work in flight; it resumes from local state on restart")
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        await self.fetcher.stop()
        await self.reconciler.stop_background()
        await self.labels.close()
        await self.node_configmap.close()
        await self.events.close()

    # ----------------------------------------------------------------------------------- status

    def status_snapshot(self) -> dict[str, Any]:
        """The node's view for ``model-agent status`` (served as JSON on ``/status``)."""
        labels = self.labels.labels()
        data = self.node_configmap.data()
        models = []
        for key in sorted(self.known_keys()):
            ref = ModelRef.from_key(key)
            raw_entry = data.get(ref.configmap_key)
            entry: dict[str, Any] = {}
            if raw_entry:
                with contextlib.suppress(ValueError):
                    entry = json.loads(raw_entry)
            manifest = self.manifests.load(key)
            job = self.fetcher.job(key)
            models.append(
                {
                    "key": key,
                    "kind": ref.kind.value,
                    "namespace": ref.namespace,
                    "name": ref.name,
                    "label": labels.get(ref.label_key),
                    "entry": entry.get("status"),
                    "reason": entry.get("reason"),
                    "manifest": None
                    if manifest is None
                    else {
                        "revision": manifest.revision,
                        "bytes": manifest.total_bytes,
                        "files": len(manifest.files),
                        "check": manifest.fast_check()[:3] or "ok",
                        "verifiedAt": manifest.verified_at,
                        "dest": manifest.dest,
                    },
                    "progress": None
                    if job is None
                    else {
                        "phase": "queued" if job.waiting_for_slot else job.progress.phase,
                        "completedBytes": job.progress.completed_bytes,
                        "totalBytes": job.progress.total_bytes,
                    },
                }
            )
        return {
            "node": self.settings.node_name,
            "synced": self.synced(),
            "breaker": {
                "open": self.breaker.is_open,
                "pending": self.breaker.pending,
                "trips": self.breaker.trips,
            },
            "trash": [e.to_json() for e in self.trash.entries()],
            "configmap": self.node_configmap.usage(),
            "unmanaged": [str(p) for p in self.unmanaged],
            # Labels and ConfigMap keys of no known model (known_keys above refreshed them): left alone.
            "unresolved": [{"where": u.where, "key": u.key, "why": u.why} for u in self._unresolved.values()],
            "models": models,
        }

    # ----------------------------------------------------------------------------------- health

    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)


def _progressed_since(reflector: Reflector) -> Recovered:
    """A restarted reflector works again once it made progress (a LIST or an event) after its failure."""
    return lambda failed_at: reflector.last_progress > failed_at
