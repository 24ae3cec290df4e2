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

Every :class:`Confirmation` carries ``read_at``, the ``time.monotonic()`` instant its read *started*. An
answer is only as fresh as that: the caller may repair its cache with the live object only if nothing was
heard of the key since (:meth:`model_agent.kube.store.Store.repair`).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from model_agent.kube import objects
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import MODEL_RESOURCES
from model_agent.model.resources import ModelRef


class Outcome(StrEnum):
    """What a live read proved about a candidate (the module's table); only three outcomes prove absence."""

    CONFIRMED_GONE = "confirmed_gone"
    RECREATED_NEW_UID = "recreated_new_uid"
    DELETING = "deleting"
    ALIVE_SAME_UID = "alive_same_uid"
    READ_FAILED = "read_failed_requeued"

    @property
    def proves_absence(self) -> bool:
        """True for the three outcomes a destructive act may follow; every other outcome means requeue, never act."""
        return self in (Outcome.CONFIRMED_GONE, Outcome.RECREATED_NEW_UID, Outcome.DELETING)


@dataclass(frozen=True)
class Confirmation:
    """The outcome of one confirmation, with the live object when there was one and when its read started."""

    outcome: Outcome
    live: dict[str, Any] | None = None  # the object read, when there was one
    detail: str = ""
    # A 404 for the resource type itself (its CRD is gone): proves nothing about the object, but every model
    # of that kind is about to look gone — the caller tells the delete breaker.
    type_gone: bool = False
    # time.monotonic() when the read that decided this started (None: no read, e.g. a LIST that failed).
    read_at: float | None = None


async def confirm_absence(
    client: KubeClient, ref: ModelRef, recorded_uid: str, *, deadline_s: float = 10.0
) -> Confirmation:
    """Read ``ref`` live (a consistent GET within ``deadline_s``) and decide against ``recorded_uid``.

    Never raises for an API or transport failure: those are ``read_failed_requeued``.
    """
    resource = MODEL_RESOURCES[ref.kind.value]
    path = resource.path(ref.namespace or None, ref.name)
    started = time.monotonic()
    try:
        live = await asyncio.wait_for(client.request("GET", path, timeout=deadline_s), deadline_s + 1)
    except ApiError as exc:
        if exc.is_object_not_found(ref.name, resource.plural):
            return Confirmation(Outcome.CONFIRMED_GONE, detail="NotFound", read_at=started)
        detail = f"HTTP {exc.status} {exc.reason}: {exc.message[:200]}"
        return Confirmation(Outcome.READ_FAILED, detail=detail, type_gone=exc.status == 404, read_at=started)
    except (ApiUnavailable, TimeoutError) as exc:
        return Confirmation(Outcome.READ_FAILED, detail=str(exc) or "deadline passed", read_at=started)
    return _decide_live(live, recorded_uid, started)


def decide_from_list(
    ref: ModelRef,
    recorded_uid: str,
    listed: dict[tuple[str, str], dict[str, Any]],
    read_at: float | None = None,
) -> Confirmation:
    """The same decision table, read off a complete consistent LIST instead of one GET."""
    live = listed.get((ref.namespace, ref.name))
    if live is None:
        return Confirmation(Outcome.CONFIRMED_GONE, detail="absent from a consistent LIST", read_at=read_at)
    return _decide_live(live, recorded_uid, read_at)


def _decide_live(live: dict[str, Any], recorded_uid: str, read_at: float | None) -> Confirmation:
    """The rows of the table for an object that was read: another UID, being deleted, or alive."""
    live_uid = objects.uid(live)
    if recorded_uid and live_uid and live_uid != recorded_uid:
        return Confirmation(
            Outcome.RECREATED_NEW_UID, live, detail=f"uid {recorded_uid} -> {live_uid}", read_at=read_at
        )
    if objects.deleting(live):
        return Confirmation(Outcome.DELETING, live, detail="deletionTimestamp set", read_at=read_at)
    return Confirmation(Outcome.ALIVE_SAME_UID, live, read_at=read_at)


STORM_WINDOW_S = 5.0


@dataclass
class _Waiter:
    ref: ModelRef
    uid: str
    future: asyncio.Future[Confirmation]


