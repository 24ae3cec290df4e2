"""The informer cache: the last known state of every watched object, by key.

A :class:`Store` holds plain object dicts keyed by ``namespace/name`` (``name`` for cluster-scoped kinds)
and remembers each object's UID. Its only subtle operation is :meth:`Store.replace`, used after a (re)list:
it installs the listed objects and reports which keys *vanished* — present before, absent from the list.

Contract: a vanished key is reported as a candidate, never as a fact. The store forgets the object (it is
no longer in the server's list) but hands the last known object to the caller, who must prove absence with
a live read before acting on it. The store itself never triggers anything destructive.

The store also remembers, per key, when it last *heard* of it (:class:`Heard`: an upsert, a relist, a
delete — deletes leave a tombstone) and the resourceVersion it heard. :meth:`Store.repair` uses it: a live
read (a confirmation GET or LIST) may put an object back into the cache only if the key is absent and the
read *started after* the last thing heard of that key — and after the last relist, which speaks for every
key (a key it lacks was absent then, whether or not the store had it). A read that started earlier may
predate a delete heard meanwhile (by an event, or by a relist that no longer lists the object), and
re-inserting it would resurrect a deleted object until the next relist. The rule is
the heard time, not a resourceVersion comparison: resourceVersions are opaque strings to clients (that
they compare as integers is an etcd implementation detail), while "the read began after the event reached
us" holds with any server, since a consistent read reflects at least every write that was already
delivered. Tombstones are kept for ``tombstone_ttl_s``; a repair by a read older than that is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from model_agent.kube import objects

Obj = dict[str, Any]


def object_key(obj: Obj) -> str:
    """The store key of ``obj``: ``namespace/name``, or ``name`` for a cluster-scoped object (as client-go's)."""
    ns, name = objects.namespace(obj), objects.name(obj)
    return f"{ns}/{name}" if ns else name


def object_uid(obj: Obj) -> str:
    """The object's UID, or ``""``: what tells a recreated object from the one that was deleted."""
    return objects.uid(obj)


def resource_version(obj: Obj) -> str:
    """The object's resourceVersion, or ``""``; opaque: compared for equality only, never ordered."""
    return objects.resource_version(obj)


@dataclass(frozen=True)
class Change:
    """What one store operation did to one key. ``old``/``new`` are None where there was none."""

    key: str
    old: Obj | None
    new: Obj | None

    @property
    def vanished(self) -> bool:
        """True when the object is gone from the cache: a candidate for removal that must be confirmed, not a fact."""
        return self.new is None


@dataclass(frozen=True)
class Heard:
    """The last thing the store heard of a key: when (``clock`` time), at which resourceVersion, a delete?"""

    at: float
    resource_version: str
    deleted: bool


TOMBSTONE_TTL_S = 3600.0
_PRUNE_EVERY_S = 60.0


class Store:
    """The informer cache of one resource (see the module contract): objects by key, and when each key was heard."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, tombstone_ttl_s: float = TOMBSTONE_TTL_S
    ) -> None:
        self._items: dict[str, Obj] = {}
        self._heard: dict[str, Heard] = {}
        self._clock = clock
        self._tombstone_ttl_s = tombstone_ttl_s
        self._pruned_at = clock()
        self.listed_at: float | None = None  # clock time of the last replace(): a relist hears of every key

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str) -> Obj | None:
        """The last known object at ``key``, or None; the dict is the cache's own: callers must not mutate it."""
        return self._items.get(key)

    def keys(self) -> list[str]:
        """A snapshot of the keys: safe to iterate while the store changes."""
        return list(self._items)

    def values(self) -> Iterator[Obj]:
        """The objects as of this call (a snapshot): safe to iterate while the store changes."""
        return iter(list(self._items.values()))

    def heard(self, key: str) -> Heard | None:
        """The last thing heard of ``key`` (None: nothing, or a tombstone older than the TTL)."""
        return self._heard.get(key)

    def upsert(self, obj: Obj) -> Change:
        """Install ``obj`` (a watch ADDED or MODIFIED), note that its key was heard now, and return the change."""
        key = object_key(obj)
        old = self._items.get(key)
        self._items[key] = obj
        self._heard[key] = Heard(self._clock(), resource_version(obj), deleted=False)
        return Change(key, old, obj)

    def delete(self, obj: Obj) -> Change:
        """Forget an object a watch reported deleted; the change carries the last known state."""
        key = object_key(obj)
        last = self._items.pop(key, None)
        self._heard[key] = Heard(self._clock(), resource_version(obj), deleted=True)
        self._prune()
        return Change(key, last if last is not None else obj, None)

    def replace(self, objs: Iterable[Obj]) -> list[Change]:
        """Install a complete list; return a change per added/updated key and per vanished key."""
        now = self._clock()
        self.listed_at = now
        fresh = {object_key(o): o for o in objs}
        changes: list[Change] = []
        for key, gone in self._items.items():
            if key not in fresh:
                changes.append(Change(key, gone, None))
                self._heard[key] = Heard(now, resource_version(gone), deleted=True)
        for key, new in fresh.items():
            previous = self._items.get(key)
            if previous is None or resource_version(previous) != resource_version(new):
                changes.append(Change(key, previous, new))
            self._heard[key] = Heard(now, resource_version(new), deleted=False)
        self._items = fresh
        self._prune()
        return changes

    def repair(self, obj: Obj, read_started: float) -> bool:
        """Insert ``obj``, read live by a read that started at ``read_started`` (``clock`` time), if it is newer
        than everything heard of its key: the key is absent and nothing was heard of it since the read began.
        True when inserted."""
        key = object_key(obj)
        if key in self._items:
            return False
        now = self._clock()
        if read_started < now - self._tombstone_ttl_s:
            return False  # older than the tombstones kept: a delete heard since might be forgotten
        heard = self._heard.get(key)
        if heard is not None and heard.at >= read_started:
            return False
        if self.listed_at is not None and self.listed_at >= read_started:
            return False  # a relist since the read began did not list it: absent, as far as anything newer says
        self._items[key] = obj
        self._heard[key] = Heard(now, resource_version(obj), deleted=False)
        return True

    def _prune(self) -> None:
        """Forget tombstones older than the TTL (at most once a minute)."""
        now = self._clock()
        if now - self._pruned_at < _PRUNE_EVERY_S:
            return
        self._pruned_at = now
        horizon = now - self._tombstone_ttl_s
        for key in [k for k, h in self._heard.items() if h.deleted and h.at < horizon]:
            del self._heard[key]
