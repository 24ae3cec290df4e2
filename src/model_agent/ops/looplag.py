"""The worst event-loop lag over a sliding window, for ``model_agent_event_loop_lag_max_seconds``.

The agent's loop tick measures, every 0.1 s, how late its sleep woke (the time the loop was busy with
something else). The histogram ``model_agent_event_loop_lag_seconds`` keeps every sample; a gauge of the
latest sample would miss a stall between two scrapes, so the gauge shows the maximum of the last
``window_s`` instead. :class:`LagWindow` keeps it in O(1) amortised per sample (a monotonic deque: a
sample is dropped as soon as a later, larger one arrives, since it can never be the maximum again).
"""

from __future__ import annotations

from collections import deque


class LagWindow:
    """The maximum lag of the last ``window_s`` seconds, kept in O(1) amortised per sample."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()  # (time, lag), lags strictly decreasing

    def add(self, now: float, lag: float) -> float:
        """Record ``lag`` seen at ``now``; return the maximum lag within the last ``window_s``."""
        while self._samples and self._samples[-1][1] <= lag:
            self._samples.pop()
        self._samples.append((now, lag))
        while self._samples[0][0] < now - self.window_s:
            self._samples.popleft()
        return self._samples[0][1]
