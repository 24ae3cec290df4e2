"""Relaying: files still being fetched on this node are served by their durable parts, one downstream per file.

Role: what lets a fleet fetch in about one model time instead of N: every node serves a file while it fetches
it, so the fleet forms chains (the seed gives each file to one node, which gives it to the next, ...) instead of
every node waiting for the seed's copy and sharing its upload. Three pieces, no I/O but the part map's:

* :class:`Relays`: the files this node is fetching that may be served, by digest (:func:`blob_algorithm`). A
  source registers a file (:meth:`Relays.scope`) only when the digest came from the origin's own listing, the same
  rule as for Ready
  files; an entry is servable only once it has a source (``upstream`` set: the origin, or a peer chain), so a
  node that has not started a file never makes another wait for it; an entry that failed (the engine deleted a
  file whose bytes did not verify) is gone at once and stops answers in flight. A file whose fetch verified and
  whose fetch ended well stays servable for ``linger_s`` more, from a descriptor opened while it was still in the
  staging (checked inside the models roots), so a downstream behind it is not cut off in the moment between the
  end of the fetch and the published copy being in the server's index (which is asked first); it is closed then,
  or as soon as another fetch of the same digest starts here.
* What may be served of a file: the ranges its fetch has written into it in this attempt (:class:`WrittenRanges`,
  fed by the engine's ``on_written`` as the bytes land, so a chain's hop costs about one write of a buffer, not
  a part and its fdatasync), and the parts its part map records (:func:`durable_end` / :class:`DurableView`:
  what a resumed file already held). Bytes merely written are not durable, and need not be: what a downstream
  gets it verifies itself against the origin's digest, whatever this node did with them; what they must be is
  present, so every range is forgotten when its file may have been replaced (a new attempt, a failed one).
  Answers waiting for bytes are woken by each write (:meth:`Relay.changed`) and look at the map on disk at
  least every poll interval.
* A probe may wait for a file this node is fetching but has no source for yet (:meth:`Relays.until_fed`): the
  node asking is usually the next in the chain, and hears the moment this node is fed instead of asking again.
* :class:`Downstreams`: at most ``cap`` downstream nodes per file at once (429 beyond), a node's claim kept
  for ``grace_s`` after its last request so its next part request finds its place still free.

Chains have no cycles: each entry carries the chain of addresses above it (``upstream``, sent to a prober as
``X-Peer-Path``) and a node never picks a holder whose chain contains itself (:func:`order_candidates` and
:mod:`.fetch`). The chain is a peer's word used for routing only; every byte is still verified against the
origin's digest.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from model_agent.transfer.partmap import PartMap

LINGER_S = 10.0  # a verified file stays servable this long after its fetch ended (until the published copy is)
PATH_HEADER = "X-Peer-Path"  # the chain above the holder, comma separated ("" for the origin or a Ready copy)
FROM_HEADER = "X-Peer-From"  # the downstream's advertised address (its identity for the per-file cap)
WAIT_HEADER = "X-Peer-Wait"  # seconds a probe may be held for a file the holder fetches to get a source
# What peers serve and ask a file by: the digest the origin's listing gave, whose length names its algorithm. An LFS
# file's sha256 (64 hex); else a git blob's sha1 (40 hex): a hub lists no sha256 for its small files.
BLOB_ALGORITHMS = {64: "sha256", 40: "git-sha1"}
_HEX = re.compile(r"^[0-9a-f]+$")


def blob_algorithm(digest: str) -> str | None:
    """The algorithm of ``digest`` (by its length), or None when peers serve nothing by it."""
    return BLOB_ALGORITHMS.get(len(digest)) if _HEX.match(digest) else None


def blob_checks(digest: str) -> dict[str, str]:
    """What a file of ``digest`` is verified against: ``{algorithm: digest}`` (ValueError: no digest peers serve by)."""
    algorithm = blob_algorithm(digest)
    if algorithm is None:
        raise ValueError(f"not a digest peers serve by: {digest[:80]!r}")
    return {algorithm: digest}


def blob_path(digest: str) -> str:
    """Where a peer serves ``digest``: ``/blobs/<algorithm>/<digest>``."""
    ((algorithm, _),) = blob_checks(digest).items()
    return f"/blobs/{algorithm}/{digest}"


@dataclass
class Relay:
    """A file being fetched here: where it is, its part map, and the chain it comes through."""

    digest: str  # the origin's, which names its algorithm (:func:`blob_algorithm`)
    path: Path
    state_path: Path
    size: int
    upstream: tuple[str, ...] | None = None  # None: no source yet (not servable); (): the origin
    failed: bool = False
    verified: bool = False  # the engine verified the file (set by the source)
    fd: int | None = None  # once its fetch ended: the verified file, read from here until ``until``
    until: float = 0.0
    written: WrittenRanges = field(default_factory=lambda: WrittenRanges())
    _changed: asyncio.Event | None = field(default=None, repr=False)

    @property
    def servable(self) -> bool:
        """Whether it may be served now."""
        return not self.failed and self.upstream is not None

    def writer(self) -> Callable[[int, int], None]:
        """The engine's ``on_written`` for a new attempt at the file (what earlier ones wrote is forgotten: the
        file may have been replaced)."""
        self.forget()

        def on_written(start: int, end: int) -> None:
            self.written.add(start, end)
            self.notify()

        return on_written

    def forget(self) -> None:
        """The file may no longer hold what was written to it (an attempt failed, the file was discarded)."""
        self.written.clear()
        self.notify()

    def notify(self) -> None:
        """Wake every answer waiting in :meth:`changed`."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def changed(self, timeout: float) -> None:
        """Return at the next write into the file, when it fails, or after ``timeout`` seconds."""
        if self._changed is None:
            self._changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):  # (no task per wait, unlike wait_for: this runs per relayed chunk)
                await self._changed.wait()

    def servable_end(self, view: DurableView, offset: int, enough: int = 0) -> int:
        """The end of the bytes from ``offset`` that may be served now (``offset``: none yet); when this attempt's
        writes already give ``enough`` bytes from there, the part map on disk is not looked at."""
        written = self.written.end_from(offset)
        if enough and written - offset >= enough:
            return written
        return max(view.durable_end(offset), written)


