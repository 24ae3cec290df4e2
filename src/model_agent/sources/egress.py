"""Who a fetch is for, and what it may use and reach: the tenancy rules of invariant 8.

Role: the one place that decides, for one model, (1) whether the node's ambient identity (the AWS, GCP,
Azure and OCI SDK chains, instance metadata) and the platform ``HF_TOKEN`` may serve it, (2) whether an
endpoint it names may be contacted, and (3) whether an address that endpoint resolves to may be connected
to. The decisions are pure functions of facts (:func:`is_trusted`, :func:`credential_for`,
:func:`endpoint_refusal`, :func:`address_refusal`), table-tested in ``tests/unit/test_egress.py``;
:class:`Guard` carries them out at the moment of connecting.

Who is trusted: a ``ClusterBaseModel`` (written by cluster admins), and a ``BaseModel`` in a namespace the
admin lists (``--trusted-namespace``). Trusted models are fetched exactly as before: ambient credentials,
any endpoint, no address checks. Every other ``BaseModel`` is a *tenant* model:

* credentials only from the Secret its own ``spec.storage.key`` names (read from its own namespace), else
  anonymous; a source that cannot go anonymous (native ``oci://``, whose credentials are always the node's)
  refuses it with ``CredentialRefused``;
* ``parameters.endpoint`` must match the allow-list (:data:`DEFAULT_TENANT_ENDPOINTS`, each store's public
  endpoints, plus ``--tenant-endpoint-allow``), else ``EndpointRefused``;
* every address a tenant model connects to is checked when it is resolved, at connect time, and the
  connection is made to that checked address (no second lookup, so DNS rebinding cannot swap it): loopback,
  link-local, unspecified, multicast and reserved addresses, the cloud metadata addresses, and the admin's
  cluster ranges (``--cluster-cidr``) are refused with ``EndpointRefused``. ``--tenant-address-allow``
  makes exceptions (an on-premises store in a private range; the project's own loopback emulators), never
  for the metadata addresses;
* no redirect is followed, and the store's response text never reaches a reason, an Event or a log line
  (sources word tenant errors from status codes only).

Patterns of the allow-list are origins, ``scheme://host[:port]``; ``*`` in the host stands for one or
more DNS labels (``https://*.blob.core.windows.net``). The path of an endpoint is not part of the match.

The policy is process-wide, set once at start-up from the flags (:func:`configure`), like the capacity
registry; a request without an owner (code paths that predate tenancy, unit tests of sources) is treated as
trusted.
"""

from __future__ import annotations

import enum
import ipaddress
import re
import socket
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from model_agent.model.reasons import Reason
from model_agent.peers import PEER_SCHEMES
from model_agent.sources.base import SourceError
from model_agent.transfer.addresses import IPAddress, unmapped

CLUSTER_KIND = "ClusterBaseModel"
NAMESPACED_KIND = "BaseModel"

# Each store's public endpoints: what a tenant may name in parameters.endpoint without the admin's say.
DEFAULT_TENANT_ENDPOINTS: tuple[str, ...] = (
    "https://s3.amazonaws.com",
    "https://*.s3.amazonaws.com",
    "https://s3.*.amazonaws.com",
    "https://*.s3.*.amazonaws.com",
    "https://s3-*.amazonaws.com",
    "https://storage.googleapis.com",
    "https://*.storage.googleapis.com",
    "https://*.blob.core.windows.net",
    "https://objectstorage.*.oraclecloud.com",
    "https://*.compat.objectstorage.*.oraclecloud.com",
)

# Instance metadata and credential endpoints: never reachable for a tenant, whatever the exceptions say.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS/GCP/Azure/OCI instance metadata
        "169.254.170.2",  # ECS task credentials
        "169.254.170.23",  # EKS Pod Identity agent
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::23",  # EKS Pod Identity agent over IPv6
        "100.100.100.200",  # Alibaba Cloud metadata
    )
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Owner:
    """Who a fetch is for: the model's kind and (for a BaseModel) its namespace."""

    kind: str
    namespace: str = ""

    def describe(self) -> str:
        """How a refusal names the owner: ``BaseModel in namespace x``, or the kind of a cluster model."""
        return f"BaseModel in namespace {self.namespace}" if self.kind == NAMESPACED_KIND else self.kind


