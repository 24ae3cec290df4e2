"""The real node's pure parts: the host restore plan, the stale-state refusal, the OCI writer, the configs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from testbed import image, oci
from testbed.servers import hoststate
from testbed.servers.containerd import render_cni, render_config
from testbed.servers.controlplane import repo_root
from testbed.servers.hoststate import Action, Snapshot, restore_plan, stale_reason
from testbed.servers.node import kubelet_config
from testbed.servers.nodepki import Pair

HOST = Snapshot(
    sysctls={"vm/overcommit_memory": "0", "kernel/panic": "1", "kernel/panic_on_oops": "0"},
    nft_chains={"ip filter": ["INPUT", "OUTPUT"]},
    mounts=["/", "/proc", "/sys/fs/cgroup"],
    cgroups=["/sys/fs/cgroup/memory/user.slice"],
    paths=[],
)

RESTORE_CASES = [
    ("unchanged host", HOST, []),
    (
        "kubelet sysctls",
        Snapshot(
            sysctls={"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"},
            nft_chains=HOST.nft_chains,
            mounts=HOST.mounts,
            cgroups=HOST.cgroups,
        ),
        [
            Action("sysctl", "kernel/panic", "1"),
            Action("sysctl", "kernel/panic_on_oops", "0"),
            Action("sysctl", "vm/overcommit_memory", "0"),
        ],
    ),
    (
        "new tables and chains",
        Snapshot(
            sysctls=HOST.sysctls,
            nft_chains={
                "ip filter": ["INPUT", "KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "OUTPUT"],
                "ip mangle": ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"],
            },
            mounts=HOST.mounts,
            cgroups=HOST.cgroups,
        ),
        [
            Action("nft-chain", "ip filter KUBE-FIREWALL"),
            Action("nft-chain", "ip filter KUBE-KUBELET-CANARY"),
            Action("nft-table", "ip mangle"),
        ],
    ),
    (
        "mounts deepest first, only the node's own",
        Snapshot(
            sysctls=HOST.sysctls,
            nft_chains=HOST.nft_chains,
            mounts=[*HOST.mounts, "/bed/node/kubelet", "/bed/node/kubelet/pods/u/volumes/x", "/mnt/other-engineer"],
            cgroups=HOST.cgroups,
        ),
        [Action("unmount", "/bed/node/kubelet/pods/u/volumes/x"), Action("unmount", "/bed/node/kubelet")],
    ),
    (
        "cgroups and fixed paths",
        Snapshot(
            sysctls=HOST.sysctls,
            nft_chains=HOST.nft_chains,
            mounts=HOST.mounts,
            cgroups=[*HOST.cgroups, "/sys/fs/cgroup/memory/kubepods", "/sys/fs/cgroup/cpu/k8s.io"],
            paths=["/var/log/containers"],
        ),
        [
            Action("cgroup", "/sys/fs/cgroup/cpu/k8s.io"),
            Action("cgroup", "/sys/fs/cgroup/memory/kubepods"),
            Action("path", "/var/log/containers"),
        ],
    ),
]


@pytest.mark.parametrize(("now", "expected"), [c[1:] for c in RESTORE_CASES], ids=[c[0] for c in RESTORE_CASES])
def test_restore_plan(now: Snapshot, expected: list[Action]) -> None:
    assert restore_plan(HOST, now, owned_prefixes=["/bed/node"]) == expected


def test_restore_plan_runs_mounts_before_cgroups_and_sysctls_last() -> None:
    now = Snapshot(
        sysctls={**HOST.sysctls, "kernel/panic": "10"},
        nft_chains={**HOST.nft_chains, "ip6 mangle": ["KUBE-IPTABLES-HINT"]},
        mounts=[*HOST.mounts, "/bed/node/kubelet"],
        cgroups=[*HOST.cgroups, "/sys/fs/cgroup/memory/kubepods"],
        paths=["/run/containerd"],
    )
    kinds = [a.kind for a in restore_plan(HOST, now, owned_prefixes=["/bed/node"])]
    assert kinds == ["unmount", "nft-table", "cgroup", "path", "sysctl"]


STALE_CASES = [
    ("clean host", HOST, False, None),
    ("our record left", HOST, True, "was not torn down"),
    ("kubepods cgroup", Snapshot(cgroups=["/sys/fs/cgroup/memory/kubepods"]), False, "cgroup /sys/fs/cgroup/memory"),
    ("canary chain", Snapshot(nft_chains={"ip mangle": ["KUBE-KUBELET-CANARY"]}), False, "KUBE-KUBELET-CANARY"),
    ("kubelet dir", Snapshot(paths=["/var/lib/kubelet"]), False, "/var/lib/kubelet exists"),
]


@pytest.mark.parametrize(("now", "own", "fragment"), [c[1:] for c in STALE_CASES], ids=[c[0] for c in STALE_CASES])
def test_stale_reason(now: Snapshot, own: bool, fragment: str | None) -> None:
    reason = stale_reason(now, own_record=own)
    if fragment is None:
        assert reason is None
    else:
        assert reason is not None and fragment in reason and "\n" not in reason


def test_snapshot_round_trips_through_json() -> None:
    assert Snapshot.from_json(HOST.to_json()) == HOST


def test_capture_reads_this_host() -> None:
    snap = hoststate.capture(fixed_paths=("/", "/does-not-exist"))
    assert "/" in snap.mounts and snap.paths == ["/"]


def test_oci_archive_round_trips(tmp_path: Path) -> None:
    target = tmp_path / "pause.tar"
    digest = oci.write_archive(
        target, ref="testbed.local/pause:1", files=[oci.LayerFile("bin/pause", b"\x7fELF")], entrypoint=["/bin/pause"]
    )
    manifest, config, layers = image.read_manifest(target)
    assert digest.startswith("sha256:")
    assert config["config"] == {"Entrypoint": ["/bin/pause"], "User": "65535:65535"}
    assert image.file_list(layers) == {"/bin", "/bin/pause"}
    # Deterministic: the same input gives the same bytes (the cache key of the archive).
    again = tmp_path / "again.tar"
    oci.write_archive(
        again, ref="testbed.local/pause:1", files=[oci.LayerFile("bin/pause", b"\x7fELF")], entrypoint=["/bin/pause"]
    )
    assert again.read_bytes() == target.read_bytes()
    assert manifest["layers"]


def test_file_list_applies_whiteouts(tmp_path: Path) -> None:
    import io
    import tarfile

    def layer(names: list[str]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for n in names:
                tar.addfile(tarfile.TarInfo(n), io.BytesIO(b""))
        return buf.getvalue()

    files = image.file_list(
        [
            layer(["usr/bin/pip", "usr/bin/python", "opt/a/x", "opt/a/y"]),
            layer(["usr/bin/.wh.pip", "opt/a/.wh..wh..opq"]),
        ]
    )
    assert files == {"/usr/bin/python"}


def test_context_paths_agree_with_dockerignore() -> None:
    lines = (repo_root() / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == set(image.CONTEXT_PATHS)


def test_containerd_config_carries_what_this_machine_needs(tmp_path: Path) -> None:
    config = tomllib.loads(render_config(tmp_path, sandbox_image="testbed.local/pause:3.10"))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == "testbed.local/pause:3.10"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert config["grpc"]["address"] == str(tmp_path / "containerd.sock")
    assert all(str(tmp_path) in config[k] for k in ("root", "state"))
    bridge = json.loads(render_cni(tmp_path))["plugins"][0]
    # No route off the machine: no gateway, no masquerading.
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False


def test_kubelet_config_fits_this_machine(tmp_path: Path) -> None:
    cfg = kubelet_config(
        tmp_path,
        port=1234,
        ca=tmp_path / "ca.crt",
        serving=Pair(tmp_path / "s.crt", tmp_path / "s.key"),
        runtime_endpoint="unix:///x.sock",
    )
    assert cfg["cgroupDriver"] == "cgroupfs" and cfg["failCgroupV1"] is False and cfg["failSwapOn"] is False
    assert cfg["readOnlyPort"] == 0 and cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["address"] == "127.0.0.1" and cfg["evictionHard"] == {}
