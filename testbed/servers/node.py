"""A real Kubernetes node for the test bed: kubelet + containerd + CNI, with the controller manager and scheduler.

Role: run the agent the way users do — its image, its Helm chart, a DaemonSet pod started by a kubelet
that calls its probes and hands it a pod-bound service-account token — on the test machine, next to the
control plane of :mod:`testbed.servers.controlplane`.

* :func:`build` compiles ``kubelet``, ``kube-controller-manager``, ``kube-scheduler`` and ``pause`` from
  ``tools/controlplane`` (the same pinned module as the API server) into ``<cache>/node/<version>/``;
  nothing happens when they are there.
* :func:`apiserver_flags` is what the API server needs for real nodes (its kubelet client certificate,
  InternalIP first); pass it as ``ControlPlane.up(real_nodes=...)``.
* :class:`Node` starts containerd (:mod:`testbed.servers.containerd`), imports the images, and runs the
  controller manager, the scheduler and one kubelet (``system:node:<name>`` certificate from the control
  plane's CA, cgroupfs, cgroup v1 accepted, node IP 127.0.0.1); :meth:`Node.up` returns when the Node
  is Ready. Everything lives in ``<control plane state dir>/node``.
* :meth:`Node.down` stops them, kills every container, and puts the host back as it was before
  :meth:`Node.up` (:mod:`testbed.servers.hoststate`: sysctls, netfilter chains, cgroups, mounts, fixed
  paths); :meth:`Node.preflight` refuses, in one line, to start over a node that was not torn down.

Processes are only ever signalled when their command line names the node's directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from model_agent.kube.client import KubeClient
from testbed.ports import free_port
from testbed.servers import hoststate, nodepki
from testbed.servers import pki as _pki
from testbed.servers.containerd import Containerd, kill_all, pids_naming
from testbed.servers.controlplane import (
    KUBERNETES_VERSION,
    ControlPlane,
    ControlPlaneError,
    _find_go,
    _ldflags,
    _noop,
    cache_root,
    empty_staging_dir,
    poll_until_ready,
    publish_build,
    repo_root,
    run_go_build,
    write_state_file,
)
from testbed.servers.service import spawn_logged

Echo = Callable[[str], None]
NODE_NAME = "testbed-node-1"
READY_TIMEOUT_S = 180.0
COMPONENTS = ("kube-scheduler", "kube-controller-manager", "kubelet", "pause")
NODE_LABELS = {
    "node.kubernetes.io/instance-type": "BM.GPU.H100.8",
    "nvidia.com/gpu.present": "true",
}


# ----------------------------------------------------------------------------------------------- build


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    pause: Path


def binaries_dir(version: str = KUBERNETES_VERSION) -> Path:
    return cache_root() / "node" / version


def cached_binaries() -> NodeBinaries | None:
    d = binaries_dir()
    found = NodeBinaries(d / "kubelet", d / "kube-controller-manager", d / "kube-scheduler", d / "pause")
    return found if all(Path(p).is_file() for p in asdict(found).values()) else None


def build(*, echo: Echo = _noop) -> NodeBinaries:
    """Build the node's binaries from the pinned module unless cached (``-p 1``: the machine is shared)."""
    if (cached := cached_binaries()) is not None:
        echo(f"node {KUBERNETES_VERSION}: using cached binaries in {cached.kubelet.parent}")
        return cached
    module = repo_root() / "tools" / "controlplane"
    go = _find_go()
    target = binaries_dir()
    staging = empty_staging_dir(target)
    timings: dict[str, float] = {}
    for name in COMPONENTS:
        echo(f"building {name} ({KUBERNETES_VERSION}); the kubelet takes minutes on 2 cores")
        started = time.monotonic()
        argv = [go, "build", "-p", "1", "-trimpath", "-tags", "grpcnotrace", "-ldflags", _ldflags(KUBERNETES_VERSION)]
        run_go_build(name, [*argv, "-o", str(staging / name), f"./{name}"], module=module, staging=staging)
        timings[name] = round(time.monotonic() - started, 1)
        echo(f"built {name} in {timings[name]:.0f}s")
    (staging / "build-info.json").write_text(json.dumps({"version": KUBERNETES_VERSION, "seconds": timings}))
    publish_build(staging, target)
    found = cached_binaries()
    assert found is not None
    return found


