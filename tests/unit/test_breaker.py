"""Unit tests for the delete breaker, driven by a fake clock (no sleeping, no real time)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from model_agent.agent.breaker import Breaker, Decision, Verdict


class FakeClock:
    """A settable clock: ``clock()`` returns ``now``; ``advance(s)`` moves it forward."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Changes:
    """Records ``on_change(opened, why)`` calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[bool, str]] = []

    def __call__(self, opened: bool, why: str) -> None:
        self.calls.append((opened, why))

    @property
    def opened(self) -> list[bool]:
        return [opened for opened, _ in self.calls]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def act(breaker: Breaker, key: str, total: int) -> Verdict:
    """Decide, and when allowed, report the act as done (what the remover does on success)."""
    verdict = breaker.decide(key, total).verdict
    if verdict == Verdict.ACT:
        breaker.record(key)
    return verdict


def make(clock: FakeClock, **kwargs: object) -> tuple[Breaker, Changes]:
    kwargs.setdefault("settle_s", 5.0)
    breaker = Breaker(clock=clock, wall_clock=lambda: 0.0, **kwargs)  # type: ignore[arg-type]
    changes = Changes()
    breaker.on_change = changes
    return breaker, changes


def trip(breaker: Breaker, total: int = 4) -> None:
    assert breaker.decide("a", total) == Decision(Verdict.WAIT, 5.0)
    assert breaker.decide("b", total) == Decision(Verdict.WAIT, 5.0)
    assert breaker.decide("c", total).verdict == Verdict.HELD
    assert breaker.is_open


# --------------------------------------------------------------------------------------------- settle


def test_settle_waits_with_the_remaining_delay_then_acts(clock: FakeClock) -> None:
    breaker, changes = make(clock)
    assert breaker.decide("a", total_models=10) == Decision(Verdict.WAIT, 5.0)
    assert breaker.pending == ["a"]
    clock.advance(2.0)
    assert breaker.decide("a", total_models=10) == Decision(Verdict.WAIT, pytest.approx(3.0))  # type: ignore[arg-type]
    clock.advance(3.0)
    assert breaker.decide("a", total_models=10) == Decision(Verdict.ACT)
    assert breaker.pending == ["a"]  # allowed, not yet done
    breaker.record("a")
    assert breaker.pending == []
    assert not breaker.is_open
    assert changes.calls == []


def test_zero_settle_acts_at_once(clock: FakeClock) -> None:
    breaker, _ = make(clock, settle_s=0.0)
    assert breaker.decide("a", total_models=1) == Decision(Verdict.ACT)


# ----------------------------------------------------------------------------------------------- trip


def test_trips_when_pending_reaches_minimum_and_exceeds_ratio(clock: FakeClock) -> None:
    breaker, changes = make(clock, ratio=0.5, minimum=3)
    assert breaker.decide("a", total_models=4).verdict == Verdict.WAIT
    assert breaker.decide("b", total_models=4).verdict == Verdict.WAIT
    held = breaker.decide("c", total_models=4)
    assert held.verdict == Verdict.HELD
    assert held.delay_s > 0
    assert breaker.is_open
    assert breaker.trips == 1
    assert changes.opened == [True]
    assert "3 of 4" in changes.calls[0][1]
    # Held even once every candidate has settled: nothing acts while it is open.
    clock.advance(60.0)
    assert [breaker.decide(k, 4).verdict for k in "abc"] == [Verdict.HELD] * 3
    assert breaker.trips == 1
    assert changes.opened == [True]


def test_acted_removals_count_toward_the_window(clock: FakeClock) -> None:
    breaker, changes = make(clock, settle_s=0.0, ratio=0.5, minimum=3)
    assert act(breaker, "a", 4) == Verdict.ACT
    assert act(breaker, "b", 4) == Verdict.ACT
    assert breaker.decide("c", 4).verdict == Verdict.HELD
    assert changes.opened == [True]


@pytest.mark.parametrize(
    ("total", "removals"),
    [
        pytest.param(10, 5, id="half-is-not-more-than-half"),
        pytest.param(2, 2, id="below-minimum"),
        pytest.param(100, 50, id="large-node-at-ratio"),
    ],
)
def test_below_thresholds_never_trips(clock: FakeClock, total: int, removals: int) -> None:
    breaker, changes = make(clock, ratio=0.5, minimum=3)
    keys = [f"m{i}" for i in range(removals)]
    assert all(breaker.decide(k, total).verdict == Verdict.WAIT for k in keys)
    clock.advance(5.0)
    assert all(act(breaker, k, total) == Verdict.ACT for k in keys)
    assert not breaker.is_open
    assert breaker.trips == 0
    assert changes.calls == []


def test_old_acts_leave_the_window(clock: FakeClock) -> None:
    breaker, changes = make(clock, settle_s=0.0, ratio=0.5, minimum=3, window_s=600.0)
    assert act(breaker, "a", 4) == Verdict.ACT
    assert act(breaker, "b", 4) == Verdict.ACT
    clock.advance(601.0)
    assert act(breaker, "c", 4) == Verdict.ACT
    assert changes.calls == []


# ---------------------------------------------------------------------------------------- window end


def test_window_expiry_closes_and_forgets_pending(clock: FakeClock) -> None:
    breaker, changes = make(clock, window_s=600.0)
    trip(breaker)
    clock.advance(600.0)
    # The first decision after the window closes the breaker; the held removals were forgotten, so this
    # one settles afresh and must pass the count again.
    assert breaker.decide("a", 4) == Decision(Verdict.WAIT, 5.0)
    assert not breaker.is_open
    assert breaker.pending == ["a"]
    assert changes.opened == [True, False]
    # The same storm, confirmed again, trips it again.
    assert breaker.decide("b", 4).verdict == Verdict.WAIT
    assert breaker.decide("c", 4).verdict == Verdict.HELD
    assert breaker.trips == 2
    assert changes.opened == [True, False, True]


# --------------------------------------------------------------------------------------------- resume


def test_resume_allows_removals_for_one_window(clock: FakeClock) -> None:
    breaker, changes = make(clock, window_s=600.0)
    trip(breaker)
    breaker.resume()
    assert not breaker.is_open
    assert changes.opened == [True, False]
    assert all(breaker.decide(k, 4).verdict == Verdict.WAIT for k in "abc")  # still settles
    clock.advance(5.0)
    assert [act(breaker, k, 4) for k in "abc"] == [Verdict.ACT] * 3
    assert not breaker.is_open
    # Once the resumed window is over, a further removal counts again (the three acts are still in the
    # window: 3 + 1 of 4 models).
    clock.advance(596.0)
    assert breaker.decide("d", 4).verdict == Verdict.HELD
    assert breaker.trips == 2


def test_resume_via_the_resume_file(clock: FakeClock, tmp_path: Path) -> None:
    resume_file = tmp_path / "resume"
    wall = FakeClock(1_700_000_000.0)
    breaker = Breaker(settle_s=5.0, window_s=600.0, resume_file=resume_file, clock=clock, wall_clock=wall)
    changes = Changes()
    breaker.on_change = changes
    trip(breaker)
    clock.advance(1.0)
    assert breaker.decide("a", 4).verdict == Verdict.HELD  # no file yet
    resume_file.touch()
    os.utime(resume_file, (wall.now, wall.now))
    wall.advance(1.0)
    assert breaker.decide("a", 4).verdict != Verdict.HELD
    assert not breaker.is_open
    assert changes.calls[-1] == (False, "resumed by an operator")
    clock.advance(5.0)
    assert [breaker.decide(k, 4).verdict for k in "abc"] == [Verdict.ACT] * 3


def test_a_stale_resume_file_does_not_resume(clock: FakeClock, tmp_path: Path) -> None:
    resume_file = tmp_path / "resume"
    wall = FakeClock(1_700_000_000.0)
    resume_file.touch()
    os.utime(resume_file, (wall.now - 3600.0, wall.now - 3600.0))  # touched an hour ago: older than a window
    breaker = Breaker(settle_s=5.0, window_s=600.0, resume_file=resume_file, clock=clock, wall_clock=wall)
    trip(breaker)
    clock.advance(10.0)
    assert breaker.decide("a", 4).verdict == Verdict.HELD
    assert breaker.is_open


def test_one_touch_resumes_once(clock: FakeClock, tmp_path: Path) -> None:
    resume_file = tmp_path / "resume"
    wall = FakeClock(1_700_000_000.0)
    breaker = Breaker(settle_s=0.0, window_s=600.0, resume_file=resume_file, clock=clock, wall_clock=wall)
    resume_file.touch()
    os.utime(resume_file, (wall.now, wall.now))
    assert act(breaker, "a", 4) == Verdict.ACT  # resumed: acts even though it would trip later
    clock.advance(601.0)
    wall.advance(1.0)  # the same touch, seen again: not a new resume
    assert [act(breaker, k, 4) for k in "bcd"] == [Verdict.ACT, Verdict.ACT, Verdict.HELD]


# --------------------------------------------------------------------------------------------- forget


def test_forget_removes_a_pending_candidate(clock: FakeClock) -> None:
    breaker, changes = make(clock)
    breaker.decide("a", 4)
    breaker.decide("b", 4)
    breaker.forget("a")
    breaker.forget("never-seen")  # unknown keys are fine
    assert breaker.pending == ["b"]
    # "a" came back alive, so the next candidate does not trip: 2 of 4 is not more than half.
    assert breaker.decide("c", 4).verdict == Verdict.WAIT
    assert not breaker.is_open
    assert changes.calls == []


def test_forgetting_every_held_removal_closes_the_breaker(clock: FakeClock) -> None:
    breaker, changes = make(clock)
    trip(breaker)
    breaker.forget("a")
    breaker.forget("b")
    assert breaker.is_open
    breaker.forget("c")
    assert not breaker.is_open
    assert changes.opened == [True, False]
    assert breaker.pending == []


# ------------------------------------------------------------------------------ counting what happened


def test_a_failing_act_retried_never_counts_and_never_trips(clock: FakeClock) -> None:
    # One removal whose act keeps failing (the trash refuses the path): it is decided again on every retry,
    # and is never recorded. On a node of 8 models, with one other removal done, it must never trip.
    breaker, changes = make(clock, settle_s=0.0, ratio=0.5, minimum=3)
    assert act(breaker, "ok", 8) == Verdict.ACT
    for _ in range(50):
        assert breaker.decide("failing", 8).verdict == Verdict.ACT  # the act fails: no record
        clock.advance(5.0)
    assert not breaker.is_open
    assert breaker.trips == 0
    assert changes.calls == []
    assert breaker.pending == ["failing"]


def test_an_act_recorded_twice_for_one_key_counts_once(clock: FakeClock) -> None:
    breaker, changes = make(clock, settle_s=0.0, ratio=0.5, minimum=3)
    for _ in range(5):
        assert act(breaker, "a", 4) == Verdict.ACT
    assert act(breaker, "b", 4) == Verdict.ACT  # 2 of 4: not more than half
    assert not breaker.is_open
    assert changes.calls == []


def test_a_recorded_intent_after_restart_skips_the_settle_but_still_counts(clock: FakeClock) -> None:
    breaker, _ = make(clock, settle_s=5.0, ratio=0.5, minimum=3)
    assert breaker.decide("a", 4, settled=True) == Decision(Verdict.ACT)
    breaker.record("a")
    assert breaker.decide("b", 4).verdict == Verdict.WAIT
    assert breaker.decide("c", 4, settled=True).verdict == Verdict.HELD  # a, b, c of 4


def test_a_pending_key_never_decided_again_stops_counting_after_a_window(clock: FakeClock) -> None:
    breaker, changes = make(clock, settle_s=5.0, ratio=0.5, minimum=3, window_s=600.0)
    breaker.decide("stale-1", 4)
    breaker.decide("stale-2", 4)
    clock.advance(601.0)
    assert breaker.decide("c", 4).verdict == Verdict.WAIT  # 1 of 4, not 3 of 4
    assert breaker.pending == ["c"]
    assert changes.calls == []


# ------------------------------------------------------------------------- the share at the window start


def test_the_share_is_taken_against_the_models_at_the_start_of_the_window(clock: FakeClock) -> None:
    # Three of seven deleted together: each removal drops a manifest, so the current count shrinks to 6
    # and 5 while the window still holds the earlier acts. 3 of 7 is under half: never held.
    breaker, changes = make(clock, settle_s=5.0, ratio=0.5, minimum=3)
    assert breaker.decide("a", 7).verdict == Verdict.WAIT
    assert breaker.decide("b", 7).verdict == Verdict.WAIT
    clock.advance(5.0)
    assert act(breaker, "a", 7) == Verdict.ACT
    assert act(breaker, "b", 6) == Verdict.ACT
    assert breaker.decide("c", 5).verdict == Verdict.WAIT  # confirmed late: settles, is not held
    clock.advance(5.0)
    assert act(breaker, "c", 5) == Verdict.ACT
    assert not breaker.is_open
    assert changes.calls == []


def test_the_window_start_count_resets_once_the_window_is_empty(clock: FakeClock) -> None:
    breaker, changes = make(clock, settle_s=0.0, ratio=0.5, minimum=3, window_s=600.0)
    assert act(breaker, "a", 10) == Verdict.ACT
    clock.advance(601.0)  # the window empties: the next removal starts a new one on a node of 4 models
    assert act(breaker, "b", 4) == Verdict.ACT
    assert act(breaker, "c", 4) == Verdict.ACT
    assert breaker.decide("d", 4).verdict == Verdict.HELD
    assert "3 of 4" in changes.calls[0][1]


def test_models_added_during_the_window_count(clock: FakeClock) -> None:
    breaker, _ = make(clock, settle_s=0.0, ratio=0.5, minimum=3)
    assert act(breaker, "a", 4) == Verdict.ACT
    assert act(breaker, "b", 10) == Verdict.ACT  # six models arrived meanwhile
    assert act(breaker, "c", 10) == Verdict.ACT  # 3 of 10
    assert not breaker.is_open


def test_a_resume_for_one_node_of_a_shared_root_leaves_the_others_held(clock: FakeClock, tmp_path: Path) -> None:
    """Two nodes read one private area (a shared root): ``trash resume --node node-1`` lifts node-1's hold only;
    ``--all`` lifts both."""
    from typer.testing import CliRunner

    from model_agent.cli.trash import app
    from model_agent.local.layout import Layout, resume_file

    private = Layout(tmp_path).primary.private
    breakers = {
        name: Breaker(
            settle_s=5.0,
            window_s=600.0,
            resume_file=resume_file(private, name),
            fleet_resume_file=resume_file(private, None),
            clock=clock,
        )
        for name in ("node-1", "node-2")
    }
    for breaker in breakers.values():
        trip(breaker)
    clock.advance(1.0)
    runner = CliRunner()
    refused = runner.invoke(app, ["resume", "--models-root-dir", str(tmp_path)], env={"NODE_NAME": ""})
    assert refused.exit_code == 2  # no node named: nothing is resumed by accident
    done = runner.invoke(app, ["resume", "--models-root-dir", str(tmp_path), "--node", "node-1"])
    assert done.exit_code == 0 and "node node-1" in done.output
    assert breakers["node-1"].decide("a", 4).verdict != Verdict.HELD
    assert breakers["node-2"].decide("a", 4).verdict == Verdict.HELD
    everyone = runner.invoke(app, ["resume", "--models-root-dir", str(tmp_path), "--all"])
    assert everyone.exit_code == 0 and "every node" in everyone.output
    assert breakers["node-2"].decide("a", 4).verdict != Verdict.HELD
