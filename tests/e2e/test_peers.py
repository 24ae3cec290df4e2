"""Node-to-node distribution end to end: agents fetch a model from each other, verified against the hub's sha256.

Real agents (subprocesses, one Node each, each its own models root) against the real API server and olah.
The origin's bytes are counted at olah's proxy per User-Agent (``model-agent/<node>``); the peer token is a
real TokenRequest token of a ServiceAccount for the peer audience, checked by the API server's TokenReview.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from model_agent.agent.origin_slots import lease_names
from model_agent.kube.client import ApiError
from model_agent.kube.resources import LEASES
from model_agent.model.keys import configmap_key, node_label_key
from model_agent.peers import DEFAULT_AUDIENCE
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.ports import free_port
from testbed.servers.olah import DEFAULT_LFS_PATTERNS, OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, bm, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
SA = "model-agent-peer-e2e"
USERNAME = f"system:serviceaccount:ome:{SA}"


async def mint_token(kube: Kube, tmp_path: Path, audience: str | None, name: str, node: str | None = None) -> Path:
    """A TokenRequest token of the test's ServiceAccount (for ``audience``; None: the API server's own), bound to
    the Node ``node`` (created if missing) when given: it then carries the node claim, as the kubelet's pod-bound
    projected token does, which a peer server requires."""
    try:
        await kube.c.request(
            "POST",
            "/api/v1/namespaces/ome/serviceaccounts",
            body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA}},
        )
    except ApiError as exc:
        if exc.status != 409:
            raise
    spec: dict[str, object] = {"expirationSeconds": 3600}
    if audience is not None:
        spec["audiences"] = [audience]
    if node is not None:
        await kube.create_node(node)
        uid = (await kube.c.request("GET", f"/api/v1/nodes/{node}"))["metadata"]["uid"]
        spec["boundObjectRef"] = {"kind": "Node", "apiVersion": "v1", "name": node, "uid": uid}
    answer = await kube.c.request(
        "POST",
        f"/api/v1/namespaces/ome/serviceaccounts/{SA}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    path = tmp_path / name
    path.write_text(answer["status"]["token"])
    return path


def peer_env(token: Path, port: int, advertise: str | None = None) -> dict[str, str]:
    return {
        "MODEL_AGENT_PEER_ENABLED": "true",
        "MODEL_AGENT_PEER_PORT": str(port),
        "MODEL_AGENT_PEER_BIND_ADDRESS": "127.0.0.1",
        "MODEL_AGENT_PEER_ADVERTISE_ADDRESS": advertise or f"127.0.0.1:{port}",
        "MODEL_AGENT_PEER_TOKEN_FILE": str(token),
        "MODEL_AGENT_PEER_ALLOWED_USERNAME": USERNAME,
    }


@pytest.fixture
async def byte_flipper() -> AsyncIterator[tuple[int, list[int]]]:
    """A proxy on a free port in front of 127.0.0.1:<upstream> that flips one byte of every body it relays.

    Yields ``(port, [upstream])``: the test sets the upstream port once it is known.
    """
    upstream: list[int] = []
    session = aiohttp.ClientSession(auto_decompress=False)

    async def relay(req: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in req.headers.items() if k.lower() in ("authorization", "range")}
        async with session.get(f"http://127.0.0.1:{upstream[0]}{req.path}", headers=headers) as r:
            body = bytearray(await r.read())
            if body:
                body[len(body) // 2] ^= 0x01
            keep = {k: v for k, v in r.headers.items() if k.lower() in ("content-range", "accept-ranges", "etag")}
            return web.Response(status=r.status, body=bytes(body), headers=keep)

    app = web.Application()
    app.router.add_get("/{tail:.*}", relay)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port, upstream
    finally:
        await runner.cleanup()
        await session.close()


def model_files(seed: int) -> dict[str, bytes]:
    """A tiny llama plus four LFS shards (a few MiB in all): several files to spread over peers."""
    files = tiny_llama(seed, padding_bytes=2 << 20)
    rng = hashlib.sha256(str(seed).encode()).digest()
    for i in range(4):
        files[f"extra/shard-{i}.dat"] = (rng * (1 << 15))[: (1 << 20) + i]
    return files


def origin_bytes(olah: OlahServer, repo: str) -> dict[str, int]:
    """Body bytes olah served for the repo's files, by the node named in the User-Agent."""
    by_node: dict[str, int] = {}
    for r in olah.requests():
        if r.method == "GET" and f"/{repo}/resolve/" in r.path:
            node = re.sub(r".*model-agent/", "", r.client)
            by_node[node] = by_node.get(node, 0) + r.bytes_sent
    return by_node


