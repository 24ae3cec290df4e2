"""Waiting on conditions with deadlines (never sleeping to synchronise)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout: float = 30.0, what: str = "condition", interval: float = 0.1
) -> T:
    """Poll ``probe`` until it returns a truthy value or raise AssertionError after ``timeout`` seconds.

    Exceptions raised by the probe count as "not yet" (the last one is reported on timeout).
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = await probe()
            if value:
                return value
            last = value
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)


async def always(
    probe: Callable[[], Awaitable[bool]], *, duration: float, what: str = "invariant", interval: float = 0.1
) -> None:
    """Assert ``probe`` stays true for ``duration`` seconds (sampling every ``interval``)."""
    end = time.monotonic() + duration
    while time.monotonic() < end:
        assert await probe(), f"{what} was violated"
        await asyncio.sleep(interval)


async def until(predicate: Callable[[], object], what: str = "condition", *, timeout: float = 5.0) -> None:
    """:func:`eventually` for a plain (non-async) predicate over in-process state, polled finely."""

    async def probe() -> bool:
        return bool(predicate())

    await eventually(probe, timeout=timeout, what=what, interval=0.005)
