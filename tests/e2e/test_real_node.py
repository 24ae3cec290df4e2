"""The way users run it: the image from the Dockerfile and the Helm chart, on a real kubelet.

One module-scoped bed: a control plane admitting pods as a real cluster does (ServiceAccount admission,
NodeRestriction, the Node authorizer), the controller manager and scheduler, and one kubelet on
containerd (:mod:`testbed.servers.node`) with the agent image built from ``Dockerfile``
(:mod:`testbed.image`) imported. ``helm install`` of ``deploy/helm/model-agent`` then runs the agent as
the DaemonSet's pod on that node, in the host network (a chart value; no traffic leaves loopback).

The tests run in order and share the release:

1. the pod is Running and Ready, and the kubelet is what probed it (its own probe counters);
2. the agent reaches the API server through the in-cluster configuration with the kubelet-issued,
   pod-bound token, and with that very token the admission policy refuses what it must;
3. a ``local://`` and an ``hf://`` ClusterBaseModel (through olah) become Ready on the node: label,
   entry, files on the hostPath; the container's root file system is read-only;
4. a rollout restart (the DaemonSet template annotation patched, what ``kubectl rollout restart``
   does) replaces the pod while a Node watch sees no ``models.ome.io`` label leave ``Ready``; the new pod
   is Ready without fetching a byte;
5. the agent OOM-killed (its memory limit lowered on purpose) comes back and converges, nothing lost;
6. a drain (cordon, the agent evicted) and uncordon: the agent comes back, labels intact, nothing fetched;
7. teardown leaves the host as it was (sysctls, netfilter chains, mounts, cgroups, fixed paths).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from model_agent.kube.client import ApiError, KubeClient
from model_agent.kube.resources import NODES
from model_agent.model.keys import configmap_key, node_label_key
from testbed import image
from testbed.models import tiny_llama
from testbed.ports import free_port
from testbed.servers import controlplane as cp
from testbed.servers import hoststate
from testbed.servers import node as realnode
from testbed.servers.olah import OlahServer, create_model_repo
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

NAMESPACE = "ome"
RELEASE = "model-agent"
CBM = "ClusterBaseModel"
CHART = cp.repo_root() / "deploy" / "helm" / "model-agent"
SELECTOR = "app.kubernetes.io/name=model-agent"


@dataclass
class Bed:
    plane: cp.ControlPlane
    node: realnode.Node
    before: hoststate.Snapshot
    agent_port: int
    image_ref: str
    timings: dict[str, float]

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig


def helm(bed_kubeconfig: Path, *args: str) -> str:
    proc = subprocess.run(
        [str(cp.helm_binary()), "--kubeconfig", str(bed_kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"helm {args[0]} failed:\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory, olah: OlahServer) -> Iterator[Bed]:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    cp.build_helm(echo=print)
    bins = realnode.build(echo=print)
    timings["node binaries"] = time.monotonic() - t0
    t0 = time.monotonic()
    agent_image = image.build_agent_image(echo=print)
    timings["agent image"] = time.monotonic() - t0
    before = hoststate.capture()
    plane = cp.ControlPlane(tmp_path_factory.mktemp("realnode"))
    node = realnode.Node(plane)
    node.preflight()
    t0 = time.monotonic()
    plane.up([], echo=print, real_nodes=realnode.apiserver_flags)
    try:
        node.up(images=[(agent_image.archive, agent_image.ref)], binaries=bins, echo=print)
        timings["node up"] = time.monotonic() - t0
        port = free_port()
        repo, tag = agent_image.ref.rsplit(":", 1)
        t0 = time.monotonic()
        helm(
            plane.kubeconfig,
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--set",
            f"image.repository={repo},image.tag={tag},image.pullPolicy=Never",
            "--set",
            f"hostNetwork=true,modelsRootDir={node.models_root},agent.port={port}",
            "--set",
            f"hf.endpoint={olah.endpoint},agent.flags.resync-interval=30",
            # No kube-proxy on this node: the in-cluster configuration names the API server directly,
            # as on clusters that run without one.
            "--set",
            "env.KUBERNETES_SERVICE_HOST=127.0.0.1",
            "--set-string",
            f"env.KUBERNETES_SERVICE_PORT={plane.read_state().apiserver_port}",  # type: ignore[union-attr]
        )
        timings["helm install"] = time.monotonic() - t0
        yield Bed(plane, node, before, port, agent_image.ref, timings)
    finally:
        failures = node.down()
        plane.down()
        print(f"real-node timings: { {k: round(v, 1) for k, v in timings.items()} }; teardown failures: {failures}")


@pytest.fixture
async def admin(bed: Bed) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(bed.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


async def agent_pods(admin: KubeClient) -> list[dict[str, Any]]:
    listing = await admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", query={"labelSelector": SELECTOR})
    pods: list[dict[str, Any]] = listing["items"]
    return pods


def condition(pod: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or [])


async def ready_pod(admin: KubeClient, *, not_uid: str = "") -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        for pod in await agent_pods(admin):
            live = pod["metadata"].get("deletionTimestamp") is None
            running = pod["status"].get("phase") == "Running"
            if live and running and pod["metadata"]["uid"] != not_uid and condition(pod, "Ready"):
                return pod
        return None

    found = await eventually(probe, timeout=180, what="an agent pod Running and Ready", interval=0.5)
    assert found is not None
    return found


def kubelet_ssl(bed: Bed) -> ssl.SSLContext:
    pki = bed.plane.state_dir / "pki"
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def kubelet_get(bed: Bed, path: str) -> str:
    state = bed.node.read_state()
    assert state is not None
    url = f"https://127.0.0.1:{state.kubelet_port}{path}"
    with urllib.request.urlopen(url, context=kubelet_ssl(bed), timeout=10) as resp:
        body: bytes = resp.read()
    return body.decode()


def probe_counts(bed: Bed, pod: str) -> dict[str, float]:
    """``probe_type/result`` -> count from the kubelet's own prober metrics for the agent container."""
    counts: dict[str, float] = {}
    for line in kubelet_get(bed, "/metrics/probes").splitlines():
        if line.startswith("prober_probe_total{") and f'pod="{pod}"' in line:
            fields = dict(kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(","))
            key = fields["probe_type"].strip('"') + "/" + fields["result"].strip('"')
            counts[key] = counts.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return counts