async def bytes_by_source(kube: Kube, agent: AgentProcess, name: str) -> dict[str, int]:
    """Where the node's copy of ``name`` came from, as its ConfigMap entry says; ``/status`` must say the same."""
    entry = await kube.entry(agent.node, configmap_key(CBM, "", name)) or {}
    recorded: dict[str, int] = entry.get("bytesBySource") or {}
    code, body = agent.http("/status")
    assert code == 200, body
    rows = [m for m in json.loads(body)["models"] if m["name"] == name]
    assert rows and rows[0]["bytesBySource"] == recorded, (rows, recorded)
    return recorded


async def hold_origin_slot(kube: Kube, uri: str, holder: str) -> str:
    """Take the source's one origin slot (its Lease) for ``holder``, as a node in the middle of a fetch would."""
    name = lease_names(uri, 1)[0]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": holder, "leaseDurationSeconds": 3600, "acquireTime": now, "renewTime": now}
    try:
        lease = await kube.c.request("GET", LEASES.path("ome", name))
    except ApiError as exc:
        if exc.status != 404:
            raise
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": spec}
        await kube.c.request("POST", LEASES.path("ome"), body=body)
        return name
    lease["spec"] = spec
    await kube.c.request("PUT", LEASES.path("ome", name), body=lease)
    return name


async def release_origin_slot(kube: Kube, name: str) -> None:
    lease = await kube.c.request("GET", LEASES.path("ome", name))
    lease["spec"]["holderIdentity"] = ""
    lease["spec"]["renewTime"] = "2000-01-01T00:00:00.000000Z"
    await kube.c.request("PUT", LEASES.path("ome", name), body=lease)


def on_disk(root: Path, files: dict[str, bytes]) -> bool:
    """Whether every file of the model is under ``root`` with exactly its bytes."""
    return all((root / "m" / rel).read_bytes() == data for rel, data in files.items())


