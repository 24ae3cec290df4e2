"""Where a model's object stands in its life, and what that allows: the deletion gates and the urgent lane.

A download takes minutes; a delete can arrive at any moment of it. Two rules keep the node honest about a model
whose deletion has begun (OME's agent adopted the same ones:
docs/ome-compatibility.md#47-deletes-during-downloads-and-the-removal-lane):

* no download starts, and no ``Ready`` or ``Updating`` is written, for an object whose deletion has begun or
  that is gone from the cache, or for an earlier incarnation (another UID) of a re-created one. The gate is
  asked with the cache as it is at that instant, not as it was when the reconcile began: the wait for a download
  slot or an origin slot can be long;
* a key whose object is deleting or gone is *urgent*: it is handed to the workers reserved for removals
  (``--num-high-priority-worker``) before any other key, so a delete never waits in line behind other models'
  reconciles.

:func:`presence` reads the facts, :func:`gate` and :func:`lane` decide, both pure:

=========================  ========  ==============  ===========  ==============================
presence                   lane      start download  write Ready  write Updating (progress)
=========================  ========  ==============  ===========  ==============================
``wanted``                 normal    go              go           go
``deleting``               urgent    stand down      stand down   drop
``absent``                 urgent    stand down      stand down   drop
``replaced`` (other UID)   normal    stand down      stand down   drop
=========================  ========  ==============  ===========  ==============================

Standing down is never destructive: the removal itself goes through the one destructive path
(:class:`~model_agent.agent.removal.Remover`), which cancels the running download and cleans its staging.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from model_agent.kube import objects


class Presence(StrEnum):
    """The cached object of a key, against the incarnation an act is for."""

    WANTED = "wanted"  # in the cache, not being deleted, the same UID
    DELETING = "deleting"  # deletionTimestamp set (finalizers may keep it a while)
    ABSENT = "absent"  # not in the cache
    REPLACED = "replaced"  # in the cache with another UID: the act is for an earlier incarnation


class Step(StrEnum):
    """The acts the gate is asked about."""

    START_DOWNLOAD = "start_download"
    WRITE_READY = "write_ready"
    WRITE_UPDATING = "write_updating"


class Lane(StrEnum):
    """Which workers a key waits for: the removal lane, or every worker."""

    URGENT = "urgent"
    NORMAL = "normal"


def presence(cached: dict[str, Any] | None, uid: str = "") -> Presence:
    """The presence of ``cached`` (the key's object in the cache now) for the incarnation ``uid`` (``""``: any)."""
    if cached is None:
        return Presence.ABSENT
    if objects.deleting(cached):
        return Presence.DELETING
    if uid and objects.uid(cached) not in ("", uid):
        return Presence.REPLACED
    return Presence.WANTED


# The gate's columns of the table: the presences each step goes ahead for.
_GOES_AHEAD: dict[Step, frozenset[Presence]] = {
    Step.START_DOWNLOAD: frozenset({Presence.WANTED}),
    Step.WRITE_READY: frozenset({Presence.WANTED}),
    Step.WRITE_UPDATING: frozenset({Presence.WANTED}),
}


def gate(step: Step, now: Presence) -> bool:
    """Whether ``step`` may go ahead for an object whose presence is ``now``."""
    return now in _GOES_AHEAD[step]


def lane(now: Presence) -> Lane:
    """The lane of a key whose cached object's presence is ``now``."""
    return Lane.URGENT if now in (Presence.DELETING, Presence.ABSENT) else Lane.NORMAL
