"""containerd for the test bed's node: Debian's containerd and runc, with a configuration of its own.

Role: the container runtime the kubelet talks to over CRI. Everything it keeps lives under one
directory (root, state, socket, CNI configuration, IPAM data); the runc state too. The packaged service is
never used (Debian's policy-rc.d keeps it from starting, and its paths would be shared with the host).

Choices that make it run on the test machines (each one found by a failure, see docs/operations.md):

* ``restrict_oom_score_adj = true``: the VM lacks CAP_SYS_RESOURCE, and runc cannot lower a sandbox's
  oom_score_adj below its own (``runc create failed: ... can't get final child's PID from pipe: EOF``).
* ``SystemdCgroup = false``: no systemd runs; cgroupfs, as the kubelet's ``cgroupDriver``.
* A bridge + host-local CNI network with no gateway and no masquerading: pods on it can reach each other
  only, never anything off the machine (the agent's pod uses the host network anyway); the node needs a
  network configuration to report ``NetworkReady``.
* The sandbox image is the locally written pause image (no registry is reachable).

Contract: :meth:`Containerd.start` returns when the socket answers; :meth:`Containerd.stop` kills every
task in its ``k8s.io`` namespace (the shims outlive containerd otherwise), then containerd, then any shim
still naming its socket. Only processes whose command line names this directory are signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from testbed.servers.controlplane import ControlPlaneError, _cmdline

NAMESPACE = "k8s.io"
CNI_BIN_DIR = Path("/usr/lib/cni")
# Inside the test bed's own pod network namespaces only (no gateway, no route off the machine).
POD_SUBNET = "10.244.250.0/24"
BRIDGE = "tb-cni0"
START_TIMEOUT_S = 30.0


def render_config(base: Path, *, sandbox_image: str) -> str:
    """containerd's config.toml (version 2) for a node rooted at ``base``."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", \
"io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{base / "containerd.sock"}"

[ttrpc]
  address = "{base / "containerd.sock.ttrpc"}"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"

[{cri}]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{shutil.which("runc") or "/usr/sbin/runc"}"
  Root = "{base / "state" / "runc"}"

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{base / "cni"}"
  max_conf_num = 1
"""


def render_cni(base: Path) -> str:
    """The pod network: a bridge without gateway or masquerading, addresses from a node-local range."""
    doc = {
        "cniVersion": "1.0.0",
        "name": "testbed",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "dataDir": str(base / "cni-ipam"),
                },
            },
            {"type": "loopback"},
        ],
    }
    return json.dumps(doc, indent=2)


def pids_naming(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker`` (a directory of ours)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and marker in _cmdline(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill_all(pids: list[int], marker: str, *, deadline_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``deadline_s``, each pid whose command line still names ``marker``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        alive = [p for p in pids if marker in _cmdline(p)]
        for pid in alive:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        if not [p for p in pids if marker in _cmdline(p)]:
            return
        time.sleep(0.05)
    for pid in pids:
        if marker in _cmdline(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)


class Containerd:
    """One containerd rooted at ``base`` (its socket is ``base/containerd.sock``)."""

    def __init__(self, base: Path, *, sandbox_image: str) -> None:
        self.base = base
        self.sandbox_image = sandbox_image
        self.socket = base / "containerd.sock"
        self.log = base / "containerd.log"
        self.pid = 0

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def ctr(self, *args: str, timeout: float = 300.0) -> str:
        proc = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ControlPlaneError(f"ctr {' '.join(args[:2])} failed: {last}")
        return proc.stdout

    def start(self) -> int:
        binary = shutil.which("containerd")
        if binary is None or shutil.which("runc") is None:
            raise ControlPlaneError(
                "containerd and runc are not installed: apt-get install containerd runc containernetworking-plugins"
            )
        if not (CNI_BIN_DIR / "bridge").is_file():
            raise ControlPlaneError(f"no CNI plugins in {CNI_BIN_DIR}: apt-get install containernetworking-plugins")
        (self.base / "cni").mkdir(parents=True, exist_ok=True)
        config = self.base / "config.toml"
        config.write_text(render_config(self.base, sandbox_image=self.sandbox_image))
        (self.base / "cni" / "10-testbed.conflist").write_text(render_cni(self.base))
        with self.log.open("ab") as log:
            proc = subprocess.Popen(
                [binary, "--config", str(config), "--log-level", "warn"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid = proc.pid
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise ControlPlaneError(f"containerd exited at start-up (code {proc.returncode}): see {self.log}")
            with contextlib.suppress(ControlPlaneError, subprocess.TimeoutExpired):
                if self.socket.exists():
                    self.ctr("version", timeout=5)
                    return self.pid
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"containerd did not answer on {self.socket} in {START_TIMEOUT_S:.0f}s: see {self.log}"
                )
            time.sleep(0.1)

    def import_image(self, archive: Path, ref: str) -> None:
        """Import an OCI archive into the ``k8s.io`` namespace (what the kubelet sees) and check the name."""
        self.ctr("images", "import", "--all-platforms", str(archive))
        names = self.ctr("images", "ls", "--quiet").split()
        if ref not in names:
            raise ControlPlaneError(f"importing {archive} did not create image {ref} (have: {', '.join(names)})")

    def stop(self) -> None:
        """Kill every task (so no shim outlives us), stop containerd, then any process naming our socket."""
        marker = str(self.base)
        if self.socket.exists() and pids_naming(f"--config {self.base / 'config.toml'}"):
            with contextlib.suppress(ControlPlaneError, subprocess.TimeoutExpired):
                for line in self.ctr("tasks", "ls", timeout=15).splitlines()[1:]:
                    task = line.split()[0]
                    with contextlib.suppress(ControlPlaneError, subprocess.TimeoutExpired):
                        self.ctr("tasks", "kill", "--signal", "SIGKILL", task, timeout=15)
                    with contextlib.suppress(ControlPlaneError, subprocess.TimeoutExpired):
                        self.ctr("tasks", "delete", "--force", task, timeout=15)
        kill_all(pids_naming(f"--config {self.base / 'config.toml'}"), marker)
        # Shims started by this containerd name its socket in their arguments (-address <socket>).
        kill_all(pids_naming(str(self.socket)), marker)