# -------------------------------------------------------------------------------------------- config


def apiserver_flags(certs: _pki.Pki) -> list[str]:
    """kube-apiserver flags for real kubelets: its client certificate to them, their CA, InternalIP first."""
    client = nodepki.apiserver_kubelet_client(certs)
    return [
        f"--kubelet-client-certificate={client.cert}",
        f"--kubelet-client-key={client.key}",
        f"--kubelet-certificate-authority={certs.ca_cert}",
        "--kubelet-preferred-address-types=InternalIP",
    ]


def kubeconfig_doc(server: str, ca: Path, pair: nodepki.Pair, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}],
        "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": user}}],
        "current-context": "testbed",
    }


def kubelet_config(
    node_dir: Path, *, port: int, ca: Path, serving: nodepki.Pair, runtime_endpoint: str
) -> dict[str, Any]:
    """The KubeletConfiguration for this machine (cgroupfs and cgroup v1, no swap check, no eviction)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        # These VMs run cgroup v1 (kubelet 1.35+ refuses it unless told otherwise).
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": runtime_endpoint,
        "imageServiceEndpoint": runtime_endpoint,
        "podLogsDir": str(node_dir / "pod-logs"),
        "volumePluginDir": str(node_dir / "volume-plugins"),
        # A shared developer disk must not make the node evict the agent or delete the imported images.
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "/etc/resolv.conf",
        "registerNode": True,
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
        "serializeImagePulls": True,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


# ----------------------------------------------------------------------------------------------- run


@dataclass
class NodeState:
    name: str = NODE_NAME
    kubelet_port: int = 0
    pids: dict[str, int] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)
    models_root: str = ""


class Node:
    """One kubelet (plus controller manager, scheduler, containerd) attached to a running control plane."""

    def __init__(self, plane: ControlPlane, name: str = NODE_NAME) -> None:
        self.plane = plane
        self.name = name
        self.dir = plane.state_dir / "node"
        self.state_file = self.dir / "state.json"
        self.snapshot_file = self.dir / "host-before.json"
        self.models_root = self.dir / "models"
        self.containerd = Containerd(self.dir / "containerd", sandbox_image="")

    # ---- checks

    def preflight(self) -> None:
        """Refuse (one line) to start over a node that was not torn down, or over a kubelet's leftovers."""
        reason = hoststate.stale_reason(hoststate.capture(), own_record=self.snapshot_file.is_file())
        if reason is not None:
            raise ControlPlaneError(f"cannot start the node: {reason}")

    def owned_prefixes(self) -> list[str]:
        return [str(self.dir), "/var/lib/kubelet", "/run/containerd", "/run/netns", "/var/run/netns"]

    # ---- lifecycle

    def up(
        self, *, images: Sequence[tuple[Path, str]] = (), binaries: NodeBinaries | None = None, echo: Echo = _noop
    ) -> NodeState:
        """Start everything and wait for the Node to be Ready; ``images``: (OCI archive, ref) to import."""
        from testbed import image as _image

        self.preflight()
        cp_state = self.plane.running()
        if cp_state is None:
            raise ControlPlaneError(f"no control plane runs from {self.plane.state_dir}: start it first")
        bins = binaries or build(echo=echo)
        pause = _image.build_pause_image(bins.pause, echo=echo)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.models_root.mkdir()
        self.snapshot_file.write_text(hoststate.capture().to_json())
        state = NodeState(name=self.name, kubelet_port=free_port(), models_root=str(self.models_root))
        started = time.monotonic()
        try:
            # The models root is its own shared mount: HostToContainer propagation needs a shared or slave
            # source (the host's / is private here), and a real node's data disk is a mount of its own too.
            subprocess.run(["mount", "--bind", str(self.models_root), str(self.models_root)], check=True)
            subprocess.run(["mount", "--make-rshared", str(self.models_root)], check=True)
            self.containerd = Containerd(self.dir / "containerd", sandbox_image=pause.ref)
            state.pids["containerd"] = self.containerd.start()
            self._write_state(state)
            for archive, ref in [(pause.archive, pause.ref), *images]:
                self.containerd.import_image(archive, ref)
                state.images.append(ref)
            server = f"https://127.0.0.1:{cp_state.apiserver_port}"
            certs = self._certs()
            state.pids["kube-controller-manager"] = self._spawn(
                "kube-controller-manager", self._kcm_argv(bins, server, certs)
            )
            state.pids["kube-scheduler"] = self._spawn("kube-scheduler", self._scheduler_argv(bins, server, certs))
            state.pids["kubelet"] = self._spawn("kubelet", self._kubelet_argv(bins, server, certs, state))
            self._write_state(state)
            asyncio.run(self._wait_ready(state))
        except BaseException:
            self.down()
            raise
        echo(f"node {self.name} Ready in {time.monotonic() - started:.0f}s (kubelet port {state.kubelet_port})")
        return state

    def read_state(self) -> NodeState | None:
        try:
            return NodeState(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def down(self) -> list[str]:
        """Stop everything and restore the host; return one line per restore step that failed."""
        marker = str(self.dir)
        for name in ("kubelet", "kube-scheduler", "kube-controller-manager"):
            # Each is started with --kubeconfig=<node dir>/<name>.kubeconfig: that proves it is ours.
            kill_all(pids_naming(f"{self.dir / name}.kubeconfig"), marker, deadline_s=15)
        self.containerd.stop()
        # A containerd object from another process knows its directory only: stop by the directory.
        kill_all(pids_naming(str(self.dir / "containerd")), marker)
        failures: list[str] = []
        if self.snapshot_file.is_file():
            before = hoststate.Snapshot.from_json(self.snapshot_file.read_text())
            plan = hoststate.restore_plan(before, hoststate.capture(), owned_prefixes=self.owned_prefixes())
            failures = hoststate.carry_out(plan)
            if not failures:
                self.snapshot_file.unlink()
        with contextlib.suppress(OSError):
            self.state_file.unlink()
        return failures

    # ---- internals

    def _write_state(self, state: NodeState) -> None:
        write_state_file(self.state_file, state)

    def _spawn(self, name: str, argv: list[str]) -> int:
        # The kubelet runs mount, iptables and friends from the sbin directories.
        env = dict(os.environ, PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        return spawn_logged(argv, cwd=self.dir, log_path=self.dir / f"{name}.log", env=env)

    def _certs(self) -> dict[str, nodepki.Pair]:
        certs = _pki.Pki.in_directory(self.plane.state_dir / "pki")
        d = self.dir / "pki"
        return {
            "kubelet": nodepki.issue(
                certs, d, "kubelet-client", common_name=f"system:node:{self.name}", organization="system:nodes"
            ),
            "kubelet-serving": nodepki.issue(
                certs, d, "kubelet-serving", common_name=self.name, client=False, server_names=("127.0.0.1", self.name)
            ),
            "kube-controller-manager": nodepki.issue(
                certs, d, "kube-controller-manager", common_name="system:kube-controller-manager"
            ),
            "kube-scheduler": nodepki.issue(certs, d, "kube-scheduler", common_name="system:kube-scheduler"),
            "ca": nodepki.Pair(certs.ca_cert, certs.ca_key),
            "sa": nodepki.Pair(certs.sa_public, certs.sa_private),
        }

    def _kubeconfig(self, name: str, server: str, certs: dict[str, nodepki.Pair], user: str) -> Path:
        path = self.dir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig_doc(server, certs["ca"].cert, certs[name], user), sort_keys=False))
        return path

    def _kcm_argv(self, bins: NodeBinaries, server: str, certs: dict[str, nodepki.Pair]) -> list[str]:
        kubeconfig = self._kubeconfig("kube-controller-manager", server, certs, "system:kube-controller-manager")
        return [
            str(bins.kube_controller_manager),
            f"--kubeconfig={kubeconfig}",
            "--secure-port=0",
            "--leader-elect=false",
            # Each controller acts as its own service account, as on a kubeadm cluster (least privilege).
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={certs['sa'].key}",
            f"--root-ca-file={certs['ca'].cert}",
            "--cluster-name=testbed",
            "--concurrent-daemonset-syncs=1",
            "--v=1",
        ]

    def _scheduler_argv(self, bins: NodeBinaries, server: str, certs: dict[str, nodepki.Pair]) -> list[str]:
        kubeconfig = self._kubeconfig("kube-scheduler", server, certs, "system:kube-scheduler")
        return [
            str(bins.kube_scheduler),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--secure-port=0",
            "--leader-elect=false",
        ]

    def _kubelet_argv(
        self, bins: NodeBinaries, server: str, certs: dict[str, nodepki.Pair], state: NodeState
    ) -> list[str]:
        kubeconfig = self._kubeconfig("kubelet", server, certs, f"system:node:{self.name}")
        config = self.dir / "kubelet-config.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(
                    self.dir,
                    port=state.kubelet_port,
                    ca=certs["ca"].cert,
                    serving=certs["kubelet-serving"],
                    runtime_endpoint=self.containerd.endpoint,
                ),
                sort_keys=False,
            )
        )
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        return [
            str(bins.kubelet),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.dir / 'kubelet'}",
            f"--cert-dir={self.dir / 'pki'}",
            f"--hostname-override={self.name}",
            # A kubelet refuses a loopback --node-ip, and any other address of this machine is off limits
            # to the test bed: the node is "external cloud" and _initialize sets its address (127.0.0.1),
            # as a cloud controller manager would.
            "--cloud-provider=external",
            f"--node-labels={labels}",
            "--v=1",
        ]

    async def _initialize(self, client: KubeClient, node: dict[str, Any]) -> None:
        status_patch, spec_patch = initialization_patches(node)
        path = f"/api/v1/nodes/{self.name}"
        if status_patch is not None:
            await client.request(
                "PATCH", path + "/status", body=status_patch, content_type="application/merge-patch+json"
            )
        if spec_patch is not None:
            await client.request("PATCH", path, body=spec_patch, content_type="application/merge-patch+json")

    async def _wait_ready(self, state: NodeState) -> None:
        client = await KubeClient.connect(self.plane.kubeconfig)

        async def node_ready() -> str | None:
            node = await client.request("GET", f"/api/v1/nodes/{self.name}")
            await self._initialize(client, node)
            conditions = {c["type"]: c for c in (node.get("status") or {}).get("conditions") or []}
            ready = conditions.get("Ready", {})
            if ready.get("status") == "True":
                return None
            return f"Ready={ready.get('status')} ({ready.get('message', '')})"

        try:
            await poll_until_ready(
                node_ready,
                pids=state.pids,
                state_dir=self.dir,
                timeout_s=READY_TIMEOUT_S,
                interval_s=0.5,
                not_ready=f"node {self.name} not Ready",
                log_of="kubelet",
                first_reason="not registered yet",
            )
        finally:
            await client.close()


UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"


def initialization_patches(node: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(status patch, spec patch) that a cloud controller would make for this node, None where done."""
    addresses = (node.get("status") or {}).get("addresses") or []
    status_patch = None
    if not any(a.get("type") == "InternalIP" for a in addresses):
        name = node["metadata"]["name"]
        status_patch = {
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}]
            }
        }
    taints = (node.get("spec") or {}).get("taints") or []
    spec_patch = None
    if any(t.get("key") == UNINITIALIZED_TAINT for t in taints):
        spec_patch = {"spec": {"taints": [t for t in taints if t.get("key") != UNINITIALIZED_TAINT]}}
    return status_patch, spec_patch