async def test_peers_serve_the_fleet_a_liar_is_banned_and_the_service_off_falls_back(
    kube: Kube,
    olah: OlahServer,
    mirrors_root: Path,
    make_agent: AgentFactory,
    unique: str,
    tmp_path: Path,
    byte_flipper: tuple[int, list[int]],
) -> None:
    files = model_files(53)
    total = sum(len(b) for b in files.values())
    repo = f"acme/peers-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files, lfs_patterns=(*DEFAULT_LFS_PATTERNS, "*.dat"))
    group = f"peers-{unique}"
    args = ("--max-concurrent-origin-fetches", "1")
    ports = [free_port() for _ in range(4)]
    flip_port, flip_upstream = byte_flipper
    flip_upstream.append(ports[1])
    roles = ["seed", "liar", "b", "c"]
    tokens = {r: await mint_token(kube, tmp_path, DEFAULT_AUDIENCE, f"token-{r}", f"node-{unique}-{r}") for r in roles}
    token = tokens["seed"]
    # seed: the first holder; liar: its peer server is honest but it advertises the byte-flipping proxy
    seed, liar, b, c = [
        await make_agent(
            node=f"node-{unique}-{role}",
            labels={"peer-test": group},
            args=args,
            env=peer_env(tokens[role], ports[i], f"127.0.0.1:{flip_port}" if role == "liar" else None),
        )
        for i, role in enumerate(roles)
    ]
    off = await make_agent(labels={"peer-test": group}, args=args)  # the peer service off
    uri = f"hf://{repo}"
    olah.reset_stats()

    # Each agent has its own models root here (one machine), so each node gets its own model object with the
    # same source, pinned to it: the peer directory matches holders by source.
    def model_of(agent: AgentProcess) -> str:
        return f"peers-{unique}-{agent.node[-1]}"

    async def join(*agents: AgentProcess) -> None:
        for agent in agents:
            selector = {"kubernetes.io/hostname": agent.node}
            await kube.apply(cbm(model_of(agent), uri, str(agent.models_root / "m"), nodeSelector=selector))

    async def ready(*agents: AgentProcess) -> bool:
        labels = [await kube.node_labels(a.node) for a in agents]
        return all(
            ls.get(node_label_key(CBM, "", model_of(a))) == "Ready" for ls, a in zip(labels, agents, strict=True)
        )

    # 1. the seed alone fetches from the origin
    await join(seed)
    await eventually(lambda: ready(seed), timeout=90, what="the seed Ready")
    # 2. the liar node takes the weights from the seed (its own peer server is honest)
    await join(liar)
    await eventually(lambda: ready(liar), timeout=90, what="the liar node Ready (from the seed)")
    # 3. the rest at once: the two holders are the seed and the byte-flipping address
    await join(b, c, off)
    await eventually(lambda: ready(b, c, off), timeout=120, what="every node Ready")

    served = origin_bytes(olah, repo)
    print(f"peers e2e: origin bytes by node {served}, model {total} bytes")
    for agent in (seed, liar, b, c, off):
        assert on_disk(agent.models_root, files), agent.node
    peer_agents = (seed, liar, b, c)
    from_origin = sum(served.get(a.node, 0) for a in peer_agents)
    assert from_origin <= 1.1 * total, (served, total)  # the origin served the peer fleet the model about once
    assert served.get(off.node, 0) >= total * 0.99  # the service off: every byte from the origin, as before
    # the proxy flipped bytes: the nodes that asked it banned it, nothing corrupt was published (bytes above)
    banned = sum(a.metric("model_agent_peers_banned_total") for a in (b, c))
    assert banned >= 1, banned
    assert (
        sum(a.metric("model_agent_fetched_bytes_by_source_total", source="peer") for a in (liar, b, c))
        >= 3 * (total - 64 * 1024) * 0.9
    )
    assert seed.metric("model_agent_peer_upload_bytes_total") > 0
    # where each copy's bytes came from, in the node's ConfigMap entry (bytesBySource) and in `model-agent status`
    came_from = {a.node: await bytes_by_source(kube, a, model_of(a)) for a in (seed, liar, b, c, off)}
    print(f"peers e2e: bytesBySource by node {came_from}")
    assert came_from[seed.node]["peer"] == 0 and came_from[seed.node]["origin"] >= 0.99 * total
    repo_bytes = came_from[seed.node]["origin"]  # every file of the repo (.gitattributes too), once
    for agent in (liar, b, c):  # from peers, the small files too (by their git blob id), each byte counted once
        assert came_from[agent.node]["peer"] >= 0.5 * total, came_from
        assert sum(came_from[agent.node].values()) == repo_bytes, came_from
    # the liar node joined alone, the seed Ready: every file from it, nothing from the origin
    assert came_from[liar.node] == {"origin": 0, "peer": repo_bytes, "sharedRoot": 0}, came_from
    assert served.get(liar.node, 0) == 0, served
    assert came_from[off.node]["peer"] == 0 and came_from[off.node]["origin"] >= 0.99 * total

    # 4. a tenant's BaseModel of the same source on a peer-enabled node: four peers hold the source Ready, yet it
    # takes no byte from them and queues for the origin slot (held here by another node) instead of skipping it
    tenant_ns = f"tenant-{unique}"
    await kube.ensure_namespace(tenant_ns)
    tenant_node = f"node-{unique}-tenant"
    tenant = await make_agent(
        node=tenant_node,
        labels={"peer-test": group},
        args=(*args, "--tenant-address-allow", "127.0.0.0/8"),
        env=peer_env(await mint_token(kube, tmp_path, DEFAULT_AUDIENCE, "token-tenant", tenant_node), free_port()),
    )
    slot = await hold_origin_slot(kube, uri, "another-node")
    tenant_name = f"peers-tenant-{unique}"
    tenant_label = node_label_key("BaseModel", tenant_ns, tenant_name)
    tenant_key = configmap_key("BaseModel", tenant_ns, tenant_name)
    selector = {"kubernetes.io/hostname": tenant.node}
    await kube.apply(bm(tenant_ns, tenant_name, uri, str(tenant.models_root / tenant_ns / "m"), nodeSelector=selector))

    async def tenant_queued() -> bool:
        entry = await kube.entry(tenant.node, tenant_key) or {}
        return (entry.get("progress") or {}).get("phase") == "queued"

    await eventually(tenant_queued, timeout=60, what="the tenant's fetch queued for the origin slot")
    assert (await kube.node_labels(tenant.node)).get(tenant_label) == "Updating"
    await release_origin_slot(kube, slot)

    async def tenant_ready() -> bool:
        return (await kube.node_labels(tenant.node)).get(tenant_label) == "Ready"

    await eventually(tenant_ready, timeout=90, what="the tenant's model Ready once the slot is free")
    tenant_entry = await kube.entry(tenant.node, tenant_key) or {}
    print(f"peers e2e: tenant BaseModel bytesBySource {tenant_entry.get('bytesBySource')}")
    assert tenant_entry.get("bytesBySource") == {"origin": repo_bytes, "peer": 0, "sharedRoot": 0}, tenant_entry
    assert origin_bytes(olah, repo).get(tenant.node, 0) >= repo_bytes  # counted at the origin, every byte
    assert tenant.metric("model_agent_fetched_bytes_by_source_total", source="peer") == 0
    assert all((tenant.models_root / tenant_ns / "m" / rel).read_bytes() == data for rel, data in files.items())
    await kube.delete_model("BaseModel", tenant_name, tenant_ns)

    # 3. the peer server refuses a token without the audience (403), one without a node claim (403), and no
    # token (401)
    no_audience = (await mint_token(kube, tmp_path, None, "plain-token", seed.node)).read_text()
    unbound = (await mint_token(kube, tmp_path, DEFAULT_AUDIENCE, "unbound-token")).read_text()
    digest = hashlib.sha256(files["model.safetensors"]).hexdigest()
    url = f"http://127.0.0.1:{ports[0]}/blobs/sha256/{digest}"
    async with aiohttp.ClientSession() as s:
        async with s.get(url) as r:
            assert r.status == 401
        async with s.get(url, headers={"Authorization": f"Bearer {no_audience}"}) as r:
            assert r.status == 403
        async with s.get(url, headers={"Authorization": f"Bearer {unbound}"}) as r:
            assert r.status == 403 and "names no node" in await r.text()
        async with s.get(url, headers={"Authorization": f"Bearer {token.read_text()}", "Range": "bytes=0-9"}) as r:
            assert r.status == 206 and await r.read() == files["model.safetensors"][:10]
    for agent in (seed, liar, b, c, off):
        await kube.delete_model(CBM, model_of(agent))


