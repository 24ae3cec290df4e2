"""One file's transfer: parts fetched through the downloader's slots, recorded, hashed, verified.

Role: everything that happens to one file between "fetch this" and "these bytes are the promised ones"
(the contract is in :mod:`model_agent.transfer`). The event loop side schedules parts, records them in the
part map (:mod:`~model_agent.transfer.partmap`) and reads back for the hash what landed ahead of the hash
cursor (:mod:`~model_agent.transfer.hashing`); the worker-thread side sends one GET per part through a slot's
transport and moves the body into the file, spliced (:mod:`~model_agent.transfer.splice`) or copied. A copied
body at the hash cursor (the part next in file order) is hashed from the slot's buffer right after it is
written, in the receive thread, so it is never read back (:class:`~model_agent.transfer.hashing.OrderedHash`).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import fcntl
import http.client
import math
import os
import random
import select
import socket
import ssl
import termios
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from model_agent.local.capacity import Reservation, allocated_bytes
from model_agent.model.errors import SourceError
from model_agent.transfer import hashing
from model_agent.transfer.aio import Io, run_all, settle
from model_agent.transfer.answers import TRANSIENT, Answer, RangeIgnored, Retry, Stopped, check_answer, describe
from model_agent.transfer.config import Downloaded, Expected, HeaderSource, UrlSource
from model_agent.transfer.disk import disk_error, open_making_folders, preallocate
from model_agent.transfer.hashing import HASH_STEP, SUPPORTED_CHECKSUMS, OrderedHash, new_hasher
from model_agent.transfer.partmap import PartMap
from model_agent.transfer.splice import (
    FileWriteError,
    SplicePipe,
    SpliceUnsupported,
    plain_socket,
    pwrite_all,
    splice_body,
)

if TYPE_CHECKING:
    from model_agent.transfer.engine import RangedDownloader, Slot

MiB = 1024 * 1024
PROGRESS_STEP = 16 * MiB  # spliced bytes are reported to the event loop in steps this large (fewer wake-ups)
# When a relay passes the bytes on as they land (on_written), they are written and reported in pieces of RELAY_STEP,
# or of whatever arrived within RELAY_LATENCY_S of the first unreported byte, whichever comes first: not a part
# (the next node of a chain would wait a part's time per hop), nor every read. A body arriving at a capped rate
# comes a few KiB per read; reporting each cost about 15 CPU-s per GB relayed (a write, a hash update, two loop
# wake-ups and a send per read), which made a fleet of agents on shared cores CPU-bound (docs/performance.md 12).
RELAY_STEP = 256 * 1024
RELAY_LATENCY_S = 0.02
RELAY_READ = 1 * MiB  # a copied body, relayed: at most this much per read, and whatever has arrived (read1)
_CHUNK_HEADER_ROOM = 64  # bytes on the socket that hold the end of a chunk, the next one's size line and its start
# A file of one part at most this large is fetched in one thread call per attempt (Job._run_small): open, GET, write,
# hash from the buffer, verify, fsync and record, instead of the part path's five thread hops (open, request, hash
# read-back, fsync, map) and a hash task. With receive buffers sized by need (engine.Slot.buffer), 20 files of
# 1-500 KiB on a reused engine went from 36 to 30.5 ms of CPU; the hops alone were most of the rest of the gap to a
# bare one-call-per-file loop (11 ms).
SMALL_FILE = 4 * MiB


def fetched_in_one_request(size: int, part_size: int) -> bool:
    """Whether a file of ``size`` bytes is fetched by one GET per attempt (the small path), with parts of
    ``part_size``: only such a file can take checksums from its answer (``Expected.checksums_from_answer``)."""
    return 0 < size <= min(SMALL_FILE, part_size)


def _may_wait(resp: http.client.HTTPResponse, sock: socket.socket, poller: select.poll, deadline: float) -> bool:
    """Whether reading more of ``resp`` might wait past ``deadline`` (monotonic): no bytes on ``sock`` by then, or,
    between two chunks of a chunked answer, too few for the next chunk's header and a byte of it (a read there
    would wait for them, however little the socket holds). A read that finds bytes in http.client's own buffer
    does not wait at all: this errs towards writing early, never towards holding bytes back."""
    if not poller.poll(max(0, math.ceil((deadline - time.monotonic()) * 1000))):
        return True
    if resp.chunked and not getattr(resp, "chunk_left", None):
        pending = array.array("i", [0])
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, pending)
        return pending[0] < _CHUNK_HEADER_ROOM
    return False


def _nobody_waits(_pos: int) -> None:
    """The small path's hash cursor moved: no hash loop or worker waits on it."""


_pwrite_all = pwrite_all  # the copying path's writes (a name of this module: tests fill the disk through it)


