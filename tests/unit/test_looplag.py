"""Unit tests for the sliding maximum behind ``model_agent_event_loop_lag_max_seconds``."""

from __future__ import annotations

import random

from model_agent.ops.looplag import LagWindow


def test_the_worst_lag_of_the_window_is_reported_until_it_ages_out() -> None:
    window = LagWindow(60.0)
    assert window.add(0.0, 0.002) == 0.002
    assert window.add(1.0, 0.250) == 0.250  # a stall
    assert window.add(2.0, 0.001) == 0.250
    assert window.add(60.5, 0.003) == 0.250  # still within a minute of the stall
    assert window.add(61.5, 0.001) == 0.003  # the stall aged out; the next worst remains


def test_it_matches_a_brute_force_maximum() -> None:
    rng = random.Random(7)
    window = LagWindow(5.0)
    samples: list[tuple[float, float]] = []
    now = 0.0
    for _ in range(2000):
        now += rng.random()
        lag = rng.random() ** 3
        samples.append((now, lag))
        expected = max(lag for t, lag in samples if t >= now - 5.0)
        assert window.add(now, lag) == expected
