"""The work queue: hand keys ("look at object K again") from event sources to a pool of asyncio workers.

Role: the same contract as client-go's ``util/workqueue`` (a plain queue, a delaying queue and a
rate-limited queue in one class), re-implemented for a single asyncio event loop. Producers (reflector
callbacks, timers, failed reconciles) call the synchronous ``add*`` methods; workers loop::

    while True:
        try:
            key = await queue.get()
        except ShutDown:
            return
        try:
            await reconcile(key)
        except Exception:
            queue.add_rate_limited(key)   # retry later, backing off
        else:
            queue.forget(key)             # success: reset the key's backoff
        finally:
            queue.done(key)               # always

Guarantees:
* a key is never handed to two workers at once: a key is *processing* from ``get()`` until ``done()``;
* a key added while it is being processed is processed again after ``done()``: exactly once more, however
  many times it was added meanwhile;
* adds of a key that is already waiting to be processed are deduplicated (it keeps its place in line);
* ``get()`` hands out ready keys in FIFO order of their (first, non-deduplicated) add;
* ``add_after(key, delay_s)`` adds the key once the delay has elapsed; while a delayed add of a key is
  pending, a further ``add_after`` of it keeps whichever deadline is earliest. Delayed adds share one
  event-loop timer (``loop.call_at``) armed for the earliest deadline; no task is created;
* ``add_rate_limited(key)`` is ``add_after`` with a per-key exponential backoff: the nominal delay is
  ``base_delay_s · 2^n`` after ``n`` earlier rate-limited adds (1 s, 2 s, 4 s, … by default), capped at
  ``max_delay_s`` (300 s by default). The nominal delay is multiplied by a factor drawn uniformly from
  ``[1 − jitter, 1 + jitter]`` (±20 % by default, from an injectable ``random.Random``) and the result is
  capped at ``max_delay_s`` again, so no delay ever exceeds the cap. ``forget(key)`` resets the key's
  count; ``num_requeues(key)`` reports it. Counts are kept until forgotten, so callers must ``forget``
  keys that succeeded or were deleted;
* ``shutdown()`` stops accepting adds, drops the ready keys and every pending delayed add (cancelling the
  timer), and makes every waiting and future ``get()`` raise :class:`ShutDown`; keys already handed out
  may still be ``done()`` (they are not requeued);
* ``shutdown_with_drain(timeout_s)`` stops accepting adds and drops pending delayed adds at once, but keeps
  handing out the keys that are already ready (including keys re-added during processing before the
  shutdown, which ``done()`` requeues) until none are left, then ``get()`` raises :class:`ShutDown`. It
  returns ``True`` once no key is ready or processing, or ``False`` when ``timeout_s`` elapsed first; either
  way the queue ends fully shut down, as after ``shutdown()``;
* no task or timer outlives ``shutdown()``: the queue owns at most one timer handle and no tasks.

Lanes: a queue made with an ``urgent(key)`` classifier keeps two lines of ready keys. A key is classified
when it becomes ready (added, or re-queued by ``done()``); a key already waiting in the normal line that is
added again while ``urgent`` now says yes moves to the urgent line. ``get()`` hands out urgent keys first, in
FIFO order among themselves, then normal ones; ``get(urgent_only=True)`` hands out urgent keys only and
waits while there are none, so workers reserved for urgent keys are never taken by the others' work. Every
other guarantee holds across both lines (a key is in at most one line, and never processed twice at once).

Metrics: ``len(queue)`` / ``depth`` count ready keys, ``processing_count`` keys handed out and not yet
done, ``delayed_count`` pending delayed adds. Optional hooks observe each accepted (non-deduplicated) add,
each key's wait (first add → ``get``) and its processing time (``get`` → ``done``), in seconds. Hooks run
synchronously and must be cheap; an exception from a hook is logged and never disturbs the queue.

The queue is not thread-safe: every method must be called from the event loop that runs the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import structlog

log = structlog.get_logger(__name__)

K = TypeVar("K", bound=Hashable)

DEFAULT_BASE_DELAY_S = 1.0
DEFAULT_MAX_DELAY_S = 300.0
DEFAULT_JITTER = 0.2

# Beyond this many doublings any sane base delay is past any sane cap; bounds 2**n for huge counts.
_MAX_EXPONENT = 64


class ShutDown(Exception):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down and has nothing left to hand out."""


