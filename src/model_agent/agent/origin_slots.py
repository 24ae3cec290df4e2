"""Fleet-wide origin protection: at most K nodes fetch the same model source at once.

When a DaemonSet restarts, every node wants the same weights at the same moment and the whole fleet gets
throttled by the hub. Slots are ``coordination.k8s.io/v1`` Leases in the agent's namespace, named
``origin-<hash of the source>-<i>`` for i < K. A node holds a slot while it fetches: it creates the Lease,
or takes over one whose holder stopped renewing (``renewTime + leaseDurationSeconds`` in the past), with an
optimistic-concurrency update (resourceVersion), renews it every third of the duration, and releases it
(holder cleared) when done. A killed holder's slot expires, so no node waits forever. A node that finds
every slot busy waits (the model shows ``Updating`` with phase ``queued``) and retries with jitter.

Contract: :meth:`OriginSlots.hold` is an async context manager; inside it the caller owns a slot. API
errors while acquiring are retried with backoff (never "proceed without a slot"); a renewal that finds the
slot taken by another node logs it and keeps going (the fetch is idempotent; the limit is best effort at
that instant, the same as client-go leader election's). Leaving the context always releases the slot (a
failed release is logged; the slot then expires); a cancellation of the holder that arrives during the
release is raised once the release has ended, so the caller never carries on as if it had not been cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
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
    rng: InitVar[random.Random | None] = None
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self, rng: random.Random | None) -> None:
        """The random source of the slot order and the backoff (a fresh one when none is given)."""
        self._rng = rng or random.Random()

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
            try:
                await self.client.request("POST", LEASES.path(self.namespace), body=self._body(name, _now()))
                return True
            except ApiError as create_exc:
                if create_exc.status == 409:
                    return False
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = _parse(spec.get("renewTime"))
        duration = int(spec.get("leaseDurationSeconds") or self.lease_s)
        expired = renewed is None or renewed + timedelta(seconds=duration) < _now()
        if holder and holder != self.holder and not expired:
            return False
        rv = objects.resource_version(lease)
        try:
            await self.client.request("PUT", path, body=self._body(name, _now(), rv))
            return True
        except ApiError as exc:
            if exc.status == 409:
                return False  # someone else took it first
            raise

    async def _renew(self, name: str) -> None:
        path = LEASES.path(self.namespace, name)
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                lease = await self.client.request("GET", path)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") != self.holder:
                    log.warning("origin slot taken over by another node", lease=name, holder=spec.get("holderIdentity"))
                    return
                spec["renewTime"] = _micro(_now())
                await self.client.request("PUT", path, body=lease)
            except (ApiError, ApiUnavailable) as exc:
                log.warning("origin slot renewal failed", lease=name, error=str(exc))

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
