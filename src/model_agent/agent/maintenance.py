"""Maintenance: the agent's passes over its own disk — inventory, verification, purge.

Role: work that is not one model's reconcile but keeps the node's disk honest:

* **inventory** (after every full enqueue): report directories under the roots no manifest claims
  (``model_agent_unmanaged_directories``, ``/status``) and delete staging areas no model or download owns.
  The walks and deletes run in threads; which staging is stale is decided on the loop from the model keys
  and downloads of that instant, and each stale area is renamed away right then. One pass runs at a time; a
  request meanwhile runs one more after it.
* **verify** (every ``--verify-interval``, and on ``POST /verify``): re-hash the files of owned models at
  most ``--verify-rate``; damaged files are marked in the manifest, an Event says which, and the model is
  enqueued to fetch them again. A clean pass records ``verifiedAt``. On a shared root the scheduled pass
  re-hashes each model on one node per interval (:meth:`SharedRoots.verify_turn`): the others skip it
  (``model_agent_verifications_skipped``); ``model_agent_verified_files`` counts the files re-hashed.
* **purge** (periodic): delete trash older than ``--trash-grace`` in a thread. The breaker is asked before
  each entry: a breaker that opens while a purge runs stops it, since a held mass removal must stay
  recoverable.

Failures of a pass are reported to the supervisor (logged with the traceback, counted, ``/healthz`` red until
a pass succeeds); nothing here removes a model's weights — only the trash's expired entries and staging.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from model_agent.agent.shared_root import VerifyTurn
from model_agent.agent.wiring import Wiring
from model_agent.local.inventory import delete_discarded, discard, stale_staging, unmanaged_directories
from model_agent.local.layout import token_for
from model_agent.local.manifest import Manifest
from model_agent.local.verify import mark_damaged, verify_manifest
from model_agent.model.resources import ModelRef
from model_agent.ops.events import WARNING, ObjectRef

log = structlog.get_logger(__name__)

BUSY_ROUNDS = 4  # how many more times the scheduled pass tries a model whose turn was busy
BUSY_RETRY_S = 120.0  # between those tries: a few Lease periods (a peer that was hashing has left its record)


class Maintenance:
    """Inventory, verification and purge passes for one agent; see the module docstring."""

    def __init__(
        self, wiring: Wiring, cached_keys: Callable[[], set[str]], *, busy_retry_s: float = BUSY_RETRY_S
    ) -> None:
        self.w = wiring
        self.busy_retry_s = busy_retry_s
        self._verifying = asyncio.Lock()  # one verification pass at a time (scheduled or asked for)
        self.verify_progress: dict[str, Any] | None = None  # the running pass: models, done, startedAt, scheduled
        self._cached_keys = cached_keys  # the cached models' keys at this instant
        self.unmanaged: list[Path] = []
        self._inventory_keys: set[str] | None = None  # the next inventory pass's keys, while one is due
        self._inventory_task: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------------------------- inventory

    def inventory(self, keys: set[str]) -> None:
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
                self.w.supervisor.report("inventory", exc)
            else:
                self.w.supervisor.ok("inventory")

    async def _inventory_pass(self, keys: set[str]) -> None:
        layout = self.w.layout
        self.unmanaged = await asyncio.to_thread(
            lambda: unmanaged_directories(layout, [m.dest for m in self.w.manifests.all()])
        )
        self.w.metrics.unmanaged.set(len(self.unmanaged))
        # Fresh facts for the destructive part: the keys known now (a model may have appeared during the walk).
        known = keys | self._cached_keys()
        keep = {token_for(k) for k in known} | {token_for(j.key) for j in self.w.fetcher.jobs()}
        for root, stale in stale_staging(layout, keep):
            if not await asyncio.to_thread(self.w.shared_roots.may_discard_staging, root, stale):
                continue  # a shared root: this node knows only its own jobs; another node may be writing there
            if discard(root, stale) is not None:
                log.info("stale staging area removed", path=str(stale))
        await asyncio.to_thread(delete_discarded, layout)  # these, and whatever a kill left mid-delete

    async def stop(self) -> None:
        """Cancel a running inventory pass and wait for it (a rename in flight completes or never began)."""
        if self._inventory_task is not None:
            self._inventory_task.cancel()
            await asyncio.gather(self._inventory_task, return_exceptions=True)

    # ------------------------------------------------------------------------------------- verify

    async def verify(self, keys: list[str] | None = None, *, scheduled: bool = False) -> dict[str, list[str]]:
        """Re-hash the files of the given models (all when None); damaged ones are refetched. Path -> damage.

        Up to ``--model-verification-concurrency`` models are re-hashed at once (each at ``--verify-rate``).
        ``scheduled`` (the periodic pass): on a shared root a model is re-hashed by one node per interval
        (:meth:`SharedRoots.verify_turn`); a model skipped here is absent from the report. A model whose turn
        was busy (a peer hashing it, or a Lease that could not be read: an API outage) is tried again
        ``busy_retry_s`` later, up to :data:`BUSY_ROUNDS` more times, so an outage at the pass's instant does not
        leave it unverified for a whole interval. An operator's ``POST /verify`` re-hashes everything it names,
        whoever verified it last. One pass runs at a time (another waits); :attr:`verify_progress` describes it.
        """
        async with self._verifying:
            pending = [m for m in self.w.manifests.all() if (keys is None or m.key in keys) and m.owned and m.files]
            self.verify_progress = {"models": len(pending), "done": 0, "startedAt": time.time(), "scheduled": scheduled}
            try:
                return await self._verify_pass(pending, scheduled)
            finally:
                self.verify_progress = None

    async def _verify_pass(self, pending: list[Manifest], scheduled: bool) -> dict[str, list[str]]:
        w = self.w
        report: dict[str, list[str]] = {}
        gate = asyncio.Semaphore(w.settings.model_verification_concurrency)  # models re-hashed at once

        async def one(manifest: Manifest) -> str:
            """Verify one model in its turn; its key when the turn was busy, else ""."""
            try:
                return await turn_of(manifest)
            finally:
                if self.verify_progress is not None:
                    self.verify_progress["done"] += 1

        async def turn_of(manifest: Manifest) -> str:
            async with gate:
                if not scheduled:
                    report[manifest.key] = await self._verify_one(manifest)
                    return ""
                async with w.shared_roots.verify_turn(manifest, w.settings.verify_interval_s) as turn:
                    if turn in (VerifyTurn.SKIP, VerifyTurn.BUSY):
                        w.metrics.verifications_skipped.labels(turn.value).inc()
                        log.debug("verification left to a peer", key=manifest.key, turn=turn.value)
                        return manifest.key if turn == VerifyTurn.BUSY else ""
                    damaged = report[manifest.key] = await self._verify_one(manifest)
                    if turn == VerifyTurn.VERIFY:  # under the verify Lease: the record is this round's
                        await asyncio.to_thread(w.shared_roots.record_verification, manifest, damaged)
                    return ""

        for round_ in range(BUSY_ROUNDS + 1):
            busy = [key for key in await asyncio.gather(*(one(m) for m in pending)) if key]
            if not busy:
                break
            if round_ == BUSY_ROUNDS:
                log.warning("verification turn still busy; left to the next pass", keys=busy[:20])
                break
            await asyncio.sleep(self.busy_retry_s)
            pending = [m for m in (w.manifests.load(k) for k in busy) if m is not None and m.owned and m.files]
        return report

    async def _verify_one(self, manifest: Manifest) -> list[str]:
        """Re-hash one model's files and act on what is found (the same on private and shared roots)."""
        w = self.w
        started = time.monotonic()
        damaged = await asyncio.to_thread(
            verify_manifest, manifest, rate_bytes_s=w.settings.verify_rate_bytes_s or None
        )
        w.metrics.verification_duration.observe(time.monotonic() - started)
        w.metrics.verified_files.inc(len(manifest.files))
        ref = ModelRef.from_key(manifest.key)
        result = "failure" if damaged else "success"
        w.metrics.verifications.labels(ref.kind.value, ref.namespace, ref.name, result).inc()
        if damaged:
            current = w.manifests.load(manifest.key)
            if current is not None and current.storage_uri == manifest.storage_uri:
                root = w.layout.record_root(Path(current.dest))
                await asyncio.to_thread(w.manifests.save, mark_damaged(current, damaged), root)
            w.metrics.drift_repairs.labels("corrupt").inc()
            obj = w.models[ref.kind.value].store.get(f"{ref.namespace}/{ref.name}" if ref.namespace else ref.name)
            if obj is not None:
                w.events.emit(
                    ObjectRef.of(obj),
                    WARNING,
                    "Corrupted",
                    f"{len(damaged)} file(s) failed verification on node {w.settings.node_name}: "
                    f"{', '.join(damaged[:5])}; fetching them again",
                )
            log.warning("verification failed", key=manifest.key, damaged=damaged[:20])
            w.queue.add(manifest.key)
        else:
            current = w.manifests.load(manifest.key)
            if current is not None and current.files == manifest.files:
                current.verified_at = time.time()
                await asyncio.to_thread(w.manifests.save, current, w.layout.record_root(Path(current.dest)))
        return damaged

    async def verify_pass(self) -> None:
        """The scheduled re-hash of every model (in the supervised periodic task: a failure is logged)."""
        await self.verify(scheduled=True)

    # -------------------------------------------------------------------------------------- purge

    async def purge(self) -> None:
        """Delete expired trash in a thread (whole models: seconds of rmtree that must not stall the loop)."""
        breaker = self.w.breaker
        if breaker.is_open:
            return
        purged = await self.w.shared_roots.as_purge_owner(  # a shared root's trash has one purger at a time
            lambda: asyncio.to_thread(
                self.w.trash.purge_expired, self.w.settings.trash_grace_s, keep_going=lambda: not breaker.is_open
            )
        )
        for entry in purged:
            self.w.metrics.purged.inc()
            log.info("trash purged", key=entry.manifest.key, dest=entry.manifest.dest)
