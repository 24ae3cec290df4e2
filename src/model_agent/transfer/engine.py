"""The downloader: part slots (a connection, a buffer, a pipe each) shared by every file it fetches.

Role: the object a source holds for one fetch. It owns what is bounded per node rather than per file: the
``concurrency`` part slots (a semaphore, each slot a keep-alive connection and, made when first needed, a
receive buffer and a splice pipe), the worker threads that use them, the one TLS context, and the pause a
``Retry-After`` asks of every request. Each :meth:`RangedDownloader.download` is a
:class:`~model_agent.transfer.job.Job` drawing on those slots.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from model_agent.local.capacity import Reservation
from model_agent.model.errors import SourceError
from model_agent.transfer.config import Downloaded, Expected, HeaderSource, RangedConfig, UrlSource
from model_agent.transfer.hashing import SUPPORTED_CHECKSUMS
from model_agent.transfer.job import Job
from model_agent.transfer.pacing import SmallFileGate
from model_agent.transfer.splice import SplicePipe
from model_agent.transfer.transport import Proxies, SlotTransport, tls_context

if TYPE_CHECKING:
    import aiohttp


@dataclass
class Slot:
    """A part slot: its keep-alive connection, and made when first needed, its receive buffer and its pipe."""

    transport: SlotTransport
    buffer_size: int
    pipe: SplicePipe | None = None
    _buffer: bytearray | None = None

    def buffer(self, need: int) -> bytearray:
        """A receive buffer of at least ``min(need, buffer_size)`` bytes, made (or grown) when first needed.

        Lazily and by need: a slot that only ever splices never holds one, and a slot that copies small bodies
        holds a small one. A fresh ``bytearray`` is zero-filled, and a full 4 MiB buffer per slot for every
        engine session cost more CPU than 20 files of 1-500 KiB themselves (45 instead of 31 ms per round).
        """
        size = max(1, min(need, self.buffer_size))
        if self._buffer is None or len(self._buffer) < size:
            self._buffer = bytearray(size)
        return self._buffer


class RangedDownloader:
    """Downloads files over HTTP with ranged GETs; one instance shares its part slots among its downloads.

    ``session`` is accepted for compatibility and not used (the transport is ``http.client`` in worker
    threads, see :mod:`model_agent.transfer.transport`). Create the downloader inside the running event loop;
    :meth:`close` (or ``async with``) closes its connections and threads (otherwise they go when the
    downloader is garbage collected).
    """

    def __init__(self, session: aiohttp.ClientSession | None = None, config: RangedConfig | None = None) -> None:
        self.session = session
        self.config = config or RangedConfig()
        self._slots = asyncio.Semaphore(self.config.concurrency)
        self._small_files = SmallFileGate(self.config.concurrency)  # small files at once: as the origin's wait asks
        self._free: list[Slot] = []  # slots not in use: buffers and connections reused across parts and files
        self._all: list[Slot] = []
        self._tls: ssl.SSLContext | None = None
        self._tls_lock = threading.Lock()
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.concurrency, thread_name_prefix="ranged-part"
        )
        self._not_before = 0.0
        self._splice = self.config.splice  # turned off for good when the kernel refuses it once
        self._proxies = Proxies(self.config.use_proxy)  # each origin's proxy, looked up once for the session's slots

    async def __aenter__(self) -> RangedDownloader:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close idle connections and let the worker threads end; call when no download is running."""
        for slot in self._all:
            slot.transport.close()
            if slot.pipe is not None:
                slot.pipe.close()
                slot.pipe = None
        self._threads.shutdown(wait=False)

    async def download(
        self,
        url: UrlSource,
        path: Path,
        expected: Expected,
        *,
        headers: HeaderSource | None = None,
        state_path: Path | None = None,
        label: str | None = None,
        on_bytes: Callable[[int], None] | None = None,
        reservation: Reservation | None = None,
        on_written: Callable[[int, int], None] | None = None,
        parts_at_once: int = 0,
    ) -> Downloaded:
        """Fetch ``url`` into ``path`` (resuming from ``state_path``), verify it, fsync it; see the module doc.

        ``url`` may be a callable (plain or async), called for every request (e.g. to renew a presigned URL).
        ``headers`` may be a callable, called with each request's URL for headers to add (e.g. a signature).
        ``on_bytes`` is called (in the event loop) with the size of every write. ``reservation`` is shrunk by
        what the preallocation takes. ``on_written`` is called (in the event loop) with ``(start, end)`` of every
        range that is in the file (written, not yet verified nor fsynced: what a relay may pass on to a node that
        verifies it itself), after every write. ``parts_at_once`` caps the part requests of this file in flight
        (0: the session's ``concurrency``), so that files sharing a session each get slots.
        """
        unknown = set(expected.checksums) - SUPPORTED_CHECKSUMS
        if unknown:
            raise ValueError(f"unsupported checksum algorithms: {sorted(unknown)}")
        job = Job(
            self,
            url,
            Path(path),
            expected,
            headers if callable(headers) else dict(headers or {}),
            Path(state_path) if state_path is not None else Path(f"{path}.parts.json"),
            label or Path(path).name,
            on_bytes or (lambda _n: None),
            reservation,
            on_written,
            parts_at_once,
        )
        return await job.run()

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[Slot]:
        """A part slot: memory and connections are bounded by the slots, not by the files in progress."""
        async with self._slots:
            slot = self._free.pop() if self._free else self._new_slot()
            try:
                yield slot
            finally:
                self._free.append(slot)

    def _new_slot(self) -> Slot:
        cfg = self.config
        transport = SlotTransport(self._tls_context, cfg.connect_timeout_s, cfg.read_timeout_s, self._proxies)
        slot = Slot(transport, cfg.write_buffer)
        self._all.append(slot)
        return slot

    def _tls_context(self) -> ssl.SSLContext:
        """The one TLS context of this downloader, made at the first HTTPS connection (from a worker thread)."""
        with self._tls_lock:
            if self._tls is None:
                try:
                    self._tls = tls_context(self.config.ca_bundle)
                except (OSError, ssl.SSLError) as exc:
                    raise SourceError("TLSError", f"cannot load the trusted CA certificates: {exc}") from None
            return self._tls

    # -- shared pause (Retry-After)
    def _pause(self, seconds: float) -> None:
        self._not_before = max(self._not_before, time.monotonic() + seconds)

    async def _wait_turn(self) -> None:
        delay = self._not_before - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


@contextlib.asynccontextmanager
async def engine_session(config: RangedConfig) -> AsyncIterator[RangedDownloader]:
    """A :class:`RangedDownloader` for one fetch, its connections and threads closed on exit.

    Bodies are taken as stored (no decompression): the bytes written are the bytes hashed. Proxies come
    from the environment (``HTTPS_PROXY``, ``NO_PROXY``).
    """
    async with RangedDownloader(config=config) as engine:
        yield engine