@dataclass
class _Span:
    pos: int
    end: int  # exclusive


_Request = Callable[["Slot", str, dict[str, str], _Span, bool, threading.Event], object]  # a slot thread's GET
_ALREADY = object()  # the small path's "a completed record makes this file done" (see Job._small_request)


class Job:
    """The transfer of one file (made by :meth:`RangedDownloader.download`; :meth:`run` once)."""

    def __init__(
        self,
        dl: RangedDownloader,
        url: UrlSource,
        path: Path,
        expected: Expected,
        headers: HeaderSource,
        state_path: Path,
        label: str,
        on_bytes: Callable[[int], None],
        reservation: Reservation | None,
        on_written: Callable[[int, int], None] | None = None,
        parts_at_once: int = 0,
    ) -> None:
        self.dl = dl
        self.cfg = dl.config
        self.url = url
        self.path = path
        self.expected = expected
        self.size = expected.size
        self.headers = headers
        self.state_path = state_path
        self.label = label
        self.on_bytes = on_bytes
        self.on_written = on_written
        self.parts_at_once = min(self.cfg.concurrency, parts_at_once or self.cfg.concurrency)
        self.report_step = RELAY_STEP if on_written is not None else PROGRESS_STEP
        # The small path (one request per attempt): nothing waits on its hash cursor, and unless a relay passes its
        # bytes on, its writes are reported once the attempt ends: no wake-up of the event loop per write or hash.
        self.small = fetched_in_one_request(self.size, self.cfg.part_size)
        self.deferred = 0 if self.small and on_written is None else -1  # bytes written, not yet reported (-1: off)
        self.reservation = reservation
        self.algorithms = sorted({"sha256", *expected.checksums})
        self.io = Io()
        self.fd = -1
        self.state = PartMap.fresh(self.size, self.cfg.part_size, expected.validator)
        self.recorded = self.state.copy()  # what the map on disk says
        self.persist_progress = False
        self.queue: deque[int] = deque()
        self.fetched = 0
        self.resumed = 0
        self.requests = 0
        self.frontier = 0  # parts [0, frontier) are all done
        self.part_event = asyncio.Event()
        # The file's hashers, fed in file order by receive threads and the hash loop (see _hash_loop).
        self.ordered = OrderedHash([new_hasher(alg, self.size) for alg in self.algorithms], self._on_hash_advance())
        # How far the hash has got, for the transfer's lead over it (see _hash_caught_up); set on the loop.
        self.hashed = 0
        self.hash_progress = asyncio.Event()
        self.hash_over = False  # the hash loop ended (done, failed or cancelled): nothing more to wait for
        self.hash_lead = self.cfg.concurrency * self.cfg.part_size
        self.unrecorded: set[int] = set()
        self.flusher: asyncio.Task[None] | None = None
        self.flushed = asyncio.Event()  # set after every map write (or its failure)
        self.flush_error: BaseException | None = None
        self.sequential = False  # single-stream mode (the server ignores Range)
        self.next_sequential = 0
        self.range_ignored = False  # a part request was answered with the whole body: no more part requests
        self.loop = asyncio.get_running_loop()
        # One writer to the file at a time: parallel writers contend for the inode lock and the kernel spins on
        # it (measured: 1.7 -> 1.6 CPU-s/GB copying to tmpfs, and most of the gain of splice on ext4).
        self.write_lock = threading.Lock()
        # Seconds the receive threads spent waiting on the origin (for an answer, for body bytes); the small path's
        # last attempt: those seconds and the CPU seconds of its thread (the pacing of small files, transfer.pacing).
        self.waited = 0.0
        self.paced: tuple[float, float] | None = None

    # ------------------------------------------------------------------ open / state

    def _open(self) -> bool:
        """Load or reset the part map, open and preallocate the file. True when the file is already complete."""
        # (Folders are made when a file or map is first written into them, not checked per file: under
        # contention every system call of a small file's thread costs several times its own time.)
        try:
            old, present = PartMap.read(self.state_path), True
        except FileNotFoundError:
            old, present = None, False
        usable = old is not None and old.size == self.size and old.validator == self.expected.validator
        if usable:
            try:
                usable = self.path.stat().st_size == self.size
            except FileNotFoundError:
                usable = False
        if usable and old is not None and old.complete:
            # A complete map is the file's digests as hashed when it was written: usable only when they are the
            # ones expected now (the same path and size may hold another revision's bytes).
            expected = {alg: digest.lower() for alg, digest in self.expected.checksums.items()}
            same = all(old.digests.get(alg, "").lower() == digest for alg, digest in expected.items())
            if same and all(alg in old.digests for alg in self.algorithms):
                self.state = old
                return True
            usable = False  # complete, but of other bytes or without a digest we now need: fetch again
        if usable and old is not None:
            self.state = old
            self.recorded = old.copy()
            flags = os.O_RDWR
        else:
            self.state = PartMap.fresh(self.size, self.cfg.part_size, self.expected.validator)
            self.recorded = self.state.copy()
            # Forget old progress before touching the data, so no map ever describes bytes we overwrite.
            if present:
                with contextlib.suppress(FileNotFoundError):
                    self.state_path.unlink()
            flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC
        self.persist_progress = self.state.parts > 1
        try:
            self.fd = open_making_folders(self.path, flags)
        except OSError as exc:
            raise disk_error(self.label, exc, "creating the file") from exc
        if self.small:
            # Written at once by one request: no preallocation (a full disk is the write's ENOSPC, which keeps
            # the file as InsufficientDisk too) and no block count; its size stands for what it allocates. Three
            # syscalls of a ~1 ms file: 20 small files 19-25 -> 16-19 ms with the single route below.
            if self.reservation is not None:
                self.reservation.consume(self.size)
        else:
            before = allocated_bytes(self.path)
            try:
                preallocate(self.fd, self.size)
            except OSError as exc:
                os.close(self.fd)
                self.fd = -1
                raise disk_error(self.label, exc, f"preallocating {self.size} bytes") from exc
            if self.reservation is not None:
                self.reservation.consume(allocated_bytes(self.path) - before)
        if self.persist_progress and not usable:
            try:
                self.state.save(self.state_path)
            except OSError as exc:
                raise disk_error(self.label, exc, "writing the part map") from exc
        self.resumed = self.state.done_bytes()
        self.queue.extend(i for i in range(self.state.parts) if not self.state.is_done(i))
        self._advance_frontier()
        return False

    def _advance_frontier(self) -> None:
        while self.frontier < self.state.parts and self.state.is_done(self.frontier):
            self.frontier += 1

    def _frontier_bytes(self) -> int:
        return min(self.size, self.frontier * self.state.part_size)

    # ------------------------------------------------------------------ run

    async def run(self) -> Downloaded:
        if self.small:  # (an empty file needs no request: the part path)
            return await self._run_small()
        if self.expected.checksums_from_answer is not None:
            raise ValueError(f"{self.label}: checksums from the answer need a file fetched in one request")
        try:
            already = await self.io.run(self._open)
        except BaseException:
            await self._close()
            raise
        if already:
            return Downloaded(self.path, self.size, self._digests(self.state.digests), 0, self.size, 0)
        try:
            digests = await self._transfer_and_hash()
            await self._verify(digests)
            return Downloaded(self.path, self.size, digests, self.fetched, self.resumed, self.requests)
        finally:
            cleanup = asyncio.ensure_future(self._shutdown())
            await asyncio.shield(cleanup)

    async def _run_small(self) -> Downloaded:
        """A file of one small part: each attempt is one call in a slot's thread (:meth:`_small_request`).

        The same guarantees as the part path: the bytes are hashed from the receive buffer in file order as they
        are written (a retry resumes at the last byte written, the hashers with it), the file is verified, then
        fsynced and recorded complete before this returns; a mismatch deletes it. Nothing is recorded before
        completion: a kill re-fetches this one part, which is all that was in flight.
        """
        try:
            async with self.dl._small_files.admit(), self.dl._slot() as slot:
                try:
                    checked = await self._fetch_span(_Span(0, self.size), slot, self._small_request)
                finally:
                    self._report_deferred()
            if self.paced is not None:
                self.dl._small_files.observe(*self.paced)
            if checked is _ALREADY:
                return Downloaded(self.path, self.size, self._digests(self.state.digests), 0, self.size, 0)
            # (not a list: every byte is in, but the attempt failed after them; the check is made now)
            problems = checked if isinstance(checked, list) else await self.io.run(self._hash_rest_and_check)
            await self._settle_check(problems)
            return Downloaded(self.path, self.size, dict(self.state.digests), self.fetched, self.resumed, self.requests)
        finally:
            if self.fd >= 0 or not self.io.idle:  # (verified, the thread closed the file: nothing to clean up)
                cleanup = asyncio.ensure_future(self._shutdown())
                await asyncio.shield(cleanup)

    def _small_request(
        self, slot: Slot, url: str, headers: dict[str, str], span: _Span, whole: bool, stop: threading.Event
    ) -> object:
        """Worker thread: open the file at the first attempt (:data:`_ALREADY` when a completed record makes it
        done), then the GET copied through the slot's buffer, so every byte is hashed as it is written; then the
        check (:meth:`_hash_rest_and_check`): its problems, none when the file is verified and recorded."""
        waited, cpu = self.waited, time.thread_time()
        if self.fd < 0:
            if self._open():
                span.pos = span.end
                return _ALREADY
            if self.resumed:  # a map of smaller parts (another part size): the whole file is fetched again
                self.state_path.unlink(missing_ok=True)
                self.state = PartMap.fresh(self.size, self.cfg.part_size, self.expected.validator)
                self.resumed = 0
        self._request(slot, url, headers, span, whole, stop, splice=False, settle=True)
        problems = self._hash_rest_and_check()
        if not problems:  # verified, synced and recorded: nothing uses the file any more
            fd, self.fd = self.fd, -1
            os.close(fd)
        self.paced = (self.waited - waited, time.thread_time() - cpu)  # (read by the loop after this returns)
        return problems

    def _settle_checksums(self, resp: http.client.HTTPResponse) -> None:
        """Small path, worker thread, before the first byte of the body is hashed: add the checksums the answer
        states (``Expected.checksums_from_answer``) to what the file is verified against, with their hashers."""
        stated = self.expected.checksums_from_answer
        if stated is None or self.ordered.pos != 0:
            return  # (a retry after bytes were hashed: the first answer settled them, for the same validator)
        headers = {k.lower(): v for k, v in resp.getheaders()}
        found = {alg: value.lower() for alg, value in stated(headers).items() if alg in SUPPORTED_CHECKSUMS}
        checksums = {**found, **self.expected.checksums}
        self.expected = dataclasses.replace(self.expected, checksums=checksums, checksums_from_answer=None)
        self.algorithms = sorted({"sha256", *checksums})
        self.ordered = OrderedHash([new_hasher(alg, self.size) for alg in self.algorithms], self._on_hash_advance())

    def _hash_rest_and_check(self) -> list[str]:
        """Any thread, once every byte is in the file: hash what the buffers did not (nothing, copying in order;
        kept so no byte can go unhashed), then :meth:`_check_and_record`."""
        if self.ordered.pos < self.size:
            for hasher in self.ordered.hashers:
                hashing.hash_mapped(self.fd, hasher, self.ordered.pos, self.size - self.ordered.pos)
            self.ordered.pos = self.size
        digests = {alg: h.hexdigest() for alg, h in zip(self.algorithms, self.ordered.hashers, strict=True)}
        return self._check_and_record(digests)

    def _digests(self, found: Mapping[str, str]) -> dict[str, str]:
        return {alg: found[alg] for alg in self.algorithms}

    async def _transfer_and_hash(self) -> dict[str, str]:
        hasher = asyncio.ensure_future(self._hash_loop())
        try:
            if self.queue:
                workers = min(len(self.queue), self.parts_at_once)
                await run_all(self._worker() for _ in range(workers))
                if self.range_ignored and self.frontier < self.state.parts:
                    await self._single_stream()  # (no first part's answer to read on: one stream from 0)
            await self._flush_now()
            self.part_event.set()
            return await hasher
        finally:
            if not hasher.done():
                hasher.cancel()
            await asyncio.gather(hasher, return_exceptions=True)

    async def _shutdown(self) -> None:
        """After success, failure or cancellation: no thread uses the fd, the map is current, the fd closed."""
        await self.io.drain()
        if self.fd >= 0 and not self.state.complete:
            with contextlib.suppress(Exception):
                await self._flush_now()
            await self.io.drain()
        await self._close()

    async def _close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    # ------------------------------------------------------------------ parts and the part map

    async def _worker(self) -> None:
        while self.queue:
            await self._hash_caught_up()
            if not self.queue:
                return
            i = self.queue.popleft()
            # The slot is held until the part is durably recorded: parts in flight plus parts completed but not
            # yet in the map never exceed the slots, so a kill at any instant refetches <= concurrency parts.
            async with self.dl._slot() as slot:
                try:
                    await self._fetch_part(i, slot)
                except RangeIgnored:
                    self._on_range_ignored()  # (the first part's request reads the file as one stream, or none)
                    return
                self._part_done(i)
                await self._recorded(i)

    async def _hash_caught_up(self) -> None:
        """Wait (holding no slot) while the next part starts more than ``hash_lead`` bytes past the hashed prefix.

        sha256 of one file is sequential, the receive is not: left alone, eight receiving threads (and the
        origin, on a shared box) outrun the one hashing thread, the transfer ends with a third of the file
        still to hash, and that tail runs on one core while the other idles (measured: 0.6-0.8 s of a 2.2 s
        GiB). Holding the receive to one round of slots ahead of the hash keeps both busy to the end, so the
        last byte is verified moments after it lands. Parts below the lead can always start and the hash
        can always reach the contiguous prefix they complete, so this never waits on itself.
        """
        while (
            self.queue and not self.hash_over and self.queue[0] * self.state.part_size >= self.hashed + self.hash_lead
        ):
            self.hash_progress.clear()
            await self.hash_progress.wait()

    def _part_done(self, i: int) -> None:
        self.state.mark(i)
        self._advance_frontier()
        self.part_event.set()
        if self.flush_error is not None:
            raise self.flush_error
        if self.persist_progress:
            self.unrecorded.add(i)
            if self.flusher is None or self.flusher.done():
                self.flusher = asyncio.ensure_future(self._flush_loop())

    async def _recorded(self, i: int) -> None:
        """Return once part ``i`` is in the map on disk (after the fdatasync of its bytes when durable)."""
        while self.persist_progress and not self.recorded.is_done(i):
            if self.flush_error is not None:
                raise self.flush_error
            self.flushed.clear()
            await self.flushed.wait()

    async def _flush_loop(self) -> None:
        try:
            while self.unrecorded:
                batch = set(self.unrecorded)
                self.unrecorded.clear()
                if self.cfg.durable:
                    await self.io.run(os.fdatasync, self.fd)
                for i in batch:
                    self.recorded.mark(i)
                snapshot = self.recorded.copy()
                await self.io.run(snapshot.save, self.state_path)
                self.flushed.set()
        except asyncio.CancelledError:
            raise
        except OSError as exc:
            self.flush_error = disk_error(self.label, exc, "recording progress")
        except Exception as exc:
            self.flush_error = exc
        finally:
            self.flushed.set()

    async def _flush_now(self) -> None:
        """Wait for a running map write, then record whatever is still unrecorded."""
        if self.flusher is not None and not self.flusher.done():
            await asyncio.shield(self.flusher)
        if self.persist_progress and self.unrecorded and self.fd >= 0:
            self.flusher = asyncio.ensure_future(self._flush_loop())
            await asyncio.shield(self.flusher)
        if self.flush_error is not None:
            raise self.flush_error

    # ------------------------------------------------------------------ requests

    async def _fetch_part(self, i: int, slot: Slot) -> None:
        start = i * self.state.part_size
        await self._fetch_span(_Span(start, min(self.size, start + self.state.part_size)), slot, self._request)

    async def _fetch_span(self, span: _Span, slot: Slot, request: _Request) -> object:
        """``span`` through ``request`` in the slot's thread, retried from the last byte written; what the thread
        function returned the last time, None when the last attempt failed after every byte was in."""
        failures = 0
        result: object = None
        while span.pos < span.end:
            await self.dl._wait_turn()
            before = span.pos
            try:
                result = await self._stream(span, slot, whole=span.pos == 0 and span.end == self.size, request=request)
            except TRANSIENT as exc:
                if span.pos >= span.end:
                    return None
                failures = 1 if span.pos > before else failures + 1
                if failures >= self.cfg.max_attempts:
                    raise SourceError(
                        "DownloadFailed",
                        f"{self.label}: bytes {span.pos}-{span.end - 1}: {failures} attempts in a row failed; "
                        f"last: {describe(exc)}",
                    ) from None
                await asyncio.sleep(self._retry_delay(exc, failures))
        return result

    async def _request_url(self) -> str:
        if isinstance(self.url, str):
            return self.url
        url = self.url()
        return url if isinstance(url, str) else await url

    async def _stream(self, span: _Span, slot: Slot, *, whole: bool, request: _Request | None = None) -> object:
        """One GET for ``span`` in the slot's thread (``request``, default :meth:`_request`); advances ``span.pos``
        past every byte written; returns what the thread function returned."""
        self.requests += 1
        url = await self._request_url()
        headers = dict(self.headers(url) if callable(self.headers) else self.headers)
        if not whole:
            headers["Range"] = f"bytes={span.pos}-{span.end - 1}"
        if self.expected.validator:
            headers["If-Match"] = self.expected.validator
        stop = threading.Event()
        fut = self.dl._threads.submit(request or self._request, slot, url, headers, span, whole, stop)
        self.io.track(fut)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            # The thread notices within one buffer (the flag) or at once when blocked on the socket (shutdown).
            stop.set()
            slot.transport.abort()
            await settle(fut)
            raise

    def _request(
        self,
        slot: Slot,
        url: str,
        headers: dict[str, str],
        span: _Span,
        whole: bool,
        stop: threading.Event,
        *,
        splice: bool = True,
        settle: bool = False,
    ) -> None:
        """Worker thread: send the GET, check the answer, move the body to the file (spliced when ``splice`` and
        the kernel allows it, else copied through the slot's buffer); with ``settle`` (the small path), the
        answer's own checksums are taken first (:meth:`_settle_checksums`)."""
        try:
            key = slot.transport.key_of(url)
            asked = time.perf_counter()
            resp = slot.transport.get(url, headers)
            self.waited += time.perf_counter() - asked
        except ssl.SSLCertVerificationError as exc:  # (also a ValueError: first)
            raise SourceError("TLSError", f"{self.label}: certificate not trusted ({exc.verify_message})") from None
        except ValueError as exc:
            raise SourceError("BadRequest", f"{self.label}: {exc}") from None
        reusable = False
        try:
            try:
                check_answer(Answer.of(resp), self.label, self.size, span.pos, span.end, whole=whole)
            except RangeIgnored:
                if span.pos != 0:
                    raise
                self._read_on_as_one_stream(Answer.of(resp), span)
            if settle:
                self._settle_checksums(resp)
            sock = plain_socket(resp, slot.transport.active_socket()) if splice and self.dl._splice else None
            if sock is not None:
                self._splice_body(resp, sock, span, slot, stop)
            if span.pos < span.end:  # (after a complete splice there is nothing to copy: no buffer is made)
                connection = slot.transport.active_socket() if self.on_written is not None else None
                self._copy_body(resp, span, slot.buffer(span.end - span.pos), stop, sock=connection)
            reusable = resp.isclosed()  # read to its end: the connection can carry the next request
        finally:
            if not reusable:
                slot.transport.drop(key)

    def _copy_body(
        self,
        resp: http.client.HTTPResponse,
        span: _Span,
        buf: bytearray,
        stop: threading.Event,
        until: int | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        """Worker thread: copy the body into the file through the slot's buffer, to ``until`` or the span's end
        (``sock``: the answer's connection, when the caller has it)."""
        end = span.end if until is None else until
        view = memoryview(buf)
        if self.on_written is not None:
            self._copy_relayed(resp, span, view, stop, end, sock)
        while self.on_written is None and span.pos < end:
            if stop.is_set():
                raise Stopped()  # the awaiting task was cancelled and waits for this thread to let go
            # readinto fills the buffer straight from the socket; never past the span, whatever the server sends.
            asked = time.perf_counter()
            n = resp.readinto(view[: min(len(view), end - span.pos)])
            self.waited += time.perf_counter() - asked
            if not n:
                break
            self._write_at(view[:n], span)
        if span.pos < end:
            raise Retry(f"the response ended {span.end - span.pos} bytes early")

    def _copy_relayed(
        self,
        resp: http.client.HTTPResponse,
        span: _Span,
        view: memoryview,
        stop: threading.Event,
        end: int,
        sock: socket.socket | None,
    ) -> None:
        """Worker thread: a copied body that a relay passes on, to ``end`` or the end of the answer.

        What has arrived is taken as it arrives (``read1``): ``readinto`` would wait until the buffer is full (a
        whole part of a chunked answer, whose length the splice cannot use), and the next node of a chain with it.
        It is gathered in the buffer and written in pieces (``RELAY_STEP``, ``RELAY_LATENCY_S``); before a read that
        would wait longer than the latency allows, what is gathered is written first, so no byte that arrived is
        held back while the sender is quiet, and what is gathered when a read fails is written before the error goes
        on (the retry starts after it). (Without the socket to look at, every read is written at once.)
        """
        poller = select.poll()
        if sock is not None:
            poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        filled = 0
        first = 0.0
        while span.pos + filled < end:
            if stop.is_set():
                raise Stopped()
            if filled and (sock is None or _may_wait(resp, sock, poller, first + RELAY_LATENCY_S)):
                self._write_at(view[:filled], span)  # nothing more within the latency: pass on what is here
                filled = 0
            try:
                data = resp.read1(min(RELAY_READ, len(view) - filled, end - span.pos - filled))
            except BaseException:
                if filled:  # what arrived before the answer broke is kept: the retry starts after it
                    self._write_at(view[:filled], span)
                raise
            if not data:
                break
            if not filled:
                first = time.monotonic()
            view[filled : filled + len(data)] = data
            filled += len(data)
            if filled >= RELAY_STEP or filled == len(view) or time.monotonic() - first >= RELAY_LATENCY_S:
                self._write_at(view[:filled], span)
                filled = 0
        if filled:
            self._write_at(view[:filled], span)

    def _splice_body(
        self, resp: http.client.HTTPResponse, sock: socket.socket, span: _Span, slot: Slot, stop: threading.Event
    ) -> None:
        """Worker thread: the body straight from the socket into the file (see transfer.splice), as far as it goes.

        Returns with ``span`` advanced past what is in the file; :meth:`_copy_body` then does the rest, if any
        (nothing, unless the kernel refused the splice).
        """
        # What http.client read past the headers is in its buffer, not in the socket: that goes first, copied.
        if not resp.length or span.pos >= span.end:
            return  # (peek on an empty body would wait for bytes that never come)
        head = min(len(resp.fp.peek(1)), span.end - span.pos, resp.length)
        if head:
            self._write_at(memoryview(resp.read(head)), span)  # a few KiB at most: no system call
        count = min(resp.length or 0, span.end - span.pos)
        if count <= 0:
            return
        if slot.pipe is None:
            try:
                slot.pipe = SplicePipe()
            except OSError:
                return  # no pipe to be had (descriptors exhausted?): copy this body
        unreported = 0
        first = 0.0
        relayed = self.on_written is not None

        def report() -> None:
            nonlocal unreported
            if unreported:
                self._report(span.pos - unreported, unreported)
                unreported = 0

        def written(pos: int, n: int) -> None:
            nonlocal unreported, first
            span.pos = pos + n
            if relayed and not unreported:
                first = time.monotonic()
            unreported += n
            if unreported >= self.report_step or (relayed and time.monotonic() - first >= RELAY_LATENCY_S):
                report()

        def before_wait() -> float:
            """The socket is empty: wait for more within the latency, else report what is written first."""
            left = first + RELAY_LATENCY_S - time.monotonic()
            if left <= 0:
                report()
            return left if unreported else 0.0

        try:
            moved = splice_body(
                sock,
                slot.pipe,
                self.fd,
                span.pos,
                count,
                write_lock=self.write_lock,
                stopped=stop.is_set,
                timeout_s=self.cfg.read_timeout_s,
                on_written=written,
                before_wait=before_wait if relayed else None,
            )
        except SpliceUnsupported:
            self.dl._splice = False
            return
        except FileWriteError as exc:
            raise disk_error(self.label, exc.cause, "writing") from exc.cause
        finally:
            report()
            if slot.pipe is not None and not slot.pipe.file_writes_ok:
                self.dl._splice = False
        if stop.is_set():
            raise Stopped()
        if moved == resp.length:
            resp.length = 0
            resp.read()  # nothing left to read: marks the response complete, so the connection is reused

    def _write_at(self, data: memoryview, span: _Span) -> None:
        """Worker thread: write ``data`` at ``span.pos`` and advance it."""
        try:
            with self.write_lock:
                _pwrite_all(self.fd, data, span.pos)
        except OSError as exc:
            raise disk_error(self.label, exc, "writing") from exc
        self.ordered.offer(span.pos, data)  # next in file order: hashed now, from the buffer, never read back
        self._report(span.pos, len(data))
        span.pos += len(data)

    def _report(self, start: int, n: int) -> None:
        """Worker thread: ``n`` bytes from ``start`` are in the file."""
        if self.deferred >= 0:
            self.deferred += n  # (reported by the event loop when the attempt's thread call ends: _report_deferred)
            return
        self.loop.call_soon_threadsafe(self._wrote, n, start + n)

    def _report_deferred(self) -> None:
        n, self.deferred = self.deferred, 0
        if n > 0:
            self._wrote(n, n)

    def _wrote(self, n: int, pos: int) -> None:
        self.fetched += n
        self.on_bytes(n)
        if self.on_written is not None:
            self.on_written(pos - n, pos)
        if self.sequential:
            self._passed(pos)

    def _read_on_as_one_stream(self, answer: Answer, span: _Span) -> None:
        """Worker thread: the request for the first part was answered with the whole file (the server ignores
        ``Range``, as some mirrors do): this answer becomes the single stream, read to the end of the file and its
        parts recorded as it passes them, instead of being dropped and asked for again (one request and its wait
        saved per file); the other part requests stop (:meth:`_on_range_ignored`)."""
        check_answer(answer, self.label, self.size, 0, self.size, whole=True)  # (its length must be the file's)
        self.sequential = True  # (before any of its bytes is reported: _wrote marks the parts they pass)
        span.end = self.size
        self.loop.call_soon_threadsafe(self._on_range_ignored)

    def _on_range_ignored(self) -> None:
        """No more part requests: the server answers them with the whole file."""
        self.range_ignored = True
        self.queue.clear()

    async def _single_stream(self) -> None:
        """The server ignores Range: fetch the whole body in one stream, recording parts as it passes them."""
        failures = 0
        self.sequential = True
        while True:
            await self.dl._wait_turn()
            span = _Span(0, self.size)
            try:
                async with self.dl._slot() as slot:
                    await self._stream(span, slot, whole=True)
                return
            except TRANSIENT as exc:
                failures = 1 if span.pos > 0 else failures + 1
                if failures >= self.cfg.max_attempts:
                    raise SourceError(
                        "DownloadFailed", f"{self.label}: {failures} attempts in a row failed; last: {describe(exc)}"
                    ) from None
                await asyncio.sleep(self._retry_delay(exc, failures))

    def _retry_delay(self, exc: BaseException, failures: int) -> float:
        retry_after = exc.retry_after if isinstance(exc, Retry) else None
        if retry_after is not None:
            delay = min(retry_after, self.cfg.retry_after_cap_s)
            self.dl._pause(delay)  # the server asked everyone to wait, not only this request
            return delay
        delay = min(self.cfg.backoff_cap_s, self.cfg.backoff_base_s * 2.0 ** (failures - 1))
        return delay * random.uniform(0.5, 1.0)

    def _passed(self, pos: int) -> None:
        """Single-stream mode: every part that ends at or before ``pos`` is complete."""
        part_size = self.state.part_size
        while self.next_sequential < self.state.parts and min(self.size, (self.next_sequential + 1) * part_size) <= pos:
            if not self.state.is_done(self.next_sequential):
                self._part_done(self.next_sequential)
            self.next_sequential += 1

    # ------------------------------------------------------------------ hashing and verification

    async def _hash_loop(self) -> dict[str, str]:
        """Read back for the hash what lies between the hash cursor and the completed prefix, until all is hashed.

        Bytes the receive threads hashed from their buffers (the part at the cursor) are skipped: the cursor
        is past them. What is read back: parts that completed ahead of the cursor, spliced bodies (they never
        pass through a buffer), and on resume the prefix already on disk (the hash state is not durable).
        """
        ordered = self.ordered
        try:
            while ordered.pos < self.size:
                self.part_event.clear()  # (then look: a part or a cursor move after this sets it again)
                start = ordered.pos
                length = min(HASH_STEP, self._frontier_bytes() - start)
                if length <= 0 or not ordered.claim(start, length):
                    await self.part_event.wait()  # nothing complete past the cursor, or a receive thread at it
                    continue
                # each update releases the GIL: several algorithms use both cores
                # (hashing.hash_mapped looked up per call: the benchmark's transfer-alone mode replaces it)
                futures = [self.io.submit(hashing.hash_mapped, self.fd, h, start, length) for h in ordered.hashers]
                ordered.advance_when_done(futures, length)  # (from the threads: whatever happens to this task)
                await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
                # the cursor moved in a thread: _hash_advanced wakes this loop (and the workers) from there
                while ordered.pos == start:
                    self.part_event.clear()
                    if ordered.pos == start:
                        await self.part_event.wait()
        finally:
            self.hash_over = True  # whatever happens, no worker waits for a hash that will not come
            self.hash_progress.set()
        return {alg: h.hexdigest() for alg, h in zip(self.algorithms, ordered.hashers, strict=True)}

    def _on_hash_advance(self) -> Callable[[int], None]:
        return _nobody_waits if self.small else self._hash_advanced

    def _hash_advanced(self, pos: int) -> None:
        """Any thread: the hash cursor is at ``pos``; tell the event loop (the hash loop and the workers wait on it)."""
        with contextlib.suppress(RuntimeError):  # the loop is gone: the job ended, nothing waits any more
            self.loop.call_soon_threadsafe(self._hash_moved, pos)

    def _hash_moved(self, pos: int) -> None:
        self.hashed = max(self.hashed, pos)
        self.hash_progress.set()
        self.part_event.set()

    async def _verify(self, digests: dict[str, str]) -> None:
        await self._settle_check(await self.io.run(self._check_and_record, digests))

    def _check_and_record(self, digests: dict[str, str]) -> list[str]:
        """Any thread: what is wrong with the file against the expectation; when nothing, fsync it and record it
        complete with its digests (the map a later call returns from at once)."""
        problems = []
        on_disk = os.fstat(self.fd).st_size
        if on_disk != self.size:
            problems.append(f"size {on_disk} != {self.size}")
        for alg, want in sorted(self.expected.checksums.items()):
            if digests.get(alg) != want.lower():
                problems.append(f"{alg} {digests.get(alg)} != expected {want.lower()}")
        if problems:
            return problems
        try:
            os.fsync(self.fd)
        except OSError as exc:  # (a SourceError, not an OSError: no retry may take an unsynced file as done)
            raise disk_error(self.label, exc, "syncing the file") from exc
        self.state.complete = True
        self.state.digests = dict(digests)
        try:
            if self.small:  # (no map is on disk: none was, or _open and _small_request removed it)
                self.state.create(self.state_path)
            else:
                self.state.save(self.state_path)
        except OSError as exc:
            raise disk_error(self.label, exc, "recording completion") from exc
        return []

    async def _settle_check(self, problems: list[str]) -> None:
        """A failed check deletes the file and its map (once no thread uses them) and raises VerificationFailed."""
        if not problems:
            return
        await self.io.drain()
        self.state.complete = True  # nothing left to record: the file is discarded below
        for p in (self.path, self.state_path):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        raise SourceError("VerificationFailed", f"{self.label}: " + "; ".join(problems))
