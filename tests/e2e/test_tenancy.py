"""Tenants are untrusted: a namespaced BaseModel never gets the node's identity.

Against the real control plane, the agent as a subprocess with ambient credentials of every kind in its
environment: AWS keys with a session token (and the instance metadata endpoint pointed at a recorder), a
GCP service account key file (``GOOGLE_APPLICATION_CREDENTIALS``, generated here), an Azure account key and
service principal (the authority host pointed at a recorder), an OCI config file, and a platform
``HF_TOKEN``. The servers on the other side are this test's own recorders on 127.0.0.1, which keep every
request they get:

* ``attacker`` — what a tenant names as its endpoint. A BaseModel of ``team-evil`` pointing ``s3://``,
  ``gs://``, ``az://`` and ``oci://`` at it is ``Failed`` with a reason naming the rule, and the attacker
  gets no request at all;
* ``sink`` — a server the admin allow-lists (and exempts from the address rules). ClusterBaseModels and
  BaseModels of a trusted namespace pointed at it arrive signed with the node's identity (the SigV4 key id and
  session token, the service account's JWT, the SharedKey, the platform HF token): the rules, not a broken
  signer, are what keep those from tenants; ``team-evil``'s models pointed at the same server arrive with no
  credential of any kind, and the 403 body it answers never reaches their reasons, Events or log lines;
* ``public`` — an allow-listed recording proxy in front of moto: a ``team-evil`` model with no Secret is
  fetched anonymously (unsigned listing, HEAD and ranged GETs through the checked connections) and is Ready.

The agent never exits.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from model_agent.agent.crash_record import PROBATION_S
from model_agent.kube.resources import BASEMODELS, EVENTS
from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.servers.moto import MotoServer, create_bucket, upload_objects
from tests.support.kube import Kube, bm, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
BM = "BaseModel"
EVIL = "team-evil"
TRUSTED = "team-trusted"
NODE_KEY_ID = "AKIANODEIDENTITY0001"
NODE_SESSION_TOKEN = "node-session-token-FwoGZXIvYXdzEJr"
NODE_GCP_EMAIL = "node-identity@platform.iam.gserviceaccount.com"
PLATFORM_HF_TOKEN = "hf_platformTokenNeverForTenants0001"
BODY_MARKER = "INTERNAL-ONLY-BODY-7f3a"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]

    def credentials(self) -> list[str]:
        """Every sign of a credential in this request: auth headers, session tokens, signed query strings."""
        found = [f"{k}: {v[:60]}" for k, v in self.headers.items() if k.lower() in _CREDENTIAL_HEADERS]
        found += [marker for marker in _SIGNED_QUERY if marker in self.path]
        return found


_CREDENTIAL_HEADERS = ("authorization", "x-amz-security-token", "x-ms-authorization", "proxy-authorization")
_SIGNED_QUERY = ("X-Amz-Credential", "X-Amz-Signature", "Signature=", "sig=", "X-Goog-Signature", NODE_KEY_ID)


@dataclass
class Recorder:
    """An HTTP server on 127.0.0.1 that records every request; answers 403 with a body, or forwards upstream."""

    upstream: tuple[str, int] | None = None
    seen: list[Seen] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def matching(self, needle: str) -> list[Seen]:
        return [s for s in list(self.seen) if needle in s.path]

    def start(self) -> None:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = urllib.parse.unquote(self.path)  # obstore's GCS client escapes even "-" in bucket names
                recorder.seen.append(Seen(self.command, path, {k: v for k, v in self.headers.items()}))
                if recorder.upstream is None:
                    payload = f"<Error><Code>AccessDenied</Code><Message>{BODY_MARKER}</Message></Error>".encode()
                    self.send_response(403)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(*recorder.upstream, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    headers["Host"] = f"{recorder.upstream[0]}:{recorder.upstream[1]}"
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(k, v)
                    # A HEAD's length is the object's (it has no body here to count).
                    head_length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                    self.send_header("Content-Length", head_length or str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

            def log_message(self, *_: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def attacker() -> Iterator[Recorder]:
    rec = Recorder()
    rec.start()
    yield rec
    rec.stop()


@pytest.fixture
def sink() -> Iterator[Recorder]:
    rec = Recorder()
    rec.start()
    yield rec
    rec.stop()


AgentFactory = Callable[..., Awaitable[AgentProcess]]


@pytest.fixture
async def make_agent(kubeconfig: Path, kube: Kube, tmp_path: Path, unique: str) -> AsyncIterator[AgentFactory]:
    """``await make_agent(args=..., env=...)``: a Node and an agent for it (no Hub mirror: HF_ENDPOINT is given)."""
    agents: list[AgentProcess] = []

    async def factory(*, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> AgentProcess:
        name = f"node-{unique}-{len(agents)}"
        await kube.create_node(name)
        agent = AgentProcess(
            kubeconfig=kubeconfig,
            node=name,
            models_root=tmp_path / f"models-{name}",
            log_path=tmp_path / f"agent-{name}.log",
            args=("--resync-interval", "30", *args),
            env=env,
        )
        agents.append(agent)
        agent.start()
        await asyncio.to_thread(agent.wait_ready)
        return agent

    try:
        yield factory
    finally:
        for agent in agents:
            if agent.alive():
                agent.stop()


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto-tenancy")) as server:
        yield server


def service_account_key(email: str, token_uri: str) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return json.dumps(
        {
            "type": "service_account",
            "project_id": "platform",
            "private_key_id": "node-key-1",
            "private_key": pem,
            "client_email": email,
            "token_uri": token_uri,
        }
    )


def ambient_identity(tmp_path: Path, recorder: Recorder) -> dict[str, str]:
    """Every kind of node identity the SDKs find in the environment; metadata/authority hosts at ``recorder``."""
    gcp_key = tmp_path / "node-gcp-key.json"
    gcp_key.write_text(service_account_key(NODE_GCP_EMAIL, f"{recorder.endpoint}/token"))
    oci_dir = tmp_path / "oci"
    oci_dir.mkdir()
    oci_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (oci_dir / "key.pem").write_bytes(
        oci_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    (oci_dir / "config").write_text(
        "[DEFAULT]\nuser=ocid1.user.oc1..node\nfingerprint=00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff\n"
        f"tenancy=ocid1.tenancy.oc1..node\nregion=us-ashburn-1\nkey_file={oci_dir / 'key.pem'}\n"
    )
    return {
        "AWS_ACCESS_KEY_ID": NODE_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": "nodeSecretAccessKey0000000000000000000000",
        "AWS_SESSION_TOKEN": NODE_SESSION_TOKEN,
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"{recorder.endpoint}/",
        "GOOGLE_APPLICATION_CREDENTIALS": str(gcp_key),
        "AZURE_STORAGE_ACCOUNT_KEY": base64.b64encode(b"node-azure-account-key-32-bytes!").decode(),
        "AZURE_CLIENT_ID": "node-client-id",
        "AZURE_CLIENT_SECRET": "node-client-secret-value",
        "AZURE_TENANT_ID": "node-tenant-id",
        "AZURE_AUTHORITY_HOST": recorder.endpoint,
        "OCI_CONFIG_PATH": str(oci_dir / "config"),
        "HF_TOKEN": PLATFORM_HF_TOKEN,
    }


def object_models(u: str, endpoint: str, namespace: str | None, root: Path, tag: str) -> dict[str, dict[str, Any]]:
    """One model per object store, all pointed at ``endpoint``; each bucket is named as its model (seen in paths)."""
    uris = {
        "s3": (f"s3://{tag}-s3-{u}/llama", {"endpoint": endpoint, "region": "us-east-1"}),
        "gs": (f"gs://{tag}-gs-{u}/llama", {"endpoint": endpoint}),
        "az": (f"az://acct/{tag}-az-{u}/llama", {"endpoint": f"{endpoint}/acct"}),
    }
    out: dict[str, dict[str, Any]] = {}
    for store, (uri, params) in uris.items():
        name = f"{tag}-{store}-{u}"
        dest = str(root / (namespace or "cluster") / name)
        out[name] = (
            bm(namespace, name, uri, dest, parameters=params) if namespace else cbm(name, uri, dest, parameters=params)
        )
    return out


def kind_ns(manifest: dict[str, Any]) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"].get("namespace", "")


async def entry_of(kube: Kube, agent: AgentProcess, manifest: dict[str, Any]) -> dict[str, Any]:
    kind, ns = kind_ns(manifest)
    return await kube.entry(agent.node, configmap_key(kind, ns, manifest["metadata"]["name"])) or {}


async def wait_failed(kube: Kube, agent: AgentProcess, manifest: dict[str, Any], reason: str | None) -> dict[str, Any]:
    kind, ns = kind_ns(manifest)
    name = manifest["metadata"]["name"]

    async def failed() -> dict[str, Any] | None:
        assert agent.alive(), f"the agent exited; log:\n{agent.tail()}"
        labels = await kube.node_labels(agent.node)
        entry = await entry_of(kube, agent, manifest)
        if labels.get(node_label_key(kind, ns, name)) == "Failed" and entry.get("status") == "Failed":
            return entry
        return None

    entry = await eventually(failed, timeout=60, what=f"{name} Failed")
    assert entry is not None
    if reason is not None:
        assert str(entry.get("reason", "")).startswith(f"{reason}:"), entry
    return entry


async def warning_reasons(kube: Kube, namespace: str, name: str) -> set[str]:
    items = (await kube.c.request("GET", EVENTS.path(namespace)))["items"]
    return {
        str(e.get("reason"))
        for e in items
        if e.get("type") == "Warning" and (e.get("involvedObject") or {}).get("name") == name
    }


async def test_tenant_endpoints_get_no_request_and_the_model_fails_naming_the_rule(
    kube: Kube, make_agent: AgentFactory, attacker: Recorder, sink: Recorder, tmp_path: Path, unique: str
) -> None:
    u = unique
    await kube.ensure_namespace(EVIL)
    env = ambient_identity(tmp_path, sink)
    env["HF_ENDPOINT"] = sink.endpoint
    agent = await make_agent(
        env=env,
        # localhost is allow-listed here: the address rule, checked on what it resolves to, still refuses it.
        args=("--tenant-endpoint-allow", f"http://localhost:{attacker.endpoint.rsplit(':', 1)[1]}"),
    )
    root = agent.models_root
    models = object_models(u, attacker.endpoint, EVIL, root, "evil")
    expected = {name: "EndpointRefused" for name in models}
    extra = {
        f"evil-oci-{u}": (
            bm(
                EVIL,
                f"evil-oci-{u}",
                f"oci://n/evilns/b/evil-{u}/o/llama",
                str(root / EVIL / f"evil-oci-{u}"),
                parameters={"endpoint": attacker.endpoint, "auth": "UserPrincipal"},
            ),
            "CredentialRefused",
        ),
        f"evil-imds-{u}": (
            bm(
                EVIL,
                f"evil-imds-{u}",
                f"s3://evil-{u}/x",
                str(root / EVIL / f"evil-imds-{u}"),
                parameters={"endpoint": "http://169.254.169.254"},
            ),
            "EndpointRefused",
        ),
        f"evil-rebind-{u}": (
            bm(
                EVIL,
                f"evil-rebind-{u}",
                f"s3://evil-{u}/x",
                str(root / EVIL / f"evil-rebind-{u}"),
                parameters={"endpoint": attacker.endpoint.replace("127.0.0.1", "localhost")},
            ),
            "EndpointRefused",
        ),
    }
    for name, (manifest, reason) in extra.items():
        models[name] = manifest
        expected[name] = reason
    for manifest in models.values():
        await kube.apply(manifest)
    for name, manifest in models.items():
        entry = await wait_failed(kube, agent, manifest, expected[name])
        assert EVIL in entry["reason"], entry  # the reason says whose rule it was
        assert expected[name] in await eventually(
            functools.partial(warning_reasons, kube, EVIL, name), timeout=30, what=f"{name} Warning Event"
        )
    rebind = (await entry_of(kube, agent, models[f"evil-rebind-{u}"]))["reason"]
    assert "loopback" in rebind, rebind
    assert attacker.seen == [], [(s.method, s.path) for s in attacker.seen]
    assert sink.seen == [], "a refused tenant model reached the metadata/authority recorder"
    assert agent.alive()
    for name in models:
        await kube.delete_model(BM, name, EVIL)


async def test_the_node_identity_serves_trusted_models_only(
    kube: Kube,
    make_agent: AgentFactory,
    moto: MotoServer,
    attacker: Recorder,
    sink: Recorder,
    tmp_path: Path,
    unique: str,
) -> None:
    u = unique
    await kube.ensure_namespace(EVIL)
    await kube.ensure_namespace(TRUSTED)
    public = Recorder(upstream=("127.0.0.1", int(moto.endpoint.rsplit(":", 1)[1])))
    public.start()
    try:
        files = tiny_llama(47)
        bucket = f"public-{u}"
        client = moto.client()
        await asyncio.to_thread(create_bucket, client, bucket)
        await asyncio.to_thread(upload_objects, client, bucket, {f"llama/{k}": v for k, v in files.items()})
        for key in files:  # a public bucket: what a tenant without a Secret can fetch
            await asyncio.to_thread(client.put_object_acl, Bucket=bucket, Key=f"llama/{key}", ACL="public-read")
        env = ambient_identity(tmp_path, attacker)
        env["HF_ENDPOINT"] = sink.endpoint
        agent = await make_agent(
            env=env,
            args=(
                "--trusted-namespace", TRUSTED,
                "--tenant-endpoint-allow", sink.endpoint,
                "--tenant-endpoint-allow", public.endpoint,
                "--tenant-address-allow", "127.0.0.1/32",
            ),
        )  # fmt: skip
        root = agent.models_root
        trusted = {
            **object_models(u, sink.endpoint, None, root, "cluster"),
            **object_models(u, sink.endpoint, TRUSTED, root, "trusted"),
        }
        tenant = object_models(u, sink.endpoint, EVIL, root, "evil")
        hf_cluster = cbm(f"hf-cluster-{u}", f"hf://platform/cluster-{u}", str(root / "cluster" / f"hf-{u}"))
        hf_tenant = bm(EVIL, f"hf-evil-{u}", f"hf://evil/tenant-{u}", str(root / EVIL / f"hf-{u}"))
        anonymous = bm(
            EVIL,
            f"evil-public-{u}",
            f"s3://{bucket}/llama",
            str(root / EVIL / f"public-{u}"),
            parameters={"endpoint": public.endpoint, "region": "us-east-1"},
        )
        for manifest in [*trusted.values(), *tenant.values(), hf_cluster, hf_tenant, anonymous]:
            await kube.apply(manifest)

        # Trusted models: the sink sees the node's identity (so the signers work; the rules decide who gets them).
        async def signed(tag: str) -> dict[str, Seen]:
            assert agent.alive(), agent.tail()
            found: dict[str, Seen] = {}
            for store in ("s3", "gs", "az"):
                hits = [s for s in sink.matching(f"/{tag}-{store}-{u}") if "authorization" in _lower(s.headers)]
                if hits:
                    found[store] = hits[0]
            return found if len(found) == 3 else {}

        for tag in ("cluster", "trusted"):
            try:
                seen = await eventually(functools.partial(signed, tag), timeout=60, what=f"{tag} models signed")
            except AssertionError as exc:
                summary = [(s.method, s.path[:60], sorted(_lower(s.headers))) for s in sink.seen]
                raise AssertionError(f"{exc}; the sink saw: {summary}") from None
            headers = _lower(seen["s3"].headers)
            assert f"Credential={NODE_KEY_ID}/" in headers["authorization"]
            assert headers["x-amz-security-token"] == NODE_SESSION_TOKEN
            gcs_jwt = _lower(seen["gs"].headers)["authorization"].split()[1]
            claims = json.loads(base64.urlsafe_b64decode(gcs_jwt.split(".")[1] + "=="))
            assert claims["iss"] == NODE_GCP_EMAIL
            assert _lower(seen["az"].headers)["authorization"].startswith("SharedKey acct:")

        async def hf_seen(repo: str) -> list[Seen]:
            return sink.matching(repo)

        hf_platform = await eventually(lambda: hf_seen(f"platform/cluster-{u}"), timeout=60, what="cluster HF call")
        assert _lower(hf_platform[0].headers)["authorization"] == f"Bearer {PLATFORM_HF_TOKEN}"

        # Tenant models: the same sink (allow-listed), no credential of any kind; reasons without its body.
        for manifest in tenant.values():
            entry = await wait_failed(kube, agent, manifest, "AccessDenied")
            assert BODY_MARKER not in json.dumps(entry), entry
        await wait_failed(kube, agent, hf_tenant, None)
        needles = [f"/evil-{store}-{u}" for store in ("s3", "gs", "az")] + [f"evil/tenant-{u}"]
        for needle in needles:
            assert sink.matching(needle), f"no tenant request for {needle} reached the allow-listed sink"
        tenant_requests = [s for s in list(sink.seen) if any(n in s.path for n in needles)]
        for s in tenant_requests:
            assert s.credentials() == [], f"a tenant request carried a credential: {s.method} {s.path} {s.headers}"

        # A tenant's anonymous fetch from an allow-listed public store works end to end, unsigned.
        async def ready() -> bool:
            assert agent.alive(), agent.tail()
            return (await entry_of(kube, agent, anonymous)).get("status") == "Ready"

        await eventually(ready, timeout=90, what="the tenant's public model Ready")
        assert any(s.method == "GET" and "/llama/" in s.path for s in public.seen), "no object GET"
        for s in public.seen:
            assert s.credentials() == [], f"an anonymous tenant fetch carried a credential: {s.path} {s.headers}"

        events = json.dumps((await kube.c.request("GET", EVENTS.path(EVIL)))["items"])
        assert BODY_MARKER not in events
        for line in agent.log_text().splitlines():
            if f"evil-{u}" in line or f"evil/tenant-{u}" in line or EVIL in line:
                assert BODY_MARKER not in line, line
        assert attacker.seen == [], "metadata or authority endpoint contacted"
        assert agent.alive()
        for manifest in [*trusted.values(), *tenant.values(), hf_cluster, hf_tenant, anonymous]:
            kind, ns = kind_ns(manifest)
            await kube.delete_model(kind, manifest["metadata"]["name"], ns or None)
    finally:
        public.stop()


def _lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


# ---------------------------------------------------------------------------------------------------------------
# Resource attacks and the crash loop (item 3): bounded memory, ConfigMap room,
# log masking, download deadlines, durable crash records.

MiB = 1024 * 1024


def chart_memory_limit() -> int:
    """The chart's memory limit for the agent container, in bytes (deploy/helm values: resources.limits.memory)."""
    import yaml

    values = yaml.safe_load((Path(__file__).parents[2] / "deploy/helm/model-agent/values.yaml").read_text())
    text = str(values["resources"]["limits"]["memory"])
    units = {"Ki": 1024, "Mi": MiB, "Gi": 1024 * MiB}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def peak_rss(agent: AgentProcess) -> int:
    """The agent process's peak resident set (VmHWM), bytes."""
    assert agent.proc is not None
    for line in Path(f"/proc/{agent.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@dataclass
class FakeTenantStore:
    """A FAKE S3-compatible object store of this test's own, on 127.0.0.1: what a hostile tenant's endpoint does.

    Path-style requests only; anonymous; every request is recorded. Buckets behave by their name's prefix:

    * ``endless-*``: a ListObjectsV2 that never ends (every page holds 1,000 keys and a new continuation token);
    * ``hang-*``: a listing that is accepted and not answered until :attr:`released` (then 403 AccessDenied);
    * ``gated-*`` (a bucket in ``files``): its listing is answered only once :attr:`released`, then normally;
    * ``trickle-*``: one 1 MiB object whose body trickles one byte every 0.4 s;
    * a bucket in ``files``: those objects, served whole or by ``Range`` (ETag = MD5, as S3 does);
    * anything else: 403 AccessDenied.

    moto cannot paginate forever, hang a listing or trickle a body, hence this fake.
    """

    files: dict[str, dict[str, bytes]] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def listings(self, bucket: str) -> int:
        return sum(1 for method, path in list(self.seen) if method == "GET" and path.startswith(f"/{bucket}?"))

    def start(self) -> None:
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                return None

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                store.seen.append((self.command, self.path))
                url = urllib.parse.urlsplit(self.path)
                bucket, _, key = url.path.lstrip("/").partition("/")
                query = urllib.parse.parse_qs(url.query)
                if not key and "list-type" in query:
                    self._list(bucket, query)
                elif bucket.startswith("trickle-"):
                    self._trickle()
                elif key in store.files.get(bucket, {}):
                    self._object(store.files[bucket][key])
                else:
                    self._send(403, b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>")

            def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
                token = (query.get("continuation-token") or ["0"])[0]
                if bucket.startswith("hang-"):
                    store.released.wait(120)
                    self._send(403, b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>")
                    return
                if bucket.startswith("gated-"):  # a healthy store that is slow to list until released
                    store.released.wait(120)
                if bucket.startswith("endless-"):
                    page = int(token)
                    keys = [(f"m/{page:06d}-{i:04d}", 1, "0" * 32) for i in range(1000)]
                    more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{page + 1}</NextContinuationToken>"
                elif bucket.startswith("trickle-"):
                    keys, more = [("m/model.safetensors", MiB, "1" * 32)], "<IsTruncated>false</IsTruncated>"
                elif bucket in store.files:
                    keys = [(k, len(v), hashlib.md5(v).hexdigest()) for k, v in store.files[bucket].items()]
                    more = "<IsTruncated>false</IsTruncated>"
                else:
                    self._send(403, b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>")
                    return
                contents = "".join(
                    f"<Contents><Key>{k}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
                    f'<ETag>"{etag}"</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>'
                    for k, size, etag in keys
                )
                body = (
                    '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/'
                    f'2006-03-01/"><Name>{bucket}</Name><Prefix>m/</Prefix><KeyCount>{len(keys)}</KeyCount>'
                    f"<MaxKeys>1000</MaxKeys>{more}{contents}</ListBucketResult>"
                ).encode()
                self._send(200, body, {"Content-Type": "application/xml"})

            def _object(self, data: bytes) -> None:
                headers = {"ETag": f'"{hashlib.md5(data).hexdigest()}"', "Accept-Ranges": "bytes"}
                headers["Last-Modified"] = "Thu, 01 Jan 2026 00:00:00 GMT"
                wanted = self.headers.get("Range")
                if self.command == "GET" and wanted and wanted.startswith("bytes="):
                    first, _, last = wanted[6:].partition("-")
                    start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                    self._send(206, data[start : end + 1], headers)
                    return
                self._send(200, data, headers)

            def _trickle(self) -> None:
                headers = {"ETag": f'"{"1" * 32}"', "Accept-Ranges": "bytes", "Content-Length": str(MiB)}
                self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command == "HEAD":
                    return
                for _ in range(MiB):
                    if store.stopping.wait(0.4):
                        return
                    try:
                        self.wfile.write(b"\0")
                        self.wfile.flush()
                    except OSError:
                        return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()
        self.released.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def tenant_store() -> Iterator[FakeTenantStore]:
    store = FakeTenantStore()
    store.start()
    yield store
    store.stop()


def tenant_s3(name: str, bucket: str, store: FakeTenantStore, root: Path, **storage: Any) -> dict[str, Any]:
    params = {"endpoint": store.endpoint, "region": "us-east-1"}
    return bm(EVIL, name, f"s3://{bucket}/m", str(root / EVIL / name), parameters=params, **storage)


def store_args(store: FakeTenantStore) -> tuple[str, ...]:
    # The fake store is on loopback: allow-listed, and exempt from the address rules, like a store the admin named.
    return ("--tenant-endpoint-allow", store.endpoint, "--tenant-address-allow", "127.0.0.1/32")


@dataclass
class Victims:
    """Models of others on the attacked node: a ClusterBaseModel and another tenant's BaseModel, both Ready."""

    models: list[dict[str, Any]]
    dirs: list[Path]
    before: dict[str, Any] = field(default_factory=dict)

    async def snapshot(self, kube: Kube, agent: AgentProcess) -> dict[str, Any]:
        labels = await kube.node_labels(agent.node)
        out: dict[str, Any] = {}
        for manifest in self.models:
            kind, ns = kind_ns(manifest)
            name = manifest["metadata"]["name"]
            out[name] = (labels.get(node_label_key(kind, ns, name)), await entry_of(kube, agent, manifest))
        for d in self.dirs:
            out[str(d)] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}
        return out


async def victims_ready(kube: Kube, agent: AgentProcess, tmp_path: Path, u: str) -> Victims:
    cluster_dir = tmp_path / f"victim-cluster-{u}"
    good_dir = agent.models_root / "team-good" / f"victim-{u}"
    for d, seed in ((cluster_dir, 71), (good_dir, 72)):
        d.mkdir(parents=True)
        for name, data in tiny_llama(seed).items():
            (d / name).write_bytes(data)
    await kube.ensure_namespace("team-good")
    victims = Victims(
        [
            cbm(f"victim-cluster-{u}", f"local://{cluster_dir}"),
            bm("team-good", f"victim-good-{u}", f"local://{good_dir}"),
        ],
        [cluster_dir, good_dir],
    )
    for manifest in victims.models:
        await kube.apply(manifest)
    for manifest in victims.models:
        await wait_state(kube, agent, manifest, "Ready")
    victims.before = await victims.snapshot(kube, agent)
    return victims


async def wait_state(
    kube: Kube, agent: AgentProcess, manifest: dict[str, Any], state: str, timeout: float = 60
) -> dict[str, Any]:
    kind, ns = kind_ns(manifest)
    name = manifest["metadata"]["name"]

    async def reached() -> dict[str, Any] | None:
        assert agent.alive(), f"the agent exited; log:\n{agent.tail()}"
        labels = await kube.node_labels(agent.node)
        entry = await entry_of(kube, agent, manifest)
        if labels.get(node_label_key(kind, ns, name)) == state and entry.get("status") == state:
            return entry
        return None

    entry = await eventually(reached, timeout=timeout, what=f"{name} {state}")
    assert entry is not None
    return entry


async def test_resource_attacks_fail_alone_within_the_memory_limit(
    kube: Kube, make_agent: AgentFactory, tenant_store: FakeTenantStore, tmp_path: Path, unique: str
) -> None:
    """Metadata bomb, 1.2 MB config.json, endless listing, trickling body, Secret values that look like log text.

    Each tenant model ends as the rule says (Failed naming it, or Ready without what it refused), the victims'
    labels, entries and bytes do not change, the agent's peak RSS stays below the chart's memory limit, and the
    agent never exits. The metadata bomb is a 48 MiB index of ``{}``: decoded whole it is well over 1 GiB.
    """
    u = unique
    await kube.ensure_namespace(EVIL)
    shared = tmp_path / f"shared-{u}"  # --tenant-local-allow: pre-provisioned weights for tenants, outside the roots
    agent = await make_agent(
        args=(
            *store_args(tenant_store),
            "--download-min-rate", "4096", "--download-min-rate-window", "3",
            "--tenant-local-allow", str(shared),
        ),
    )  # fmt: skip
    root = agent.models_root
    victims = await victims_ready(kube, agent, tmp_path, u)
    (shared / "llama").mkdir(parents=True)
    for name, data in tiny_llama(75).items():
        (shared / "llama" / name).write_bytes(data)
    (shared / "escape").symlink_to(victims.dirs[0])  # inside the listed directory, leading to the victim's weights

    bomb_files = dict(tiny_llama(73))
    pad = b"[" + b"{}," * (16 * MiB) + b"{}]"
    bomb_files["model.safetensors.index.json"] = (
        b'{"metadata":{},"weight_map":{"lm_head.weight":"model.safetensors"},"pad":' + pad + b"}"
    )
    big_files = dict(tiny_llama(74))
    config = json.loads(big_files["config.json"])
    config["architectures"] = ["L" * (1200 * 1024)]
    big_files["config.json"] = json.dumps(config).encode()
    assert len(big_files["config.json"]) > 1_200_000
    tenant_store.files[f"bomb-{u}"] = {f"m/{k}": v for k, v in bomb_files.items()}
    tenant_store.files[f"big-{u}"] = {f"m/{k}": v for k, v in big_files.items()}
    await kube.c.request(
        "POST",
        f"/api/v1/namespaces/{EVIL}/secrets",
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"looks-like-logs-{u}"},
            "stringData": {
                "AWS_ACCESS_KEY_ID": "model",
                "AWS_SECRET_ACCESS_KEY": "Failed",
                "AWS_SESSION_TOKEN": "BaseModel/",
                "note": "model failed",
            },
        },
    )
    models = {
        "bomb": tenant_s3(f"evil-bomb-{u}", f"bomb-{u}", tenant_store, root),
        "big": tenant_s3(f"evil-bigconfig-{u}", f"big-{u}", tenant_store, root),
        "endless": tenant_s3(f"evil-endless-{u}", f"endless-{u}", tenant_store, root),
        "trickle": tenant_s3(f"evil-trickle-{u}", f"trickle-{u}", tenant_store, root),
        "secret": tenant_s3(f"evil-secret-{u}", f"secret-{u}", tenant_store, root, key=f"looks-like-logs-{u}"),
    }
    models["shared"] = bm(EVIL, f"evil-shared-{u}", f"local://{shared / 'llama'}")
    models["escape"] = bm(EVIL, f"evil-escape-{u}", f"local://{shared / 'escape'}")
    for manifest in models.values():
        await kube.apply(manifest)

    await wait_state(kube, agent, models["shared"], "Ready")  # an admin-listed directory serves tenants
    escape = await wait_failed(kube, agent, models["escape"], "InvalidPath")
    assert str(victims.dirs[0]) not in escape["reason"], escape  # the symlink's target is not revealed
    endless = await wait_failed(kube, agent, models["endless"], "ListingTooLarge")
    assert "more than 100000 objects" in endless["reason"], endless
    trickle = await wait_failed(kube, agent, models["trickle"], "DownloadTooSlow")
    assert "--download-min-rate" in trickle["reason"], trickle
    await wait_failed(kube, agent, models["secret"], "AccessDenied")
    # The bomb's weights are fine: Ready, with the parameter count estimated (the index was refused unread).
    await wait_state(kube, agent, models["bomb"], "Ready")
    big = await wait_state(kube, agent, models["big"], "Ready")
    entry_text = json.dumps(big)
    assert len(entry_text) < 4096, len(entry_text)  # strings from the model's files are capped
    assert big.get("config", {}).get("modelArchitecture", "").startswith("LLL"), big

    for name, manifest in models.items():
        reasons = await warning_reasons(kube, EVIL, manifest["metadata"]["name"])
        if name in ("endless", "trickle", "secret", "escape"):
            assert reasons, f"no Warning Event for {name}"
    assert await victims.snapshot(kube, agent) == victims.before
    limit = chart_memory_limit()
    peak = peak_rss(agent)
    assert peak < limit, f"peak RSS {peak / MiB:.0f} MiB >= the chart's limit {limit / MiB:.0f} MiB"
    # The Secret's short values are not log masks: later lines about other models read as written.
    log_text = agent.log_text()
    assert "[REDACTED] failed" not in log_text and '"[REDACTED]"' not in log_text.replace('"token": "[REDACTED]"', "")
    failed_lines = [line for line in log_text.splitlines() if f"evil-endless-{u}" in line and "model failed" in line]
    assert failed_lines and all("BaseModel/" in line for line in failed_lines), failed_lines[:2]
    assert agent.alive()
    print(f"peak RSS {peak / MiB:.0f} MiB (limit {limit / MiB:.0f} MiB)")


async def test_failing_models_of_one_namespace_fill_only_their_share(
    kube: Kube, make_agent: AgentFactory, tmp_path: Path, unique: str
) -> None:
    """Twelve invalid models of ``team-evil`` with a cap of five: five entries and labels, seven Events only."""
    u = unique
    await kube.ensure_namespace(EVIL)
    agent = await make_agent(args=("--max-failed-per-namespace", "5"))
    root = agent.models_root
    victims = await victims_ready(kube, agent, tmp_path, u)
    invalid = [
        bm(EVIL, f"evil-many-{i:02d}-{u}", f"s3://b-{u}/x", str(root / EVIL / f"many-{i}"),
           parameters={"endpoint": "http://169.254.169.254"})
        for i in range(12)
    ]  # fmt: skip
    for manifest in invalid:
        await kube.apply(manifest)

    async def decided() -> bool:
        assert agent.alive(), agent.tail()
        items = (await kube.c.request("GET", EVENTS.path(EVIL)))["items"]
        warned = {(e.get("involvedObject") or {}).get("name") for e in items if e.get("type") == "Warning"}
        return all(m["metadata"]["name"] in warned for m in invalid)

    await eventually(decided, timeout=60, what="a Warning Event for every invalid model")
    labels = await kube.node_labels(agent.node)
    shown = []
    for manifest in invalid:
        name = manifest["metadata"]["name"]
        entry = await entry_of(kube, agent, manifest)
        label = labels.get(node_label_key(BM, EVIL, name))
        assert (label is None) == (not entry), (name, label, entry)
        if entry:
            assert entry["status"] == "Failed" and entry["reason"].startswith("EndpointRefused:"), entry
            shown.append(name)
    assert len(shown) == 5, shown
    refused = agent.metric("model_agent_failed_entries_refused_total", namespace=EVIL)
    assert refused == 7, refused
    items = (await kube.c.request("GET", EVENTS.path(EVIL)))["items"]
    notes = [e["message"] for e in items if "FailedQuotaExceeded" in str(e.get("message"))]
    assert len(notes) == 7, notes
    assert await victims.snapshot(kube, agent) == victims.before
    assert peak_rss(agent) < chart_memory_limit()
    assert agent.alive()


async def kill_during_listings(agent: AgentProcess, store: FakeTenantStore, bucket: str, times: int) -> None:
    """SIGKILL the agent ``times`` times, each while a listing of ``bucket`` is open, and start it again."""
    for death in range(1, times + 1):

        async def listing_started(n: int = death) -> bool:
            assert agent.alive(), agent.tail()
            return store.listings(bucket) >= n

        await eventually(listing_started, timeout=30, what=f"listing {death} under way")
        await asyncio.to_thread(agent.kill)
        agent.start()
        await asyncio.to_thread(agent.wait_ready)


async def test_three_kills_during_a_healthy_models_listing_leave_it_ready_once_the_agent_runs_undisturbed(
    kube: Kube, make_agent: AgentFactory, tenant_store: FakeTenantStore, unique: str
) -> None:
    """SIGKILLs that the model did not cause (a liveness-probe kill, an OOM of something else, a drain) three
    times within a second of start-up, each while the healthy model's listing is open: the crash guard charges
    it and quarantines it, but only on probation. Once the agent runs undisturbed the model is tried again and
    Ready, without anyone editing it."""
    u = unique
    await kube.ensure_namespace(EVIL)
    bucket = f"gated-{u}"
    tenant_store.files[bucket] = {"m/config.json": b'{"architectures": ["LlamaForCausalLM"]}', "m/w.bin": b"w" * 4096}
    agent = await make_agent(args=store_args(tenant_store))
    model = tenant_s3(f"healthy-{u}", bucket, tenant_store, agent.models_root)
    await kube.apply(model)
    await kill_during_listings(agent, tenant_store, bucket, 3)
    tenant_store.released.set()  # from now on the store answers, and nothing kills the agent
    entry = await wait_failed(kube, agent, model, "QuarantinedAfterCrash")
    assert "tried again in" in entry["reason"], entry
    label = node_label_key("BaseModel", EVIL, model["metadata"]["name"])

    async def ready() -> bool:
        assert agent.alive(), agent.tail()
        return (await kube.node_labels(agent.node)).get(label) == "Ready"

    await eventually(ready, timeout=PROBATION_S + 60, what="Ready after the probation, with no edit")
    assert (agent.models_root / EVIL / model["metadata"]["name"] / "w.bin").read_bytes() == b"w" * 4096
    await asyncio.to_thread(agent.stop, 30.0)


async def test_an_agent_killed_during_a_listing_does_not_loop(
    kube: Kube, make_agent: AgentFactory, tenant_store: FakeTenantStore, tmp_path: Path, unique: str
) -> None:
    """The agent SIGKILLed during a tenant model's listing, three times: the next start quarantines the model.

    The fault is real and deterministic: the fake store accepts the listing and never answers, so the agent is
    inside the step when the test kills it (as the kernel's OOM killer would on a listing that ate memory). The
    fourth start lists nothing for the model: ``Failed: QuarantinedAfterCrash``, an Event, the agent stays up.
    A changed spec is tried again.
    """
    u = unique
    await kube.ensure_namespace(EVIL)
    agent = await make_agent(args=store_args(tenant_store))
    root = agent.models_root
    model = tenant_s3(f"evil-hang-{u}", f"hang-{u}", tenant_store, root)
    bucket = f"hang-{u}"
    await kube.apply(model)
    await kill_during_listings(agent, tenant_store, bucket, 3)
    entry = await wait_failed(kube, agent, model, "QuarantinedAfterCrash")
    assert "3 times" in entry["reason"] and "listing" in entry["reason"], entry
    assert "QuarantinedAfterCrash" in await eventually(
        functools.partial(warning_reasons, kube, EVIL, model["metadata"]["name"]), timeout=30, what="the Event"
    )
    assert tenant_store.listings(bucket) == 3, tenant_store.seen
    assert agent.alive()
    # A new spec (generation) is a new chance: listed again.
    await kube.c.request(
        "PATCH",
        f"/apis/ome.io/v1beta1/namespaces/{EVIL}/basemodels/{model['metadata']['name']}",
        body={"spec": {"storage": {"parameters": {**model["spec"]["storage"]["parameters"], "retry": "1"}}}},
        content_type="application/merge-patch+json",
    )

    async def listed_again() -> bool:
        return tenant_store.listings(bucket) >= 4

    await eventually(listed_again, timeout=30, what="a listing for the changed spec")
    assert agent.alive()
    # A listing thread cannot be interrupted: answer the held listing so the agent can stop in time.
    tenant_store.released.set()
    await asyncio.to_thread(agent.stop, 30.0)


async def test_models_of_one_namespace_fill_only_their_share_of_ready_and_updating(
    kube: Kube, make_agent: AgentFactory, tmp_path: Path, unique: str
) -> None:
    """Eight valid models of ``team-evil`` with a cap of three Ready or Updating: three Ready, five ``Failed:
    ModelQuotaExceeded`` (never fetched, counted), the admin's models untouched; deleting a Ready one frees its
    place for one of the others at its next retry (every minute: here a spec touch brings it forward)."""
    u = unique
    await kube.ensure_namespace(EVIL)
    agent = await make_agent(args=("--max-models-per-namespace", "3"))
    root = agent.models_root
    victims = await victims_ready(kube, agent, tmp_path, u)
    many = []
    for i in range(8):
        weights = root / EVIL / f"quota-{i}"
        weights.mkdir(parents=True)
        for name, data in tiny_llama(100 + i).items():
            (weights / name).write_bytes(data)
        many.append(bm(EVIL, f"evil-quota-{i}-{u}", f"local://{weights}"))
    for manifest in many:
        await kube.apply(manifest)

    async def states() -> dict[str, str]:
        out = {}
        for manifest in many:
            entry = await entry_of(kube, agent, manifest)
            out[manifest["metadata"]["name"]] = f"{entry['status']}:{entry.get('reason', '')}" if entry else ""
        return out

    async def decided() -> dict[str, str] | None:
        assert agent.alive(), agent.tail()
        now = await states()
        return now if all(s.startswith(("Ready", "Failed")) for s in now.values()) else None

    found = await eventually(decided, timeout=60, what="every model Ready or refused")
    assert found is not None
    ready = [n for n, s in found.items() if s.startswith("Ready")]
    refused = [n for n, s in found.items() if s.startswith("Failed:ModelQuotaExceeded")]
    assert (len(ready), len(refused)) == (3, 5), found
    assert agent.metric("model_agent_models_refused_total", namespace=EVIL) == 5
    assert await victims.snapshot(kube, agent) == victims.before
    await kube.delete_model(BM, ready[0], EVIL)

    async def one_more_ready() -> bool:
        for name in refused:  # a touch of each refused model's spec brings its retry forward
            await kube.c.request(
                "PATCH",
                BASEMODELS.path(EVIL, name),
                body={"metadata": {"annotations": {"touch": str(time.monotonic())}}},
                content_type="application/merge-patch+json",
            )
        now = await states()
        return sum(1 for s in now.values() if s.startswith("Ready")) == 3 and not now[ready[0]]

    await eventually(one_more_ready, timeout=60, interval=1.0, what="a refused model taking the freed place")
