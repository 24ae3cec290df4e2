"""The agent's HTTP endpoints on ``--port``: ``/metrics``, ``/healthz``, ``/livez``, ``/readyz``.

Unlike OME's (whose liveness always succeeds), every check here can fail:

* ``/livez`` — the event loop ticks (a blocked loop cannot answer at all; a starved one shows a stale tick)
  and every reflector made progress (an event, a bookmark or a successful list) within ``stale_after_s``;
* ``/readyz`` — every cache has synced once;
* ``/healthz`` (and ``/healthz/model-agent-health``) — each models root exists and is a directory; each
  records directory (the manifests: ``--state-dir`` or ``<root>/.model-agent``) is writable, but the root
  itself need not be (OME issue #787: a read-only root of pre-provisioned ``local://`` models is healthy,
  only a fetch into it fails, with its reason on the model); the API server answered within the last
  ``api_fresh_s`` (checked with ``/version``); no request was denied (401/403) in the last 10 minutes — an
  agent whose RBAC lacks ``get`` on the model kinds can never confirm a removal, and says so here, in an
  Event on its Node and in ``model_agent_rbac_denied``; and every supervised background task (reflectors,
  resync, purge, verify, loop tick) runs: one that ended unexpectedly is named here until it has restarted
  and works again (``model_agent_background_tasks_down``).

Add ``?verbose`` for one line per check. Failures answer HTTP 500. The listener is bounded
(:data:`~model_agent.ops.listener.HEALTH_LIMITS`).

The operator's tools, ``GET /status`` (every model of every tenant on the node) and ``POST /verify`` (a full
re-hash), answer only requests from the loopback address: ``model-agent status``/``verify`` run in the agent's
container (``kubectl exec``), or through ``kubectl port-forward``, which arrives there as loopback. Anyone else
on the pod network gets 403. A ``POST /verify`` while a pass runs gets 409 with that pass's progress (one pass at
a time: a full re-hash reads every byte of the node's models). ``/metrics`` and the probes stay open to the
network: the kubelet and Prometheus use them, and they reveal no tenant's data.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.reflector import Reflector
from model_agent.ops.listener import HEALTH_LIMITS, Gate, serve
from model_agent.ops.metrics import Metrics
from model_agent.transfer.addresses import parse_ip

Check = Callable[[], "str | None"]  # None: ok; a string: why it failed


@dataclass
class HealthSources:
    client: KubeClient
    metrics: Metrics
    reflectors: list[Reflector]
    roots: list[str]
    loop_tick: Callable[[], float]
    synced: Callable[[], bool]
    status: Callable[[], dict[str, Any]] = dict
    verify: Callable[[list[str] | None], Awaitable[dict[str, list[str]]]] | None = None
    verify_running: Callable[[], dict[str, Any] | None] = lambda: None
    rbac_problem: Callable[[], str | None] = lambda: None
    # Supervised background tasks that ended unexpectedly and have not recovered yet (None: all run).
    background_problem: Callable[[], str | None] = lambda: None
    # Directories the agent must write (each root's manifests), checked for writability; the roots only exist.
    records: list[str] = field(default_factory=list)
    stale_after_s: float = 900.0
    api_fresh_s: float = 30.0


class HealthServer:
    def __init__(self, sources: HealthSources, host: str, port: int) -> None:
        self.s = sources
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self.gate: Gate | None = None
        self._api_ok_at = 0.0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/livez", self._livez)
        app.router.add_get("/livez/ping", self._livez)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/healthz/model-agent-health", self._healthz)
        app.router.add_get("/status", self._status)
        app.router.add_post("/verify", self._verify)
        return app

    async def start(self) -> None:
        def refused(why: str) -> None:
            self.s.metrics.listener_refused.labels("health", why).inc()

        self._runner, self.port, self.gate = await serve(
            self.app(), self.host, self.port, HEALTH_LIMITS, name="health", on_refused=refused
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _verify(self, req: web.Request) -> web.Response:
        """POST /verify?model=Kind/ns/name (repeatable; none: all models). Answers path -> damaged files."""
        if not _from_loopback(req):
            return _operator_only("/verify")
        if self.s.verify is None:
            return web.json_response({"error": "verification not available"}, status=503)
        running = self.s.verify_running()
        if running is not None:
            return web.json_response({"error": "a verification pass is running", "running": running}, status=409)
        keys = req.query.getall("model", []) or None
        return web.json_response(await self.s.verify(list(keys) if keys else None))

    async def _status(self, req: web.Request) -> web.Response:
        if not _from_loopback(req):
            return _operator_only("/status")
        return web.json_response(self.s.status())

    async def _metrics(self, _req: web.Request) -> web.Response:
        return web.Response(body=self.s.metrics.render(), content_type="text/plain", charset="utf-8")

    @staticmethod
    def _answer(req: web.Request, checks: list[tuple[str, str | None]], name: str) -> web.Response:
        failed = [(n, why) for n, why in checks if why is not None]
        verbose = "verbose" in req.query
        lines = [f"[{'-' if why else '+'}]{n} {'failed: ' + why if why else 'ok'}" for n, why in checks]
        if failed:
            body = "\n".join(lines) + f"\n{name} check failed\n"
            return web.Response(status=500, text=body)
        return web.Response(text=("\n".join(lines) + f"\n{name} check passed\n") if verbose else "ok")

    async def _livez(self, req: web.Request) -> web.Response:
        now = time.monotonic()
        checks: list[tuple[str, str | None]] = [
            (
                "event-loop",
                None if now - self.s.loop_tick() < 10 else f"last tick {now - self.s.loop_tick():.0f}s ago",
            )
        ]
        for r in self.s.reflectors:
            idle = now - r.last_progress
            checks.append(
                (
                    f"reflector-{r.name}",
                    None if idle < self.s.stale_after_s else f"no progress for {idle:.0f}s",
                )
            )
        return self._answer(req, checks, "livez")

    async def _readyz(self, req: web.Request) -> web.Response:
        checks = [(f"cache-{r.name}", None if r.synced.is_set() else "not synced yet") for r in self.s.reflectors]
        return self._answer(req, checks, "readyz")

    async def _healthz(self, req: web.Request) -> web.Response:
        checks: list[tuple[str, str | None]] = []
        for root in self.s.roots:
            ok = os.path.isdir(root)  # noqa: ASYNC240 - one stat, cheaper than a thread hop
            checks.append(("model-agent-health", None if ok else f"{root} is not a directory"))
        for records in self.s.records:
            why = None
            if not os.path.isdir(records):  # noqa: ASYNC240 - one stat
                why = f"{records} (the agent's records) is not a directory"
            elif not os.access(records, os.W_OK):
                why = f"{records} (the agent's records) is not writable: give --state-dir a writable directory"
            checks.append(("records", why))
        checks.append(("api-server", await self._api_check()))
        checks.append(("rbac", self.s.rbac_problem()))
        checks.append(("background-tasks", self.s.background_problem()))
        return self._answer(req, checks, "healthz")

    async def _api_check(self) -> str | None:
        if time.monotonic() - self._api_ok_at < self.s.api_fresh_s:
            return None
        try:
            await self.s.client.request("GET", "/version", timeout=3)
        except (ApiError, ApiUnavailable) as exc:
            return str(exc)[:200]
        self._api_ok_at = time.monotonic()
        return None


def _from_loopback(req: web.Request) -> bool:
    """Did the request come from this host's (this pod's) own loopback address?"""
    address = parse_ip(req.remote or "")
    return address is not None and address.is_loopback


def _operator_only(path: str) -> web.Response:
    why = (
        f"{path} answers only on the loopback address: run model-agent status or model-agent verify in the agent's "
        "container (kubectl exec), or use kubectl port-forward\n"
    )
    return web.Response(status=403, text=why)