class WorkQueue(Generic[K]):
    """A deduplicating, delaying, rate-limiting FIFO of keys for asyncio workers (see the module doc)."""

    def __init__(
        self,
        name: str = "",
        *,
        base_delay_s: float = DEFAULT_BASE_DELAY_S,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        jitter: float = DEFAULT_JITTER,
        rng: random.Random | None = None,
        on_add: Callable[[K], None] | None = None,
        on_wait: Callable[[K, float], None] | None = None,
        on_processed: Callable[[K, float], None] | None = None,
        urgent: Callable[[K], bool] | None = None,
    ) -> None:
        if not base_delay_s > 0:
            raise ValueError(f"base_delay_s must be > 0, got {base_delay_s}")
        if not max_delay_s >= base_delay_s:
            raise ValueError(f"max_delay_s must be >= base_delay_s, got {max_delay_s} < {base_delay_s}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter}")
        self.name = name
        self._base_delay_s = base_delay_s
        self._max_delay_s = max_delay_s
        self._jitter = jitter
        self._rng = rng if rng is not None else random.Random()
        self._on_add = on_add
        self._on_wait = on_wait
        self._on_processed = on_processed
        self._urgent = urgent

        # Ready keys in hand-out order, the urgent lane and the normal one; each key is in at most one, once.
        self._urgent_queue: deque[K] = deque()
        self._queue: deque[K] = deque()
        # Keys that need processing: every key in _queue, plus processing keys re-added meanwhile.
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._added_at: dict[K, float] = {}
        self._started_at: dict[K, float] = {}

        # Delayed adds: the live deadline per key, and a heap that may hold stale (superseded) entries.
        self._delayed: dict[K, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = 0.0

        self._failures: dict[K, int] = {}

        # Waiting get()s: each future with whether it takes urgent keys only.
        self._getters: deque[tuple[asyncio.Future[None], bool]] = deque()
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._shutting_down = False

    # ---------------------------------------------------------------- introspection

    def __len__(self) -> int:
        """The number of keys ready to be handed out (both lanes)."""
        return len(self._queue) + len(self._urgent_queue)

    depth = property(__len__, doc="Ready keys (client-go's ``workqueue_depth``); the same as ``len(queue)``.")

    @property
    def processing_count(self) -> int:
        """Keys handed out by ``get()`` and not yet ``done()``."""
        return len(self._processing)

    @property
    def delayed_count(self) -> int:
        """Keys with a pending delayed (or rate-limited) add."""
        return len(self._delayed)

    @property
    def shutting_down(self) -> bool:
        """Whether ``shutdown()`` or ``shutdown_with_drain()`` was called: adds are ignored."""
        return self._shutting_down

    # ---------------------------------------------------------------- adding

    def add(self, key: K) -> None:
        """Mark ``key`` as needing processing; ignored after shutdown or if it is already waiting (a waiting key
        the classifier now calls urgent moves to the urgent lane)."""
        if self._shutting_down:
            return
        if key in self._dirty:
            if key not in self._processing and self._is_urgent(key) and key in self._queue:
                self._queue.remove(key)
                self._enqueue(key)
            return
        self._dirty.add(key)
        self._added_at[key] = time.monotonic()
        if key not in self._processing:
            self._enqueue(key)
        # Otherwise done() queues it once the current processing ends.
        self._observe(self._on_add, key)

    def add_after(self, key: K, delay_s: float) -> None:
        """Add ``key`` once ``delay_s`` has elapsed (now if ``delay_s <= 0``); the earliest pending wins."""
        if self._shutting_down:
            return
        if delay_s <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + delay_s
        current = self._delayed.get(key)
        if current is not None and current[0] <= deadline:
            return
        self._seq += 1
        self._delayed[key] = (deadline, self._seq)
        heapq.heappush(self._heap, (deadline, self._seq, key))
        if self._timer is None or deadline < self._timer_when:
            self._arm_timer(loop, deadline)

    def add_rate_limited(self, key: K) -> float:
        """Add ``key`` after its next backoff delay, which is returned (seconds)."""
        delay = self._next_backoff(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff (call when it was processed successfully or no longer exists)."""
        self._failures.pop(key, None)

    def num_requeues(self, key: K) -> int:
        """How many rate-limited adds ``key`` had since it was last forgotten."""
        return self._failures.get(key, 0)

    # ---------------------------------------------------------------- consuming

    async def get(self, *, urgent_only: bool = False) -> K:
        """Wait for the next ready key and mark it processing; the caller must call ``done(key)``.

        Urgent keys come first; ``urgent_only`` waits for an urgent key and takes no other. Raises
        :class:`ShutDown` once the queue is shut down and no key this caller may take is left.
        """
        while not self._urgent_queue and (urgent_only or not self._queue):
            if self._shutting_down:
                raise ShutDown
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (waiter, urgent_only)
            self._getters.append(entry)
            try:
                await waiter
            except BaseException:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._getters.remove(entry)
                if not waiter.cancelled():
                    # We were woken for a key but will not take it: pass the wake-up on.
                    self._wake_getters()
                raise
        key = self._urgent_queue.popleft() if self._urgent_queue else self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        now = time.monotonic()
        self._started_at[key] = now
        added = self._added_at.pop(key, now)
        self._wake_getters()
        self._observe(self._on_wait, key, now - added)
        return key

    def done(self, key: K) -> None:
        """End the processing of ``key``; if it was added meanwhile, it is queued again.

        Raises ``ValueError`` if ``key`` is not being processed (``done`` called twice, or without ``get``).
        """
        if key not in self._processing:
            raise ValueError(f"work queue {self.name!r}: done() for a key that is not processing: {key!r}")
        self._processing.discard(key)
        started = self._started_at.pop(key, None)
        if key in self._dirty:
            self._enqueue(key)
        self._wake_drain_waiters()
        if started is not None:
            self._observe(self._on_processed, key, time.monotonic() - started)

    # ---------------------------------------------------------------- shutting down

    def shutdown(self) -> None:
        """Stop now: ignore adds, drop ready and delayed keys, make every ``get()`` raise ShutDown."""
        self._begin_shutdown()
        for key in (*self._queue, *self._urgent_queue):
            self._added_at.pop(key, None)
        self._queue.clear()
        self._urgent_queue.clear()
        # Processing keys re-added before the shutdown are not requeued by done() any more.
        for key in self._dirty:
            self._added_at.pop(key, None)
        self._dirty.clear()
        self._wake_drain_waiters()

    async def shutdown_with_drain(self, timeout_s: float | None = None) -> bool:
        """Ignore adds, let workers finish the ready and processing keys, then shut down.

        Returns ``True`` if no key was left ready or processing, ``False`` if ``timeout_s`` (``None``:
        no limit) elapsed first. Either way (and if cancelled) the queue ends as after ``shutdown()``.
        """
        self._begin_shutdown()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                while self._queue or self._urgent_queue or self._processing:
                    waiter: asyncio.Future[None] = loop.create_future()
                    self._drain_waiters.append(waiter)
                    try:
                        await waiter
                    finally:
                        if waiter in self._drain_waiters:
                            self._drain_waiters.remove(waiter)
            return True
        except TimeoutError:
            return False
        finally:
            self.shutdown()

    # ---------------------------------------------------------------- internals

    def _begin_shutdown(self) -> None:
        self._shutting_down = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()
        self._delayed.clear()
        # Wake every getter: those finding the queue empty raise ShutDown, the rest take a key (drain).
        while self._getters:
            waiter, _ = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _is_urgent(self, key: K) -> bool:
        if self._urgent is None:
            return False
        try:
            return self._urgent(key)
        except Exception:
            log.exception("work queue urgency classifier failed", queue=self.name)
            return False

    def _enqueue(self, key: K) -> None:
        """Put a ready key in its lane and wake a getter that may take it."""
        (self._urgent_queue if self._is_urgent(key) else self._queue).append(key)
        self._wake_getters()

    def _wake_getters(self) -> None:
        """Wake one waiting getter per ready key it may take: urgent keys wake urgent-only getters first."""
        urgent, normal = len(self._urgent_queue), len(self._queue)
        if not self._getters or not (urgent or normal):
            return
        for only in (True, False):  # urgent-only getters first, for urgent keys; then the others, for the rest
            for entry in list(self._getters):
                waiter, urgent_only = entry
                if urgent_only != only or waiter.done():
                    continue
                if urgent > 0:
                    urgent -= 1
                elif normal > 0 and not urgent_only:
                    normal -= 1
                else:
                    continue
                self._getters.remove(entry)
                waiter.set_result(None)

    def _wake_drain_waiters(self) -> None:
        if self._queue or self._urgent_queue or self._processing:
            return
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _arm_timer(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_when = when
        self._timer = loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._shutting_down:
            return
        loop = asyncio.get_running_loop()
        # The loop may run a timer up to one clock resolution early; the armed deadline counts as due.
        now = max(loop.time(), self._timer_when)
        while self._heap and self._heap[0][0] <= now:
            deadline, seq, key = heapq.heappop(self._heap)
            if self._delayed.get(key) == (deadline, seq):
                del self._delayed[key]
                self.add(key)
        # Drop superseded entries at the top so the timer is armed for a live deadline.
        while self._heap and self._delayed.get(self._heap[0][2]) != self._heap[0][:2]:
            heapq.heappop(self._heap)
        if self._heap:
            self._arm_timer(loop, self._heap[0][0])

    def _next_backoff(self, key: K) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        nominal = min(self._max_delay_s, self._base_delay_s * 2.0 ** min(failures, _MAX_EXPONENT))
        factor = 1.0 + self._jitter * (2.0 * self._rng.random() - 1.0)
        return min(self._max_delay_s, nominal * factor)

    def _observe(self, hook: Callable[..., None] | None, *args: object) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            log.exception("work queue metrics hook failed", queue=self.name)
