"""The local control plane: a real kube-apiserver and etcd, built from the published Go modules.

Role: everything the end-to-end tests and the demo stand on. Three steps, each usable alone:

* :func:`build` compiles ``kube-apiserver`` and ``etcd`` from ``tools/controlplane`` (its own ``go.mod``
  pinning ``k8s.io/kubernetes``) into a per-version cache directory, and does nothing when the binaries
  for the pinned version are already there.
* :class:`ControlPlane` runs etcd and kube-apiserver in a state directory on free loopback ports, with a
  generated PKI, waits for ``/readyz``, writes ``<state-dir>/kubeconfig`` and records pids in
  ``<state-dir>/state.json`` so that ``down`` works from another process.
* :func:`bootstrap` installs the CRDs from ``deploy/crds`` (server-side apply, waits for Established),
  creates the ``ome`` Namespace and one Node per requested name.

Errors meant for a person are :class:`ControlPlaneError` with a one-line message saying what to do.
Processes are stopped with SIGTERM, then SIGKILL after a deadline, and only when their command line proves
they are ours (a recycled pid is never signalled).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from model_agent.kube.resources import CRDS, NAMESPACES, NODES
from testbed.ports import free_port
from testbed.servers import pki as _pki
from testbed.servers.service import last_line, run_step, spawn_logged

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

KUBERNETES_VERSION = "v1.36.3"
GO_MIN_VERSION = (1, 26)
BUILD_TIMEOUT_S = 45 * 60
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0

Echo = Callable[[str], None]


class ControlPlaneError(Exception):
    """A failure a person can act on; the message is one line that says what to do."""


def _noop(_: str) -> None:
    pass


def cache_root() -> Path:
    override = os.environ.get("MODEL_AGENT_CACHE")
    return Path(override) if override else Path.home() / ".cache" / "model-agent"


def repo_root() -> Path:
    """The source checkout this package runs from (``testbed/servers`` -> repository root)."""
    return Path(__file__).resolve().parents[2]


def default_state_dir() -> Path:
    return cache_root() / "dev"


# ----------------------------------------------------------------------------------------------- build


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path
    version: str


def binaries_dir(version: str = KUBERNETES_VERSION) -> Path:
    return cache_root() / "controlplane" / version


def cached_binaries(version: str = KUBERNETES_VERSION) -> Binaries | None:
    d = binaries_dir(version)
    found = Binaries(d / "kube-apiserver", d / "etcd", version)
    if found.kube_apiserver.is_file() and found.etcd.is_file():
        return found
    return None


def _find_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ControlPlaneError(
            f"the Go toolchain (go >= 1.26) is not on PATH: install it, or put a cached build in {binaries_dir()}"
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    try:
        major, minor = (int(x) for x in out.removeprefix("go").split(".")[:2])
    except ValueError:
        return go
    if (major, minor) < GO_MIN_VERSION:
        raise ControlPlaneError(f"{out} is too old to build Kubernetes {KUBERNETES_VERSION}: install go >= 1.26")
    return go


def _ldflags(version: str) -> str:
    minor = version.split(".")[1]
    stamps = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        stamps += [f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor=1", f"-X {pkg}.gitMinor={minor}"]
    return " ".join(["-s", "-w", *stamps])


def go_build_env() -> dict[str, str]:
    """A static, reproducible ``go build``: no cgo, the installed toolchain only, the module's pinned deps."""
    return dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-mod=readonly")


