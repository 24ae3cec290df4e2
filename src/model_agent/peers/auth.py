"""Who may talk to a peer server: the agent's own ServiceAccount, proven by a projected token for the peer audience.

Client side, :class:`TokenFile`: the token the kubelet projects into the pod (``audience`` set to the
peer audience), read again whenever the file changes, since the kubelet rotates it. It is sent only to
peers (``Authorization: Bearer``), never to an origin.

Server side, :class:`TokenReviewer`: a bearer token is checked with a ``TokenReview``
(``authentication.k8s.io/v1``) whose ``spec.audiences`` is the peer audience; it passes only when the API
server says it is authenticated for that audience and its username is the agent's ServiceAccount
(``system:serviceaccount:<namespace>:<name>``). Answers are cached by the token's sha256 (never the token)
for ``cache_s`` (a refusal for a shorter time, so a bad client cannot make the API server review its token
at request rate, and a fixed client is not refused for long). A review that cannot be made (API down)
refuses (503 to the peer), it never admits.

A token is admitted only **from the node it names**: the review's ``user.extra`` must carry the node claim
(``authentication.kubernetes.io/node-name``, present in a pod-bound or node-bound token), and the request must
come from the host that node's agent advertises (``addresses``: node -> ``host:port``, from the nodes' status
ConfigMaps, :meth:`model_agent.peers.directory.PeerDirectory.addresses`). A token harvested by anyone - a rogue
server the token was presented to, a log - is then worth nothing from any other address. A token without the
claim is refused (403); addresses that cannot be read refuse with 503.

**The review budget.** A review is an API request, and anyone on the pod network can send tokens. So, before any
review, the token is read as the JWT it must be (never trusted: only to refuse cheaply): a token that is no JWT,
is expired, is not for the peer audience, is not the agent's ServiceAccount, names no node, or names a node whose
advertised host is not the request's source is refused without asking the API server. What is left comes from an
advertised agent address; it is reviewed at most :data:`REVIEWS_PER_SOURCE_QPS` per second per source (burst
:data:`REVIEWS_PER_SOURCE_BURST`; 429 beyond), through a client whose rate budget is the reviewer's own
(:data:`REVIEW_QPS`), never the one labels, entries, confirmations and Leases draw on
(:meth:`model_agent.kube.client.KubeClient.with_budget`). Decided: no local signature verification against the
issuer's keys: it would need the issuer discovery endpoint and key rotation here, and a review is still needed for
revocation (a deleted pod or ServiceAccount); with the checks above a review happens only for a token sent from
an agent's own address, at a bounded rate.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import structlog

from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.ratelimit import TokenBucket
from model_agent.transfer.addresses import IPAddress, parse_ip

log = structlog.get_logger(__name__)

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
REVIEW_QPS = 2.0  # the reviewer's own API budget (burst REVIEW_BURST), apart from the agent's
REVIEW_BURST = 10
REVIEWS_PER_SOURCE_QPS = 0.5  # reviews asked for one source address, at most (burst below; 429 beyond)
REVIEWS_PER_SOURCE_BURST = 5
MAX_TOKEN_BYTES = 16 * 1024


class TokenFile:
    """The current token in ``path``; re-read when its mtime or size changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = ""

    def token(self) -> str:
        """The token now ("" when the file is unreadable: the peer then refuses and the origin is used)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                with open(self.path, encoding="utf-8") as f:
                    self._token = f.read().strip()
                self._stamp = stamp
        except OSError:
            return ""
        return self._token


@dataclass(frozen=True)
class Verdict:
    """A review's answer: HTTP status to give (200 admits) and why."""

    status: int
    why: str = ""
    node: str = ""  # the node the admitted token names

    @property
    def admitted(self) -> bool:
        return self.status == 200


