"""kube/kubeconfig.py and KubeClient.connect without the Kubernetes client library.

The decision (:func:`plan`) is table-tested; the I/O is tested against a real TLS server on loopback with
certificates from the test bed's PKI: a kubeconfig with inline (``*-data``) material authenticates with the
client certificate, the in-cluster service account sends its token, and a kubeconfig using an ``exec`` plugin
still works through the library (the fallback), with the plugin's token.
"""

from __future__ import annotations

import base64
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from model_agent.kube import kubeconfig
from model_agent.kube.client import KubeClient
from model_agent.kube.kubeconfig import Credentials, KubeconfigError, Material, NeedsLibrary, TokenSource, plan
from testbed.servers import pki

BASE = Path("/etc/kube")


def doc(cluster: dict[str, Any], user: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    context: dict[str, Any] = {"cluster": "c"}
    if user is not None:
        context["user"] = "u"
    return {
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user or {}}],
        "contexts": [{"name": "ctx", "context": context}, {"name": "other", "context": {"cluster": "missing"}}],
        "current-context": "ctx",
        **extra,
    }


HTTPS = {"server": "https://10.0.0.1:6443/"}
PLANS: list[tuple[str, dict[str, Any], Credentials | NeedsLibrary]] = [
    ("plain http, no user", doc({"server": "http://127.0.0.1:8080"}), Credentials(host="http://127.0.0.1:8080")),
    (
        "http ignores TLS fields (as the library does)",
        doc({"server": "http://h", "certificate-authority": "ca.crt"}, {"client-certificate": "c.crt"}),
        Credentials(host="http://h"),
    ),
    (
        "relative files resolve against the kubeconfig's directory",
        doc({**HTTPS, "certificate-authority": "ca.crt"}, {"client-certificate": "c.crt", "client-key": "/k.pem"}),
        Credentials(
            host="https://10.0.0.1:6443",
            ca=Material(path=BASE / "ca.crt"),
            client_cert=Material(path=BASE / "c.crt"),
            client_key=Material(path=Path("/k.pem")),
        ),
    ),
    (
        "inline data wins over a file",
        doc(
            {
                **HTTPS,
                "certificate-authority": "ca.crt",
                "certificate-authority-data": base64.b64encode(b"PEM").decode(),
            }
        ),
        Credentials(host="https://10.0.0.1:6443", ca=Material(data=b"PEM")),
    ),
    (
        "token wins over tokenFile",
        doc(HTTPS, {"token": "abc", "tokenFile": "t"}),
        Credentials(host="https://10.0.0.1:6443", token="abc"),
    ),
    ("tokenFile", doc(HTTPS, {"tokenFile": "t"}), Credentials(host="https://10.0.0.1:6443", token_file=BASE / "t")),
    (
        "insecure-skip-tls-verify",
        doc({**HTTPS, "insecure-skip-tls-verify": True}),
        Credentials(host="https://10.0.0.1:6443", verify=False),
    ),
    ("exec plugin", doc(HTTPS, {"exec": {"command": "x"}}), NeedsLibrary("user uses exec")),
    ("auth-provider", doc(HTTPS, {"auth-provider": {"name": "oidc"}}), NeedsLibrary("user uses auth-provider")),
    ("basic auth", doc(HTTPS, {"username": "a", "password": "b"}), NeedsLibrary("user uses username")),
    ("tls-server-name", doc({**HTTPS, "tls-server-name": "k"}), NeedsLibrary("cluster uses tls-server-name")),
    ("proxy-url", doc({**HTTPS, "proxy-url": "http://p"}), NeedsLibrary("cluster uses proxy-url")),
]


@pytest.mark.parametrize(("case", "config", "want"), PLANS, ids=[p[0] for p in PLANS])
def test_plan(case: str, config: dict[str, Any], want: Credentials | NeedsLibrary) -> None:
    assert plan(config, BASE) == want


@pytest.mark.parametrize(
    ("config", "context", "message"),
    [
        (doc(HTTPS), "nope", "context 'nope' not found"),
        (doc(HTTPS), "other", "cluster 'missing'"),
        (doc({"certificate-authority": "x"}), None, "has no server"),
        ({**doc(HTTPS), "current-context": ""}, None, "no context given"),
    ],
)
def test_plan_rejects_a_malformed_kubeconfig_clearly(config: dict[str, Any], context: str | None, message: str) -> None:
    with pytest.raises(KubeconfigError, match=message):
        plan(config, BASE, context)


def test_a_named_context_is_used_over_the_current_one() -> None:
    config = doc(HTTPS)
    config["clusters"].append({"name": "missing", "cluster": {"server": "http://second"}})
    assert plan(config, BASE, "other") == Credentials(host="http://second")


