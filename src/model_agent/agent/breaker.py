"""The delete breaker: a mass removal is held until a person or time says it is real.

Every destructive act that passed its live confirmation (a removal, the retirement of a superseded copy) is
first *pending* for a short settle period; only then may it act. :meth:`Breaker.decide` gives the verdict
and counts nothing; the caller reports an act with :meth:`Breaker.record` once it has happened, so an act
that fails and is retried is counted once, when it finally succeeds — and never if it never does. Within
the window each key counts once, pending or acted. When the window's removals reach ``minimum`` and exceed
``ratio`` of this node's models, the breaker opens: nothing destructive happens until

* the window has passed since it opened (then it closes, the pending set is forgotten, and every held
  removal must pass its confirmation and this count again — a CRD that stays deleted re-trips it), or
* an operator resumes it (``model-agent trash resume``, which touches ``resume.<node>`` in the agent's
  private area; ``--all`` touches ``resume``, which every node reads): removals confirmed during the
  following window are allowed. On a shared root the private area is every node's, so a resume names its
  node: lifting one node's hold never lifts another's.

The share is taken against the node's models at the start of the window (the count when the window's first
removal appeared, or the current count if it grew since), not the manifests left after earlier removals of
the same window: three of seven is under half, however the three are spread over the window.

The settle period is what makes a storm visible before anything moves: a CRD deletion or a namespace
delete delivers its deletes within seconds, so they are all pending together and trip the breaker before
the first weight is touched. A pending key that is not decided again for a whole window (its candidate
went away without a verdict) stops counting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class Verdict(StrEnum):
    """What the breaker allows a confirmed destructive act: go ahead, wait out the settle period, or hold."""

    ACT = "act"
    WAIT = "wait"  # settling: come back after ``delay_s``
    HELD = "held"  # breaker open


@dataclass(frozen=True)
class Decision:
    """A :class:`Verdict`, and how long to wait before asking again when it is ``wait``."""

    verdict: Verdict
    delay_s: float = 0.0


@dataclass(eq=False, kw_only=True)
class Breaker:
    """The delete breaker of one node (see the module contract); ``on_change(opened, why)`` hears it trip and close."""

    ratio: float = 0.5
    minimum: int = 3
    window_s: float = 600.0
    settle_s: float = 5.0
    resume_file: Path | None = None  # this node's (``resume.<node>``)
    fleet_resume_file: Path | None = None  # every node's (``resume``: ``trash resume --all``)
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    # key -> when its act happened (once per key per window)
    _acted: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _pending: dict[str, _Pending] = field(default_factory=dict, init=False, repr=False)
    # The node's model count when the window's first removal appeared; None while the window is empty.
    _window_models: int | None = field(default=None, init=False, repr=False)
    opened_at: float | None = field(default=None, init=False)
    trips: int = field(default=0, init=False)
    _resumed_until: float = field(default=0.0, init=False, repr=False)
    _resume_seen: float = field(default=0.0, init=False, repr=False)
    on_change: Callable[[bool, str], None] | None = field(default=None, init=False, repr=False)

    @property
    def is_open(self) -> bool:
        """Whether every destructive act is held now (``/status``, the ``model_agent_delete_breaker_open`` gauge)."""
        return self.opened_at is not None

    @property
    def pending(self) -> list[str]:
        """The keys whose removal is pending or held, sorted: what ``model-agent status`` lists."""
        return sorted(self._pending)

    def _expire(self, now: float) -> None:
        for key, at in list(self._acted.items()):
            if now - at > self.window_s:
                del self._acted[key]
        for key, p in list(self._pending.items()):
            if now - p.last > self.window_s:
                del self._pending[key]
        if self.opened_at is not None and now - self.opened_at >= self.window_s:
            self.opened_at = None
            self._pending.clear()
            if self.on_change:
                self.on_change(False, "window passed; held removals must be confirmed again")
        if not self._acted and not self._pending:
            self._window_models = None
        self._check_resume(now)

    def _check_resume(self, now: float) -> None:
        stamps = []
        for path in (self.resume_file, self.fleet_resume_file):
            if path is None:
                continue
            try:
                stamps.append(path.stat().st_mtime)
            except OSError:
                continue
        if not stamps:
            return
        stamp = max(stamps)
        if stamp > self._resume_seen:
            self._resume_seen = stamp
            if self.wall_clock() - stamp < self.window_s:
                self.resume(now)

    def resume(self, now: float | None = None) -> None:
        """An operator's resume: close the breaker and let removals confirmed in the next window act."""
        now = self.clock() if now is None else now
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

    def _note_pending(self, key: str, total_models: int, now: float) -> _Pending:
        if not self._acted and not self._pending:
            self._window_models = total_models  # the window starts here: the share is taken against this
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(first=now, last=now)
        pending.last = now
        return pending

    def _would_remove(self) -> int:
        return len(self._acted.keys() | self._pending.keys())

    def _models(self, total_models: int) -> int:
        # Models that appeared during the window count too; removed ones still count until it ends.
        return max(total_models, self._window_models or 0, 1)

    def _over(self, total_models: int) -> tuple[int, int] | None:
        """``(would remove, models)`` when the removals of the window are over the limit; None when not."""
        would_remove = self._would_remove()
        models = self._models(total_models)
        if would_remove >= self.minimum and would_remove > self.ratio * models:
            return would_remove, models
        return None

    def _trip(self, now: float, why: str) -> None:
        """Open the breaker at ``now``; ``on_change`` hears ``why``."""
        self.opened_at = now
        self.trips += 1
        if self.on_change:
            self.on_change(True, why)

    def suspect(self, key: str, total_models: int) -> None:
        """A candidate whose absence cannot be proven because its whole kind vanished (the CRD is gone).

        It counts as pending — if the kind comes back without it, it would be removed — so a CRD deletion
        trips the breaker (and says so) even though nothing can be confirmed; it never grants an act.
        """
        now = self.clock()
        self._expire(now)
        self._note_pending(key, total_models, now)
        over = self._over(total_models)
        if self.opened_at is None and over is not None:
            would_remove, models = over
            self._trip(
                now,
                f"{would_remove} of {models} models look gone within {self.window_s:.0f}s because their "
                "resource type is gone (CRD deleted?); nothing is removed",
            )

    def decide(self, key: str, total_models: int, *, settled: bool = False) -> Decision:
        """The verdict for one confirmed removal; counts nothing as done (see :meth:`record`).

        ``settled``: the removal passed its settle period before (a recorded intent found after a restart),
        so it is not made to wait again; it is still counted and still held while the breaker is open.
        """
        now = self.clock()
        self._expire(now)
        first = self._note_pending(key, total_models, now).first
        resumed = now < self._resumed_until
        if self.opened_at is not None and not resumed:
            return Decision(Verdict.HELD, delay_s=min(60.0, self.window_s))
        over = None if resumed else self._over(total_models)
        if over is not None:
            would_remove, models = over
            self._trip(
                now,
                f"{would_remove} of {models} models would be removed within "
                f"{self.window_s:.0f}s (limit: more than {self.ratio:.0%} and at least {self.minimum})",
            )
            return Decision(Verdict.HELD, delay_s=min(60.0, self.window_s))
        waited = now - first
        if waited < self.settle_s and not settled:
            return Decision(Verdict.WAIT, delay_s=self.settle_s - waited)
        return Decision(Verdict.ACT)

    def record(self, key: str) -> None:
        """The act :meth:`decide` allowed for ``key`` has happened: it counts in the window, once per key."""
        now = self.clock()
        self._pending.pop(key, None)
        self._acted.pop(key, None)  # re-inserted at the end: the window runs from its latest act
        self._acted[key] = now


@dataclass
class _Pending:
    first: float  # when it was first confirmed: the settle period runs from here
    last: float  # when it was last decided: a key not decided for a window stops counting
