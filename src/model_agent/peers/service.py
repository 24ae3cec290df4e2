"""One agent's peer distribution, assembled: server, token checks, directory, bans and the fetch hook.

Role: what :mod:`model_agent.agent.wiring` builds when the peer service is on, and what the runtime runs
(:meth:`PeerService.run`: listen, advertise this node's address on its status ConfigMap, serve until cancelled,
then stop listening; the annotation is left, since a peer that cannot connect just moves on to the next).
:meth:`PeerService.status` is the ``peers`` part of ``/status``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.local.manifest import Manifest
from model_agent.ops.metrics import Metrics
from model_agent.peers import PeerConfig
from model_agent.peers.auth import TokenFile, TokenReviewer, review_budget, service_account_username
from model_agent.peers.bans import Bans
from model_agent.peers.directory import PeerDirectory
from model_agent.peers.fetch import PeerFetcher
from model_agent.peers.relay import Relays
from model_agent.peers.seeding import Hold, Owner, peer_aware_slots
from model_agent.peers.server import BlobIndex, PeerServer
from model_agent.transfer import RangedConfig

log = structlog.get_logger(__name__)

ADVERTISE_RETRY_S = 10.0


class PeerService:
    """The peer parts of one agent (see the module contract)."""

    def __init__(
        self,
        config: PeerConfig,
        client: KubeClient,
        *,
        namespace: str,
        node_name: str,
        manifests: Callable[[], Iterable[Manifest]],
        roots: Callable[[], list[Path]],
        models: Callable[[], Mapping[str, Iterable[dict[str, Any]]]],
        metrics: Metrics,
        ranged: RangedConfig | None = None,
        by_blob_id: Callable[[Manifest], bool] = lambda _manifest: False,
    ) -> None:
        self.config = config
        self.metrics = metrics
        username = config.allowed_username or service_account_username(namespace, "model-agent")
        self.directory = PeerDirectory(client, node_name, models, namespace=namespace)
        # Reviews draw on their own API budget, never the one labels, entries, confirmations and Leases use.
        reviews = client.with_budget(review_budget().acquire)
        self.reviewer = TokenReviewer(reviews, config.audience, username, addresses=self.directory.addresses)
        self.bans = Bans(config.ban_s, on_ban=lambda _a: metrics.peers_banned.inc())
        self.token_file = TokenFile(config.token_file) if config.token_file else None
        self.advertised = ""
        self.relays = Relays(roots)  # files being fetched here, served by their durable parts
        self.fetcher = PeerFetcher(
            self.directory,
            self.bans,
            self.token_file.token if self.token_file is not None else lambda: "",
            ranged=ranged,
            on_peer_bytes=lambda n: metrics.bytes_by_source.labels("peer").inc(n),
            relays=self.relays,
            me=lambda: self.advertised,
            relay_part_size=config.relay_part_size,
        )
        self.server = PeerServer(
            BlobIndex(manifests, roots, by_blob_id=by_blob_id),  # (which copies' small files: the agent's rule)
            self.reviewer,
            host=config.bind_address,
            port=config.port,
            upload_rate=config.upload_rate,
            max_per_peer=config.max_per_peer,
            on_upload=metrics.peer_upload_bytes.inc,
            on_answer=lambda method, code: metrics.peer_requests.labels(method, str(code)).inc(),
            on_refused=lambda why: metrics.listener_refused.labels("peer", why).inc(),
            relays=self.relays,
            downstreams_per_file=config.downstreams_per_file,
        )
        metrics.peer_upload_rate_limit.set(config.upload_rate)
        # Origin slots kept after a fetch until peers can see this node Ready (.seeding); cancelled (released)
        # when the service stops.
        self.slot_keepers: set[asyncio.Task[None]] = set()

    def slots(self, hold: Hold, takes_from_peers: Callable[[str, Owner | None], bool]) -> Hold:
        """The origin-slot hold made peer-aware (:mod:`.seeding`) for the fetches ``takes_from_peers`` admits."""
        return peer_aware_slots(hold, self.directory, takes_from_peers=takes_from_peers, keepers=self.slot_keepers)

    def on_origin_bytes(self, n: int) -> None:
        """Count bytes a source took from the origin."""
        self.metrics.bytes_by_source.labels("origin").inc(n)

    async def run(self) -> None:
        """Serve until cancelled; advertise the address once listening (retried until the API takes it)."""
        await self.server.start()
        try:
            address = self.config.advertise_address or _with_port(self.config.advertised(), self.server.port)
            while True:
                try:
                    await self.directory.advertise(address)
                    self.advertised = address
                    log.info("peer address advertised", address=address)
                    break
                except (ApiError, ApiUnavailable) as exc:
                    log.warning("could not advertise the peer address; retrying", error=str(exc)[:200])
                    await asyncio.sleep(ADVERTISE_RETRY_S)
            await asyncio.Event().wait()
        finally:
            for keeper in list(self.slot_keepers):
                keeper.cancel()
            if self.slot_keepers:
                await asyncio.wait(list(self.slot_keepers))
            await self.server.stop()
            self.relays.close()

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows of the peers."""
        return {
            "enabled": True,
            "advertised": self.advertised,
            "port": self.server.port,
            "uploadedBytes": self.server.uploaded,
            "uploadRateLimit": self.config.upload_rate,
            "banned": self.bans.current(),
            "bansTotal": self.bans.total,
            "tokenReviews": self.reviewer.reviews,
            "tokensRefusedUnreviewed": self.reviewer.refused_unreviewed,
            "originSlotsKept": len(self.slot_keepers),
            "relaying": len(self.relays),
            "downstreamsRefused": self.server.downstreams.refused,
        }


def _with_port(advertised: str, port: int) -> str:
    """``advertised`` with the port actually bound (the configured port may be 0: any)."""
    host, _, _ = advertised.rpartition(":")
    return f"{host}:{port}"
