"""One shape for the local helper servers (mirror, S3, fault proxy): start/stop, sync and async contexts.

A subclass implements blocking :meth:`start` and :meth:`stop`; this mixin adds ``astart``/``astop`` (run in
a worker thread so an event loop is never blocked) and both context-manager protocols, stopping on exit
however the block ends.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Self


def wait_until_answering(
    proc: subprocess.Popen[bytes], url: str, deadline: float, *, poll_s: float = 0.05
) -> int | None:
    """Poll ``url`` until any HTTP answer (None), or until ``proc`` exits (its exit code).

    Raises TimeoutError at ``deadline`` (monotonic). Waiting on the process doubles as the poll interval, so
    an exit is noticed at once.
    """
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return None
        except urllib.error.HTTPError:
            return None  # any status means the server is up
        except (urllib.error.URLError, OSError):
            pass
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(url)
        try:
            return proc.wait(timeout=min(poll_s, remaining))
        except subprocess.TimeoutExpired:
            continue


class ManagedService:
    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    async def astart(self) -> object:
        return await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await self.astart()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.astop()
