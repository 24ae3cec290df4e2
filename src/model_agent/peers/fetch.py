"""The fetch side: one file from a peer through the transfer engine, verified against the origin's digest.

:meth:`PeerFetcher.fetch` is the hook a source calls before it goes to the origin for a file whose digest the
origin's listing gave (an LFS file's sha256, or a small file's git blob sha1: :func:`~.relay.blob_algorithm`). It
asks the holders of the source (:mod:`.directory`): the nodes Ready for it, and the nodes still fetching it, which
relay the durable parts of their files (:mod:`.relay`), in the order :func:`~.relay.order_candidates` gives (Ready
copies first, then the nearest fetching node before this one, so the fleet lines up in chains). Each candidate is
first probed (``HEAD``: it answers only when it has the file and a free downstream place for it, and names the chain
it gets it through; one whose chain contains this node is skipped: no cycles); the file is then one
``engine.download`` of ``http://<peer>/blobs/<algorithm>/<digest>`` with the peer token as the only credential and
``Expected(size, {algorithm: digest})`` from the origin's listing.

Contract:

* Returns the engine's :class:`~model_agent.transfer.Downloaded` when a peer's bytes verified, else None: the
  caller then fetches from the origin as it always did, so peers can only ever save origin traffic. A fetch that
  skipped the origin-slot queue for peers (:data:`~model_agent.peers.seeding.ORIGIN_GATE` set) returns None only
  once it holds the origin slot and a round of every kind of holder gave nothing: until then it waits for the slot
  through the gate and asks the peers again every ``retry_s``; while some holder answers that it has the file but
  serves another node (429), it does not even ask for the slot (for at most ``busy_s``): the fleet has the bytes.
  Without a gate (the fetch holds its slot, or no slots at all) one round of the Ready holders decides.
* ``VerificationFailed`` bans the peer when it alone sent the file's bytes (:mod:`.bans`); the engine has deleted
  the file, so the next attempt starts clean and is again a single peer's, and this node serves nothing of it until
  then. Any other failure (a peer stalled, went away, refused) keeps the partial file and its part map: the next
  holder resumes the parts not yet recorded, and this node goes on serving what it has meanwhile (under the chain
  it had), so its own downstream waits for the next bytes instead of giving up on it too.
  Before returning None the partial file and its map are removed, so the origin starts clean as before.
* While a peer feeds the file, this node relays it (``relay``, registered by the source) as its bytes land (the
  engine's ``on_written``): the chain above it is the holder's plus the holder.
* Cancellation is never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import structlog

from model_agent.model.errors import SourceError
from model_agent.peers.bans import Bans
from model_agent.peers.directory import PeerDirectory
from model_agent.peers.relay import (
    FROM_HEADER,
    PATH_HEADER,
    WAIT_HEADER,
    Relay,
    Relays,
    blob_checks,
    blob_path,
    chain_of,
    order_candidates,
)
from model_agent.peers.seeding import ORIGIN_GATE, OriginGate
from model_agent.transfer import Downloaded, Expected, RangedConfig, engine_session

if TYPE_CHECKING:
    from model_agent.local.capacity import Reservation
    from model_agent.transfer import RangedDownloader

log = structlog.get_logger(__name__)


PROBE_TIMEOUT_S = 3.0  # beyond the time a probe asked to be held (X-Peer-Wait)
RETRY_S = 0.25  # between rounds of candidates while waiting for the origin slot
# Between rounds that found no holder, the nearest node fetching the file is asked to hold the probe until it has a
# source (X-Peer-Wait), for at most this long: the next node of a chain follows the moment its upstream is fed, and
# a fleet waiting for its seed probes a few times a second instead of twenty (measured: docs/performance.md 14).
FEED_WAIT_S = 1.0
PROBES_PER_ROUND = 5  # candidates probed per round: the nearest ones, plus a rotating few of the others
NEAREST = 3
BUSY = 429  # a holder's answer when it has the file and serves its downstreams already
# Part requests of one file in flight to its holder: the part the holder is writing and the next, ready at once. A
# holder still fetching has nothing beyond its frontier yet, so more would only hold slots of the fetch's shared
# engine session waiting while another file of the fetch has none (measured: the files started two at a time, half
# the rate for the first parts at every hop of a chain).
PARTS_AT_ONCE = 2
BUSY_S = 60.0  # holders busy for this long: the origin slot decides again (the fetch must not starve)


def peer_ranged(base: RangedConfig, relay_part_size: int = 0) -> RangedConfig:
    """The engine tuning for peers: a dead or slow peer is given up quickly, the next one is there; parts of
    ``relay_part_size`` (when set), the unit this node relays in."""
    return dataclasses.replace(
        base,
        part_size=relay_part_size or base.part_size,
        max_attempts=min(base.max_attempts, 3),
        backoff_cap_s=min(base.backoff_cap_s, 2.0),
        retry_after_cap_s=min(base.retry_after_cap_s, 5.0),
        connect_timeout_s=min(base.connect_timeout_s, 5.0),
        read_timeout_s=min(base.read_timeout_s, 30.0),
    )


class PeerFetcher:
    """Peer-first fetching of verified files (see the module contract)."""

    def __init__(
        self,
        directory: PeerDirectory,
        bans: Bans,
        token: Callable[[], str],
        *,
        ranged: RangedConfig | None = None,
        on_peer_bytes: Callable[[int], None] = lambda _n: None,
        relays: Relays | None = None,
        me: Callable[[], str] = lambda: "",
        relay_part_size: int = 0,
        retry_s: float = RETRY_S,
        busy_s: float = BUSY_S,
        feed_wait_s: float = FEED_WAIT_S,
    ) -> None:
        self.directory = directory
        self.bans = bans
        self.token = token
        self.ranged = peer_ranged(ranged or RangedConfig(), relay_part_size)
        self.on_peer_bytes = on_peer_bytes
        self.relays = relays if relays is not None else Relays()
        self.relay_part_size = relay_part_size
        self.me = me
        self.retry_s = retry_s
        self.busy_s = busy_s
        self.feed_wait_s = feed_wait_s
        self._turn = itertools.count(random.randrange(1 << 16))  # nodes start at different peers
        self._probes: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def session(self, files_at_once: int = 1) -> AsyncIterator[RangedDownloader]:
        """An engine session tuned for peers, for the files of one fetch, ``files_at_once`` of them at a time: with
        a slot for each part request every one of them may have in flight (:data:`PARTS_AT_ONCE`). Fewer, and the
        largest files' requests, waiting at a holder for its next bytes, hold every slot while the small files
        wait for one; their holders' places lapse meanwhile (measured: config files taken from peers 8-11 s after
        the fetch began, with a slot for each: docs/performance.md 14)."""
        slots = max(self.ranged.concurrency, files_at_once * PARTS_AT_ONCE)
        # Never through a proxy: a peer is a node of this cluster, and the request carries the peer token.
        tuned = dataclasses.replace(self.ranged, concurrency=slots, use_proxy=False)
        async with engine_session(tuned) as engine:
            try:
                yield engine
            finally:
                if self._probes is not None:
                    probes, self._probes = self._probes, None
                    await probes.close()

    def relay_ranged(self, base: RangedConfig) -> RangedConfig:
        """``base`` in parts of at most the relay part size: what an origin fetch that other nodes relay uses."""
        if not self.relay_part_size or base.part_size <= self.relay_part_size:
            return base
        return dataclasses.replace(base, part_size=self.relay_part_size)

    async def candidates(
        self, uri: str, turn: int | None = None, *, relaying: bool = False, round_: int = 0
    ) -> list[str]:
        """Non-banned holders of ``uri`` to probe this round (see :func:`~model_agent.peers.relay.order_candidates`):
        Ready ones rotated by ``turn`` (the next file's turn when None); ``relaying``: nodes still fetching it too,
        at most :data:`PROBES_PER_ROUND` of them (the nearest, plus others in turn by ``round_``)."""
        return (await self._round(uri, turn, relaying=relaying, round_=round_))[0]

    async def _round(self, uri: str, turn: int | None, *, relaying: bool, round_: int) -> tuple[list[str], str | None]:
        """:meth:`candidates`, and the first of them that is fetching the source rather than Ready for it: the node
        this one follows in the chain."""
        if turn is None:
            turn = next(self._turn)
        ready = await self.directory.holders(uri)
        fetching = await self.directory.relaying(uri) if relaying else []
        order = [a for a in order_candidates(ready, fetching, self.me(), turn) if not self.bans.banned(a)]
        nearest = next((a for a in order if a not in ready), None)
        if len(order) <= PROBES_PER_ROUND or not relaying:
            return order, nearest
        rest = order[NEAREST:]
        at = (round_ * (PROBES_PER_ROUND - NEAREST)) % len(rest)
        return order[:NEAREST] + (rest[at:] + rest[:at])[: PROBES_PER_ROUND - NEAREST], nearest

    async def probe(self, address: str, digest: str, token: str, *, wait: float = 0.0) -> tuple[str, ...] | int:
        """The chain ``address`` gets ``digest`` through, when it can serve this node now; else the HTTP status
        (429: it has the file and serves another node; 0: no answer). ``wait``: ask ``address`` to hold the answer
        that long for the file, if it is fetching it, to get a source."""
        if self._probes is None:
            self._probes = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {token}", FROM_HEADER: self.me()}
        if wait > 0:
            headers[WAIT_HEADER] = f"{wait:g}"
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S + wait)
        try:
            async with self._probes.head(
                f"http://{address}{blob_path(digest)}", headers=headers, timeout=timeout
            ) as resp:
                if resp.status not in (200, 206):
                    return resp.status
                return chain_of(resp.headers.get(PATH_HEADER))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("peer probe failed", peer=address, error=str(exc)[:200])
            return 0

    async def fetch(
        self,
        engine: RangedDownloader,
        uri: str,
        digest: str,
        size: int,
        path: Path,
        *,
        state_path: Path,
        label: str,
        on_bytes: Callable[[int], None] | None = None,
        reservation: Reservation | None = None,
        relay: Relay | None = None,
    ) -> Downloaded | None:
        """``path`` from a peer, verified against ``digest`` (the origin's); None when no peer could give it."""
        token = self.token()
        if not token:
            return None
        gate = ORIGIN_GATE.get()
        turn = next(self._turn)
        file = _File(digest, size, path, state_path, label, on_bytes, reservation, relay)
        started = time.monotonic()
        busy_since: float | None = None
        for round_ in itertools.count():
            holding = gate is None or gate.won()  # the origin is open to this fetch
            # Holding the slot, only Ready copies are worth asking (as a fetch that queued for its slot does): a
            # node still fetching has at most what this one would fetch from the origin anyway.
            candidates, nearest = await self._round(uri, turn, relaying=not holding, round_=round_)
            busy = False
            for address in candidates:
                got = await self._attempt(engine, address, file)
                if isinstance(got, Downloaded):
                    if gate is not None:
                        await gate.abandon()
                    self.on_peer_bytes(got.fetched_bytes)
                    log.info(
                        "file taken from a peer", peer=address, file=label, bytes=got.fetched_bytes, probes=file.probes
                    )
                    return got
                busy = busy or got == BUSY
            if gate is None:
                break  # (no gate: one round of the Ready holders, as a fetch holding its slot always did)
            now = time.monotonic()
            busy_since = (busy_since or now) if busy else None
            if busy_since is not None and now - busy_since < self.busy_s:
                # A holder has the file and serves another node: the chain grows, this node finds its end (a node
                # fetching it with a free place) in a round or two. The origin is not asked meanwhile, even with
                # the slot: it would fetch what the fleet already has.
                await gate.abandon()
                await self._pause(None, nearest, file.digest)
                continue
            if holding:
                break
            if round_ == 0:
                log.info(
                    "no peer gives the file yet; asking for the origin slot meanwhile",
                    file=label,
                    asked=len(candidates),
                    after_s=round(time.monotonic() - started, 2),
                )
            if await self._pause(gate, nearest, file.digest):  # the slot, or the next round
                log.info(
                    "origin slot taken: peers could not give the file",
                    file=label,
                    rounds=round_ + 1,
                    probes=file.probes,
                )
                break  # (this round's peers were just asked: not once more before the origin)
        file.discard()
        return None

    async def _pause(self, gate: OriginGate | None, nearest: str | None, digest: str) -> bool:
        """The pause before the next round: wait for the origin slot (``gate``; None: not now, holders are busy
        serving the file), and meanwhile ask ``nearest`` to hold a probe until it has a source for ``digest``;
        whether the slot is this fetch's now. The pause ends when the slot is won, when ``nearest`` can serve the
        file (the next round asks it first), or after ``retry_s`` otherwise (at most ``feed_wait_s`` while
        ``nearest`` holds the probe)."""

        async def slot_wait(timeout: float) -> bool:
            if gate is not None:
                return await gate.wait(timeout)
            await asyncio.sleep(timeout)
            return False

        token = self.token()
        if nearest is None or self.feed_wait_s <= 0 or not token:
            return await slot_wait(self.retry_s)
        started = time.monotonic()
        slot = asyncio.ensure_future(slot_wait(self.feed_wait_s))
        fed = asyncio.ensure_future(self.probe(nearest, digest, token, wait=self.feed_wait_s))
        try:
            await asyncio.wait({slot, fed}, return_when=asyncio.FIRST_COMPLETED)
            if not slot.done() and not isinstance(fed.result(), tuple):
                # answered without waiting (it is not fetching the file, or serves another node): pace as before
                await asyncio.wait({slot}, timeout=max(0.0, self.retry_s - (time.monotonic() - started)))
            if slot.done():
                return slot.result()
            return gate is not None and gate.won()  # (won meanwhile, or the next round at once)
        finally:
            slot.cancel()  # (an acquisition under way goes on: gate.wait only stops waiting for it)
            fed.cancel()
            await asyncio.gather(slot, fed, return_exceptions=True)

    async def _attempt(self, engine: RangedDownloader, address: str, file: _File) -> Downloaded | int | None:
        """One holder: probe, then download (resuming what earlier holders gave); :data:`BUSY` when it has the
        file but serves another node, None when it did not work."""
        me = self.me()
        token = self.token()
        if not token:
            return None
        file.probes += 1
        chain = await self.probe(address, file.digest, token)
        if isinstance(chain, int):
            return BUSY if chain == BUSY else None
        if me and me in chain:
            return None
        if file.relay is not None:
            self.relays.fed_by(file.relay, (address, *chain))
        before = file.written
        try:
            return await engine.download(
                f"http://{address}{blob_path(file.digest)}",
                file.path,
                Expected(file.size, blob_checks(file.digest)),
                headers={"Authorization": f"Bearer {token}", FROM_HEADER: me},
                state_path=file.state_path,
                label=f"{file.label} (peer {address})",
                on_bytes=file.counted,
                reservation=file.reservation,
                on_written=file.relay.writer() if file.relay is not None else None,
                parts_at_once=PARTS_AT_ONCE,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any peer failure: the next peer, finally the origin
            if file.written > before:
                file.senders.add(address)
            if isinstance(exc, SourceError) and exc.reason == "VerificationFailed":
                if file.relay is not None:
                    self.relays.fed_by(file.relay, None)  # the file is gone: nothing of it is served until refetched
                if file.senders <= {address}:
                    log.warning("peer served bytes that failed verification; banned", peer=address, file=file.label)
                    self.bans.ban(address)
                else:
                    log.warning("bytes of several peers failed verification; fetching again", file=file.label)
                file.discard()  # (the engine deleted the file and its map: the next attempt is one peer's again)
            else:
                why = exc.reason if isinstance(exc, SourceError) else type(exc).__name__
                log.info(
                    "peer could not serve the file; the next resumes it",
                    peer=address,
                    file=file.label,
                    why=why,
                    detail=str(exc)[:300],
                )
            return None


@dataclasses.dataclass
class _File:
    """One file being asked from peers, across attempts: the bytes written so far and who sent them."""

    digest: str
    size: int
    path: Path
    state_path: Path
    label: str
    on_bytes: Callable[[int], None] | None
    reservation: Reservation | None
    relay: Relay | None
    written: int = 0
    probes: int = 0  # holders probed for it so far (the log says how much asking a file cost)
    senders: set[str] = dataclasses.field(default_factory=set)  # peers whose bytes are in the partial file

    def counted(self, n: int) -> None:
        """Progress of an attempt."""
        self.written += n
        if self.on_bytes is not None:
            self.on_bytes(n)

    def discard(self) -> None:
        """Remove the partial file and its part map; take back the progress reported for it."""
        if self.relay is not None:
            self.relay.forget()
        _discard(self.path, self.state_path, self.written, self.on_bytes)
        self.written = 0
        self.senders.clear()


def _discard(path: Path, state_path: Path, written: int, on_bytes: Callable[[int], None] | None) -> None:
    """Remove a failed attempt's partial file and part map; take back the progress it reported."""
    if written and on_bytes is not None:
        on_bytes(-written)
    for p in (path, state_path):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
