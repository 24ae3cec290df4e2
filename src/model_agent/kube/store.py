"""The informer cache: the last known state of every watched object, by key.

A :class:`Store` holds plain object dicts keyed by ``namespace/name`` (``name`` for cluster-scoped kinds)
and remembers each object's UID. Its only subtle operation is :meth:`Store.replace`, used after a (re)list:
it installs the listed objects and reports which keys *vanished* — present before, absent from the list.

Contract: a vanished key is reported as a candidate, never as a fact. The store forgets the object (it is
no longer in the server's list) but hands the last known object to the caller, who must prove absence with
a live read before acting on it. The store itself never triggers anything destructive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    name = str(meta.get("name") or "")
    return f"{ns}/{name}" if ns else name


def object_uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def resource_version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclass(frozen=True)
class Change:
    """What one store operation did to one key. ``old``/``new`` are None where there was none."""

    key: str
    old: Obj | None
    new: Obj | None

    @property
    def vanished(self) -> bool:
        return self.new is None


class Store:
    def __init__(self) -> None:
        self._items: dict[str, Obj] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str) -> Obj | None:
        return self._items.get(key)

    def keys(self) -> list[str]:
        return list(self._items)

    def values(self) -> Iterator[Obj]:
        return iter(list(self._items.values()))

    def upsert(self, obj: Obj) -> Change:
        key = object_key(obj)
        old = self._items.get(key)
        self._items[key] = obj
        return Change(key, old, obj)

    def delete(self, obj: Obj) -> Change:
        """Forget an object a watch reported deleted; the change carries the last known state."""
        key = object_key(obj)
        last = self._items.pop(key, None)
        return Change(key, last if last is not None else obj, None)

    def replace(self, objs: Iterable[Obj]) -> list[Change]:
        """Install a complete list; return a change per added/updated key and per vanished key."""
        fresh = {object_key(o): o for o in objs}
        changes: list[Change] = []
        for key, gone in self._items.items():
            if key not in fresh:
                changes.append(Change(key, gone, None))
        for key, new in fresh.items():
            previous = self._items.get(key)
            if previous is None or resource_version(previous) != resource_version(new):
                changes.append(Change(key, previous, new))
        self._items = fresh
        return changes
