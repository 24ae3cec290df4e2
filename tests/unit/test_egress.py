"""The tenancy rules (sources/egress.py) as data, and the places the sources carry them out.

Pure decisions are table-tested: who is trusted, what a fetch signs with, which endpoints a tenant may name,
which addresses it may reach. Then the carriers: the guard's connect (one lookup, connect to the checked
address), the ranged engine's transport under the guard, and each source's settings for a tenant model.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_agent.sources import cloud, egress, oci, s3
from model_agent.sources.base import FetchRequest, SourceError
from model_agent.sources.egress import (
    CLUSTER_KIND,
    NAMESPACED_KIND,
    CredentialUse,
    Guard,
    Owner,
    TenancyPolicy,
    address_refusal,
    credential_for,
    endpoint_refusal,
    is_trusted,
    origin_of,
)
from model_agent.sources.objects import RemoteObject
from model_agent.transfer.transport import CONNECT_GUARD, SlotTransport, tls_context

CLUSTER = Owner(CLUSTER_KIND)
EVIL = Owner(NAMESPACED_KIND, "team-evil")
TRUSTED = Owner(NAMESPACED_KIND, "team-trusted")
POLICY = TenancyPolicy.build(trusted_namespaces=["team-trusted"], cluster_ranges=["10.96.0.0/12"])


@pytest.mark.parametrize(
    ("owner", "trusted"),
    [(None, True), (CLUSTER, True), (TRUSTED, True), (EVIL, False), (Owner(NAMESPACED_KIND, ""), False)],
)
def test_who_is_trusted(owner: Owner | None, trusted: bool) -> None:
    assert is_trusted(owner, POLICY) is trusted


@pytest.mark.parametrize(
    ("owner", "has_secret", "anonymous", "use"),
    [
        (CLUSTER, False, False, CredentialUse.AMBIENT),
        (CLUSTER, True, False, CredentialUse.SECRET),
        (CLUSTER, False, True, CredentialUse.ANONYMOUS),
        (TRUSTED, False, False, CredentialUse.AMBIENT),
        (EVIL, False, False, CredentialUse.ANONYMOUS),  # never the node's identity
        (EVIL, True, False, CredentialUse.SECRET),  # its own namespace's Secret
        (EVIL, True, True, CredentialUse.ANONYMOUS),
    ],
)
def test_what_a_fetch_signs_with(owner: Owner, has_secret: bool, anonymous: bool, use: CredentialUse) -> None:
    assert credential_for(owner, POLICY, has_secret=has_secret, anonymous=anonymous) is use


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://s3.amazonaws.com", True),
        ("https://s3.eu-west-1.amazonaws.com", True),
        ("https://bucket.s3.eu-west-1.amazonaws.com/key?x=1", True),
        ("https://storage.googleapis.com", True),
        ("https://acct.blob.core.windows.net/container", True),
        ("https://objectstorage.us-ashburn-1.oraclecloud.com", True),
        ("https://ns.compat.objectstorage.us-ashburn-1.oraclecloud.com", True),
        ("http://s3.amazonaws.com", False),  # the scheme is part of the origin
        ("https://s3.amazonaws.com:8443", False),  # and so is the port
        ("https://s3.amazonaws.com.evil.example", False),  # a full match, not a prefix
        ("https://evil.example/s3.amazonaws.com", False),
        ("https://s3.amazonaws.com@evil.example", False),  # userinfo: the host is evil.example
        ("http://127.0.0.1:9000", False),
        ("http://169.254.169.254", False),
        ("https://storage.googleapis.com.", False),
        ("ftp://storage.googleapis.com", False),
        ("not a url", False),
    ],
)
def test_tenant_endpoint_allow_list_defaults(url: str, allowed: bool) -> None:
    assert (endpoint_refusal(url, POLICY) is None) is allowed


def test_admin_patterns_add_to_the_defaults() -> None:
    policy = TenancyPolicy.build(endpoint_allow=["http://minio.storage.svc:9000", "https://*.r2.example.com"])
    assert endpoint_refusal("http://minio.storage.svc:9000/", policy) is None
    assert endpoint_refusal("https://a.b.r2.example.com", policy) is None
    assert endpoint_refusal("https://r2.example.com", policy) is not None  # '*' is at least one label
    assert endpoint_refusal("http://minio.storage.svc:9001", policy) is not None
    assert endpoint_refusal("https://storage.googleapis.com", policy) is None
    with pytest.raises(ValueError, match="endpoint pattern"):
        TenancyPolicy.build(endpoint_allow=["minio.storage:9000"])


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://S3.AmazonAWS.com/x", "https://s3.amazonaws.com:443"),
        ("http://[::1]:9000/", "http://[::1]:9000"),
        ("http://a:b@host/", None),
        ("http://host:99999/", None),
        ("file:///etc/passwd", None),
    ],
)
def test_origin_of(url: str, origin: str | None) -> None:
    assert origin_of(url) == origin


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped IPv6 is the IPv4 address
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("169.254.170.2", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("10.96.0.1", "cluster range"),
        ("10.1.2.3", None),  # private but not configured: allowed (the allow-list still gates hosts)
        ("52.216.1.1", None),
        ("2600:1f18::1", None),
    ],
)
def test_tenant_address_rules(address: str, rule: str | None) -> None:
    why = address_refusal(address, POLICY)
    if rule is None:
        assert why is None
    else:
        assert why is not None and rule in why


def test_address_exceptions_never_cover_metadata() -> None:
    policy = TenancyPolicy.build(address_allow=["127.0.0.0/8", "169.254.0.0/16", "10.96.0.0/12"])
    assert address_refusal("127.0.0.1", policy) is None
    assert address_refusal("10.96.0.1", policy) is None
    why = address_refusal(ipaddress.ip_address("169.254.169.254"), policy)
    assert why is not None and "metadata" in why


# ------------------------------------------------------------------------------------------ the guard


@pytest.fixture
def listener() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback TCP listener that records the connections it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()
    for conn in accepted:
        conn.close()


def test_guard_refuses_before_connecting(listener: tuple[int, list[socket.socket]]) -> None:
    port, accepted = listener
    guard = Guard(EVIL, POLICY)
    with pytest.raises(SourceError) as caught:
        guard.create_connection(("127.0.0.1", port), 2.0)
    assert caught.value.reason == "EndpointRefused"
    assert "loopback" in caught.value.message and not caught.value.retryable
    assert accepted == []


def test_guard_connects_to_the_address_it_checked(
    listener: tuple[int, list[socket.socket]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One lookup per connection: a name that would resolve differently a second time cannot be swapped."""
    port, _ = listener
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1", "169.254.169.254"])  # what a rebinding DNS server would say, in turn
    calls: list[str] = []

    def rebinding(host: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(host)
        return real(next(answers) if host == "rebind.test" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    guard = Guard(EVIL, TenancyPolicy.build(address_allow=["127.0.0.0/8"]))
    sock = guard.create_connection(("rebind.test", port), 2.0)
    try:
        assert sock.getpeername() == ("127.0.0.1", port)
    finally:
        sock.close()
    assert calls == ["rebind.test"]
    with pytest.raises(SourceError, match="metadata"):  # the second answer is checked too, and refused
        guard.create_connection(("rebind.test", port), 2.0)


def test_ranged_transport_connects_through_the_guard(listener: tuple[int, list[socket.socket]]) -> None:
    port, accepted = listener
    token = CONNECT_GUARD.set(Guard(EVIL, POLICY).create_connection)
    try:
        transport = SlotTransport(tls_context, 2.0, 2.0)
    finally:
        CONNECT_GUARD.reset(token)
    with pytest.raises(SourceError) as caught:
        transport.get(f"http://127.0.0.1:{port}/weights", {})
    assert caught.value.reason == "EndpointRefused"
    assert accepted == []
    unguarded = SlotTransport(tls_context, 2.0, 2.0)  # made outside a tenant fetch: connects as before
    with pytest.raises(OSError):  # the listener never answers: the read times out
        unguarded.get(f"http://127.0.0.1:{port}/weights", {})
    unguarded.close()
    assert len(accepted) == 1


def test_aiohttp_resolver_refuses_forbidden_addresses() -> None:
    resolver = Guard(EVIL, POLICY).aiohttp_resolver()
    with pytest.raises(SourceError, match="loopback"):
        asyncio.run(resolver.resolve("localhost", 80))
    allowed = Guard(EVIL, TenancyPolicy.build(address_allow=["127.0.0.0/8"])).aiohttp_resolver()
    hosts = asyncio.run(allowed.resolve("127.0.0.1", 80, socket.AF_INET))
    assert [h["host"] for h in hosts] == ["127.0.0.1"]


# ------------------------------------------------------------------------------------------ the sources


@pytest.fixture
def policy() -> Iterator[TenancyPolicy]:
    before = egress.current()
    egress.configure(POLICY)
    yield POLICY
    egress.configure(before)


@pytest.mark.parametrize(
    ("key", "served"),
    [
        ("ClusterBaseModel//m", True),
        ("BaseModel/team-trusted/m", True),
        ("BaseModel/team-evil/m", False),  # a tenant's copy: a file of it could be a SHA-1 collision made for this
        ("BaseModel//m", False),
        ("", False),
    ],
)
def test_small_files_are_served_by_git_blob_id_only_from_copies_a_trusted_owner_fetched(
    policy: TenancyPolicy, key: str, served: bool
) -> None:
    assert egress.serves_by_blob_id(key) is served


def _request(uri: str, owner: Owner | None, secret: dict[str, str] | None = None, /, **params: str) -> FetchRequest:
    return FetchRequest(
        storage_uri=uri,
        dest=Path("/tmp/none/dest"),
        staging=Path("/tmp/none/staging"),
        previous=None,
        parameters=dict(params),
        secret=secret,
        owner=owner,
    )


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000 junk", "http://minio:9000\nx", "https://a@b"])
def test_s3_endpoint_must_be_a_whole_url(endpoint: str) -> None:
    with pytest.raises(SourceError) as caught:
        s3.settings_for(_request("s3://bucket/p", None, endpoint=endpoint))
    assert caught.value.reason == "InvalidParameter"


def test_s3_tenant_rules(policy: TenancyPolicy) -> None:
    with pytest.raises(SourceError) as caught:
        s3.settings_for(_request("s3://bucket/p", EVIL, endpoint="http://127.0.0.1:9000"))
    assert caught.value.reason == "EndpointRefused" and "team-evil" in caught.value.message
    tenant = s3.settings_for(_request("s3://bucket/p", EVIL))
    assert tenant.anonymous and tenant.credentials is None and tenant.guard is not None
    keyed = s3.settings_for(_request("s3://bucket/p", EVIL, {"accessKeyId": "AKIA1", "secretAccessKey": "s"}))
    assert not keyed.anonymous and keyed.credentials is not None
    for owner in (CLUSTER, TRUSTED, None):
        trusted = s3.settings_for(_request("s3://bucket/p", owner, endpoint="http://127.0.0.1:9000"))
        assert not trusted.anonymous and trusted.guard is None


def test_cloud_tenant_rules(policy: TenancyPolicy) -> None:
    with pytest.raises(SourceError) as caught:
        cloud.settings_for(_request("gs://bucket/p", EVIL, endpoint="http://127.0.0.1:4443"))
    assert caught.value.reason == "EndpointRefused"
    gcs = cloud.settings_for(_request("gs://bucket/p", EVIL))
    assert gcs.anonymous and not gcs.ambient and gcs.guard is not None
    principal = {"clientId": "c", "clientSecret": "s", "tenantId": "t"}
    with pytest.raises(SourceError) as caught:
        cloud.settings_for(_request("az://acct/c/p", EVIL, principal))
    assert caught.value.reason == "CredentialRefused"
    sas = cloud.settings_for(_request("az://acct/c/p", EVIL, {"sasToken": "?sv=1&sig=x"}))
    assert sas.credentials == {"sas_key": "sv=1&sig=x"} and not sas.anonymous
    assert cloud.settings_for(_request("gs://bucket/p", CLUSTER, endpoint="http://127.0.0.1:4443")).ambient


def test_oci_native_refuses_tenants_before_any_sdk_call(policy: TenancyPolicy) -> None:
    def no_identity() -> tuple[Any, dict[str, Any]]:
        raise AssertionError("a tenant model reached the node's OCI identity")

    source = oci.OciSource(signer_factories={name: no_identity for name in oci.AUTH_TYPES})
    cases: list[dict[str, str]] = [{}, {"auth": "UserPrincipal"}, {"s3Compat": "true"}]
    for params in cases:  # s3Compat needs the namespace in the URI
        with pytest.raises(SourceError) as caught:
            asyncio.run(source.fetch(_request("oci://bucket/p", EVIL, **params)))
        assert caught.value.reason == "CredentialRefused"
    with pytest.raises(SourceError) as caught:  # s3Compat with a namespace: the S3 rules (endpoint refused)
        asyncio.run(
            source.fetch(
                _request("oci://n/ns/b/bucket/o/p", EVIL, s3Compat="true", region="r1", endpoint="http://127.0.0.1:1")
            )
        )
    assert caught.value.reason == "EndpointRefused"


def test_tenant_probes_follow_no_redirect(listener: tuple[int, list[socket.socket]]) -> None:
    """A store that answers a tenant's probe with a redirect (to an internal address) is not followed."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    inner_port, accepted = listener

    class Redirecting(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{inner_port}/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    guard = Guard(EVIL, TenancyPolicy.build(address_allow=["127.0.0.0/8"]))
    listed = RemoteObject("k", "k", 10, '"e"')

    async def run() -> None:
        async with cloud.probe_session(guard) as session:
            url = f"http://127.0.0.1:{server.server_address[1]}/bucket/k"
            await cloud.probe(session, url, listed, "gs://bucket/k", follow_redirects=False)

    try:
        with pytest.raises(SourceError, match="unexpected HTTP 302"):
            asyncio.run(run())
    finally:
        server.shutdown()
        server.server_close()
    assert accepted == []


def test_s3_tenant_secret_is_never_mixed_with_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's key pair is signed alone: the node's AWS_SESSION_TOKEN is not added to it; no Secret: unsigned."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANODE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "node-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "node-session-token")
    before = egress.current()
    egress.configure(TenancyPolicy.build(endpoint_allow=["http://localhost:1"], address_allow=["127.0.0.0/8"]))
    sent: list[dict[str, str]] = []

    class Stop(Exception):
        pass

    def record(request: Any, **_: Any) -> None:
        sent.append({k.lower(): str(v) for k, v in request.headers.items()})
        raise Stop

    def hook(client: Any) -> None:
        client.meta.events.register("before-send.s3", record)

    source = s3.S3Source(on_client=hook)
    try:
        for secret in ({"accessKeyId": "AKIATENANT", "secretAccessKey": "tenant-secret"}, None):
            with pytest.raises(SourceError):
                asyncio.run(source.fetch(_request("s3://bucket/p", EVIL, secret, endpoint="http://localhost:1")))
    finally:
        egress.configure(before)
    keyed, unsigned = sent
    assert "Credential=AKIATENANT/" in keyed["authorization"] and "x-amz-security-token" not in keyed
    assert "authorization" not in unsigned and "x-amz-security-token" not in unsigned