def empty_staging_dir(target: Path) -> Path:
    """An empty ``<target>.building`` beside ``target``; :func:`publish_build` renames it into place, so the
    cache holds a whole build or none (a killed build is redone)."""
    staging = target.with_name(target.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def publish_build(staging: Path, target: Path) -> None:
    """Replace ``target`` with the finished ``staging`` directory."""
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def run_go_build(name: str, argv: list[str], *, module: Path, staging: Path) -> None:
    """Run one ``go build`` (``argv``) of ``name`` in ``module``; raise :class:`ControlPlaneError` with the
    last line of its output when it fails, the full output in ``<staging>/<name>.build.log``."""
    proc = run_step(
        argv, f"building {name}", ControlPlaneError, timeout_s=BUILD_TIMEOUT_S, cwd=module, env=go_build_env()
    )
    if proc.returncode != 0:
        log = staging / f"{name}.build.log"
        log.write_text(proc.stdout + proc.stderr)
        raise ControlPlaneError(f"go build of {name} failed: {last_line(proc.stderr)} (full log: {log})")


def build(*, force: bool = False, echo: Echo = _noop) -> Binaries:
    """Build the pinned control plane binaries unless they are cached; return their paths."""
    if not force and (cached := cached_binaries()) is not None:
        echo(f"control plane {KUBERNETES_VERSION}: using cached binaries in {cached.kube_apiserver.parent}")
        return cached
    module = repo_root() / "tools" / "controlplane"
    if not (module / "go.mod").is_file():
        raise ControlPlaneError(f"{module}/go.mod is missing: run from a model-agent source checkout")
    go = _find_go()
    target = binaries_dir()
    staging = empty_staging_dir(target)
    steps: list[tuple[str, list[str]]] = [
        (
            "kube-apiserver",
            [
                go,
                "build",
                "-trimpath",
                "-tags",
                "grpcnotrace",
                "-ldflags",
                _ldflags(KUBERNETES_VERSION),
                "-o",
                str(staging / "kube-apiserver"),
                "./kube-apiserver",
            ],
        ),
        ("etcd", [go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / "etcd"), "./etcd"]),
    ]
    started = time.monotonic()
    for name, argv in steps:
        echo(f"building {name} ({KUBERNETES_VERSION}) - a cold build takes several minutes on 2 cores")
        step_started = time.monotonic()
        run_go_build(name, argv, module=module, staging=staging)
        echo(f"built {name} in {time.monotonic() - step_started:.0f}s")
    elapsed = time.monotonic() - started
    info = {
        "version": KUBERNETES_VERSION,
        "build_seconds": round(elapsed, 1),
        "sizes": {p.name: p.stat().st_size for p in staging.iterdir() if p.is_file() and not p.suffix},
    }
    (staging / "build-info.json").write_text(json.dumps(info, indent=2))
    publish_build(staging, target)
    echo(f"control plane {KUBERNETES_VERSION} built in {elapsed:.0f}s into {target}")
    found = cached_binaries()
    assert found is not None
    return found


HELM_VERSION = "v3.22.0"


def helm_binary() -> Path:
    """Where the pinned helm (built from its Go module, for chart tests) lives once built."""
    return cache_root() / "helm" / HELM_VERSION / "helm"


def go_install(package: str, version: str, target: Path, *, echo: Echo = _noop) -> Path:
    """``go install package@version`` into ``target``'s folder (static, stripped) unless ``target`` exists."""
    name = target.name
    if target.is_file():
        echo(f"{name} {version}: using cached binary {target}")
        return target
    go = _find_go()
    target.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOBIN=str(target.parent))
    echo(f"building {name} {version} from its Go module")
    started = time.monotonic()
    argv = [go, "install", "-trimpath", "-ldflags", "-s -w", f"{package}@{version}"]
    proc = run_step(argv, f"building {name}", ControlPlaneError, timeout_s=BUILD_TIMEOUT_S, env=env)
    if proc.returncode != 0:
        raise ControlPlaneError(f"go install of {name} {version} failed: {last_line(proc.stderr)}")
    echo(f"built {name} in {time.monotonic() - started:.0f}s")
    return target


def build_helm(*, echo: Echo = _noop) -> Path:
    """``go install`` the pinned helm into the cache (a real chart renderer for the deploy tests)."""
    return go_install("helm.sh/helm/v3/cmd/helm", HELM_VERSION, helm_binary(), echo=echo)


# ------------------------------------------------------------------------------------------------- run


