"""Confirming absence: the live read every destructive act must pass first.

A watch ``DELETED``, a key that vanished in a relist, a record on disk with no cached object, a node
selection that no longer matches: each is a *candidate*. :func:`confirm_absence` reads the object from the
API server with no resourceVersion (a consistent read), bounded by a deadline, and decides:

============================================  =======================  ===================================
Live read                                     Outcome                  Act?
============================================  =======================  ===================================
404 NotFound naming this object               ``confirmed_gone``       yes
object with another UID                       ``recreated_new_uid``    yes, for the recorded UID only
object with a deletionTimestamp               ``deleting``             yes
same UID (or UID unknown), alive              ``alive_same_uid``       no: the rumour is dropped
timeout, 5xx, 429, 401/403, connection error  ``read_failed_requeued`` no: requeue with backoff
404 that does not name the object             ``read_failed_requeued`` no (the resource type is gone,
                                                                       e.g. the CRD was deleted)
============================================  =======================  ===================================

The last row is the deliberate safe choice: when the CRD itself is deleted every object goes, but a 404 for
the *type* proves nothing about one object (the CRD may be re-applied a second later), so nothing is
removed until the type answers again. A CRD that stays deleted leaves the weights in place; the operator
removes them with ``model-agent trash``/by hand. (The delete breaker is the second line of defence.)

``alive_same_uid`` also covers "deselected" candidates: the caller then re-evaluates selection against
the live object. A known-UID candidate is never confirmed by an object carrying no UID.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import MODEL_RESOURCES
from model_agent.model.resources import ModelRef


class Outcome(StrEnum):
    CONFIRMED_GONE = "confirmed_gone"
    RECREATED_NEW_UID = "recreated_new_uid"
    DELETING = "deleting"
    ALIVE_SAME_UID = "alive_same_uid"
    READ_FAILED = "read_failed_requeued"

    @property
    def proves_absence(self) -> bool:
        return self in (Outcome.CONFIRMED_GONE, Outcome.RECREATED_NEW_UID, Outcome.DELETING)


@dataclass(frozen=True)
class Confirmation:
    outcome: Outcome
    live: dict[str, Any] | None = None  # the object read, when there was one
    detail: str = ""


async def confirm_absence(
    client: KubeClient, ref: ModelRef, recorded_uid: str, *, deadline_s: float = 10.0
) -> Confirmation:
    resource = MODEL_RESOURCES[ref.kind.value]
    path = resource.path(ref.namespace or None, ref.name)
    try:
        live = await asyncio.wait_for(client.request("GET", path, timeout=deadline_s), deadline_s + 1)
    except ApiError as exc:
        if exc.is_object_not_found(ref.name, resource.plural):
            return Confirmation(Outcome.CONFIRMED_GONE, detail="NotFound")
        return Confirmation(Outcome.READ_FAILED, detail=f"HTTP {exc.status} {exc.reason}: {exc.message[:200]}")
    except (ApiUnavailable, TimeoutError) as exc:
        return Confirmation(Outcome.READ_FAILED, detail=str(exc) or "deadline passed")
    meta = live.get("metadata") or {}
    live_uid = str(meta.get("uid") or "")
    if recorded_uid and live_uid and live_uid != recorded_uid:
        return Confirmation(Outcome.RECREATED_NEW_UID, live, detail=f"uid {recorded_uid} -> {live_uid}")
    if meta.get("deletionTimestamp"):
        return Confirmation(Outcome.DELETING, live, detail="deletionTimestamp set")
    return Confirmation(Outcome.ALIVE_SAME_UID, live)