@dataclass(eq=False)
class TokenReviewer:
    """Checks a peer's bearer token with the API server (see the module contract)."""

    client: KubeClient
    audience: str
    username: str
    _: KW_ONLY
    # node -> its advertised host:port (None: the source address is not checked - unit tests of the review only)
    addresses: Callable[[], Awaitable[dict[str, str]]] | None = None
    cache_s: float = 60.0
    refusal_cache_s: float = 10.0
    _cache: dict[str, tuple[float, Verdict]] = field(default_factory=dict, init=False, repr=False)
    _by_source: dict[str, tuple[float, float]] = field(default_factory=dict, init=False, repr=False)
    refused_unreviewed: int = field(default=0, init=False)  # tokens refused without a review (tests, status)
    _inflight: dict[str, asyncio.Future[Verdict]] = field(default_factory=dict, init=False, repr=False)
    reviews: int = field(default=0, init=False)  # TokenReviews sent (tests and the status)

    async def check(self, authorization: str | None, remote: str | None = None) -> Verdict:
        """The verdict for an ``Authorization`` header value sent from the address ``remote``."""
        if not authorization or not authorization.startswith("Bearer ") or not authorization[7:].strip():
            return Verdict(401, "no bearer token")
        token = authorization[7:].strip()
        claimed = _claims(token)
        if self.addresses is not None:
            why = self._cheap_refusal(claimed)
            if why:
                self.refused_unreviewed += 1
                return Verdict(403, why)
            assert claimed is not None
            claimed_node = _node_of(claimed)
            found = await self._from_advertised(claimed_node, remote)
            if found is not None:
                self.refused_unreviewed += 1
                return found
        verdict = await self._token_verdict(token, remote or "")
        if not verdict.admitted or self.addresses is None:
            return verdict
        if claimed is None or verdict.node != _node_of(claimed):
            return Verdict(403, "the token's node claim does not match its review")
        return verdict

    def _cheap_refusal(self, claims: dict[str, Any] | None) -> str:
        """Why a token is refused without a review (read, never trusted, as the JWT it must be), or ""."""
        if claims is None:
            return "not a ServiceAccount token"
        audiences = claims.get("aud")
        if self.audience not in (audiences if isinstance(audiences, list) else [audiences]):
            return "token not valid for the peer audience"
        expiry = claims.get("exp")
        if not isinstance(expiry, int | float) or expiry < time.time():
            return "token expired"
        if claims.get("sub") != self.username:
            return "this identity is not the model agent"
        if not _node_of(claims):
            return "the token names no node (a pod-bound or node-bound token is required)"
        return ""

    async def _from_advertised(self, node: str, remote: str | None) -> Verdict | None:
        """A refusal unless ``remote`` is the host ``node`` advertises; None when it is."""
        assert self.addresses is not None
        try:
            advertised = (await self.addresses()).get(node, "")
        except Exception as exc:  # (the directory answers {} on API errors; anything else must not admit)
            log.warning("peer addresses not readable", error=str(exc)[:200])
            return Verdict(503, "peer addresses unavailable")
        if not advertised:
            return Verdict(403, f"node {node} advertises no peer address")
        if not _same_host(advertised.rpartition(":")[0], remote or ""):
            return Verdict(403, f"a token of node {node} is admitted only from that node's address")
        return None

    async def _token_verdict(self, token: str, remote: str) -> Verdict:
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        if digest not in self._inflight and not self._source_budget(remote):
            return Verdict(429, "too many token reviews from this address")
        pending = self._inflight.get(digest)
        if pending is not None:  # one review per token at a time, whatever the request rate
            return await asyncio.shield(pending)
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._inflight[digest] = future
        try:
            verdict = await self._review(token)
            if verdict.status != 503:
                ttl = self.cache_s if verdict.admitted else self.refusal_cache_s
                self._cache[digest] = (time.monotonic() + ttl, verdict)
                if len(self._cache) > 4096:  # bounded: drop expired answers
                    self._cache = {k: v for k, v in self._cache.items() if v[0] > time.monotonic()}
            future.set_result(verdict)
            return verdict
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters see it, nobody logs "never retrieved"
            raise
        finally:
            del self._inflight[digest]

    async def _review(self, token: str) -> Verdict:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        self.reviews += 1
        try:
            answer = await self.client.request("POST", TOKENREVIEWS, body=body)
        except (ApiError, ApiUnavailable) as exc:
            log.warning("peer token review failed", error=str(exc)[:200])
            return Verdict(503, "token review unavailable")
        status = answer.get("status") or {}
        if not status.get("authenticated"):
            return Verdict(403, "token not valid for the peer audience")
        if self.audience not in (status.get("audiences") or [self.audience]):
            return Verdict(403, "token not valid for the peer audience")
        username = (status.get("user") or {}).get("username", "")
        if username != self.username:
            return Verdict(403, f"{username or 'this identity'} is not the model agent")
        nodes = ((status.get("user") or {}).get("extra") or {}).get(NODE_CLAIM) or []
        if not isinstance(nodes, list) or len(nodes) != 1 or not isinstance(nodes[0], str) or not nodes[0]:
            return Verdict(403, "the token names no node (a pod-bound or node-bound token is required)")
        return Verdict(200, node=nodes[0])

    def _source_budget(self, source: str) -> bool:
        """Take one review from ``source``'s budget (a token bucket per address); False when it is spent."""
        now = time.monotonic()
        tokens, at = self._by_source.get(source, (float(REVIEWS_PER_SOURCE_BURST), now))
        tokens = min(float(REVIEWS_PER_SOURCE_BURST), tokens + (now - at) * REVIEWS_PER_SOURCE_QPS)
        if tokens < 1.0:
            self._by_source[source] = (tokens, now)
            return False
        self._by_source[source] = (tokens - 1.0, now)
        if len(self._by_source) > 4096:  # bounded: forget the full buckets
            self._by_source = {k: v for k, v in self._by_source.items() if v[0] < REVIEWS_PER_SOURCE_BURST - 1}
        return True


def _same_host(advertised: str, remote: str) -> bool:
    """Is ``remote`` (a peer's socket address) the advertised host? IPs compare as addresses (``[::1]``, v4-mapped)."""

    def parsed(host: str) -> IPAddress | str:
        return parse_ip(host) or host.strip("[]").lower()

    return bool(remote) and parsed(advertised) == parsed(remote)


def review_budget() -> TokenBucket:
    """The reviewer's own API budget (:data:`REVIEW_QPS`, burst :data:`REVIEW_BURST`)."""
    return TokenBucket(REVIEW_QPS, REVIEW_BURST)


def _claims(token: str) -> dict[str, Any] | None:
    """The payload of a JWT, unverified (only to refuse cheaply); None for anything that is not one."""
    if len(token) > MAX_TOKEN_BYTES or token.count(".") != 2:
        return None
    payload = token.split(".")[1]
    try:
        decoded = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    return decoded if isinstance(decoded, dict) else None


def _node_of(claims: dict[str, Any]) -> str:
    """The node a ServiceAccount token is bound to (``kubernetes.io.node.name``), or ""."""
    scope = claims.get("kubernetes.io")
    node = scope.get("node") if isinstance(scope, dict) else None
    name = node.get("name") if isinstance(node, dict) else None
    return name if isinstance(name, str) else ""


def service_account_username(namespace: str, name: str) -> str:
    """The username the API server gives a ServiceAccount's tokens."""
    return f"system:serviceaccount:{namespace}:{name}"
