"""The reflector: keep a :class:`~model_agent.kube.store.Store` equal to the server's view of one resource.

Loop: paginated consistent LIST (``resourceVersion`` unset) → ``Store.replace`` → WATCH from the list's
resourceVersion with bookmarks → apply each event → on the stream's normal end, watch again from the last
seen resourceVersion; on ``410 Gone`` (or an ERROR event) relist; on any other failure back off (0.8 s
doubling to 30 s, jittered) and retry. What follows each attempt is decided by :func:`plan_next` (a pure
table, unit-tested row by row): a LIST that fails — a ``410`` on its ``continue`` token included — is
retried with backoff, never at once; a watch that ends within ``MIN_WATCH_S`` of opening is reopened only
after a (growing) backoff, so a server that closes every watch at once cannot make it spin, and one expired
(``410``) right after the LIST it started from relists only after a minimum wait; a watch that ran longer
resets the backoff, and its ``410`` relists at once.

Guarantees:
* the change callback is synchronous and must not block: it only says "look at key K again", so a slow
  consumer can never stall the watch (the Go agent's unbuffered hand-off could);
* a key that vanished in a relist is reported as a ``Change`` with ``new=None`` (``vanished``) exactly as a
  watch ``DELETED`` is: a candidate that the consumer must confirm, never a fact;
* a failed or partial LIST never reaches the store: the store changes only after every page arrived;
* every request carries a deadline, and a watch that stays silent longer than its server timeout plus a
  margin is treated as dead (bookmarks keep a healthy stream talking);
* anything else that goes wrong (a bug, an answer of an unexpected shape) ends :meth:`Reflector.run` with
  the exception: the agent's supervisor logs it, counts it, marks the component down and runs it again
  (from a fresh LIST) after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import structlog

from model_agent.kube import objects
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import Resource
from model_agent.kube.store import Change, Store

log = structlog.get_logger(__name__)

ChangeHandler = Callable[[Change, str], None]

LIST_PAGE_SIZE = 500
LIST_TIMEOUT_S = 60.0
BACKOFF_INITIAL_S = 0.8
BACKOFF_CAP_S = 30.0
# A watch that ends within this long of opening (cleanly, refused or with 410) is reopened only after a
# backoff: a server or proxy that closes every watch at once must not make the reflector spin.
MIN_WATCH_S = 1.0


class MalformedEvent(ValueError):
    """A watch event the API server cannot have sent (its object lacks a ``metadata`` mapping)."""


class _Relist(Exception):
    """Internal: the watch cannot continue from its resourceVersion; list again."""


class Phase(StrEnum):
    """Which request an :class:`Attempt` was: the LIST that fills the store, or a WATCH that follows it."""

    LIST = "list"
    WATCH = "watch"


class Result(StrEnum):
    """How an attempt ended, in the three cases :func:`plan_next` tells apart."""

    ENDED = "ended"  # a watch stream ended normally (the server's timeout, a proxy closing it)
    GONE = "gone"  # 410 Gone, or an ERROR event in the watch: the resourceVersion cannot be continued
    FAILED = "failed"  # any other API error or an unreachable server


@dataclass(frozen=True)
class Attempt:
    """How one LIST or WATCH attempt ended: the facts :func:`plan_next` decides from."""

    phase: Phase
    result: Result
    lasted_s: float = 0.0
    # The watch began from the resourceVersion of the LIST just before it (not from a long-running stream).
    after_relist: bool = False
    have_resource_version: bool = True


@dataclass(frozen=True)
class Plan:
    """:func:`plan_next`'s decision: whether to relist, how long to wait first, and the backoff base to carry on."""

    relist: bool
    delay_s: float  # before jitter; 0: at once
    backoff_s: float  # the backoff base for the next failure