def agent_metrics(bed: Bed) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{bed.agent_port}/metrics", timeout=10) as resp:
        text: bytes = resp.read()
    return text.decode()


def metric_total(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def pod_token_path(bed: Bed, pod: dict[str, Any]) -> Path:
    volumes = bed.node.dir / "kubelet" / "pods" / pod["metadata"]["uid"] / "volumes" / "kubernetes.io~projected"
    tokens: list[Path] = sorted(volumes.glob("kube-api-access-*/token"))
    assert tokens, f"no projected service-account token under {volumes}"
    return tokens[0]


async def token_client(bed: Bed, token: str, tmp: Path) -> KubeClient:
    state = bed.plane.read_state()
    assert state is not None
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": f"https://127.0.0.1:{state.apiserver_port}",
                    "certificate-authority": str(bed.plane.state_dir / "pki" / "ca.crt"),
                },
            }
        ],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path = tmp / "pod-token.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return await KubeClient.connect(path)


# ------------------------------------------------------------------------------------------------ tests


async def test_daemonset_pod_is_running_and_ready_with_kubelet_called_probes(bed: Bed, admin: KubeClient) -> None:
    started = time.monotonic()
    pod = await ready_pod(admin)
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == bed.node.name
    assert pod["spec"]["hostNetwork"] is True
    assert pod["status"]["containerStatuses"][0]["image"].endswith(bed.image_ref.split("/", 1)[1])

    def called() -> bool:
        counts = probe_counts(bed, name)
        return all(counts.get(f"{kind}/successful", 0) >= 1 for kind in ("Startup", "Readiness", "Liveness"))

    async def probed() -> bool:
        return await asyncio.to_thread(called)

    # The liveness probe runs every 20 s once the startup probe passed.
    await eventually(probed, timeout=90, what="startup, readiness and liveness probes called by the kubelet")
    counts = probe_counts(bed, name)
    assert not any(k.endswith("/failed") and v for k, v in counts.items() if not k.startswith("Startup")), counts
    # The API server reaches the kubelet (InternalIP 127.0.0.1, its serving certificate): `kubectl logs`.
    log = await admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/log", query={"tailLines": "50"})
    assert log, "no log through the API server"
    print(f"agent pod Ready {time.monotonic() - started:.1f}s after helm install returned; probes {counts}")
    # The chart's NetworkPolicy is installed with it (this node's bridge plugin enforces none, and the pod runs in
    # the host network, where no plugin would: the probes above pass either way).
    policy = await admin.request("GET", f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies/{RELEASE}")
    assert [rule["ports"][0]["port"] for rule in policy["spec"]["ingress"]] == [8090, bed.agent_port]


async def test_agent_uses_the_kubelet_issued_pod_bound_token(bed: Bed, admin: KubeClient, tmp_path: Path) -> None:
    pod = await ready_pod(admin)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    projected = [v for n, v in volumes.items() if n.startswith("kube-api-access-")]
    assert projected, f"no projected service-account volume in {sorted(volumes)}"
    sources = projected[0]["projected"]["sources"]
    assert any("serviceAccountToken" in s for s in sources)
    token = pod_token_path(bed, pod).read_text()
    client = await token_client(bed, token, tmp_path)
    try:
        review = await client.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        user = review["status"]["userInfo"]
        assert user["username"] == f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
        extra = user.get("extra") or {}
        # Bound to this pod on this node: what the chart's admission policy keys on.
        assert extra.get("authentication.kubernetes.io/pod-name") == [pod["metadata"]["name"]]
        assert extra.get("authentication.kubernetes.io/node-name") == [bed.node.name]

        async def patch(labels: dict[str, str], *, dry_run: bool) -> ApiError | None:
            try:
                await client.request(
                    "PATCH",
                    NODES.path(name=bed.node.name),
                    body={"metadata": {"labels": labels}},
                    content_type="application/merge-patch+json",
                    query={"dryRun": "All"} if dry_run else None,
                )
            except ApiError as exc:
                return exc
            return None

        assert await patch({"models.ome.io/clusterbasemodel.probe": "Ready"}, dry_run=True) is None
        for labels in ({"models.ome.io/clusterbasemodel.probe": "Hacked"}, {"node-role.kubernetes.io/x": ""}):
            refused = await patch(labels, dry_run=True)
            assert refused is not None and refused.status in (403, 422), f"{labels} was not refused"
        with pytest.raises(ApiError) as secrets:
            await client.request("GET", "/api/v1/secrets")
        assert secrets.value.status == 403
    finally:
        await client.close()
    # The agent itself authenticated with the same token: no denial counted, API calls made.
    text = agent_metrics(bed)
    assert metric_total(text, "model_agent_rbac_denied_total") == 0
    assert metric_total(text, "model_agent_api_request_duration_seconds_count") > 0


@dataclass
class Models:
    local: str
    hf: str


@pytest.fixture(scope="module")
async def models(bed: Bed, olah: OlahServer, mirrors_root: Path) -> Models:
    unique = f"{os.getpid()}"
    files = tiny_llama(3)
    repo = f"acme/real-node-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    weights = bed.node.models_root / "local" / "tiny-local"
    weights.mkdir(parents=True)
    (weights / "config.json").write_bytes(files["config.json"])
    client = await KubeClient.connect(bed.kubeconfig)
    try:
        kube = Kube(client)
        await kube.apply(cbm("tiny-local", f"local://{weights}", str(weights)))
        await kube.apply(cbm("tiny-hf", f"hf://{repo}", str(bed.node.models_root / "cluster" / "tiny-hf")))
    finally:
        await client.close()
    return Models(local="tiny-local", hf="tiny-hf")


async def test_models_become_ready_on_the_node_with_files_on_the_host_path(
    bed: Bed, admin: KubeClient, models: Models
) -> None:
    kube = Kube(admin)
    started = time.monotonic()
    for name in (models.local, models.hf):

        async def ready(name: str = name) -> bool:
            label = (await kube.node_labels(bed.node.name)).get(node_label_key(CBM, "", name))
            entry = await kube.entry(bed.node.name, configmap_key(CBM, "", name), NAMESPACE)
            return label == "Ready" and (entry or {}).get("status") == "Ready"

        await eventually(ready, timeout=120, what=f"{name} Ready on {bed.node.name}", interval=0.5)
    hf_dir = bed.node.models_root / "cluster" / models.hf
    for rel, data in tiny_llama(3).items():
        assert (hf_dir / rel).read_bytes() == data, rel
    print(f"local:// and hf:// models Ready in {time.monotonic() - started:.1f}s")

    # The runtime's view of the container: a read-only root, writes only to the models root and /tmp.
    pod = await ready_pod(admin)
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    info = json.loads(bed.node.containerd.ctr("containers", "info", container_id))
    assert info["Spec"]["root"]["readonly"] is True

    ctr = ["ctr", "--address", str(bed.node.containerd.socket), "-n", "k8s.io"]

    def exec_in(*argv: str) -> subprocess.CompletedProcess[str]:
        exec_id = f"t{time.monotonic_ns()}"
        return subprocess.run(
            [*ctr, "tasks", "exec", "--exec-id", exec_id, container_id, *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    denied = exec_in("python", "-c", "open('/opt/model-agent/probe', 'w')")
    assert denied.returncode != 0 and "Read-only file system" in denied.stdout + denied.stderr, denied
    allowed = exec_in("python", "-c", "open('/tmp/probe', 'w').write('x')")
    assert allowed.returncode == 0, allowed.stderr


async def test_rollout_restart_keeps_every_label_ready_and_downloads_nothing(
    bed: Bed, admin: KubeClient, models: Models
) -> None:
    kube = Kube(admin)
    old = await ready_pod(admin)
    keys = [node_label_key(CBM, "", models.local), node_label_key(CBM, "", models.hf)]
    listing = await admin.request("GET", NODES.path(), query={"fieldSelector": f"metadata.name={bed.node.name}"})
    seen: list[dict[str, str | None]] = []

    async def watch() -> None:
        query = {
            "watch": "true",
            "resourceVersion": listing["metadata"]["resourceVersion"],
            "fieldSelector": f"metadata.name={bed.node.name}",
        }
        async for event in admin.watch_lines(NODES.path(), query=query, read_timeout=300):
            labels = (event.get("object") or {}).get("metadata", {}).get("labels") or {}
            seen.append({k: labels.get(k) for k in keys})

    pods = await admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", query={"labelSelector": SELECTOR})
    old_states: list[dict[str, Any]] = []  # the old pod's container states as the kubelet reports them

    async def watch_old_pod() -> None:
        query = {"watch": "true", "resourceVersion": pods["metadata"]["resourceVersion"], "labelSelector": SELECTOR}
        async for event in admin.watch_lines(f"/api/v1/namespaces/{NAMESPACE}/pods", query=query, read_timeout=300):
            pod = event.get("object") or {}
            if (pod.get("metadata") or {}).get("uid") == old["metadata"]["uid"]:
                old_states.extend(
                    s.get("state") or {} for s in (pod.get("status") or {}).get("containerStatuses") or []
                )

    watcher = asyncio.create_task(watch())
    pod_watcher = asyncio.create_task(watch_old_pod())
    try:
        labels = await kube.node_labels(bed.node.name)
        assert all(labels.get(k) == "Ready" for k in keys), labels
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        await admin.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{RELEASE}",
            body={"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}}}},
            content_type="application/strategic-merge-patch+json",
        )
        started = time.monotonic()
        new = await ready_pod(admin, not_uid=old["metadata"]["uid"])

        async def old_gone() -> bool:
            return all(p["metadata"]["uid"] != old["metadata"]["uid"] for p in await agent_pods(admin))

        await eventually(old_gone, timeout=60, what="the old pod gone")
        print(f"rollout: new pod Ready {time.monotonic() - started:.1f}s after the template patch")
    finally:
        watcher.cancel()
        pod_watcher.cancel()
        await asyncio.gather(watcher, pod_watcher, return_exceptions=True)
    # The old agent stopped on SIGTERM within the grace period: its container ended by itself, not SIGKILLed (137).
    ended = [state["terminated"] for state in old_states if "terminated" in state]
    assert ended, f"the old pod's container was never reported terminated: {old_states[-3:]}"
    assert all(t.get("exitCode") != 137 for t in ended), f"the old agent was killed at the end of its grace: {ended}"
    left = [s for s in seen if any(v != "Ready" for v in s.values())]
    assert not left, f"a models.ome.io label left Ready during the rollout: {left[:3]}"
    assert seen, "the Node watch saw no event"
    # The new agent adopted what is on disk: nothing fetched.
    text = await asyncio.to_thread(agent_metrics, bed)
    assert metric_total(text, "model_agent_fetched_bytes_total") == 0, "the new pod downloaded"
    assert new["metadata"]["name"] != old["metadata"]["name"]


def container_memory_cgroup(pod: dict[str, Any]) -> Path:
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    found = sorted(Path("/sys/fs/cgroup/memory/kubepods").glob(f"*/pod{pod['metadata']['uid']}/{container_id}"))
    found += sorted(Path("/sys/fs/cgroup/memory/kubepods").glob(f"pod{pod['metadata']['uid']}/{container_id}"))
    assert found, f"no memory cgroup for container {container_id}"
    return found[0]


async def test_oom_killed_agent_comes_back_and_converges(bed: Bed, admin: KubeClient, models: Models) -> None:
    """The agent's container is OOM-killed by the kernel for exceeding its memory limit, set low on purpose:
    the container's memory cgroup limit is lowered to just above its usage and a process in the container
    allocates past it; the memcg OOM killer picks the largest task (the agent). The runtime reports
    OOMKilled, the kubelet restarts the container, the agent converges with every label still Ready."""
    kube = Kube(admin)
    # 198 more local:// models (a config.json each), so the steady state is measured with 200 models.
    extra = [f"mem-{i:03d}" for i in range(198)]
    for name in extra:
        weights = bed.node.models_root / "local" / name
        weights.mkdir(parents=True, exist_ok=True)
        (weights / "config.json").write_bytes(tiny_llama(3)["config.json"])
        await kube.apply(cbm(name, f"local://{weights}", str(weights)))
    keys = [node_label_key(CBM, "", name) for name in (models.local, models.hf, *extra)]

    async def all_ready() -> bool:
        labels = await kube.node_labels(bed.node.name)
        return all(labels.get(k) == "Ready" for k in keys)

    await eventually(all_ready, timeout=120, what="200 models Ready on the node", interval=0.5)
    pod = await ready_pod(admin)
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    cgroup = container_memory_cgroup(pod)
    usage = int((cgroup / "memory.usage_in_bytes").read_text())
    found = re.search(r"^total_rss (\d+)$", (cgroup / "memory.stat").read_text(), re.M)
    assert found, "no total_rss in the container's memory.stat"
    rss = int(found.group(1))
    print(f"agent container memory at steady state with 200 models: usage {usage >> 20} MiB, rss {rss >> 20} MiB")
    (cgroup / "memory.limit_in_bytes").write_text(str(usage + (16 << 20)))
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    ctr = ["ctr", "--address", str(bed.node.containerd.socket), "-n", "k8s.io", "tasks", "exec"]
    hog = "b = bytearray(64 << 20); import time; time.sleep(30)"
    await asyncio.to_thread(
        subprocess.run, [*ctr, "--exec-id", "oom", container_id, "python", "-c", hog], capture_output=True, timeout=60
    )

    async def restarted() -> dict[str, Any] | None:
        current = (await agent_pods(admin))[0]
        status = current["status"]["containerStatuses"][0]
        last = (status.get("lastState") or {}).get("terminated") or {}
        if status["restartCount"] > restarts and last.get("reason") == "OOMKilled" and condition(current, "Ready"):
            return current
        return None

    await eventually(restarted, timeout=120, what="the agent OOMKilled, restarted and Ready again", interval=0.5)
    labels = await kube.node_labels(bed.node.name)
    assert all(labels.get(k) == "Ready" for k in keys), labels
    for rel, data in tiny_llama(3).items():
        assert (bed.node.models_root / "cluster" / models.hf / rel).read_bytes() == data, rel
    text = await asyncio.to_thread(agent_metrics, bed)
    assert metric_total(text, "model_agent_fetched_bytes_total") == 0, "the restarted agent downloaded"


async def test_drained_node_gets_its_agent_back_with_labels_intact(bed: Bed, admin: KubeClient, models: Models) -> None:
    """Cordon, evict the agent (what a drain does to a pod), uncordon: the DaemonSet's pod comes back on the
    cordoned node (it tolerates unschedulable) and adopts the models; no label changes on the way."""
    kube = Kube(admin)
    keys = [node_label_key(CBM, "", models.local), node_label_key(CBM, "", models.hf)]
    node_path = NODES.path(name=bed.node.name)
    old = await ready_pod(admin)
    await admin.request(
        "PATCH", node_path, body={"spec": {"unschedulable": True}}, content_type="application/merge-patch+json"
    )
    try:
        name = old["metadata"]["name"]
        await admin.request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/eviction",
            body={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NAMESPACE}},
        )
        new = await ready_pod(admin, not_uid=old["metadata"]["uid"])
        assert new["spec"]["nodeName"] == bed.node.name
    finally:
        await admin.request(
            "PATCH", node_path, body={"spec": {"unschedulable": None}}, content_type="application/merge-patch+json"
        )
    labels = await kube.node_labels(bed.node.name)
    assert all(labels.get(k) == "Ready" for k in keys), labels
    text = await asyncio.to_thread(agent_metrics, bed)
    assert metric_total(text, "model_agent_fetched_bytes_total") == 0, "the agent downloaded after the drain"


async def test_teardown_restores_the_host(bed: Bed) -> None:
    failures = bed.node.down()
    assert failures == []
    bed.plane.down()
    after = hoststate.capture()
    assert after.sysctls == bed.before.sysctls
    assert after.nft_chains == bed.before.nft_chains
    assert after.cgroups == bed.before.cgroups
    assert after.paths == bed.before.paths
    ours = [m for m in after.mounts if m not in bed.before.mounts and str(bed.plane.state_dir) in m]
    assert ours == [], ours
    assert not bed.node.snapshot_file.exists()
