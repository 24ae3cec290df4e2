"""Node alerts: what the agent must tell the cluster about itself, as Warning Events on its own Node.

Role: two conditions no single model owns, both turned into an Event on this node's Node object, a log line
and a metric:

* the delete breaker opening or closing (``DeleteBreakerOpen`` / ``DeleteBreakerClosed``;
  ``model_agent_delete_breaker_open``, ``..._trips_total``): removals are held until an operator looks;
* a request denied with 401/403 (``Forbidden``, once per resource): an agent whose RBAC lacks ``get`` on a
  model kind can never confirm a removal. :meth:`rbac_problem` makes ``/healthz`` red for ten minutes after
  the last denial.

Contract: the observers run on the event loop inside the API client's and the breaker's calls; they never
block and never raise (the Event recorder queues, it does not send inline).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import structlog

from model_agent.agent.late_wiring import LateWiring
from model_agent.ops.events import WARNING, ObjectRef

if TYPE_CHECKING:
    from model_agent.agent.wiring import Wiring

log = structlog.get_logger(__name__)

RBAC_WINDOW_S = 600.0


class NodeAlerts(LateWiring):
    """Breaker and RBAC warnings for this node; see the module docstring."""

    def __init__(self) -> None:
        self.forbidden: dict[str, float] = {}  # resource -> last 401/403 (monotonic), for /healthz

    def attach(self, wiring: Wiring) -> None:
        """Bind the built collaborators (before any request is made)."""
        self._w = wiring

    def _node(self) -> dict[str, Any]:
        """This node's Node from the cache, or a reference by name when the cache has none yet."""
        node = self.w.settings.node_name
        return self.w.node.store.get(node) or {"kind": "Node", "apiVersion": "v1", "metadata": {"name": node}}

    def on_breaker_change(self, opened: bool, message: str) -> None:
        """The delete breaker opened or closed: gauge, trip counter, Event and log line."""
        self.w.metrics.breaker_open.set(1 if opened else 0)
        if opened:
            self.w.metrics.breaker_trips.inc()
        reason = "DeleteBreakerOpen" if opened else "DeleteBreakerClosed"
        self.w.events.emit(ObjectRef.of(self._node()), WARNING, reason, message)
        log.warning("delete breaker", open=opened, message=message)

    def note_forbidden(self, verb: str, resource: str, status: int, _seconds: float) -> None:
        """The API client's observer: remember 401/403 per resource; the first one (after start) is an Event."""
        if status not in (401, 403):
            return
        first = resource not in self.forbidden
        self.forbidden[resource] = time.monotonic()
        if first and self._w is not None and self.w.started.is_set():
            self.w.events.emit(
                ObjectRef.of(self._node()),
                WARNING,
                "Forbidden",
                f"the agent may not {verb} {resource} (HTTP {status}): check its RBAC; removals that need a "
                "confirmation read are held until it can",
            )

    def rbac_problem(self, window_s: float = RBAC_WINDOW_S) -> str | None:
        """A /healthz check: any request denied within the window names its resource here."""
        now = time.monotonic()
        denied = sorted(r for r, t in self.forbidden.items() if now - t < window_s)
        return f"requests denied (401/403) for: {', '.join(denied)}" if denied else None
