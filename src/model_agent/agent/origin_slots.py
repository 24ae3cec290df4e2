"""Fleet-wide origin protection: at most K nodes fetch the same model source at once.

When a DaemonSet restarts, every node wants the same weights at the same moment and the whole fleet gets
throttled by the hub. Slots are ``coordination.k8s.io/v1`` Leases in the agent's namespace, named
``origin-<hash of the source>-<i>`` for i < K. A node holds a slot while it fetches: it creates the Lease,
or takes over one whose holder stopped renewing (its record unchanged for ``leaseDurationSeconds``), with an
optimistic-concurrency update (resourceVersion), renews it every third of the duration, and releases it
(holder cleared) when done. A killed holder's slot expires, so no node waits forever. A node that finds
every slot busy waits (the model shows ``Updating`` with phase ``queued``) and retries with jitter.

Expiry is judged by local observation, as client-go's leader election does: a Lease held by another node
counts as expired only once this process has seen the same record (holder, renew time, resourceVersion)
unchanged for longer than its duration on its own monotonic clock. The holder's ``renewTime`` is written
by the holder's wall clock and is never compared with this node's, so no clock skew makes a live Lease look
expired.

Fencing: :meth:`OriginSlots.holds` says whether this process may still act as the holder of a Lease it
took — not once a renewal found another holder, and not once the last successful renewal is older than
:data:`FENCE_SHARE` of the duration (a holder cut off from the API server stops before another node can
take the Lease over). Callers that use a Lease as a mutex (shared roots) ask it immediately before each
destructive step.

A bound on every hold (``max_hold_s``, ``--lease-max-hold``): a holder that keeps renewing — a node that is stuck,
or a stolen node token renewing on purpose — holds a Lease for at most that long. Waiters time how long they have
seen one holder hold one acquisition (holder and ``acquireTime`` unchanged) on their own monotonic clock and take
the Lease over past the bound, as if it had expired; the holder fences itself (:meth:`holds` turns False and it
stops renewing) one duration earlier, so it stops before they can. A fetch that is cut so resumes under a new
acquisition. The admission policy (``deploy/``) makes the ``acquireTime`` a waiter times honest: a renewal may not
change it (only a new holder, after a release, sets a new one), and a Lease is held only as the token's own node.
What it cannot enforce is time itself (admission rules have no clock): a stolen token can take a Lease another node
holds before it expired, or release one and take it again at once; the node whose token it is then stands in
``holderIdentity`` for the operator to find and revoke.

Contract: :meth:`OriginSlots.hold` is an async context manager; inside it the caller owns a slot. API
errors while acquiring are retried with backoff (never "proceed without a slot"); a renewal that finds the
slot taken by another node logs it and fences the holder (:meth:`holds` turns False; a fetch that is only
counted by the slot goes on: the limit is best effort at that instant, the same as client-go leader
election's). The renewer survives any error of a renewal (logged, retried at the next tick). Leaving the
context always releases the slot (a failed release is logged; the slot then expires); a cancellation of the
holder that arrives during the release is raised once the release has ended, so the caller never carries on
as if it had not been cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import structlog

from model_agent.kube import objects
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import LEASES

if TYPE_CHECKING:
    from model_agent.sources.egress import Owner

log = structlog.get_logger(__name__)

DEFAULT_MAX_HOLD_S = 6 * 3600.0
"""The longest a holder keeps one acquisition of a Lease (``--lease-max-hold``)."""

# A holder acts on a Lease only while its last successful renewal is younger than this share of the duration:
# renewals come every third, so one failed renewal is tolerated, two are not, and the holder stops well before
# another node (which waits a full duration of unchanged record, locally timed) can take the Lease over.
FENCE_SHARE = 2 / 3


def _now() -> datetime:
    return datetime.now(UTC)


def _micro(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.strptime(value.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    except ValueError:
        try:
            return datetime.strptime(value.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S%z")
        except ValueError:
            return None


def lease_names(source: str, slots: int) -> list[str]:
    """The ``slots`` Lease names of ``source``: the same on every node, so the fleet competes for the same K."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    return [f"origin-{digest}-{i}" for i in range(slots)]


