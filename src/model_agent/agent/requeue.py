"""The one exception the reconcile loop understands: look at this key again later.

``delay_s=None`` asks for the work queue's per-item exponential backoff (1 s doubling to 5 min, jittered):
used when a read failed and the outcome is unknown. A number asks for exactly that delay: used when the
wait is known (a settle period, a held breaker).
"""

from __future__ import annotations


class Requeue(Exception):
    """Look at the key again: after ``delay_s``, or with the queue's backoff when None; ``why`` is logged."""

    def __init__(self, why: str, delay_s: float | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.delay_s = delay_s