@dataclass(frozen=True)
class TenancyPolicy:
    """The admin's configuration of the rules above (``model-agent run`` flags)."""

    trusted_namespaces: frozenset[str] = frozenset()
    endpoint_allow: tuple[str, ...] = DEFAULT_TENANT_ENDPOINTS
    cluster_ranges: tuple[IPNetwork, ...] = ()
    address_allow: tuple[IPNetwork, ...] = ()
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_patterns", tuple(_compile(p) for p in self.endpoint_allow))

    @classmethod
    def build(
        cls,
        *,
        trusted_namespaces: Iterable[str] = (),
        endpoint_allow: Iterable[str] = (),
        cluster_ranges: Iterable[str] = (),
        address_allow: Iterable[str] = (),
    ) -> TenancyPolicy:
        """From flag values; ``endpoint_allow`` adds to the defaults. ValueError for a malformed value."""
        extra = tuple(p.strip().rstrip("/") for p in endpoint_allow if p.strip())
        return cls(
            trusted_namespaces=frozenset(n.strip() for n in trusted_namespaces if n.strip()),
            endpoint_allow=DEFAULT_TENANT_ENDPOINTS + extra,
            cluster_ranges=tuple(ipaddress.ip_network(c.strip(), strict=False) for c in cluster_ranges if c.strip()),
            address_allow=tuple(ipaddress.ip_network(c.strip(), strict=False) for c in address_allow if c.strip()),
        )

    @property
    def patterns(self) -> tuple[re.Pattern[str], ...]:
        """The compiled ``endpoint_allow`` patterns a tenant's endpoint must match."""
        return self._patterns


_PATTERN = re.compile(r"(https?)://([a-z0-9*]([a-z0-9*.-]*[a-z0-9*])?)(:\d{1,5})?")
_HOST_LABELS = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"


def _compile(pattern: str) -> re.Pattern[str]:
    """``scheme://host[:port]`` with ``*`` for one or more DNS labels, as a full-match regex of an origin."""
    text = pattern.strip().lower().rstrip("/")
    m = _PATTERN.fullmatch(text)
    if m is None:
        raise ValueError(f"not an endpoint pattern (scheme://host[:port], '*' for labels): {pattern!r}")
    scheme, host, port = m[1], m[2], m[4]
    port = port or (":443" if scheme == "https" else ":80")
    host_re = r"\.".join(_HOST_LABELS if label == "*" else re.escape(label) for label in host.split("."))
    return re.compile(f"{scheme}://{host_re}{re.escape(port)}")


def is_trusted(owner: Owner | None, policy: TenancyPolicy) -> bool:
    """ClusterBaseModels, BaseModels of namespaces the admin trusts, and requests without an owner."""
    if owner is None or owner.kind != NAMESPACED_KIND:
        return True
    return owner.namespace in policy.trusted_namespaces


def serves_by_blob_id(manifest_key: str) -> bool:
    """Whether the peer server may serve the small files of the copy published under ``manifest_key``
    (``Kind/namespace/name``) by their git blob id: only a copy a trusted owner fetched. A blob id is a SHA-1, whose
    collisions can be made: a tenant could fetch a file made to collide with one a trusted model lists, and have it
    served in its place. A sha256 is served from any copy (docs/security.md#7-peer-distribution-model_agentpeers)."""
    kind, _, rest = manifest_key.partition("/")
    return kind in (CLUSTER_KIND, NAMESPACED_KIND) and is_trusted(Owner(kind, rest.partition("/")[0]), current())


def takes_from_peers(storage_uri: str, owner: Owner | None) -> bool:
    """Whether a fetch of ``storage_uri`` for ``owner`` may take bytes from peers: a source that asks peers
    (``hf://``) and an owner trusted with the platform's credentials, since peers hold what those fetched
    (docs/security.md#7-peer-distribution-model_agentpeers)."""
    return storage_uri.startswith(PEER_SCHEMES) and is_trusted(owner, current())


class CredentialUse(enum.Enum):
    """What one fetch may sign with; only trusted owners get ``AMBIENT``."""

    SECRET = "secret"  # the Secret of spec.storage.key (own namespace for a BaseModel)
    AMBIENT = "ambient"  # the node's identity / the platform token
    ANONYMOUS = "anonymous"


def credential_for(owner: Owner | None, policy: TenancyPolicy, *, has_secret: bool, anonymous: bool) -> CredentialUse:
    """What one fetch signs with: a Secret when named, anonymous when asked, else ambient only when trusted."""
    if anonymous:
        return CredentialUse.ANONYMOUS
    if has_secret:
        return CredentialUse.SECRET
    return CredentialUse.AMBIENT if is_trusted(owner, policy) else CredentialUse.ANONYMOUS


