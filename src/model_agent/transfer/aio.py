"""asyncio helpers of the engine: blocking file work in threads that can be waited for, and task groups.

Role: the few pieces of concurrency plumbing the engine and the sources share. :class:`Io` runs blocking
file work in a shared thread pool and knows which of it is still running, so a file descriptor is closed
only when no thread uses it any more; :func:`settle` waits for a thread's work through any number of
cancellations; :func:`gather_or_cancel` / :func:`run_all` are ``gather`` that cancels and awaits the
others on the first failure; :func:`largest_first` is the order sources start files in; :func:`enter_unless`
enters an async context (a Lease slot) unless what the caller polls for turns up first, :func:`enter_or` unless
what it awaits completes first, and :func:`abandon_entry` stops such an entry without leaving a slot won in that
instant held.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

_T = TypeVar("_T")
_U = TypeVar("_U")


class _HasSize(Protocol):
    @property
    def size(self) -> int: ...


_Sized = TypeVar("_Sized", bound=_HasSize)

_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="ranged-io")
        return _EXECUTOR


class Io:
    """Blocking file work in threads, tracked so the descriptor is closed only when no thread still uses it."""

    def __init__(self) -> None:
        self._inflight: set[concurrent.futures.Future[Any]] = set()

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.wrap_future(self.submit(fn, *args))

    def submit(self, fn: Callable[..., _T], *args: Any) -> concurrent.futures.Future[_T]:
        """Start ``fn(*args)`` in the pool, tracked; the caller waits for the future (or adds callbacks)."""
        fut = _executor().submit(fn, *args)
        self.track(fut)
        return fut

    def track(self, fut: concurrent.futures.Future[Any]) -> None:
        """Count ``fut`` (work that may use the descriptor) until it ends."""
        self._inflight.add(fut)
        fut.add_done_callback(self._inflight.discard)

    @property
    def idle(self) -> bool:
        """No tracked work is running."""
        return not self._inflight

    async def drain(self) -> None:
        while self._inflight:
            await asyncio.to_thread(concurrent.futures.wait, list(self._inflight))


async def settle(fut: concurrent.futures.Future[Any]) -> None:
    """Wait until a thread's work has ended, whatever cancellations arrive meanwhile (its buffer is then free)."""
    waiter = asyncio.wrap_future(fut)
    while not fut.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([waiter])
    with contextlib.suppress(BaseException):
        waiter.result()


async def run_all(coros: Iterable[Awaitable[Any]]) -> None:
    """Run the coroutines; on the first exception cancel the others, wait for them, and re-raise it."""
    await gather_or_cancel(coros)


def largest_first(files: Iterable[_Sized]) -> list[_Sized]:
    """The order to start files in when only some run at once: largest first, so what is left at the end is
    small files rather than one large file fetched alone (a whole model to disk: 0.38-0.45 -> 0.46-0.47 GB/s)."""
    return sorted(files, key=lambda f: f.size, reverse=True)


async def gather_or_cancel(coros: Iterable[Awaitable[_T]]) -> list[_T]:
    """Their results in order; on the first exception the others are cancelled and awaited, then it is raised
    (unlike ``asyncio.gather``, which leaves the others running)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return []
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            error = task.exception() if task in done and not task.cancelled() else None
            if error is not None:
                raise error
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def enter_unless(
    cm: AbstractAsyncContextManager[_T], turned_up: Callable[[], Awaitable[bool]], poll_s: float
) -> tuple[bool, _T | None]:
    """Enter ``cm`` unless ``turned_up()`` answers true first (asked every ``poll_s`` seconds while entering):
    ``(True, its value)`` when entered (the caller must leave it), ``(False, None)`` when it turned up. An error
    or a cancellation abandons the entry (:func:`abandon_entry`) and is raised."""
    entering = asyncio.ensure_future(cm.__aenter__())
    try:
        while True:
            done, _ = await asyncio.wait([entering], timeout=poll_s)
            if done:
                return True, entering.result()
            if await turned_up():
                await abandon_entry(entering, cm)
                return False, None
    except BaseException:
        await abandon_entry(entering, cm)
        raise


async def enter_or(cm: AbstractAsyncContextManager[Any], other: Awaitable[_U]) -> tuple[bool, _U | None]:
    """Enter ``cm`` unless ``other`` completes first: ``(True, None)`` when entered (the caller must leave it;
    ``other`` is cancelled), ``(False, its result)`` when it completed. An error of either, or a cancellation,
    abandons the entry (:func:`abandon_entry`), cancels ``other`` and is raised."""
    entering = asyncio.ensure_future(cm.__aenter__())
    waiting = asyncio.ensure_future(other)
    try:
        await asyncio.wait([entering, waiting], return_when=asyncio.FIRST_COMPLETED)
        if entering.done():
            entering.result()
            return True, None
        result = waiting.result()
        await abandon_entry(entering, cm)
        return False, result
    except BaseException:
        await abandon_entry(entering, cm)
        raise
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


async def abandon_entry(entering: asyncio.Future[Any], cm: AbstractAsyncContextManager[Any]) -> None:
    """Stop entering ``cm``; when the entry was won meanwhile, ``cm`` is left at once."""
    if not entering.done():
        entering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(asyncio.wait([entering]))
    if entering.done() and not entering.cancelled() and entering.exception() is None:
        await cm.__aexit__(None, None, None)
