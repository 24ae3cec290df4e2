"""Node-to-node distribution: a node takes the files of a model from peers that already hold them.

Role: each agent serves the files of its Ready models read-only on the node network (:mod:`.server`,
content-addressed ``/blobs/sha256/<hex>`` or ``/blobs/git-sha1/<hex>`` with ``Range``), and the files it is
fetching by their durable parts (:mod:`.relay`); a fetching agent learns who holds a model from the cluster
(:mod:`.directory`: Nodes labelled Ready, or Updating, for a model of the same source and annotated with a peer
address), takes each file from one of them through the transfer engine (:mod:`.fetch`; a holder takes at most
``downstreams_per_file`` nodes per file at once, so the fleet fetches in chains rather than all from the seed),
and goes to the origin only for what no peer could give, and then only holding an origin slot. While a node waits
for an origin slot it keeps looking for a peer (:mod:`.seeding`), so the origin-slot holders are the seeders.

Guarantees:

1. **Verified against the origin, never the peer.** A file is asked from a peer only when the origin's own
   listing gave its digest (an LFS file's sha256, a small file's git blob sha1), and the engine checks the bytes
   against that digest; a peer's word is never used. (A git blob id is a SHA-1: to pass, a peer would need a
   second preimage of a digest it did not choose, which no known attack on SHA-1 gives; and files are served by
   blob id only from copies a trusted owner fetched, so a tenant cannot plant a collision: :mod:`.server`.) A
   mismatch deletes the file (the engine's guarantee), bans that peer for a while (:mod:`.bans`, counted) and the
   next peer or the origin is tried: a lying peer costs bandwidth, never correctness.
2. **Fallback is the origin as before.** No peer, every peer banned or failing, or the service off: the
   file comes from the origin exactly as without peers.
3. **Only peers of this cluster's agent.** Both directions authenticate: a fetch presents a projected
   ServiceAccount token for a dedicated audience; the server accepts only a token the API server reviews
   as valid for that audience and as the agent's own ServiceAccount (:mod:`.auth`). The peer token never
   goes to an origin, origin credentials never go to a peer.
4. **Read-only and confined.** The server serves only files recorded in this node's manifests, whose size
   and mtime still match the record, and the parts of files this node is fetching that its part maps record as
   durable (written and fdatasync-ed), of files whose digest the origin's listing gave, never one that failed or is
   being deleted; each opened without following symlinks and inside the models roots; it caps its upload rate
   (token bucket), the requests in flight per peer and the downstream nodes per file (429 over the limits).
5. **Off unless asked.** ``PeerConfig.enabled`` is false by default (drop-in compatibility with OME's
   flags); the Helm chart turns it on.
6. **Trusted owners only.** :func:`model_agent.sources.egress.takes_from_peers` is the one rule (a tenancy rule, so
   it lives with the others in ``sources``, above this package; the agent hands it to :mod:`.seeding`): peers hold
   what the platform fetched with its own credentials (gated repos included), so only a fetch that may use them (a
   ClusterBaseModel, a ``--trusted-namespace`` BaseModel: :func:`model_agent.sources.egress.is_trusted`) of a
   source that asks peers (``hf://``) takes bytes from peers; and only such a fetch skips the origin-slot queue
   because a peer holds the source (:mod:`.seeding`). A tenant's fetch queues for its origin slot like any fetch
   without peers: it gets every byte from the origin.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PEER_ADDRESS_ANNOTATION = "models.ome.io/peer-address"
DEFAULT_AUDIENCE = "model-agent-peer"
DEFAULT_PORT = 8090
# Sources whose fetch asks peers before the origin (model_agent.sources.hf); others fetch from the origin only.
PEER_SCHEMES = ("hf://",)


@dataclass(frozen=True)
class PeerConfig:
    """Peer distribution settings of one agent (from ``Settings.peer_config``: flags ``--peer-*``, environment
    ``MODEL_AGENT_PEER_*``)."""

    enabled: bool = False
    port: int = DEFAULT_PORT
    bind_address: str = "0.0.0.0"  # the node network is where peers are
    advertise_address: str = ""  # host:port other nodes use; "" -> the pod IP (POD_IP) and ``port``
    token_file: str = ""  # projected ServiceAccount token with ``audience`` (re-read when it changes)
    audience: str = DEFAULT_AUDIENCE
    allowed_username: str = ""  # "" -> system:serviceaccount:<namespace>:<service account of this pod>
    upload_rate: float = 0.0  # bytes/s served to all peers together; 0: no cap
    max_per_peer: int = 32  # requests in flight per peer address; more get 429
    ban_s: float = 600.0
    downstreams_per_file: int = 1  # nodes one file is served to at once (429 beyond): chains, not a star; 0: no cap
    relay_part_size: int = 4 * 1024 * 1024  # the part size of hf:// LFS fetches with peers on; 0: the engine's

    def advertised(self) -> str:
        """The address written on this node's Node object."""
        if self.advertise_address:
            return self.advertise_address
        host = os.environ.get("POD_IP", "127.0.0.1")
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
