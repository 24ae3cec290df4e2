"""The peer server: this node's Ready model files, and what it has of those it is fetching, read-only, by
digest, to authenticated peers.

``GET`` and ``HEAD /blobs/sha256/<64 hex>`` and ``/blobs/git-sha1/<40 hex>`` (a hub's small files, whose listing
gives only their git blob id), with a single ``Range`` (``bytes=a-b``, ``a-``, ``-n``: 206 with
``Content-Range``; 416 outside the file). Nothing else is routed.

Contract:

* **What is served.** Only files recorded in this node's manifests (published models; a model whose
  removal was decided is left out), looked up by a digest the manifest records (a git blob id only of the copies
  ``by_blob_id`` accepts: those a trusted owner fetched, since SHA-1 collisions can be made), and only while the file's
  size and mtime still match the record (a file changed on disk is 404). The index is rebuilt from the
  manifests at most every ``index_s``; a digest not found forces one rebuild (at most once a second).
* **Files being fetched** (:mod:`.relay`, when given ``relays``): a digest no manifest records is looked up in
  the relays; only an entry with a source (the origin, or a peer chain) is served, and only the bytes its fetch
  has written into it or its part map on disk records (:meth:`~.relay.Relay.servable_end`). An answer that
  reaches bytes not there yet waits for them (woken by the next write, the map looked at at least every
  ``relay_poll_s``), so a downstream right behind streams on without a new request; after ``relay_wait_s``
  without a new byte anywhere in the file (an answer far ahead of the fetch waits as long as the fetch goes
  on), or as soon as the entry failed (its file is being deleted), the
  connection is closed short and the client resumes from what it got. Answers carry ``X-Peer-Path``: the chain
  of holders above this one for that file ("" for a Ready copy or the origin), which a prober uses to avoid
  cycles. A ``HEAD`` with ``X-Peer-Wait: <s>`` for a file this node is fetching but has no source for yet is held
  until it has one (then answered as any probe) or for at most that long (capped at ``MAX_FEED_WAIT_S``; then
  404): the node behind it in the chain hears at once that it may follow, instead of probing again and again.
* **Confined.** The file is opened with ``O_NOFOLLOW`` after its real path is checked to be inside one of
  the models roots; the checked descriptor is the one read, so a symlink swapped in meanwhile is refused.
* **Who.** Every request is authenticated first (:mod:`.auth`): no token 401, refused token 403, review
  unavailable 503.
* **How much.** At most ``max_per_peer`` requests in flight per peer address (429 with ``Retry-After``
  beyond, before any file is opened); at most ``downstreams_per_file`` downstream nodes per file (named by their
  ``X-Peer-From`` address, else their IP; a node's place is kept a few seconds after its last request, so its
  next part request finds it; 429 beyond, so the next node takes the file from a node further down the chain);
  the bytes of all answers together are paced by a token bucket at ``upload_rate`` bytes/s (0: no cap), and
  each answer's socket by the kernel at its share of that rate (``SO_MAX_PACING_RATE``), so they leave evenly
  rather than in bursts. Every byte sent counts in ``on_upload``, every answer (method, status) in ``on_answer``.
  The listener is bounded (:data:`~model_agent.ops.listener.PEER_LIMITS`); a connection closed at a limit counts
  in ``on_refused``.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from pathlib import Path
from typing import BinaryIO

import structlog
from aiohttp import web

from model_agent.local.manifest import Manifest
from model_agent.ops.listener import PEER_LIMITS, Gate, serve
from model_agent.peers.auth import TokenReviewer
from model_agent.peers.relay import (
    FROM_HEADER,
    PATH_HEADER,
    WAIT_HEADER,
    Downstreams,
    DurableView,
    Relay,
    Relays,
    blob_algorithm,
    open_confined,
)

log = structlog.get_logger(__name__)

CHUNK = 1024 * 1024
RELAY_POLL_S = 0.05  # how often an answer waiting for bytes looks at the part map (writes wake it sooner)
RELAY_BATCH = 64 * 1024  # a relayed file's bytes are sent in pieces of at least this much ...
RELAY_BATCH_S = 0.05  # ... or whatever is there after this long (at most the hop's added latency)
RELAY_WAIT_S = 5.0  # no new byte in the file for this long: the answer ends short (the client resumes)
MAX_FEED_WAIT_S = 2.0  # the longest a probe (X-Peer-Wait) is held for a file this node is fetching to get a source
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux >= 3.13; the constant is missing in 3.11
_PACING_MAX = 2**32 - 1  # the option is a u32 when set as an int
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class Blob:
    """Where a digest's bytes are on this node, and what they must still look like."""

    path: Path
    size: int
    mtime_ns: int