def test_in_cluster_needs_host_port_token_and_ca(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert kubeconfig.in_cluster(env, tmp_path) is None  # no token, no CA: not in a pod
    (tmp_path / "token").write_text("tok")
    (tmp_path / "ca.crt").write_text("")
    assert kubeconfig.in_cluster(env, tmp_path) is None  # an empty CA
    (tmp_path / "ca.crt").write_text("PEM")
    assert kubeconfig.in_cluster({"KUBERNETES_SERVICE_HOST": "h"}, tmp_path) is None
    creds = kubeconfig.in_cluster(env, tmp_path)
    assert creds == Credentials(
        host="https://[fd00::1]:443", ca=Material(path=tmp_path / "ca.crt"), token_file=tmp_path / "token"
    )


def test_a_token_file_is_reread_after_a_minute(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    now = [0.0]
    source = TokenSource(Credentials(host="https://h", token_file=token), clock=lambda: now[0])
    assert source.header() == "Bearer first"
    token.write_text("second")  # the kubelet rotated the projected token
    now[0] = 59.0
    assert source.header() == "Bearer first"
    now[0] = 60.0
    assert source.header() == "Bearer second"
    token.write_text("")  # caught mid-rotation: keep the last good token
    now[0] = 121.0
    assert source.header() == "Bearer second"


def test_default_kubeconfig_leaves_a_merge_to_the_library() -> None:
    assert kubeconfig.default_kubeconfig({"KUBECONFIG": "/a"}) == Path("/a")
    assert kubeconfig.default_kubeconfig({"KUBECONFIG": "/a:/b"}) is None
    assert kubeconfig.default_kubeconfig({}) == Path("~/.kube/config").expanduser()


# --- against a real TLS server ------------------------------------------------------------------------------


class Seen:
    def __init__(self) -> None:
        self.authorization: list[str | None] = []
        self.client_cn: list[str | None] = []


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[pki.Pki, int, Seen]]:
    certs = pki.generate(tmp_path / "pki")
    seen = Seen()

    async def handler(request: web.Request) -> web.Response:
        seen.authorization.append(request.headers.get("Authorization"))
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(x[0] for x in peer["subject"]) if peer else {}
        seen.client_cn.append(subject.get("commonName"))
        return web.json_response({"kind": "Node", "metadata": {"name": "n"}})

    app = web.Application()
    app.router.add_get("/api/v1/nodes/n", handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs.ca_cert))
    context.load_cert_chain(str(certs.serving_cert), str(certs.serving_key))
    context.verify_mode = ssl.CERT_OPTIONAL  # a client certificate is checked when given; tokens work without
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield certs, port, seen
    finally:
        await runner.cleanup()


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig_file(tmp_path: Path, port: int, user: dict[str, Any], cluster: dict[str, Any]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc({"server": f"https://127.0.0.1:{port}", **cluster}, user)))
    return path


async def test_inline_client_certificate_authenticates(tls_server: tuple[pki.Pki, int, Seen], tmp_path: Path) -> None:
    certs, port, seen = tls_server
    user = {"client-certificate-data": b64(certs.admin_cert), "client-key-data": b64(certs.admin_key)}
    path = kubeconfig_file(tmp_path, port, user, {"certificate-authority-data": b64(certs.ca_cert)})
    client = await KubeClient.connect(path)
    try:
        assert (await client.request("GET", "/api/v1/nodes/n"))["metadata"]["name"] == "n"
    finally:
        await client.close()
    assert seen.client_cn == ["model-agent-dev-admin"]
    assert seen.authorization == [None]


async def test_a_server_not_signed_by_the_given_ca_is_refused(
    tls_server: tuple[pki.Pki, int, Seen], tmp_path: Path
) -> None:
    _, port, seen = tls_server
    other = pki.generate(tmp_path / "other")
    path = kubeconfig_file(tmp_path, port, {"token": "t"}, {"certificate-authority": str(other.ca_cert)})
    client = await KubeClient.connect(path)
    try:
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            await client.request("GET", "/api/v1/nodes/n")
    finally:
        await client.close()
    assert seen.authorization == []  # nothing, not even the token, reached the impostor


async def test_in_cluster_service_account_sends_its_token(
    tls_server: tuple[pki.Pki, int, Seen], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs, port, seen = tls_server
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("pod-bound-token")
    (account / "ca.crt").write_bytes(certs.ca_cert.read_bytes())
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    client = await KubeClient.connect()
    try:
        await client.request("GET", "/api/v1/nodes/n")
    finally:
        await client.close()
    assert seen.authorization == ["Bearer pod-bound-token"]


async def test_an_exec_plugin_still_works_through_the_library(
    tls_server: tuple[pki.Pki, int, Seen], tmp_path: Path
) -> None:
    certs, port, seen = tls_server
    credential = (
        '{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"from-exec"}}'
    )
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": sys.executable,
        "args": ["-c", f"print({credential!r})"],
    }
    path = kubeconfig_file(tmp_path, port, {"exec": plugin}, {"certificate-authority": str(certs.ca_cert)})
    client = await KubeClient.connect(path)
    try:
        await client.request("GET", "/api/v1/nodes/n")
    finally:
        await client.close()
    assert seen.authorization == ["Bearer from-exec"]