@contextlib.asynccontextmanager
async def rogue_server(answer: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[int]:
    """A server on a free loopback port answering every request with ``answer``; yields its port."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


async def forget_configmap(kube: Kube, name: str) -> None:
    """Delete a status ConfigMap the test wrote for a node no agent runs on (none removes it)."""
    with contextlib.suppress(ApiError):
        await kube.c.request("DELETE", f"/api/v1/namespaces/ome/configmaps/{name}")


async def claim_ready(kube: Kube, node: str, model: str, address: str) -> None:
    """What anyone who may patch a Node (its kubelet, or a compromised agent on it) can do: create it if missing,
    label it Ready for the ClusterBaseModel ``model`` and annotate a peer address on it."""
    await kube.create_node(node)
    await kube.label_node(node, {node_label_key(CBM, "", model): "Ready"})
    await kube.c.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        body={"metadata": {"annotations": {"models.ome.io/peer-address": address}}},
        content_type="application/merge-patch+json",
    )


async def test_a_node_that_only_labels_itself_a_holder_never_sees_a_probe_and_a_token_replayed_elsewhere_is_refused(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    """A Node without an agent (its kubelet, or anyone who may patch Nodes) labels itself Ready for the model and
    annotates a peer address pointing at a recorder, as the Go-era directory read it. The agent fetching the model
    never asks it: no digest, no token reaches the recorder. The agent's own token, replayed from another address,
    is refused; from the agent's own address it is admitted."""
    files = model_files(57)
    repo = f"acme/rogue-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files, lfs_patterns=(*DEFAULT_LFS_PATTERNS, "*.dat"))
    seen: list[tuple[str, str, str]] = []

    async def record(req: web.Request) -> web.Response:
        seen.append((req.method, req.path, req.headers.get("Authorization", "")))
        return web.Response(status=429, headers={"Retry-After": "60"})

    async with rogue_server(record) as recorder:
        name = f"rogue-{unique}"
        await claim_ready(kube, f"node-{unique}-rogue", name, f"127.0.0.1:{recorder}")
        node = f"node-{unique}-a"
        token = await mint_token(kube, tmp_path, DEFAULT_AUDIENCE, "token-a", node)
        port = free_port()
        agent = await make_agent(node=node, env=peer_env(token, port))
        await kube.apply(
            cbm(name, f"hf://{repo}", str(agent.models_root / "m"), nodeSelector={"kubernetes.io/hostname": node})
        )

        async def ready() -> bool:
            return (await kube.node_labels(node)).get(node_label_key(CBM, "", name)) == "Ready"

        await eventually(ready, timeout=90, what="the model Ready from the origin")
        assert seen == [], seen[:3]
        assert on_disk(agent.models_root, files)
        digest = hashlib.sha256(files["model.safetensors"]).hexdigest()
        url = f"http://127.0.0.1:{port}/blobs/sha256/{digest}"
        headers = {"Authorization": f"Bearer {token.read_text()}", "Range": "bytes=0-9"}
        elsewhere = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))  # another host's address (loopback /8)
        async with aiohttp.ClientSession(connector=elsewhere) as s, s.get(url, headers=headers) as r:
            assert r.status == 403, r.status
            assert "only from that node's address" in await r.text()
        async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
            assert r.status == 206 and await r.read() == files["model.safetensors"][:10]
        await kube.delete_model(CBM, name)


