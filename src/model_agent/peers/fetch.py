"""The fetch side: one file from a peer through the transfer engine, verified against the origin's digest.

:meth:`PeerFetcher.fetch` is the hook a source calls before it goes to the origin for a file whose sha256 the
origin's listing gave. It asks the holders of the source (:mod:`.directory`) in turn, starting at a
different one for every file (round robin) so the files of a model come from several peers at once; each
attempt is one ``engine.download`` of ``http://<peer>/blobs/sha256/<digest>`` with the peer token as the only
credential and ``Expected(size, {"sha256": digest})`` from the origin's listing.

Contract:

* Returns the engine's :class:`~model_agent.transfer.Downloaded` when a peer's bytes verified, else None (no
  holder, all banned or failing, no token, or the service off): the caller then fetches from the origin
  as it always did, so peers can only ever save origin traffic.
* ``VerificationFailed`` from a peer bans it (:mod:`.bans`); any other failure just moves on. After any
  failed attempt the partial file and its part map are removed, so the next peer (or the origin) starts
  clean and a later mismatch is never blamed on a peer that did not send those bytes.
* Cancellation is never swallowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from model_agent.model.errors import SourceError
from model_agent.peers.bans import Bans
from model_agent.peers.directory import PeerDirectory
from model_agent.transfer import Downloaded, Expected, RangedConfig, engine_session

if TYPE_CHECKING:
    from model_agent.local.capacity import Reservation
    from model_agent.transfer import RangedDownloader

log = structlog.get_logger(__name__)


def peer_ranged(base: RangedConfig) -> RangedConfig:
    """The engine tuning for peers: a dead or slow peer is given up quickly, the next one is there."""
    return dataclasses.replace(
        base,
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
    ) -> None:
        self.directory = directory
        self.bans = bans
        self.token = token
        self.ranged = peer_ranged(ranged or RangedConfig())
        self.on_peer_bytes = on_peer_bytes
        self._turn = itertools.count(random.randrange(1 << 16))  # nodes start at different peers

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[RangedDownloader]:
        """An engine session tuned for peers, for the files of one fetch."""
        async with engine_session(self.ranged) as engine:
            yield engine

    async def candidates(self, uri: str) -> list[str]:
        """Non-banned holders of ``uri``, rotated so that consecutive files start at different peers."""
        holders = [a for a in await self.directory.holders(uri) if not self.bans.banned(a)]
        if not holders:
            return []
        start = next(self._turn) % len(holders)
        return holders[start:] + holders[:start]

    async def fetch(
        self,
        engine: RangedDownloader,
        uri: str,
        sha256: str,
        size: int,
        path: Path,
        *,
        state_path: Path,
        label: str,
        on_bytes: Callable[[int], None] | None = None,
        reservation: Reservation | None = None,
    ) -> Downloaded | None:
        """``path`` from a peer, verified against ``sha256`` (the origin's); None when no peer could give it."""
        token = self.token()
        if not token:
            return None
        for address in await self.candidates(uri):
            url = f"http://{address}/blobs/sha256/{sha256}"
            written = [0]

            def counted(n: int, written: list[int] = written) -> None:
                written[0] += n
                if on_bytes is not None:
                    on_bytes(n)

            try:
                got = await engine.download(
                    url,
                    path,
                    Expected(size, {"sha256": sha256}),
                    headers={"Authorization": f"Bearer {token}"},
                    state_path=state_path,
                    label=f"{label} (peer {address})",
                    on_bytes=counted,
                    reservation=reservation,
                )
            except SourceError as exc:
                if exc.reason == "VerificationFailed":
                    log.warning("peer served bytes that failed verification; banned", peer=address, file=label)
                    self.bans.ban(address)
                else:
                    log.info("peer could not serve the file", peer=address, file=label, reason=exc.reason)
                _discard(path, state_path, written[0], on_bytes)
                continue
            except Exception as exc:  # any peer failure: the next peer, finally the origin
                log.info("peer fetch failed", peer=address, file=label, error=str(exc)[:200])
                _discard(path, state_path, written[0], on_bytes)
                continue
            self.on_peer_bytes(got.fetched_bytes)
            log.info("file taken from a peer", peer=address, file=label, bytes=got.fetched_bytes)
            return got
        return None


def _discard(path: Path, state_path: Path, written: int, on_bytes: Callable[[int], None] | None) -> None:
    """Remove a failed attempt's partial file and part map; take back the progress it reported."""
    if written and on_bytes is not None:
        on_bytes(-written)
    for p in (path, state_path):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
