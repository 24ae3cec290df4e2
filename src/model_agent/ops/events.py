"""Kubernetes Events on models and on the Node: what the agent decided, visible with ``kubectl describe``.

Like client-go's recorder, repeated events are aggregated: the same (object, type, reason, message)
within ``aggregate_window_s`` bumps ``count``/``lastTimestamp`` on the existing Event instead of creating a
new one, and a per-object token bucket (burst 25, one token per 10 s) stops a hot loop from spamming the
API server. Emitting never blocks the caller and never raises: events are sent by a background task with
a deadline, and failures are logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from model_agent.kube import objects
from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import EVENTS

log = structlog.get_logger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True)
class ObjectRef:
    """The ``involvedObject`` of an Event: enough to find the object with ``kubectl describe`` and to tell a
    recreated one (another UID) from the old.
    """

    kind: str
    api_version: str
    name: str
    namespace: str
    uid: str

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ObjectRef:
        """The reference of a cached object; a missing field becomes ``""``, so a half-known object gets its Event."""
        return cls(
            kind=str(obj.get("kind") or ""),
            api_version=str(obj.get("apiVersion") or ""),
            name=objects.name(obj),
            namespace=objects.namespace(obj),
            uid=objects.uid(obj),
        )


@dataclass
class _Seen:
    name: str
    namespace: str
    count: int
    last: float


class _Bucket:
    def __init__(self, burst: int = 25, refill_s: float = 10.0) -> None:
        self.tokens = float(burst)
        self.burst = burst
        self.refill_s = refill_s
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) / self.refill_s)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(eq=False)
class EventRecorder:
    """Sends Events for one agent (``host`` is its node): aggregated, rate-limited per object, never blocking.

    ``sent`` and ``dropped`` count what reached the server and what the per-object bucket held back.
    """

    client: KubeClient
    _: KW_ONLY
    host: str
    component: str = "model-agent"
    aggregate_window_s: float = 600
    _seen: dict[tuple[str, str, str, str], _Seen] = field(default_factory=dict, init=False, repr=False)
    _buckets: dict[str, _Bucket] = field(default_factory=dict, init=False, repr=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)
    sent: int = field(default=0, init=False)
    dropped: int = field(default=0, init=False)

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Log the Event at once and send it in the background; over the object's budget it is only logged.

        Never raises and never waits: callers emit from the reconcile path and the event loop.
        """
        reason = str(reason)  # a Reason member is sent and logged as its wire word only
        log.info(
            "event",
            object=f"{ref.kind}/{ref.namespace}/{ref.name}",
            type=type_,
            reason=reason,
            message=message,
        )
        bucket = self._buckets.setdefault(ref.uid or ref.name, _Bucket())
        if not bucket.take():
            self.dropped += 1
            return
        task = asyncio.get_running_loop().create_task(self._send(ref, type_, reason, message[:1024]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        key = (ref.uid or ref.name, type_, reason, message)
        now = time.monotonic()
        seen = self._seen.get(key)
        try:
            if seen is not None and now - seen.last < self.aggregate_window_s:
                seen.count += 1
                seen.last = now
                await self.client.request(
                    "PATCH",
                    EVENTS.path(seen.namespace, seen.name),
                    body={"count": seen.count, "lastTimestamp": _now()},
                    content_type="application/merge-patch+json",
                    timeout=5,
                )
            else:
                namespace = ref.namespace or "default"
                name = f"{ref.name}.{secrets.token_hex(8)}"
                stamp = _now()
                body = {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": name, "namespace": namespace},
                    "involvedObject": {
                        "kind": ref.kind,
                        "apiVersion": ref.api_version,
                        "name": ref.name,
                        "namespace": ref.namespace,
                        "uid": ref.uid,
                    },
                    "reason": reason,
                    "message": message,
                    "type": type_,
                    "source": {"component": self.component, "host": self.host},
                    "reportingComponent": self.component,
                    "reportingInstance": self.host,
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                    "count": 1,
                }
                await self.client.request("POST", EVENTS.path(namespace), body=body, timeout=5)
                self._seen[key] = _Seen(name, namespace, 1, now)
            self.sent += 1
        except (ApiError, ApiUnavailable) as exc:
            if seen is not None and isinstance(exc, ApiError) and exc.status == 404:
                self._seen.pop(key, None)  # the aggregated Event expired; the next one creates anew
            log.warning("event not recorded", reason=reason, error=str(exc))

    async def close(self, timeout_s: float = 5.0) -> None:
        """Let in-flight events finish (bounded), then cancel the rest."""
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pending, return_exceptions=True)