class WrittenRanges:
    """The byte ranges written into a file so far, kept sorted and merged (few: about one per part in flight)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.total = 0  # bytes ever added (grows while the fetch goes on: the relay's sign of progress)

    def add(self, start: int, end: int) -> None:
        """``[start, end)`` is in the file."""
        if end <= start:
            return
        self.total += end - start
        i = bisect.bisect_left(self._ends, start)  # the first range that ends at or after start: it may touch
        j = i
        while j < len(self._starts) and self._starts[j] <= end:
            start, end = min(start, self._starts[j]), max(end, self._ends[j])
            j += 1
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    def end_from(self, offset: int) -> int:
        """The end of the written range that holds ``offset``, else ``offset``."""
        i = bisect.bisect_right(self._starts, offset) - 1
        return self._ends[i] if i >= 0 and self._ends[i] > offset else offset

    def clear(self) -> None:
        self._starts.clear()
        self._ends.clear()


class Relays:
    """The registry of relayable files of this node, by digest (see the module contract)."""

    def __init__(self, roots: Callable[[], list[Path]] = list, *, linger_s: float = LINGER_S) -> None:
        self.roots = roots
        self.linger_s = linger_s
        self._by_digest: dict[str, Relay] = {}

    def find(self, digest: str, now: float | None = None) -> Relay | None:
        """The servable entry of ``digest``, or None."""
        relay = self._by_digest.get(digest)
        if relay is not None and relay.fd is not None and (time.monotonic() if now is None else now) > relay.until:
            self._drop(relay)
            return None
        return relay if relay is not None and relay.servable else None

    @staticmethod
    def live(relay: Relay) -> bool:
        """Whether answers in flight from ``relay`` may go on (checked before every chunk): it has not failed. A
        file whose fetch succeeded stays readable by them once unregistered (its bytes verified, its descriptor
        open), so a downstream one part behind finishes without a new request."""
        return not relay.failed

    @contextlib.contextmanager
    def scope(self) -> Iterator[RelayScope]:
        """The entries of one fetch: every entry it starts is dropped when the scope ends (and marked failed when
        it ends with an error: the staging may be cleaned up)."""
        scope = RelayScope(self)
        try:
            yield scope
        except BaseException:
            for relay in scope.entries:
                self.failed(relay)
            raise
        finally:
            for relay in scope.entries:
                if relay.failed or not relay.verified or not self._linger(relay):
                    self._drop(relay)

    def _linger(self, relay: Relay) -> bool:
        """Keep a verified file servable for ``linger_s`` from a descriptor opened now (still in the staging)."""
        if self.linger_s <= 0 or self._by_digest.get(relay.digest) is not relay:
            return False
        relay.fd = open_confined(relay.path, relay.size, self.roots())
        relay.until = time.monotonic() + self.linger_s
        return relay.fd is not None

    def fed_by(self, relay: Relay, upstream: tuple[str, ...] | None) -> None:
        """``relay`` now comes through ``upstream`` (``()``: the origin; None: from nowhere for now)."""
        if relay.failed:
            return
        if upstream is None:
            relay.forget()  # (an attempt failed: a file that failed verification is gone already)
        relay.upstream = upstream
        self._add(relay)
        if upstream is not None:
            relay.notify()  # (a probe waiting in :meth:`until_fed` answers now)

    async def until_fed(self, digest: str, timeout: float) -> Relay | None:
        """The servable entry of ``digest``, waiting at most ``timeout`` s for one this node is fetching to get a
        source; None at once when this node is not fetching ``digest`` (nothing to wait for), or when the wait ends
        without one."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.find(digest)
            if found is not None:
                return found
            pending = self._by_digest.get(digest)
            left = deadline - time.monotonic()
            if pending is None or pending.failed or left <= 0:
                return None
            await pending.changed(left)

    def failed(self, relay: Relay) -> None:
        """``relay``'s file is being deleted (it failed verification, or was given up): never served again."""
        relay.failed = True
        relay.forget()  # (and wakes the answers waiting for its bytes: they end now)
        self._drop(relay)

    @staticmethod
    def verified(relay: Relay) -> None:
        """The engine verified ``relay``'s file: it may linger once its fetch ends well."""
        relay.verified = True

    def close(self) -> None:
        """Drop every entry (the service stops)."""
        for relay in list(self._by_digest.values()):
            self._drop(relay)

    def _add(self, relay: Relay) -> None:
        old = self._by_digest.get(relay.digest)
        if old is None or not old.servable or relay.servable or old.fd is not None:
            if old is not None and old is not relay and old.fd is not None:
                self._drop(old)
            self._by_digest[relay.digest] = relay

    def _drop(self, relay: Relay) -> None:
        if self._by_digest.get(relay.digest) is relay:
            del self._by_digest[relay.digest]
        if relay.fd is not None:
            fd, relay.fd = relay.fd, None
            os.close(fd)

    def __len__(self) -> int:
        return len(self._by_digest)


