"""A client-side token bucket for API requests, so no agent can flood the API server.

Like client-go's default (5 QPS, burst 10): :meth:`TokenBucket.acquire` returns at once while tokens are
left and otherwise waits for the next one. Waiters are served in arrival order (a single lock), so a storm
of confirmation reads queues behind the bucket instead of hitting the server all at once. Installed as
``KubeClient.before_request``; watches take one token when they are opened, never while they stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    """``qps`` tokens a second, at most ``burst`` saved up; ``waited_s`` totals the time callers were held back."""

    def __init__(self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = asyncio.Lock()
        self.waited_s = 0.0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now

    async def acquire(self) -> None:
        """Take one token, waiting (in arrival order) until one is there; never raises and never drops a caller."""
        async with self._lock:
            self._refill()
            if self._tokens < 1:
                delay = (1 - self._tokens) / self.qps
                self.waited_s += delay
                await asyncio.sleep(delay)
                self._refill()
            self._tokens -= 1