class BlobIndex:
    """digest -> file, from the manifests of this node (see the module contract)."""

    def __init__(
        self,
        manifests: Callable[[], Iterable[Manifest]],
        roots: Callable[[], list[Path]],
        *,
        index_s: float = 5.0,
        by_blob_id: Callable[[Manifest], bool] = lambda _manifest: False,
    ) -> None:
        self._manifests = manifests
        self._roots = roots
        self._by_blob_id = by_blob_id
        self.index_s = index_s
        self._blobs: dict[str, Blob] = {}
        self._at = -1e9
        self._lock = asyncio.Lock()

    def _build(self) -> dict[str, Blob]:
        blobs: dict[str, Blob] = {}
        for manifest in self._manifests():
            if manifest.removing:
                continue
            dest = Path(manifest.dest)
            by_blob_id = self._by_blob_id(manifest)
            for f in manifest.files:
                for digest in (f.sha256, f.git_sha1 if by_blob_id else None):
                    if digest and blob_algorithm(digest):
                        blobs[digest] = Blob(dest / f.path, f.size, f.mtime_ns)
        return blobs

    async def find(self, digest: str) -> Blob | None:
        """The file holding ``digest``, or None."""
        async with self._lock:
            age = time.monotonic() - self._at
            if age > self.index_s or (digest not in self._blobs and age > 1.0):
                self._blobs = await asyncio.to_thread(self._build)
                self._at = time.monotonic()
            return self._blobs.get(digest)

    def roots(self) -> list[Path]:
        """The models roots now (what every served file must be inside)."""
        return self._roots()

    def open(self, blob: Blob) -> int | None:
        """A descriptor of ``blob`` when it is inside a models root and unchanged; None otherwise."""
        real = Path(os.path.realpath(blob.path))
        if real != blob.path or not any(root in real.parents for root in self._roots()):
            return None
        try:
            fd = os.open(blob.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        st = os.fstat(fd)
        if st.st_size != blob.size or (blob.mtime_ns and st.st_mtime_ns != blob.mtime_ns) or not _regular(st.st_mode):
            os.close(fd)
            return None
        return fd


def _regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


class UploadPacer:
    """A token bucket of ``rate`` bytes/s shared by every answer (burst: one second's worth); 0: no pacing.

    Beside the bucket (the hard cap), each answer's socket is paced by the kernel at its share of the rate
    (``SO_MAX_PACING_RATE``: the rate over the answers sending now), so the bytes leave as an even stream
    instead of a second's burst of 1 MiB writes: on a link with a short queue a burst overflows it and
    the drops slow this node's own download on the same link (its ACKs wait behind the burst) as much as
    the answer.
    """

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.answers = 0  # answers sending a body now, not waiting for a relayed file's bytes (they share the rate)
        self._tokens = rate
        self._at = time.monotonic()
        self._lock = asyncio.Lock()

    def share(self) -> int:
        """Bytes/s each answer's socket is paced at now (0: not paced)."""
        if self.rate <= 0:
            return 0
        return max(1, min(int(self.rate / max(1, self.answers)), _PACING_MAX))

    @staticmethod
    def pace(sock: object, rate: int) -> bool:
        """Set the kernel's pacing of ``sock`` to ``rate`` bytes/s; False where the kernel cannot."""
        setsockopt = getattr(sock, "setsockopt", None)
        if setsockopt is None:
            return False
        try:
            setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, rate)
        except OSError:
            return False
        return True

    async def take(self, n: int) -> None:
        """Wait until ``n`` bytes may be sent."""
        if self.rate <= 0:
            return
        async with self._lock:  # FIFO: one waiter at a time draws from the bucket
            while True:
                now = time.monotonic()
                self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= min(n, self.rate):
                    self._tokens -= n  # may go negative for n > rate: the debt is paid by waiting below
                    return
                await asyncio.sleep((min(n, self.rate) - self._tokens) / self.rate)


def feed_wait(header: str | None) -> float:
    """How long a probe asked to be held for a file being fetched here to get a source (``X-Peer-Wait``, seconds),
    within ``[0, MAX_FEED_WAIT_S]``; 0 for anything else."""
    try:
        wait = float(header or 0)
    except ValueError:
        return 0.0
    return min(wait, MAX_FEED_WAIT_S) if wait > 0 else 0.0  # (NaN compares False: 0)


def parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """``(start, end_exclusive)`` of a ``Range`` header; None for the whole file; "unsatisfiable" for 416."""
    if not header:
        return None
    m = _RANGE.match(header.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        return None  # a form we do not serve (several ranges): the whole file, as RFC 9110 allows
    if not m.group(1):
        n = int(m.group(2))
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - n), size
    start = int(m.group(1))
    end = min(int(m.group(2)) + 1, size) if m.group(2) else size
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, end