async def test_a_forged_resolve_record_and_a_rogue_holder_never_get_bytes_the_hub_did_not_vouch_for_published(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    """A compromised agent node (its token can write resolve records and its own status ConfigMap) writes the
    model's resolve record with the digest of its own weights, labels its Node Ready and serves those weights as a
    peer. An honest node fetching the model confirms the record with its own hub listing, takes no byte the hub
    did not list (the rogue's bytes fail verification), publishes the hub's weights, and rewrites the record."""
    files = model_files(59)
    repo = f"acme/forged-{unique}"
    commit = await asyncio.to_thread(
        create_model_repo, mirrors_root, repo, files, lfs_patterns=(*DEFAULT_LFS_PATTERNS, "*.dat")
    )
    uri = f"hf://{repo}"
    forged = b"EVIL" * (len(files["model.safetensors"]) // 4)
    forged_digest = hashlib.sha256(forged).hexdigest()
    asked: list[str] = []

    async def serve(req: web.Request) -> web.StreamResponse:  # the rogue peer: its weights for any digest
        asked.append(req.path)
        if req.method == "HEAD":
            return web.Response(status=200, headers={"Content-Length": str(len(forged)), "Accept-Ranges": "bytes"})
        first, last = 0, len(forged) - 1
        if req.http_range.start is not None:
            first = req.http_range.start
            last = (req.http_range.stop or len(forged)) - 1
        headers = {"Content-Range": f"bytes {first}-{last}/{len(forged)}", "Accept-Ranges": "bytes"}
        return web.Response(status=206, body=forged[first : last + 1], headers=headers)

    async with contextlib.AsyncExitStack() as stack:
        rogue_port = await stack.enter_async_context(rogue_server(serve))
        stack.push_async_callback(forget_configmap, kube, f"node-{unique}-rogue")
        name = f"forged-{unique}"
        rogue = f"node-{unique}-rogue"
        await claim_ready(kube, rogue, name, f"127.0.0.1:{rogue_port}")
        status_labels = {"models.ome/basemodel-status": "true", "models.ome/node": rogue}
        await kube.c.request(  # what the rogue's own agent token may write: its node's status ConfigMap...
            "POST",
            "/api/v1/namespaces/ome/configmaps",
            body={
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": rogue,
                    "labels": status_labels,
                    "annotations": {"models.ome.io/peer-address": f"127.0.0.1:{rogue_port}"},
                },
            },
        )
        listing = []
        for path, data in sorted(files.items()):
            lfs = path.endswith((".safetensors", ".dat"))
            entry = {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest() if lfs else None}
            entry["git_sha1"] = None if lfs else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            if path == "model.safetensors":
                entry.update(size=len(forged), sha256=forged_digest)
            listing.append(entry)
        record = "model-agent-resolve-" + hashlib.sha256(uri.encode()).hexdigest()[:24]
        await kube.c.request(  # ...and any resolve record: this one names its own weights
            "POST",
            "/api/v1/namespaces/ome/configmaps",
            body={
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": record, "labels": {"app.kubernetes.io/managed-by": "model-agent"}},
                "data": {
                    "uri": uri,
                    "commit": commit,
                    "files": json.dumps(listing),
                    "at": str(datetime.now(UTC).timestamp()),
                },
            },
        )
        node = f"node-{unique}-honest"
        token = await mint_token(kube, tmp_path, DEFAULT_AUDIENCE, "token-honest", node)
        args = ("--max-concurrent-origin-fetches", "1")  # (resolve records are used with origin slots)
        agent = await make_agent(node=node, args=args, env=peer_env(token, free_port()))
        await kube.apply(cbm(name, uri, str(agent.models_root / "m"), nodeSelector={"kubernetes.io/hostname": node}))

        async def ready() -> bool:
            return (await kube.node_labels(node)).get(node_label_key(CBM, "", name)) == "Ready"

        await eventually(ready, timeout=90, what="the model Ready with the hub's bytes")
        assert on_disk(agent.models_root, files)
        assert f"/blobs/sha256/{forged_digest}" not in asked, asked[:5]
        rewritten = await kube.c.request("GET", f"/api/v1/namespaces/ome/configmaps/{record}")
        weights = [f for f in json.loads(rewritten["data"]["files"]) if f["path"] == "model.safetensors"]
        assert weights[0]["sha256"] == hashlib.sha256(files["model.safetensors"]).hexdigest()
        await kube.delete_model(CBM, name)
