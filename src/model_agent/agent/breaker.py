"""The delete breaker: a mass removal is held until a person or time says it is real.

Every removal that passed its live confirmation is first *pending* for a short settle period; only then
is it allowed to act. While pending and after acting it counts toward the window. When the removals of the
window (acted + pending) reach ``minimum`` and exceed ``ratio`` of this node's models, the breaker opens:
nothing destructive happens until

* the window has passed since it opened (then it closes, the pending set is forgotten, and every held
  removal must pass its confirmation and this count again — a CRD that stays deleted re-trips it), or
* an operator resumes it (``model-agent trash resume``, which touches ``resume`` in the agent's private
  area): removals confirmed during the following window are allowed.

The settle period is what makes a storm visible before anything moves: a CRD deletion or a namespace
delete delivers its deletes within seconds, so they are all pending together and trip the breaker before
the first weight is touched.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class Verdict(StrEnum):
    ACT = "act"
    WAIT = "wait"  # settling: come back after ``delay_s``
    HELD = "held"  # breaker open


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    delay_s: float = 0.0


class Breaker:
    def __init__(
        self,
        *,
        ratio: float = 0.5,
        minimum: int = 3,
        window_s: float = 600.0,
        settle_s: float = 5.0,
        resume_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.ratio = ratio
        self.minimum = minimum
        self.window_s = window_s
        self.settle_s = settle_s
        self.resume_file = resume_file
        self._clock = clock
        self._wall = wall_clock
        self._acted: deque[float] = deque()
        self._pending: dict[str, float] = {}
        self.opened_at: float | None = None
        self.trips = 0
        self._resumed_until = 0.0
        self._resume_seen = 0.0
        self.on_change: Callable[[bool, str], None] | None = None

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    @property
    def pending(self) -> list[str]:
        return sorted(self._pending)

    def _expire(self, now: float) -> None:
        while self._acted and now - self._acted[0] > self.window_s:
            self._acted.popleft()
        if self.opened_at is not None and now - self.opened_at >= self.window_s:
            self.opened_at = None
            self._pending.clear()
            if self.on_change:
                self.on_change(False, "window passed; held removals must be confirmed again")
        self._check_resume(now)

    def _check_resume(self, now: float) -> None:
        if self.resume_file is None:
            return
        try:
            stamp = self.resume_file.stat().st_mtime
        except OSError:
            return
        if stamp > self._resume_seen:
            self._resume_seen = stamp
            if self._wall() - stamp < self.window_s:
                self.resume(now)

    def resume(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        self._resumed_until = now + self.window_s
        if self.opened_at is not None:
            self.opened_at = None
            if self.on_change:
                self.on_change(False, "resumed by an operator")

    def forget(self, key: str) -> None:
        """A candidate turned out alive (or came back): it no longer counts as pending.

        When the breaker is open and the last pending removal is forgotten, nothing is held any more (every
        model that looked gone came back, e.g. after a CRD was re-created), so it closes.
        """
        if self._pending.pop(key, None) is not None and self.opened_at is not None and not self._pending:
            self.opened_at = None
            if self.on_change:
                self.on_change(False, "every held removal turned out alive")

    def suspect(self, key: str, total_models: int) -> None:
        """A candidate whose absence cannot be proven because its whole kind vanished (the CRD is gone).

        It counts as pending — if the kind comes back without it, it would be removed — so a CRD deletion
        trips the breaker (and says so) even though nothing can be confirmed; it never grants an act.
        """
        now = self._clock()
        self._expire(now)
        self._pending.setdefault(key, now)
        would_remove = len(self._acted) + len(self._pending)
        if self.opened_at is None and would_remove >= self.minimum and would_remove > self.ratio * max(total_models, 1):
            self.opened_at = now
            self.trips += 1
            if self.on_change:
                self.on_change(
                    True,
                    f"{would_remove} of {total_models} models look gone within {self.window_s:.0f}s because their "
                    "resource type is gone (CRD deleted?); nothing is removed",
                )

    def decide(self, key: str, total_models: int) -> Decision:
        now = self._clock()
        self._expire(now)
        first = self._pending.setdefault(key, now)
        resumed = now < self._resumed_until
        if self.opened_at is not None and not resumed:
            return Decision(Verdict.HELD, delay_s=min(60.0, self.window_s))
        would_remove = len(self._acted) + len(self._pending)
        if not resumed and would_remove >= self.minimum and would_remove > self.ratio * max(total_models, 1):
            self.opened_at = now
            self.trips += 1
            if self.on_change:
                self.on_change(
                    True,
                    f"{would_remove} of {total_models} models would be removed within "
                    f"{self.window_s:.0f}s (limit: more than {self.ratio:.0%} and at least {self.minimum})",
                )
            return Decision(Verdict.HELD, delay_s=min(60.0, self.window_s))
        waited = now - first
        if waited < self.settle_s:
            return Decision(Verdict.WAIT, delay_s=self.settle_s - waited)
        del self._pending[key]
        self._acted.append(now)
        return Decision(Verdict.ACT)