def origin_of(url: str) -> str | None:
    """``scheme://host:port`` of an http(s) URL (lowercase, explicit port), None when it is not one."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host or parts.username is not None or parts.password is not None:
        return None
    if host.startswith("["):
        host = host.strip("[]")
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port or (443 if scheme == 'https' else 80)}"


def endpoint_refusal(url: str, policy: TenancyPolicy) -> str | None:
    """Why a tenant may not name ``url`` as its endpoint, or None when the allow-list has it."""
    origin = origin_of(url)
    if origin is None:
        return "it is not an http(s) URL with a host"
    if any(p.fullmatch(origin) for p in policy.patterns):
        return None
    return f"{origin} is not on the tenant endpoint allow-list (--tenant-endpoint-allow)"


def address_refusal(address: str | IPAddress, policy: TenancyPolicy) -> str | None:
    """Why a tenant model may not connect to ``address``, naming the rule; None when it may."""
    ip = unmapped(ipaddress.ip_address(address) if isinstance(address, str) else address)  # ::ffff:127.0.0.1
    if ip in METADATA_ADDRESSES:
        return f"{ip} is an instance metadata address"
    if any(ip in net for net in policy.address_allow):
        return None
    for rule, hit in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
    ):
        if hit:
            return f"{ip} is a {rule} address"
    for net in policy.cluster_ranges:
        if ip in net:
            return f"{ip} is in the cluster range {net} (--cluster-cidr)"
    return None


# ----------------------------------------------------------------------------------------- the process policy

_POLICY = TenancyPolicy()


def configure(policy: TenancyPolicy) -> None:
    """Set the process-wide policy (``model-agent run`` does, from its flags, before any fetch)."""
    global _POLICY
    _POLICY = policy


def current() -> TenancyPolicy:
    """The process-wide policy :func:`configure` set (before it: no namespace trusted, the default endpoints)."""
    return _POLICY


def refused(rule: str, message: str) -> SourceError:
    """A tenant model refused by a rule: not retried (it fails the same way until the spec changes)."""
    return SourceError(rule, message, retryable=False)


# ----------------------------------------------------------------------------------------------- the guard


@dataclass(frozen=True)
class Guard:
    """The rules for one tenant model, carried out: endpoint checks, and checked resolution at connect time."""

    owner: Owner
    policy: TenancyPolicy

    def check_allowed(self, url: str, what: str = "parameters.endpoint") -> None:
        """Refuse an endpoint off the allow-list (pure: no lookup)."""
        why = endpoint_refusal(url, self.policy)
        if why is not None:
            raise refused(Reason.ENDPOINT_REFUSED, f"{what} refused for a {self.owner.describe()}: {why}")

    def check_endpoint(self, url: str, what: str = "parameters.endpoint") -> None:
        """Refuse an endpoint off the allow-list, then resolve its host and refuse a forbidden address (blocks)."""
        self.check_allowed(url, what)
        parts = urllib.parse.urlsplit(url.strip())
        self.resolve(parts.hostname or "", parts.port or (443 if parts.scheme.lower() == "https" else 80))

    def resolve(self, host: str, port: int) -> list[tuple[Any, ...]]:
        """``getaddrinfo`` for a TCP connection, refused as a whole when any address is forbidden."""
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise SourceError(Reason.SOURCE_UNREACHABLE, f"{host}: cannot resolve ({exc.strerror})") from None
        for info in infos:
            why = address_refusal(str(info[4][0]).split("%", 1)[0], self.policy)
            if why is not None:
                message = f"{host} refused for a {self.owner.describe()}: {why} (tenant address rule)"
                raise refused(Reason.ENDPOINT_REFUSED, message)
        return infos

    def create_connection(
        self,
        address: tuple[str, int],
        timeout: float | None = None,
        source_address: tuple[str, int] | None = None,
    ) -> socket.socket:
        """A drop-in for :func:`socket.create_connection` that connects only to checked addresses."""
        host, port = address
        last: OSError | None = None
        for family, kind, proto, _, sockaddr in self.resolve(host, port):
            sock = socket.socket(family, kind, proto)
            try:
                if timeout is not None:
                    sock.settimeout(timeout)
                if source_address is not None:
                    sock.bind(source_address)
                sock.connect(sockaddr)  # the address just checked: no second lookup
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise last or OSError(f"no address for {host}")

    def aiohttp_resolver(self) -> Any:
        """An aiohttp resolver that refuses forbidden addresses (aiohttp then connects to what it returns)."""
        import aiohttp.abc

        guard = self

        class _CheckedResolver(aiohttp.abc.AbstractResolver):
            async def resolve(self, host: str, port: int = 0, family: int = socket.AF_UNSPEC) -> list[Any]:
                import asyncio

                infos = await asyncio.to_thread(guard.resolve, host, port)
                return [
                    {
                        "hostname": host,
                        "host": str(sockaddr[0]),
                        "port": int(sockaddr[1]),
                        "family": fam,
                        "proto": proto,
                        "flags": socket.AI_NUMERICHOST,
                    }
                    for fam, _, proto, _, sockaddr in infos
                    if family in (socket.AF_UNSPEC, fam)
                ]

            async def close(self) -> None:
                return None

        return _CheckedResolver()


def guard_for(owner: Owner | None, policy: TenancyPolicy | None = None) -> Guard | None:
    """The guard of a tenant model, None for a trusted one (fetched without restrictions)."""
    policy = policy or current()
    if owner is None or is_trusted(owner, policy):
        return None
    return Guard(owner, policy)
