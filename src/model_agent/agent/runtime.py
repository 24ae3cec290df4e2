"""The agent process: runs watching → queueing → processing, and shuts it down in order.

Who does what: :mod:`~model_agent.agent.wiring` builds the collaborators;
:mod:`~model_agent.agent.watch_handlers` turns changes into queued keys; :mod:`~model_agent.agent.node_alerts`
raises the node's own warnings; :mod:`~model_agent.agent.maintenance` runs inventory, verify and purge;
:mod:`~model_agent.ops.status_view` shapes ``/status``. This module starts, supervises and stops them.

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
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from model_agent.agent.maintenance import Maintenance
from model_agent.agent.node_alerts import NodeAlerts
from model_agent.agent.requeue import Requeue
from model_agent.agent.settings import Settings
from model_agent.agent.supervisor import Recovered
from model_agent.agent.watch_handlers import WatchHandlers
from model_agent.agent.wiring import Wiring
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.reflector import Reflector
from model_agent.kube.workqueue import ShutDown
from model_agent.model.resources import ModelRef
from model_agent.ops.looplag import LagWindow
from model_agent.ops.status_view import Download, ModelFacts, status_view

log = structlog.get_logger(__name__)

SHUTDOWN_DRAIN_S = 3.0
LOOP_TICK_S = 0.1  # fine enough to catch a 100 ms stall of the event loop, cheap enough to run always


class Agent:
    """One node's agent: built from the settings, started once, stopped once (see the module docstring).

    The collaborators are attributes (``agent.queue``, ``agent.reconciler``, ``agent.layout``, ...) for the
    CLI, the health server and the benchmarks; they are those of :class:`~model_agent.agent.wiring.Wiring`.
    """

    def __init__(self, settings: Settings, client: KubeClient) -> None:
        self.settings = settings
        self.client = client
        self.handlers = WatchHandlers()
        self.alerts = NodeAlerts()
        self.wiring = wiring = Wiring(settings, client, self.handlers, self.alerts)
        self.maintenance = Maintenance(wiring, lambda: {r.key for r in self.handlers.cached_refs()})
        self.handlers.attach(wiring, on_full_pass=self.maintenance.inventory)
        self.alerts.attach(wiring)
        # The collaborators, by name (the public surface the CLI, /healthz and the benchmarks use).
        self.metrics = wiring.metrics
        self.layout = wiring.layout
        self.manifests = wiring.manifests
        self.trash = wiring.trash
        self.queue = wiring.queue
        self.models = wiring.models
        self.node = wiring.node
        self.configmap = wiring.configmap
        self.reflectors = wiring.reflectors
        self.events = wiring.events
        self.labels = wiring.labels
        self.node_configmap = wiring.node_configmap
        self.fetcher = wiring.fetcher
        self.origin = wiring.origin
        self.breaker = wiring.breaker
        self.confirmer = wiring.confirmer
        self.remover = wiring.remover
        self.reconciler = wiring.reconciler
        self.supervisor = wiring.supervisor
        self.started = wiring.started
        self._workers: list[asyncio.Task[None]] = []
        self.last_loop_tick = time.monotonic()

    # ------------------------------------------------------------------------- what others ask

    def known_keys(self) -> set[str]:
        """Every model to look at (see :meth:`WatchHandlers.known_keys`)."""
        return self.handlers.known_keys()

    def enqueue_all(self) -> None:
        """Look at every known model again, then take an inventory."""
        self.handlers.enqueue_all()

    async def verify(self, keys: list[str] | None = None) -> dict[str, list[str]]:
        """Re-hash the given models' files (all when None); path -> damage (see :mod:`.maintenance`)."""
        return await self.maintenance.verify(keys)

    def verify_running(self) -> dict[str, Any] | None:
        """The verification pass running now (models, done, startedAt, scheduled), or None."""
        return self.maintenance.verify_progress

    def rbac_problem(self, window_s: float = 600.0) -> str | None:
        """A /healthz check: the resources denied (401/403) within the window, or None."""
        return self.alerts.rbac_problem(window_s)

    @property
    def unmanaged(self) -> list[Path]:
        """Directories under the roots no manifest claims (from the last inventory)."""
        return self.maintenance.unmanaged

    # ------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.layout.ensure()
        self.wiring.shared_roots.mark()  # this node's marker in each root: how nodes sharing one learn it
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
        if self.wiring.peers is not None:  # serve this node's Ready files to peers (model_agent.peers)
            self.supervisor.spawn("peer server", self.wiring.peers.run)
        for i in range(self.settings.workers):
            self._workers.append(asyncio.create_task(self._worker(), name=f"worker {i}"))
        for i in range(self.settings.num_high_priority_worker):  # the removal lane (agent/lifecycle.py)
            self._workers.append(asyncio.create_task(self._worker(urgent_only=True), name=f"removal worker {i}"))
        self._spawn_periodic("resync", self.settings.resync_interval_s, self._resync)
        self._spawn_periodic("purge", min(60.0, max(1.0, self.settings.trash_grace_s / 10)), self.maintenance.purge)
        self._spawn_periodic("verify", self.settings.verify_interval_s, self.maintenance.verify_pass)
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

    async def _worker(self, *, urgent_only: bool = False) -> None:
        while True:
            try:
                key = await self.queue.get(urgent_only=urgent_only)
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
        """Stop in order: background tasks, inventory, queue (drained briefly), workers, fetcher, writers."""
        await self.supervisor.stop()
        await self.maintenance.stop()
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
        facts = []
        for key in self.known_keys():  # refreshes the unresolved keys shown below
            ref = ModelRef.from_key(key)
            job = self.fetcher.job(key)
            download = None
            if job is not None:
                phase = "queued" if job.waiting_for_slot else job.progress.phase
                download = Download(phase, job.progress.completed_bytes, job.progress.total_bytes)
            facts.append(
                ModelFacts(
                    key, labels.get(ref.label_key), data.get(ref.configmap_key), self.manifests.load(key), download
                )
            )
        view = status_view(
            node=self.settings.node_name,
            synced=self.synced(),
            breaker={"open": self.breaker.is_open, "pending": self.breaker.pending, "trips": self.breaker.trips},
            trash=[e.to_json() for e in self.trash.entries()],
            configmap=self.node_configmap.usage(),
            unmanaged=[str(p) for p in self.unmanaged],
            unresolved=[{"where": u.where, "key": u.key, "why": u.why} for u in self.handlers.unresolved.values()],
            models=facts,
        )
        view["sharedRoots"] = self.wiring.shared_roots.status()  # shared or not, why, fs type (agent/shared_root.py)
        view["peers"] = self.wiring.peers.status() if self.wiring.peers is not None else {"enabled": False}
        view["verifying"] = self.verify_running()  # the re-hash pass running now (its progress), or None
        return view

    # ----------------------------------------------------------------------------------- health

    def synced(self) -> bool:
        """Whether every cache has synced once (``/readyz``)."""
        return all(r.synced.is_set() for r in self.reflectors)


def _progressed_since(reflector: Reflector) -> Recovered:
    """A restarted reflector works again once it made progress (a LIST or an event) after its failure."""
    return lambda failed_at: reflector.last_progress > failed_at