@dataclass
class State:
    etcd_pid: int = 0
    apiserver_pid: int = 0
    etcd_port: int = 0
    etcd_peer_port: int = 0
    apiserver_port: int = 0
    kubeconfig: str = ""
    nodes: list[str] = field(default_factory=list)
    started_at: float = 0.0


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def write_state_file(path: Path, state: DataclassInstance) -> None:
    """Write ``state`` as JSON through a temporary file renamed over ``path``: a ``down`` or ``status`` from
    another process reads the old record or the new one, never half of one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(path)


def _alive_and_ours(pid: int, marker: str) -> bool:
    return pid > 0 and marker in _cmdline(pid)


def _running_or_ours(pid: int, marker: str) -> bool:
    """For a component just started: ours, or a process whose command line is empty for a moment.

    While ``execve`` replaces a process's image, ``/proc/<pid>/cmdline`` reads empty; a kubelet (a large binary)
    was once read in that instant and taken for dead. An empty command line counts as alive unless the process is a
    zombie (its state in ``/proc/<pid>/stat``): the next poll decides.
    """
    if _alive_and_ours(pid, marker):
        return True
    if pid <= 0 or _cmdline(pid):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _how_it_ended(pid: int) -> str:
    """Why a component is gone, as far as this process can tell: its exit status when it was our child (a
    component that died with an empty log was most likely killed by a signal), else what /proc says."""
    try:
        waited, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        waited, status = 0, 0
    if waited == pid:
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit status {os.waitstatus_to_exitcode(status)}"
    if Path(f"/proc/{pid}").exists():
        return f"pid {pid} runs, but its command line does not name the state directory: {_cmdline(pid)[:200]!r}"
    return f"pid {pid} gone, not a child of this process"


def _stop_pid(pid: int, marker: str, deadline_s: float = STOP_TIMEOUT_S) -> None:
    if not _alive_and_ours(pid, marker):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not _alive_and_ours(pid, marker):
            _reap(pid)
            return
        _reap(pid)
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> None:
    # Children of this very process become zombies until waited for; others are reaped by init.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


class ControlPlane:
    """etcd + kube-apiserver processes recorded in one state directory."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = (state_dir or default_state_dir()).resolve()
        self.state_file = self.state_dir / "state.json"
        self.kubeconfig = self.state_dir / "kubeconfig"

    # ---- state file

    def read_state(self) -> State | None:
        try:
            raw = json.loads(self.state_file.read_text())
            return State(**raw)
        except (OSError, ValueError, TypeError):
            return None

    def _write_state(self, state: State) -> None:
        write_state_file(self.state_file, state)

    def running(self) -> State | None:
        """The recorded state when both processes are alive and ours, else None."""
        state = self.read_state()
        if state and self._both_alive(state):
            return state
        return None

    def _both_alive(self, state: State) -> bool:
        marker = str(self.state_dir)
        return _alive_and_ours(state.etcd_pid, marker) and _alive_and_ours(state.apiserver_pid, marker)

    # ---- lifecycle

    def up(
        self,
        nodes: Sequence[str] = (),
        *,
        apiserver_port: int | None = None,
        binaries: Binaries | None = None,
        echo: Echo = _noop,
        real_nodes: Callable[[_pki.Pki], Sequence[str]] | None = None,
    ) -> State:
        """Start the control plane (building it first if needed) and bootstrap CRDs, Namespace, Nodes.

        ``real_nodes`` (testbed.servers.node): pods are admitted as on a real cluster (ServiceAccount
        admission on, NodeRestriction added) and the flags it returns for the PKI are appended.
        """
        existing = self.read_state()
        if existing is not None:
            if self._both_alive(existing):
                raise ControlPlaneError(
                    f"a control plane is already running from {self.state_dir} "
                    f"(apiserver pid {existing.apiserver_pid}): run `python -m testbed down --state-dir "
                    f"{self.state_dir}` first, or use it as is with KUBECONFIG={self.kubeconfig}"
                )
            echo(f"found state left by a killed run in {self.state_dir}; cleaning it up")
            self.down()
        if apiserver_port is not None and _port_in_use(apiserver_port):
            raise ControlPlaneError(
                f"port {apiserver_port} on 127.0.0.1 is in use: free it or pick another with --port"
            )
        bins = binaries or build(echo=echo)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.state_dir.mkdir(parents=True)
        certs = _pki.generate(self.state_dir / "pki")
        state = State(
            etcd_port=free_port(),
            etcd_peer_port=free_port(),
            apiserver_port=apiserver_port or free_port(),
            kubeconfig=str(self.kubeconfig),
            nodes=list(nodes),
            started_at=time.time(),
        )
        started = time.monotonic()
        try:
            state.etcd_pid = self._spawn("etcd", self._etcd_argv(bins, state))
            self._write_state(state)
            argv = self._apiserver_argv(bins, state, certs)
            if real_nodes is not None:
                argv = [a for a in argv if a != "--disable-admission-plugins=ServiceAccount"]
                argv += ["--enable-admission-plugins=NodeRestriction", *real_nodes(certs)]
            state.apiserver_pid = self._spawn("kube-apiserver", argv)
            self._write_state(state)
            self._write_kubeconfig(state, certs)
            asyncio.run(self._wait_ready_and_bootstrap(state, nodes))
        except BaseException:
            self.down()
            raise
        echo(f"control plane ready in {time.monotonic() - started:.1f}s; KUBECONFIG={self.kubeconfig}")
        return state

    def down(self) -> bool:
        """Stop whatever this state directory records; True if something was running. Never fails."""
        state = self.read_state()
        if state is None:
            return False
        marker = str(self.state_dir)
        was_running = _alive_and_ours(state.apiserver_pid, marker) or _alive_and_ours(state.etcd_pid, marker)
        _stop_pid(state.apiserver_pid, marker)
        _stop_pid(state.etcd_pid, marker)
        with contextlib.suppress(OSError):
            self.state_file.unlink()
        return was_running

    # ---- internals

    def _spawn(self, name: str, argv: list[str]) -> int:
        return spawn_logged(argv, cwd=self.state_dir, log_path=self.state_dir / f"{name}.log")

    def _etcd_argv(self, bins: Binaries, state: State) -> list[str]:
        client = f"http://127.0.0.1:{state.etcd_port}"
        peer = f"http://127.0.0.1:{state.etcd_peer_port}"
        return [
            str(bins.etcd),
            "--name=dev",
            f"--data-dir={self.state_dir / 'etcd-data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=dev={peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
            "--quota-backend-bytes=4294967296",
        ]

    def _apiserver_argv(self, bins: Binaries, state: State, certs: _pki.Pki) -> list[str]:
        return [
            str(bins.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{state.etcd_port}",
            f"--cert-dir={self.state_dir / 'pki'}",
            f"--tls-cert-file={certs.serving_cert}",
            f"--tls-private-key-file={certs.serving_key}",
            f"--client-ca-file={certs.ca_cert}",
            f"--secure-port={state.apiserver_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--authorization-mode=Node,RBAC",
            "--disable-admission-plugins=ServiceAccount",
            f"--service-account-issuer=https://127.0.0.1:{state.apiserver_port}/",
            f"--service-account-key-file={certs.sa_public}",
            f"--service-account-signing-key-file={certs.sa_private}",
            "--profiling=false",
            "--v=0",
        ]

    def _write_kubeconfig(self, state: State, certs: _pki.Pki) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "model-agent-dev",
                    "cluster": {
                        "server": f"https://127.0.0.1:{state.apiserver_port}",
                        "certificate-authority": str(certs.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(certs.admin_cert), "client-key": str(certs.admin_key)},
                }
            ],
            "contexts": [{"name": "model-agent-dev", "context": {"cluster": "model-agent-dev", "user": "admin"}}],
            "current-context": "model-agent-dev",
        }
        self.kubeconfig.write_text(yaml.safe_dump(doc, sort_keys=False))

    async def _wait_ready_and_bootstrap(self, state: State, nodes: Sequence[str]) -> None:
        client = await KubeClient.connect(self.kubeconfig)

        async def readyz() -> str | None:
            await client.request("GET", "/readyz", timeout=5)
            return None

        try:
            await poll_until_ready(
                readyz,
                pids={"etcd": state.etcd_pid, "kube-apiserver": state.apiserver_pid},
                state_dir=self.state_dir,
                timeout_s=START_TIMEOUT_S,
                interval_s=0.25,
                not_ready="kube-apiserver not ready",
                log_of="kube-apiserver",
            )
            await bootstrap(client, nodes)
        finally:
            await client.close()


