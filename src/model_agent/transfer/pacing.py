"""How many small files a downloader fetches at once: enough to hide the origin's wait, no more.

Role: the gate the small path (:meth:`~model_agent.transfer.job.Job._run_small`) passes before it takes a
slot. A small file costs a fixed amount of CPU (the request, its headers, the write, the hash, the fsync and
the record: about 0.7 ms here) and waits for the origin the rest of its time in the thread. By Little's law
the files in flight needed to keep that CPU busy are the time one takes divided by the CPU it uses: on a
loopback origin answering in a tenth of a millisecond that is two, against an object store 20 ms away it is
every slot. More than that only adds threads fighting for the interpreter and the cores: 20 files of 1-500 KiB
from a loopback origin took 36 ms through the engine at 8 at once and 27 ms at 2 (``bench/small_files.py``).

Guarantees:

1. **Never above the cap**, the downloader's ``concurrency``, and never below :data:`MIN_IN_FLIGHT` (one file on
   the wire while another is written).
2. **Learns from what it sees**: the least time a recent small file (:data:`WINDOW`) waited on its origin, over the
   average CPU time of their slot threads (:data:`SMOOTHING`), sets the limit (:func:`small_files_in_flight`, a
   pure function); it starts at :data:`MIN_IN_FLIGHT` and rises after the first files when the origin is far.
   The least wait, not the average, because a thread's wait for the interpreter lock after its answer arrived
   counts as waiting too: with the average, contention read as a far origin and let in more files, which made
   more contention (measured: the limit drifted to 3-4 on loopback). An origin's latency is a floor under every
   file's wait, as TCP Vegas and BBR take the least round trip for the path's own.
3. **Cancellation-safe**: a waiter cancelled before or in the instant it is let in holds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator

MIN_IN_FLIGHT = 2
SMOOTHING = 0.3  # weight of the newest file in the running average of CPU time
WINDOW = 8  # the small files whose least wait stands for the origin's latency


def small_files_in_flight(waited_s: float, cpu_s: float, cap: int) -> int:
    """Small files to have in flight when one waits ``waited_s`` seconds on the origin (for its answer and its
    body) and uses ``cpu_s`` seconds of CPU: ``1 + waited / cpu`` rounded up (Little's law: while one file uses
    the CPU the others wait), at least :data:`MIN_IN_FLIGHT`, at most ``cap``. No CPU measured (a clock too
    coarse) counts as all waiting."""
    if cap <= MIN_IN_FLIGHT:
        return max(1, cap)
    if cpu_s <= 0.0:
        return cap
    return max(MIN_IN_FLIGHT, min(cap, 1 + math.ceil(waited_s / cpu_s)))


class SmallFileGate:
    """An asyncio semaphore whose limit follows :func:`small_files_in_flight` over the files it has seen."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.limit = min(cap, MIN_IN_FLIGHT)
        self._active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._waits: deque[float] = deque(maxlen=WINDOW)
        self._cpu = -1.0  # (none seen yet)

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Hold one of ``limit`` places for the body of the ``async with``."""
        if self._active < self.limit and not self._waiters:
            self._active += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # the place is counted for this waiter when its future is set (_wake)
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # let in at the instant it was cancelled: give the place on
                else:
                    with contextlib.suppress(ValueError):  # (already taken off by _wake, which skips the cancelled)
                        self._waiters.remove(waiter)
                raise
        try:
            yield
        finally:
            self._release()

    def observe(self, waited_s: float, cpu_s: float) -> None:
        """One small file waited ``waited_s`` seconds on the origin and used ``cpu_s`` of CPU: adjust the limit."""
        self._waits.append(waited_s)
        self._cpu = cpu_s if self._cpu < 0.0 else self._cpu + SMOOTHING * (cpu_s - self._cpu)
        self.limit = small_files_in_flight(min(self._waits), self._cpu, self.cap)
        self._wake()

    def _release(self) -> None:
        self._active -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._active < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._active += 1
                waiter.set_result(None)