def plan_next(attempt: Attempt, backoff_s: float) -> Plan:
    """What to do after an attempt: relist or watch again, how long to wait, and the next backoff base.

    =====  ======  ==========================================  =======  ===============  ==============
    phase  result  condition                                   relist   delay            next backoff
    =====  ======  ==========================================  =======  ===============  ==============
    list   any     (a failed LIST, a 410 continue included)    yes      backoff          doubled
    watch  ended   lasted >= MIN_WATCH_S                       no       0                reset
    watch  ended   shorter                                     no       backoff          doubled
    watch  gone    lasted >= MIN_WATCH_S, or resumed an old    yes      0                reset if it
                   resourceVersion (not right after a LIST)                              lasted
    watch  gone    shorter, right after a LIST                 yes      the floor        unchanged
                                                                        (initial)
    watch  failed  any                                         no (yes  backoff (reset   doubled
                                                               w/o rv)  first if it
                                                                        lasted)
    =====  ======  ==========================================  =======  ===============  ==============
    """
    grown = min(backoff_s * 2, BACKOFF_CAP_S)
    lasted = attempt.lasted_s >= MIN_WATCH_S
    if attempt.phase == Phase.LIST:
        return Plan(relist=True, delay_s=backoff_s, backoff_s=grown)
    if attempt.result == Result.ENDED:
        if lasted:
            return Plan(relist=False, delay_s=0.0, backoff_s=BACKOFF_INITIAL_S)
        return Plan(relist=False, delay_s=backoff_s, backoff_s=grown)
    if attempt.result == Result.GONE:
        if lasted or not attempt.after_relist:
            return Plan(relist=True, delay_s=0.0, backoff_s=BACKOFF_INITIAL_S if lasted else backoff_s)
        # A floor, not a growing wait: the LIST just succeeded, so this is no outage; the floor only keeps a
        # server that expires every fresh watch from turning the reflector into a LIST loop.
        return Plan(relist=True, delay_s=BACKOFF_INITIAL_S, backoff_s=backoff_s)
    base = BACKOFF_INITIAL_S if lasted else backoff_s
    return Plan(relist=not attempt.have_resource_version, delay_s=base, backoff_s=min(base * 2, BACKOFF_CAP_S))