@dataclass(eq=False)
class OriginSlots:
    """At most ``slots`` holders of a source across the fleet, through Leases (see the module contract); 0: no limit."""

    client: KubeClient
    namespace: str
    holder: str
    slots: int
    _: KW_ONLY
    lease_s: int = 30
    poll_s: float = 3.0
    max_hold_s: float = DEFAULT_MAX_HOLD_S
    rng: InitVar[random.Random | None] = None
    clock: Callable[[], float] = time.monotonic
    _rng: random.Random = field(init=False, repr=False)
    # Lease name -> (the record another node holds as last read: holder, renewTime, resourceVersion; when this
    # process first saw it so, on its own clock).
    _observed: dict[str, tuple[tuple[str, str, str], float]] = field(default_factory=dict, init=False, repr=False)
    # Lease name -> when this process last took or renewed it (its own clock); absent: not held, or fenced.
    _renewed: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    # Lease name -> (another node's acquisition as last read: holder, acquireTime; when this process first saw it).
    _held_since: dict[str, tuple[tuple[str, str], float]] = field(default_factory=dict, init=False, repr=False)
    # Lease name -> when this process took it (its own clock): the start of its own hold.
    _taken: dict[str, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self, rng: random.Random | None) -> None:
        """The random source of the slot order and the backoff (a fresh one when none is given)."""
        self._rng = rng or random.Random()

    def holds(self, source: str) -> bool:
        """May this process still act as the holder of a slot of ``source``? (The module's fencing contract.)"""
        now = self.clock()
        for name in lease_names(source, self.slots):
            renewed = self._renewed.get(name)
            if renewed is not None and now - renewed < FENCE_SHARE * self.lease_s and not self._overheld(name, now):
                return True
        return False

    def _overheld(self, name: str, now: float) -> bool:
        """Has this process held ``name`` (one acquisition) for as long as it may? One duration before the bound
        the waiters apply, so it stops acting before they can take the Lease over."""
        taken = self._taken.get(name)
        return taken is not None and now - taken >= self.max_hold_s - self.lease_s

    @contextlib.asynccontextmanager
    async def hold(
        self, source: str, on_wait: Callable[[], None] = lambda: None, *, owner: Owner | None = None
    ) -> AsyncIterator[str]:
        """Hold a slot of ``source`` for the ``async with`` block, renewing it; ``on_wait`` hears that all are busy.

        Yields the Lease's name (``""`` when slots are off); the slot is released on leaving, whatever happens.
        ``owner`` (who the fetch is for) changes nothing here: every owner queues for the same slots (peer
        distribution uses it, :mod:`model_agent.peers.seeding`).
        """
        if self.slots <= 0:
            yield ""
            return
        name = await self._acquire(source, on_wait)
        loop = asyncio.get_running_loop()
        renewer = loop.create_task(self._renew(name), name=f"renew {name}")
        try:
            yield name
        finally:
            self._renewed.pop(name, None)
            self._taken.pop(name, None)
            renewer.cancel()
            # The release runs to its end even when the holder is cancelled meanwhile (a slot left held
            # blocks other nodes until it expires), but a cancellation that arrives during it is raised
            # afterwards, never swallowed: a cancelled fetch must not go on to publish.
            release = loop.create_task(self._release_after(renewer, name), name=f"release {name}")
            try:
                await asyncio.shield(release)
            except asyncio.CancelledError:
                await asyncio.wait([release])
                raise

    async def _release_after(self, renewer: asyncio.Task[None], name: str) -> None:
        await asyncio.gather(renewer, return_exceptions=True)
        try:
            await self._release(name)
        except (ApiError, ApiUnavailable) as exc:
            log.warning("origin slot release failed; it expires on its own", lease=name, error=str(exc))

    async def _acquire(self, source: str, on_wait: Callable[[], None]) -> str:
        names = lease_names(source, self.slots)
        waited = False
        backoff = self.poll_s
        while True:
            order = names[:]
            self._rng.shuffle(order)
            try:
                for name in order:
                    if await self._try(name):
                        log.info("origin slot acquired", lease=name, source=source)
                        return name
                backoff = self.poll_s
            except (ApiError, ApiUnavailable) as exc:
                log.warning("origin slot unavailable; retrying", error=str(exc))
                backoff = min(backoff * 2, 60.0)
            if not waited:
                on_wait()
                waited = True
            await asyncio.sleep(backoff * (0.5 + self._rng.random()))

    def _body(self, name: str, now: datetime, rv: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace}
        if rv:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": self.lease_s,
                "acquireTime": _micro(now),
                "renewTime": _micro(now),
            },
        }

    async def _try(self, name: str) -> bool:
        path = LEASES.path(self.namespace, name)
        try:
            lease = await self.client.request("GET", path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            started = self.clock()
            try:
                await self.client.request("POST", LEASES.path(self.namespace), body=self._body(name, _now()))
            except ApiError as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            self._renewed[name] = started
            self._taken[name] = started
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        rv = objects.resource_version(lease)
        if holder and holder != self.holder and not self._expired(name, lease):
            return False
        started = self.clock()
        body = self._body(name, _now(), rv)
        if holder == self.holder and spec.get("acquireTime"):
            # Still this node's (a restart, a second fetch): the same acquisition, its acquireTime kept (the
            # admission policy refuses a renewal that changes it); its hold is timed from here (below).
            body["spec"]["acquireTime"] = spec["acquireTime"]
        try:
            await self.client.request("PUT", path, body=body)
        except ApiError as exc:
            if exc.status == 409:
                return False  # someone else took it first
            raise
        self._observed.pop(name, None)
        self._held_since.pop(name, None)
        self._renewed[name] = started
        self._taken.setdefault(name, started)
        return True

    def _expired(self, name: str, lease: dict[str, Any]) -> bool:
        """Has another node's record of ``name`` stayed unchanged for longer than its duration, timed here?

        The first sighting of a record starts its clock: a Lease found stale after a restart of this process is
        taken over one duration later, never at once (its holder may be alive with a clock behind ours).
        """
        spec = lease.get("spec") or {}
        seen = (
            str(spec.get("holderIdentity") or ""),
            str(spec.get("renewTime") or ""),
            objects.resource_version(lease),
        )
        try:
            duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
        except (TypeError, ValueError):
            duration = float(self.lease_s)
        now = self.clock()
        acquisition = (seen[0], str(spec.get("acquireTime") or ""))
        first = self._held_since.get(name)
        if first is None or first[0] != acquisition:
            self._held_since[name] = (acquisition, now)
        elif now - first[1] > self.max_hold_s:
            log.warning(
                "a Lease held past the hold bound is taken over",
                lease=name,
                holder=acquisition[0],
                held_s=round(now - first[1]),
                bound_s=self.max_hold_s,
            )
            return True
        previous = self._observed.get(name)
        if previous is None or previous[0] != seen:
            self._observed[name] = (seen, now)
            return False
        return now - previous[1] > duration

    async def _renew(self, name: str) -> None:
        path = LEASES.path(self.namespace, name)
        while True:
            await asyncio.sleep(self.lease_s / 3)
            started = self.clock()
            try:
                lease = await self.client.request("GET", path)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") != self.holder:
                    log.warning("origin slot taken over by another node", lease=name, holder=spec.get("holderIdentity"))
                    self._renewed.pop(name, None)  # fenced: holds() is False from now on
                    return
                if self._overheld(name, self.clock()):
                    log.warning("Lease at the hold bound: no longer renewed", lease=name, bound_s=self.max_hold_s)
                    self._renewed.pop(name, None)  # fenced, and left to expire (or to be released on leaving)
                    return
                spec["renewTime"] = _micro(_now())
                await self.client.request("PUT", path, body=lease)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("origin slot renewal failed", lease=name, error=str(exc))
                continue
            if name in self._renewed:
                self._renewed[name] = started

    async def _release(self, name: str) -> None:
        path = LEASES.path(self.namespace, name)
        lease = await self.client.request("GET", path)
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.holder:
            return
        spec["holderIdentity"] = ""
        spec["renewTime"] = _micro(_now() - timedelta(days=1))
        await self.client.request("PUT", path, body=lease)
        log.info("origin slot released", lease=name)
