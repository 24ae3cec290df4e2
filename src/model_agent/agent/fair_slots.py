"""Download slots shared fairly between namespaces: one tenant cannot hold every download worker.

Role: the fetcher runs at most ``--num-download-worker`` downloads at once. With one shared semaphore, a
tenant who creates a few slow models (or models pointing at a server that trickles) holds every slot on
every node those models select, and nobody else's model downloads. :class:`FairSlots` replaces that
semaphore:

* at most ``total`` slots are held at once;
* a namespaced group (a tenant's namespace) holds at most ``per_group`` of them — by default one less than
  ``total``, so another group always finds a slot; the cluster group (``""``: ClusterBaseModels, written by
  cluster admins) is not capped;
* a freed slot goes to the waiting group that holds the fewest slots (oldest waiter first among equals),
  so a namespace with many queued models does not starve one with a single model.

Guarantees: a waiter that is cancelled while waiting takes no slot; a slot is released exactly once (the
``async with`` forms); grants happen in the release path, so no waiter sleeps while a slot it may take is
free. A :class:`Hold` (:meth:`FairSlots.hold`) may hand its slot back for a while (:meth:`Hold.away`: a job
waiting on another node) and queues again like any waiter to take one after; cancelled in that queue, it holds
none and releases none.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

CLUSTER_GROUP = ""


@dataclass(order=True)
class _Waiter:
    seq: int
    group: str = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class FairSlots:
    """The fair semaphore of the module contract: ``total`` slots, at most ``per_group`` per namespaced group."""

    def __init__(self, total: int, per_group: int | None = None) -> None:
        self.total = max(1, total)
        self.per_group = max(1, per_group if per_group is not None else self.total - 1)
        self._held: dict[str, int] = {}
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def in_use(self) -> int:
        """Slots held now, over every group."""
        return sum(self._held.values())

    def held(self, group: str) -> int:
        """Slots ``group`` holds now."""
        return self._held.get(group, 0)

    def _may_take(self, group: str) -> bool:
        if self.in_use >= self.total:
            return False
        return group == CLUSTER_GROUP or self.held(group) < self.per_group

    def _take(self, group: str) -> None:
        self._held[group] = self.held(group) + 1

    def _release(self, group: str) -> None:
        left = self.held(group) - 1
        if left > 0:
            self._held[group] = left
        else:
            self._held.pop(group, None)
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            eligible = [w for w in self._waiting if not w.future.done() and self._may_take(w.group)]
            if not eligible:
                break
            chosen = min(eligible, key=lambda w: (self.held(w.group), w.seq))
            self._waiting.remove(chosen)
            self._take(chosen.group)
            chosen.future.set_result(None)
        self._waiting = [w for w in self._waiting if not w.future.done()]

    async def acquire(self, group: str) -> None:
        """Wait for a slot for ``group``; cancelled while waiting, it takes none (a granted slot goes on)."""
        if not self._waiting and self._may_take(group):
            self._take(group)
            return
        waiter = _Waiter(next(self._seq), group, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        self._grant()  # the queue may be waiting only on capped groups: this one may go first
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self._release(group)  # granted just as it was cancelled: hand the slot on
            elif waiter in self._waiting:
                self._waiting.remove(waiter)
            raise

    @asynccontextmanager
    async def slot(self, group: str) -> AsyncIterator[None]:
        """Hold one slot for ``group`` for the ``async with`` block: released exactly once, whatever happens inside."""
        await self.acquire(group)
        try:
            yield
        finally:
            self._release(group)

    @asynccontextmanager
    async def hold(self, group: str) -> AsyncIterator[Hold]:
        """:meth:`slot`, as a :class:`Hold` the block may hand back for a while; released exactly once at the end."""
        held = Hold(self, group)
        await held.take()
        try:
            yield held
        finally:
            held.give_back()


class Hold:
    """One slot of ``group`` held by one job, which may step away from it (see the module guarantees)."""

    def __init__(self, slots: FairSlots, group: str) -> None:
        self._slots, self._group = slots, group
        self.held = False

    async def take(self) -> None:
        await self._slots.acquire(self._group)
        self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self._slots._release(self._group)

    @asynccontextmanager
    async def away(self) -> AsyncIterator[None]:
        """Without the slot for the block; queued for one again (fairly, behind earlier waiters) after it."""
        self.give_back()
        try:
            yield
        finally:
            await self.take()