class Reflector:
    """Keeps :attr:`store` equal to the server's view of one ``resource`` (see the module contract).

    ``on_change`` hears every change, vanished keys included; :attr:`synced` is set after the first complete
    LIST, so consumers can wait for a full cache before trusting an absence.
    """

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        on_change: ChangeHandler,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        watch_timeout_s: tuple[int, int] = (300, 600),
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.resource = resource
        self.store = Store()
        self._on_change = on_change
        self._namespace = namespace
        self._field_selector = field_selector
        self._watch_timeout_s = watch_timeout_s
        self._rng = rng or random.Random()
        self._sleep = sleep
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self.last_progress = time.monotonic()
        self.last_error: str | None = None
        self.on_relist: Callable[[str], None] | None = None

    @property
    def name(self) -> str:
        """The resource's plural: the name the reflector goes by in logs, metrics and ``/status``."""
        return self.resource.plural

    def _base_query(self) -> dict[str, str | int]:
        query: dict[str, str | int] = {}
        if self._field_selector:
            query["fieldSelector"] = self._field_selector
        return query

    async def list_all(self) -> tuple[list[dict[str, Any]], str]:
        """One complete, consistent LIST (all pages). Raises on any failure; never returns a partial list."""
        items: list[dict[str, Any]] = []
        cont = ""
        rv = ""
        path = self.resource.path(self._namespace)
        while True:
            query = self._base_query() | {"limit": LIST_PAGE_SIZE}
            if cont:
                query["continue"] = cont
            page = await self.client.request("GET", path, query=query, timeout=LIST_TIMEOUT_S)
            meta = objects.meta(page)
            raw_items = page.get("items")
            if not isinstance(raw_items, list):
                raise ApiUnavailable(f"LIST {path}: answer without an items list")
            kind = self.resource.kind
            for item in raw_items:
                if isinstance(item, dict):
                    item.setdefault("kind", kind)
                    item.setdefault("apiVersion", self.resource.api_version)
                    items.append(item)
            rv = str(meta.get("resourceVersion") or rv)
            cont = str(meta.get("continue") or "")
            if not cont:
                return items, rv

    async def run(self) -> None:
        """Run until cancelled. Unexpected exceptions propagate (the caller supervises)."""
        backoff = BACKOFF_INITIAL_S
        need_list = True
        while True:
            attempt = await self._attempt(need_list)
            plan = plan_next(attempt, backoff)
            backoff = plan.backoff_s
            need_list = plan.relist
            if plan.delay_s > 0:
                await self._sleep(plan.delay_s * (0.5 + self._rng.random()))

    async def _attempt(self, need_list: bool) -> Attempt:
        """One LIST (when needed) and one WATCH; how it ended. API failures become facts, nothing else."""
        phase = Phase.LIST if need_list else Phase.WATCH
        started = time.monotonic()
        try:
            if need_list:
                await self._relist()
                phase, started = Phase.WATCH, time.monotonic()
            await self._watch_once()
            return Attempt(Phase.WATCH, Result.ENDED, time.monotonic() - started, after_relist=need_list)
        except _Relist:
            return Attempt(Phase.WATCH, Result.GONE, time.monotonic() - started, after_relist=need_list)
        except (ApiError, ApiUnavailable) as exc:
            self.last_error = str(exc)
            lasted = time.monotonic() - started
            gone = isinstance(exc, ApiError) and exc.status == 410
            if isinstance(exc, ApiError) and exc.status in (401, 403):
                log.error("reflector forbidden", resource=self.name, phase=phase.value, error=str(exc))
            elif gone and phase == Phase.WATCH:
                log.info("watch expired; relisting", resource=self.name)
            else:
                log.warning("reflector error", resource=self.name, phase=phase.value, error=str(exc))
            return Attempt(
                phase,
                Result.GONE if gone else Result.FAILED,
                lasted,
                after_relist=need_list,
                have_resource_version=bool(self.resource_version),
            )

    async def _relist(self) -> None:
        items, rv = await self.list_all()
        self.relists += 1
        if self.on_relist is not None:
            self.on_relist(self.name)
        changes = self.store.replace(items)
        self.resource_version = rv
        self.last_progress = time.monotonic()
        self.last_error = None
        self.synced.set()
        for change in changes:
            self._emit(change, "list")

    async def _watch_once(self) -> None:
        low, high = self._watch_timeout_s
        server_timeout = self._rng.randint(low, high) if high > low else low
        query = self._base_query() | {
            "watch": "true",
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": server_timeout,
        }
        # aclosing: a reflector cancelled (or ended by a bad event) closes its stream at once, not when the
        # generator is collected
        stream = self.client.watch_lines(
            self.resource.path(self._namespace), query=query, read_timeout=server_timeout + 60
        )
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                self._on_event(event)

    def _on_event(self, event: dict[str, Any]) -> None:
        """One watch event into the store (see the module contract)."""
        self.last_progress = time.monotonic()
        etype = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            return
        if etype == "ERROR":
            code = obj.get("code")
            log.info("watch error event", resource=self.name, code=code, message=obj.get("message"))
            raise _Relist()
        if not isinstance(obj.get("metadata"), dict):
            # Not the API server's shape: end the run loudly (the supervisor logs, counts and restarts it)
            # rather than file an object under an empty key.
            raise MalformedEvent(f"{self.name}: a {etype} event whose object has no metadata mapping")
        rv = objects.resource_version(obj)
        if etype == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        if etype in ("ADDED", "MODIFIED"):
            change = self.store.upsert(obj)
        elif etype == "DELETED":
            change = self.store.delete(obj)
        else:
            return
        if rv:
            self.resource_version = rv
        self._emit(change, "watch")

    def _emit(self, change: Change, source: str) -> None:
        try:
            self._on_change(change, source)
        except Exception:  # a handler bug must not kill the watch
            log.exception("change handler failed", resource=self.name, key=change.key)
