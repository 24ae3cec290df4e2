"""Supervision of the agent's long-running background tasks (reflectors, resync, purge, verify, loop tick).

Each component is a coroutine function that is meant to run until cancelled. :meth:`Supervisor.spawn`
runs it in a task and watches it:

* an end other than cancellation — any exception, or a plain return (these loops never return on their
  own) — is logged with its traceback, counted (``on_failure(name)``, the agent's
  ``model_agent_background_task_failures_total{component}``), marks the component *down*, and the
  component runs again after :func:`restart_delay` (1 s doubling to 60 s, jittered; back to 1 s after a run
  of at least ``HEALTHY_RUN_S``), so a persistent fault neither spins nor stops the agent for good;
* :meth:`Supervisor.down` names the components that are down, for ``/healthz`` (HTTP 500 while any is): a
  component is down from its unexpected end until it runs again and, when it has a ``recovered`` check,
  until that check says it works again (a reflector: it made progress — a LIST or an event — after the
  failure; a periodic pass: a pass succeeded after the failure);
* a component that survives a failed unit of work (a periodic pass) reports it with :meth:`Supervisor.report`:
  logged with its traceback, counted the same way, and down until it reports :meth:`Supervisor.ok`;
* :meth:`Supervisor.stop` cancels every component and waits for them.

The supervisor never swallows a failure silently and never restarts a component that was cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

RESTART_INITIAL_S = 1.0
RESTART_CAP_S = 60.0
HEALTHY_RUN_S = 60.0  # a component that ran this long before failing starts its backoff afresh


def restart_delay(previous_s: float | None, ran_for_s: float) -> float:
    """The wait before running a failed component again (before jitter).

    The first failure, or one after a run of at least ``HEALTHY_RUN_S``, waits ``RESTART_INITIAL_S``; each
    further quick failure doubles the previous wait, up to ``RESTART_CAP_S``.
    """
    if previous_s is None or ran_for_s >= HEALTHY_RUN_S:
        return RESTART_INITIAL_S
    return min(previous_s * 2, RESTART_CAP_S)


Recovered = Callable[[float], bool]  # recovered(failed_at_monotonic) -> does it work again?


@dataclass
class _Component:
    name: str
    run: Callable[[], Awaitable[None]]
    recovered: Recovered | None
    task: asyncio.Task[None] | None = None
    failures: int = 0
    down_since: float | None = None  # monotonic time of the unexpected end, while down
    why: str = ""
    running_again: bool = False  # restarted since the last failure
    reported: bool = False  # down by report(): only ok() brings it up
    delay_s: float | None = None


async def _never() -> None:
    """The run of a component known only from :meth:`Supervisor.report` (it is not spawned here)."""


class Supervisor:
    """Runs and restarts the agent's background components (see the module contract)."""

    def __init__(
        self,
        *,
        on_failure: Callable[[str], None] | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._components: dict[str, _Component] = {}
        self._on_failure = on_failure
        self._rng = rng or random.Random()
        self._sleep = sleep

    def spawn(self, name: str, run: Callable[[], Awaitable[None]], *, recovered: Recovered | None = None) -> None:
        """Run ``run()`` under supervision as component ``name`` (unique)."""
        if name in self._components:
            raise ValueError(f"component {name!r} is already supervised")
        component = _Component(name, run, recovered)
        self._components[name] = component
        component.task = asyncio.get_running_loop().create_task(self._keep(component), name=name)

    def failures(self, name: str) -> int:
        """How often component ``name`` failed since it was spawned."""
        return self._components[name].failures

    def report(self, name: str, exc: BaseException) -> None:
        """Component ``name`` (which goes on running) failed one unit of work: log, count, mark it down."""
        c = self._components.get(name)
        if c is None:
            c = self._components[name] = _Component(name, _never, None)
        log.error("background task failed", component=name, exc_info=exc)
        self._mark_down(c, f"{type(exc).__name__}: {exc}"[:300])
        c.reported = True

    def ok(self, name: str) -> None:
        """Component ``name`` completed a unit of work: it is not down (any more)."""
        c = self._components.get(name)
        if c is not None and c.down_since is not None and c.reported:
            log.info("background task recovered", component=name, down_for_s=round(time.monotonic() - c.down_since, 1))
            c.down_since = None
            c.reported = False

    def _mark_down(self, c: _Component, why: str) -> None:
        c.failures += 1
        c.down_since = time.monotonic()
        c.why = why
        c.running_again = False
        c.reported = False
        if self._on_failure is not None:
            with contextlib.suppress(Exception):  # a metrics bug must not stop the restart
                self._on_failure(c.name)

    def down(self) -> dict[str, str]:
        """Components down now: name -> why (the end that took it down)."""
        result: dict[str, str] = {}
        for c in self._components.values():
            if c.down_since is None:
                continue
            if not c.reported and c.running_again and (c.recovered is None or c.recovered(c.down_since)):
                down_for = round(time.monotonic() - c.down_since, 1)
                log.info("background task recovered", component=c.name, down_for_s=down_for)
                c.down_since = None
                continue
            result[c.name] = c.why
        return result

    def problem(self) -> str | None:
        """A ``/healthz`` check: None when every component runs."""
        down = self.down()
        if not down:
            return None
        return "; ".join(f"{name} down ({why})" for name, why in sorted(down.items()))

    async def stop(self) -> None:
        """Cancel every component and wait until each has ended; none is restarted afterwards."""
        tasks = [c.task for c in self._components.values() if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._components.clear()

    async def _keep(self, c: _Component) -> None:
        while True:
            started = time.monotonic()
            try:
                await c.run()
                why = "returned unexpectedly"
                log.error("background task ended", component=c.name, why=why)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"[:300]
                log.exception("background task failed", component=c.name)
            self._mark_down(c, why)
            c.delay_s = restart_delay(c.delay_s, time.monotonic() - started)
            delay = c.delay_s * (0.75 + 0.5 * self._rng.random())
            log.warning("background task restarts", component=c.name, retry_in=round(delay, 2), failures=c.failures)
            await self._sleep(delay)
            c.running_again = True