class Confirmer:
    """Coalesces confirmations: many candidates of one kind at once are confirmed by one LIST.

    An object absent from the LIST is confirmed by its own GET before it counts as gone (a LIST proves
    presence for a whole storm at once; absence is proven per object, as without coalescing).
    Candidates arriving within ``debounce_s`` (plus up to ``jitter_s``, so a fleet hit by the same storm does
    not LIST in the same instant) of the first one are gathered per kind. A gathering of at most
    ``batch_threshold`` candidates is confirmed with one GET each; a larger one (a storm: a relist after a
    CRD change, a namespace deletion, injected deletes) with one paginated consistent LIST (no
    resourceVersion) for the whole kind, read with the same decision table. A LIST that fails confirms
    nothing: every waiter gets ``read_failed_requeued``. ``batch_threshold=None`` disables coalescing.

    One LIST serves a whole storm, however few reconcile workers carry its candidates: a LIST that *started
    after* the agent last heard of an object (:meth:`heard`, called for every watch event and relist change)
    is at least as fresh as the rumour, so it decides that object's candidate too, without another read (a
    LIST in flight is joined). Only presence is taken from it; absence is still re-proven by a GET. A
    candidate the agent heard nothing about (a drift pass) is never decided by an earlier LIST. LIST
    results are kept for ``list_reuse_s`` at most.

    Freshness holds until the answer is given, not only when the LIST is chosen: a LIST's answers reach its
    waiters only after the GETs for the objects it lacks (rate-limited, possibly slow), and an object heard
    of again meanwhile — its real DELETED arriving, or a relist of the cache (:meth:`relisted`) that may lack
    it — is not answered ``alive`` from that older LIST: it is read again with its own GET (a LIST that
    started before a delete was heard cannot prove the object alive).
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        deadline_s: float = 10.0,
        batch_threshold: int | None = 3,
        debounce_s: float = 1.5,
        jitter_s: float = 1.0,
        on_read: Any = None,
        list_reuse_s: float = 60.0,
    ) -> None:
        self._client = client
        self._list_reuse_s = list_reuse_s
        self._heard: dict[str, float] = {}  # model key -> time.monotonic() of the last event about it
        self._relisted: dict[str, float] = {}  # kind -> time.monotonic() of the cache's last relist
        self._lists: dict[str, tuple[float, asyncio.Future[dict[tuple[str, str], dict[str, Any]]]]] = {}
        self._deadline_s = deadline_s
        self._threshold = batch_threshold
        self._debounce_s = debounce_s
        self._jitter_s = jitter_s  # spreads a fleet's LISTs when a storm hits every node at once
        self._rng = random.Random()
        self._waiting: dict[str, list[_Waiter]] = {}
        self._arrivals: dict[str, list[float]] = {}  # recent candidate arrival times per kind (storm detection)
        self._flushers: set[asyncio.Task[None]] = set()
        self._on_read = on_read  # callable(method: "get" | "list") for metrics

    def heard(self, key: str) -> None:
        """The agent just heard something about model ``key`` (an event): older LISTs cannot decide it."""
        self._heard[key] = time.monotonic()

    def relisted(self, kind: str) -> None:
        """The agent's cache of ``kind`` was just relisted: news of every object of that kind, including the
        ones it no longer lists (which produce no event when the cache had already lost them)."""
        self._relisted[kind] = time.monotonic()

    async def confirm(self, ref: ModelRef, recorded_uid: str) -> Confirmation:
        """Confirm one candidate: by its own GET, or, in a storm, by a fresh LIST of its kind shared with the others.

        Same outcomes as :func:`confirm_absence`; a LIST older than the last thing heard of the key never decides it.
        """
        if self._threshold is None:
            return await self._get(ref, recorded_uid)
        loop = asyncio.get_running_loop()
        kind = ref.kind.value
        now = time.monotonic()
        covering = self._list_since(kind, self._heard.get(ref.key, now))
        if covering is not None:
            started, future = covering
            try:
                listed = await asyncio.shield(future)
            except Exception as exc:
                return Confirmation(Outcome.READ_FAILED, detail=f"LIST failed: {exc}")
            decision = decide_from_list(ref, recorded_uid, listed, started)
            if decision.outcome == Outcome.CONFIRMED_GONE or not self._fresh(ref, started):
                # Absence is proven by the object's own read; so is presence heard of again since the LIST began.
                return await self._get(ref, recorded_uid)
            return decision
        waiter = _Waiter(ref, recorded_uid, loop.create_future())
        recent = [t for t in self._arrivals.get(kind, []) if now - t < STORM_WINDOW_S]
        recent.append(now)
        self._arrivals[kind] = recent
        batch = self._waiting.setdefault(kind, [])
        batch.append(waiter)
        if len(batch) == 1:
            task = loop.create_task(self._flush_later(kind), name=f"confirm {kind}")
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)
        return await waiter.future

    async def _get(self, ref: ModelRef, uid: str) -> Confirmation:
        if self._on_read is not None:
            self._on_read("get")
        return await confirm_absence(self._client, ref, uid, deadline_s=self._deadline_s)

    async def _flush_later(self, kind: str) -> None:
        await asyncio.sleep(self._debounce_s + self._jitter_s * self._rng.random())
        batch = self._waiting.pop(kind, [])
        live = [w for w in batch if not w.future.done()]
        if not live:
            return
        # A storm is recognised by the batch or by the arrivals of the last few seconds, so its stragglers are
        # confirmed by LIST too instead of trickling in as GETs.
        now = time.monotonic()
        recent = sum(1 for t in self._arrivals.get(kind, []) if now - t < STORM_WINDOW_S)
        try:
            if self._threshold is not None and max(len(live), recent) > self._threshold:
                outcomes = await self._by_list(kind, live)
            else:
                outcomes = list(await asyncio.gather(*(self._get(w.ref, w.uid) for w in live)))
        except Exception as exc:
            outcomes = [Confirmation(Outcome.READ_FAILED, detail=f"{type(exc).__name__}: {exc}") for _ in live]
        for waiter, outcome in zip(live, outcomes, strict=True):
            if not waiter.future.done():
                waiter.future.set_result(outcome)

    def _fresh(self, ref: ModelRef, read_at: float) -> bool:
        """Did the read that started at ``read_at`` begin after the last news of ``ref`` (an event, a relist)?"""
        heard = max(self._heard.get(ref.key, 0.0), self._relisted.get(ref.kind.value, 0.0))
        return read_at > heard

    def _list_since(
        self, kind: str, since: float
    ) -> tuple[float, asyncio.Future[dict[tuple[str, str], dict[str, Any]]]] | None:
        """A LIST of ``kind`` (done or in flight) that started at or after ``since`` and may still be used:
        its start time and its future."""
        found = self._lists.get(kind)
        if found is None:
            return None
        started, future = found
        now = time.monotonic()
        if now - started > self._list_reuse_s:
            del self._lists[kind]  # stale: also frees the objects it holds
            return None
        if started < since or (future.done() and (future.cancelled() or future.exception() is not None)):
            return None
        return started, future

    async def _list(self, kind: str) -> dict[tuple[str, str], dict[str, Any]]:
        """One paginated consistent LIST of ``kind``, published in ``_lists`` while it runs and after."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[tuple[str, str], dict[str, Any]]] = loop.create_future()
        self._lists[kind] = (time.monotonic(), future)
        try:
            listed = await self._read_list(kind)
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, Exception) else ApiUnavailable("LIST cancelled"))
            future.exception()  # retrieved: joiners handle it, nobody else must see it as unhandled
            raise
        future.set_result(listed)
        return listed

    async def _read_list(self, kind: str) -> dict[tuple[str, str], dict[str, Any]]:
        if self._on_read is not None:
            self._on_read("list")
        resource = MODEL_RESOURCES[kind]
        listed: dict[tuple[str, str], dict[str, Any]] = {}
        cont = ""
        async with asyncio.timeout(self._deadline_s * 3):
            while True:
                query: dict[str, str | int] = {"limit": 500}
                if cont:
                    query["continue"] = cont
                page = await self._client.request("GET", resource.path(), query=query, timeout=self._deadline_s)
                items = page.get("items")
                if not isinstance(items, list):
                    raise ApiUnavailable("LIST answer without items")
                for item in items:
                    item.setdefault("kind", resource.kind)
                    listed[(objects.namespace(item), objects.name(item))] = item
                cont = str(objects.meta(page).get("continue") or "")
                if not cont:
                    return listed

    async def _by_list(self, kind: str, batch: list[_Waiter]) -> list[Confirmation]:
        started = time.monotonic()
        try:
            listed = await self._list(kind)
        except (ApiError, ApiUnavailable, TimeoutError) as exc:
            detail = f"LIST failed: {exc}"
            gone = isinstance(exc, ApiError) and exc.status == 404
            return [Confirmation(Outcome.READ_FAILED, detail=detail, type_gone=gone) for _ in batch]
        decisions = [decide_from_list(w.ref, w.uid, listed, started) for w in batch]
        # A LIST proves presence for a whole storm at once; absence it only suggests: each object it lacks is
        # read once more on its own, so no single answer — a LIST that drops items — can remove anything.
        absent = [i for i, d in enumerate(decisions) if d.outcome == Outcome.CONFIRMED_GONE]
        rechecked = await asyncio.gather(*(self._get(batch[i].ref, batch[i].uid) for i in absent))
        for i, decision in zip(absent, rechecked, strict=True):
            decisions[i] = decision
        # Those GETs took time; an object heard of again meanwhile (its real DELETED) cannot be answered from
        # the older LIST: read it again on its own.
        stale = [i for i in range(len(batch)) if i not in set(absent) and not self._fresh(batch[i].ref, started)]
        reread = await asyncio.gather(*(self._get(batch[i].ref, batch[i].uid) for i in stale))
        for i, decision in zip(stale, reread, strict=True):
            decisions[i] = decision
        return decisions
