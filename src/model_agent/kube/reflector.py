"""The reflector: keep a :class:`~model_agent.kube.store.Store` equal to the server's view of one resource.

Loop: paginated consistent LIST (``resourceVersion`` unset) → ``Store.replace`` → WATCH from the list's
resourceVersion with bookmarks → apply each event → on the stream's normal end, watch again from the last
seen resourceVersion; on ``410 Gone`` (or an ERROR event) relist; on any other failure back off (0.8 s
doubling to 30 s, jittered) and retry.

Guarantees:
* the change callback is synchronous and must not block: it only says "look at key K again", so a slow
  consumer can never stall the watch (the Go agent's unbuffered hand-off could);
* a key that vanished in a relist is reported as a ``Change`` with ``new=None`` (``vanished``) exactly as a
  watch ``DELETED`` is: a candidate that the consumer must confirm, never a fact;
* a failed or partial LIST never reaches the store: the store changes only after every page arrived;
* every request carries a deadline, and a watch that stays silent longer than its server timeout plus a
  margin is treated as dead (bookmarks keep a healthy stream talking).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import structlog

from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import Resource
from model_agent.kube.store import Change, Store

log = structlog.get_logger(__name__)

ChangeHandler = Callable[[Change, str], None]

LIST_PAGE_SIZE = 500
LIST_TIMEOUT_S = 60.0
BACKOFF_INITIAL_S = 0.8
BACKOFF_CAP_S = 30.0


class _Relist(Exception):
    """Internal: the watch cannot continue from its resourceVersion; list again."""


class Reflector:
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
    ) -> None:
        self.client = client
        self.resource = resource
        self.store = Store()
        self._on_change = on_change
        self._namespace = namespace
        self._field_selector = field_selector
        self._watch_timeout_s = watch_timeout_s
        self._rng = rng or random.Random()
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self.last_progress = time.monotonic()
        self.last_error: str | None = None
        self.on_relist: Callable[[str], None] | None = None

    @property
    def name(self) -> str:
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
            meta = page.get("metadata") or {}
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
        """Run until cancelled."""
        backoff = BACKOFF_INITIAL_S
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                await self._watch_once()
                backoff = BACKOFF_INITIAL_S
            except _Relist:
                need_list = True
            except asyncio.CancelledError:
                raise
            except (ApiError, ApiUnavailable) as exc:
                self.last_error = str(exc)
                if isinstance(exc, ApiError) and exc.status == 410:
                    need_list = True
                    continue
                if isinstance(exc, ApiError) and exc.status in (401, 403):
                    log.error("reflector forbidden", resource=self.name, error=str(exc))
                else:
                    log.warning("reflector error", resource=self.name, error=str(exc), retry_in=round(backoff, 2))
                delay = backoff * (0.5 + self._rng.random())
                backoff = min(backoff * 2, BACKOFF_CAP_S)
                if need_list or not self.resource_version:
                    need_list = True
                await asyncio.sleep(delay)

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
        async for event in self.client.watch_lines(
            self.resource.path(self._namespace), query=query, read_timeout=server_timeout + 60
        ):
            self.last_progress = time.monotonic()
            etype = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, dict):
                continue
            if etype == "ERROR":
                code = obj.get("code")
                log.info("watch error event", resource=self.name, code=code, message=obj.get("message"))
                raise _Relist()
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if etype == "BOOKMARK":
                if rv:
                    self.resource_version = rv
                continue
            obj.setdefault("kind", self.resource.kind)
            obj.setdefault("apiVersion", self.resource.api_version)
            if etype in ("ADDED", "MODIFIED"):
                change = self.store.upsert(obj)
            elif etype == "DELETED":
                change = self.store.delete(obj)
            else:
                continue
            if rv:
                self.resource_version = rv
            self._emit(change, "watch")

    def _emit(self, change: Change, source: str) -> None:
        try:
            self._on_change(change, source)
        except Exception:  # a handler bug must not kill the watch
            log.exception("change handler failed", resource=self.name, key=change.key)