@dataclass(eq=False)
class PeerServer:
    """The aiohttp application and its listener (see the module contract)."""

    index: BlobIndex
    reviewer: TokenReviewer
    _: KW_ONLY
    host: str
    port: int
    upload_rate: InitVar[float] = 0.0
    max_per_peer: int = 32
    on_upload: Callable[[int], None] = lambda _n: None
    on_answer: Callable[[str, int], None] = lambda _method, _code: None  # (method, status) of every answer
    on_refused: Callable[[str], None] = lambda _why: None  # a connection the listener closed at a limit (why)
    relays: Relays | None = None
    downstreams_per_file: int = 1
    relay_poll_s: float = RELAY_POLL_S
    relay_wait_s: float = RELAY_WAIT_S
    pacer: UploadPacer = field(init=False)
    downstreams: Downstreams = field(init=False)
    _inflight: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _runner: web.AppRunner | None = field(default=None, init=False, repr=False)
    _gate: Gate | None = field(default=None, init=False, repr=False)
    uploaded: int = field(default=0, init=False)

    def __post_init__(self, upload_rate: float) -> None:
        """The pacer of all answers together, at ``upload_rate`` bytes/s."""
        self.pacer = UploadPacer(upload_rate)
        self.downstreams = Downstreams(self.downstreams_per_file)

    def app(self) -> web.Application:
        """The routes: the blob endpoint only."""
        app = web.Application()
        app.router.add_get("/blobs/{algorithm}/{digest}", self._blob)  # HEAD too (allow_head)
        return app

    async def start(self) -> None:
        """Listen on ``host:port`` (port 0: any; the bound port is then in ``self.port``)."""
        self._runner, self.port, self._gate = await serve(
            self.app(), self.host, self.port, PEER_LIMITS, name="peer", on_refused=self.on_refused
        )
        log.info("peer server listening", host=self.host, port=self.port)

    async def stop(self) -> None:
        """Stop listening and end the answers in flight."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _blob(self, req: web.Request) -> web.StreamResponse:
        peer = req.remote or "?"
        if self._inflight.get(peer, 0) >= self.max_per_peer:
            self.on_answer(req.method, 429)
            return web.Response(status=429, headers={"Retry-After": "1"}, text="too many requests from this peer\n")
        self._inflight[peer] = self._inflight.get(peer, 0) + 1
        status = 500
        try:
            resp = await self._answer(req)
            status = resp.status
            return resp
        finally:
            self.on_answer(req.method, status)
            left = self._inflight[peer] - 1
            if left:
                self._inflight[peer] = left
            else:
                del self._inflight[peer]

    async def _answer(self, req: web.Request) -> web.StreamResponse:
        verdict = await self.reviewer.check(req.headers.get("Authorization"), req.remote)
        if not verdict.admitted:
            headers = {"WWW-Authenticate": "Bearer"} if verdict.status == 401 else {}
            refused = web.Response(status=verdict.status, headers=headers, text=verdict.why + "\n")
            if self._gate is not None and self._gate.refused_request(req.remote or "?"):
                refused.force_close()  # its refusal budget is spent: this connection ends with the answer
            return refused
        digest = req.match_info["digest"]
        if blob_algorithm(digest) != req.match_info["algorithm"]:
            return web.Response(status=404, text="not a sha256 or git-sha1 digest\n")
        blob = await self.index.find(digest)
        relay = self.relays.find(digest) if blob is None and self.relays is not None else None
        if blob is None and relay is None and self.relays is not None and req.method == "HEAD":
            wait = feed_wait(req.headers.get(WAIT_HEADER))
            if wait:
                relay = await self.relays.until_fed(digest, wait)
                if req.transport is None or req.transport.is_closing():
                    return web.Response(status=404, text="gone\n")  # (the prober stopped waiting: no place taken)
        chain: tuple[str, ...] = ()
        if blob is not None:
            fd = await asyncio.to_thread(self.index.open, blob)
            size = blob.size
        elif relay is not None and relay.upstream is not None:
            fd = (
                os.dup(relay.fd)  # a verified file whose fetch ended: the descriptor opened in the staging
                if relay.fd is not None
                else await asyncio.to_thread(open_confined, relay.path, relay.size, self.index.roots())
            )
            size, chain = relay.size, relay.upstream
        else:
            fd = None
        if fd is None:
            return web.Response(status=404, text="not held here\n")
        who = req.headers.get(FROM_HEADER) or req.remote or "?"
        try:
            if not self.downstreams.admit(digest, who):
                return web.Response(status=429, headers={"Retry-After": "1"}, text="this file has its downstreams\n")
            try:
                return await self._send(req, digest, fd, size, chain, relay)
            finally:
                self.downstreams.release(digest, who)
        finally:
            os.close(fd)

    async def _send(
        self, req: web.Request, digest: str, fd: int, size: int, chain: tuple[str, ...], relay: Relay | None
    ) -> web.StreamResponse:
        wanted = parse_range(req.headers.get("Range"), size)
        if wanted == "unsatisfiable":
            return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
        start, end = wanted if isinstance(wanted, tuple) else (0, size)
        resp = web.StreamResponse(status=206 if isinstance(wanted, tuple) else 200)
        resp.content_length = end - start
        resp.content_type = "application/octet-stream"
        resp.headers["Accept-Ranges"] = "bytes"
        resp.headers["ETag"] = f'"{digest}"'
        resp.headers[PATH_HEADER] = ",".join(chain)
        if isinstance(wanted, tuple):
            resp.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        try:
            await resp.prepare(req)
        except ConnectionError:
            return resp  # the client went away: nothing more to send (aiohttp notes it and closes the connection)
        if req.method == "HEAD":
            return resp
        self.pacer.answers += 1
        try:
            # Wrapping an open descriptor does no I/O (one fstat); the caller closes fd.
            with open(fd, "rb", buffering=0, closefd=False) as file:  # noqa: ASYNC230
                offset = await self._send_body(req, resp, file, start, end, relay)
        finally:
            self.pacer.answers -= 1
        if offset < end:  # ended short: close the connection, so the client sees it at once and resumes
            if req.transport is not None:
                req.transport.close()
            return resp
        await resp.write_eof()
        return resp

    async def _send_body(
        self, req: web.Request, resp: web.StreamResponse, file: BinaryIO, start: int, end: int, relay: Relay | None
    ) -> int:
        """Bytes ``[start, end)`` of ``file`` onto the answer's connection, paced; returns where it stopped (``end``:
        all)."""
        view = DurableView(relay) if relay is not None else None
        sock = req.transport.get_extra_info("socket") if req.transport is not None else None
        paced_at = 0
        offset = start
        waited_since = batch_since = time.monotonic()
        while offset < end:
            n = min(CHUNK, end - offset)
            if view is not None and relay is not None:
                if self.relays is None or not self.relays.live(relay):
                    break  # the file failed or is being deleted: not one more byte of it
                before = (view.durable_parts, relay.written.total)
                # (a batch's worth written from here: sent without a look at the map on disk, a stat per wake-up)
                durable = relay.servable_end(view, offset, enough=min(n, RELAY_BATCH))
                now = time.monotonic()
                if (view.durable_parts, relay.written.total) != before:
                    waited_since = now  # the fetch goes on (perhaps short of this offset yet)
                # Bytes a write just brought are sent once RELAY_BATCH of them are there or RELAY_BATCH_S has passed:
                # sending each few KiB a receive wrote cost more CPU than the relaying itself.
                short = durable - offset < min(n, RELAY_BATCH) and now - batch_since < RELAY_BATCH_S
                if durable <= offset or short:
                    if durable <= offset and now - waited_since > self.relay_wait_s:
                        break
                    # Waiting for bytes, this answer sends nothing: its share goes to the answers that do meanwhile.
                    self.pacer.answers -= 1
                    try:
                        wait = self.relay_poll_s if durable <= offset else RELAY_BATCH_S - (now - batch_since)
                        await relay.changed(wait)  # the next write, or a look at the map on disk
                    finally:
                        self.pacer.answers += 1
                    continue
                n = min(n, durable - offset)
            share = self.pacer.share()
            if share != paced_at and sock is not None and self.pacer.pace(sock, share):
                paced_at = share  # the answers sending now changed: this socket's share with them
            await self.pacer.take(n)
            sent = await _send_file(req, resp, file, offset, n)
            if not sent:
                break  # truncated under us (the peer's size check and verification catch it), or the client left
            offset += sent
            waited_since = batch_since = time.monotonic()
            self.uploaded += sent
            self.on_upload(sent)
        return offset


async def _send_file(req: web.Request, resp: web.StreamResponse, file: BinaryIO, offset: int, n: int) -> int:
    """Bytes ``[offset, offset + n)`` of ``file`` onto the answer's connection; the count sent, fewer at the file's
    end, 0 when the client has gone (not an error: the answer just ends short).

    By ``sendfile(2)`` from the event loop: the kernel moves the bytes from the page cache, with no thread hop and no
    copy through Python (docs/performance.md 15). Where it cannot (a file system without it, or a transport that is
    not a plain socket), the piece is read in a thread and written, as before: asyncio's own fallback would read it
    16 KiB per thread hop.
    """
    transport = req.transport
    if transport is None or transport.is_closing():
        return 0
    try:
        return await asyncio.get_running_loop().sendfile(transport, file, offset, n, fallback=False)
    except ConnectionError:
        return 0
    except RuntimeError:  # no sendfile(2) for this file or transport (SendfileNotAvailableError), or it closed
        if transport.is_closing():
            return 0
    try:
        data = await asyncio.to_thread(os.pread, file.fileno(), n, offset)
        await resp.write(data)
    except ConnectionError:
        return 0
    return len(data)
