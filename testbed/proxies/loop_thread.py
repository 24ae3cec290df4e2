"""A server that runs its own asyncio loop in a thread, so it keeps serving while the test thread blocks.

Both proxies are built on it: the test (or benchmark) calls ``start`` and ``stop`` from any thread, the
server's coroutines run on the loop of its own thread. A subclass provides ``_setup`` (bind, return the port)
and ``_cleanup`` (close what it opened); this base owns the loop's life: ``start`` returns once the port is
bound (or raises what ``_setup`` raised), ``stop`` stops the loop, cancels what is still running on it, and
joins the thread. Both are idempotent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
from typing import ClassVar, Self

from aiohttp import web

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


async def serve_on_loopback(runner: web.AppRunner) -> int:
    """Set ``runner`` up and serve it on a free ``127.0.0.1`` port; return the port.

    The socket is bound here (port 0) and handed to aiohttp, so the port is known as soon as it is taken
    and no other process can win it in between (unlike picking a free port first).
    """
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    return port


class LoopThread:
    """The thread-and-loop lifecycle shared by the test bed's in-process servers (``thread_name`` names the thread)."""

    thread_name: ClassVar[str] = "loop-thread"
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    def start(self) -> int:
        """Start serving in the server's own thread and return its port."""
        return self._start_thread(self.thread_name)

    def stop(self) -> None:
        """Stop serving and join the thread; idempotent."""
        self._stop_thread()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    async def _setup(self) -> int:
        """Open the server on the loop; return the port it listens on."""
        raise NotImplementedError

    async def _cleanup(self) -> None:
        """Close what ``_setup`` opened (runs on the loop, after it stopped serving)."""

    def _start_thread(self, name: str) -> int:
        """Start the loop thread and wait until ``_setup`` bound the port (or failed: then it raises)."""
        if self._thread is not None:
            return self.port
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=name, daemon=True)
        self._thread.start()
        try:
            self.port = ready.result(timeout=START_TIMEOUT_S)
        except BaseException:
            self._stop_thread()
            raise
        return self.port

    def _stop_thread(self) -> None:
        """Stop the loop and join the thread; nothing when it does not run."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(STOP_TIMEOUT_S)
        self._loop = self._thread = None
        self.port = 0

    def _run(self, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            try:
                port = loop.run_until_complete(self._setup())
            except BaseException as exc:
                ready.set_exception(exc)
                return
            ready.set_result(port)
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(self._cleanup())
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()