async def poll_until_ready(
    probe: Callable[[], Awaitable[str | None]],
    *,
    pids: Mapping[str, int],
    state_dir: Path,
    timeout_s: float,
    interval_s: float,
    not_ready: str,
    log_of: str,
    first_reason: str = "no answer yet",
) -> None:
    """Wait for components started in the background (the control plane, a node) to be ready.

    Every ``interval_s``: a component of ``pids`` that is gone (no longer a process whose command line names
    ``state_dir``) fails at once, pointing at its ``<state_dir>/<name>.log`` (waiting longer cannot help);
    then ``probe()`` asks the API server: None means ready, a string (or an API error) is why not yet.
    After ``timeout_s`` :class:`ControlPlaneError` says ``not_ready``, the last reason and ``log_of``'s log.
    """
    deadline = time.monotonic() + timeout_s
    last = first_reason
    while True:
        for name, pid in pids.items():
            if not _running_or_ours(pid, str(state_dir)):
                how = _how_it_ended(pid)
                raise ControlPlaneError(f"{name} exited during start-up ({how}): see {state_dir / (name + '.log')}")
        try:
            reason = await probe()
            if reason is None:
                return
            last = reason
        except (ApiError, ApiUnavailable) as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{not_ready} after {timeout_s:.0f}s ({last}): see {state_dir / (log_of + '.log')}")
        await asyncio.sleep(interval_s)