@dataclass
class RelayScope:
    """Entries of one fetch (:meth:`Relays.scope`)."""

    relays: Relays
    entries: list[Relay] = field(default_factory=list)

    def start(self, digest: str, size: int, path: Path, state_path: Path) -> Relay:
        """Register a file about to be fetched (not servable until it is :meth:`Relays.fed_by` a source)."""
        relay = Relay(digest, path, state_path, size)
        self.entries.append(relay)
        self.relays._add(relay)
        return relay


def durable_end(state: PartMap | None, size: int, offset: int) -> int:
    """The end of the durable bytes that start at ``offset`` (``offset`` itself when the byte there is not)."""
    if state is None or state.size != size or offset >= size:
        return offset
    if state.complete:
        return size
    i = offset // state.part_size
    while i < state.parts and state.is_done(i):
        i += 1
    return max(offset, min(size, i * state.part_size))


class DurableView:
    """A relay's part map as on disk, re-read only when the map file was replaced (``os.replace`` each save)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self._stamp: tuple[int, int, int] | None = None
        self._state: PartMap | None = None
        self.durable_parts = 0  # parts the map on disk records (grows while the fetch goes on anywhere in the file)

    def durable_end(self, offset: int) -> int:
        """:func:`durable_end` of the map on disk now (a map once seen complete is final: the file verified)."""
        if self.relay.fd is not None:
            return self.relay.size if self.relay.verified else offset
        if self._state is not None and self._state.complete:
            return durable_end(self._state, self.relay.size, offset)
        try:
            st = os.stat(self.relay.state_path)
        except OSError:
            return offset  # no map (not started, or removed with a failed file): nothing is durable
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._state = PartMap.load(self.relay.state_path)
            self._stamp = stamp
            if self._state is not None:
                self.durable_parts = sum(1 for i in range(self._state.parts) if self._state.is_done(i))
        return durable_end(self._state, self.relay.size, offset)


def open_confined(path: Path, size: int, roots: list[Path]) -> int | None:
    """A read-only descriptor of ``path`` when it is a regular file of ``size`` bytes inside a models root."""
    real = Path(os.path.realpath(path))
    if real != path or not any(root in real.parents for root in roots):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_size != size or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd


@dataclass
class _Claim:
    inflight: int = 0
    last: float = 0.0


class Downstreams:
    """At most ``cap`` downstream nodes per file at once; a claim outlives its last request by ``grace_s``."""

    def __init__(self, cap: int = 1, grace_s: float = 3.0) -> None:
        self.cap = cap
        self.grace_s = grace_s
        self._claims: dict[str, dict[str, _Claim]] = {}
        self.refused = 0

    def admit(self, digest: str, who: str, now: float | None = None) -> bool:
        """Take (or renew) ``who``'s place for ``digest`` with one request in flight; False when all are taken."""
        at = time.monotonic() if now is None else now
        claims = self._claims.setdefault(digest, {})
        for other in [k for k, c in claims.items() if c.inflight == 0 and at - c.last > self.grace_s]:
            del claims[other]
        claim = claims.get(who)
        if claim is None:
            if self.cap > 0 and len(claims) >= self.cap:
                self.refused += 1
                return False
            claim = claims[who] = _Claim()
        claim.inflight += 1
        claim.last = at
        return True

    def release(self, digest: str, who: str, now: float | None = None) -> None:
        """One request of ``who`` for ``digest`` ended; its place is kept for ``grace_s``."""
        claim = self._claims.get(digest, {}).get(who)
        if claim is not None:
            claim.inflight = max(0, claim.inflight - 1)
            claim.last = time.monotonic() if now is None else now

    def holders(self, digest: str) -> list[str]:
        """Who holds a place for ``digest`` (for tests and the status)."""
        return sorted(self._claims.get(digest, {}))


def order_candidates(ready: list[str], relaying: list[str], me: str, turn: int) -> list[str]:
    """The holders to ask, in order: Ready copies first (rotated by ``turn``, so consecutive files start at
    different ones), then nodes still fetching, nearest before this node first in the ring of their addresses
    (sorted), so that with every node doing the same the fleet lines up in a chain. This node is never a
    candidate; a node both Ready and fetching counts as Ready."""
    ready = list(dict.fromkeys(a for a in ready if a != me))  # (the directory's order: sorted)
    rotated = ready[turn % len(ready) :] + ready[: turn % len(ready)] if ready else []
    fetching = sorted({a for a in relaying if a != me and a not in ready})
    ring = sorted({*fetching, me})
    at = ring.index(me)
    behind = [ring[(at - k) % len(ring)] for k in range(1, len(ring))]
    return rotated + behind


def chain_of(header: str | None) -> tuple[str, ...]:
    """The chain a holder announced (``X-Peer-Path``), as a tuple of addresses."""
    return tuple(a for a in (header or "").split(",") if a)