# ------------------------------------------------------------------------------------------- bootstrap

FIELD_MANAGER = "model-agent-dev"


def crd_documents(directory: Path | None = None) -> list[dict[str, Any]]:
    """The CRD manifests shipped in ``deploy/crds``."""
    directory = directory or repo_root() / "deploy" / "crds"
    docs: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    if not docs:
        raise ControlPlaneError(f"no CRDs found in {directory}")
    return docs


async def apply_crd(client: KubeClient, doc: dict[str, Any], *, wait_s: float = 60.0) -> dict[str, Any]:
    """Server-side apply one CRD and wait until it is Established (and its names accepted)."""
    name = doc["metadata"]["name"]
    await client.request(
        "PATCH",
        CRDS.path(name=name),
        query={"fieldManager": FIELD_MANAGER, "force": "true"},
        body=doc,
        content_type="application/apply-patch+yaml",
    )
    deadline = time.monotonic() + wait_s
    while True:
        current = await client.request("GET", CRDS.path(name=name))
        conditions = (current.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return current
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"CRD {name} not Established after {wait_s:.0f}s")
        await asyncio.sleep(0.1)


DEFAULT_INSTANCE_TYPE = "BM.GPU.H100.8"


def node_manifest(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": DEFAULT_INSTANCE_TYPE,
                "nvidia.com/gpu.present": "true",
                **(labels or {}),
            },
        },
    }


async def _create_if_absent(client: KubeClient, path: str, body: dict[str, Any]) -> None:
    try:
        await client.request("POST", path, body=body)
    except ApiError as exc:
        if exc.status != 409:
            raise


async def bootstrap(client: KubeClient, nodes: Iterable[str], *, namespace: str = "ome") -> None:
    """Install the CRDs, the agent's Namespace and the requested Nodes (idempotent)."""
    for doc in crd_documents():
        await apply_crd(client, doc)
    await _create_if_absent(
        client, NAMESPACES.path(), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    for node in nodes:
        await _create_if_absent(client, NODES.path(), node_manifest(node))
