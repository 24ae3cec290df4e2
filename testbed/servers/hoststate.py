"""The host state a kubelet and containerd change, captured before a node starts and put back after.

Role: the test bed's node runs real programs as root on the developer's (or CI's) machine. They set
sysctls (``vm.overcommit_memory``, ``kernel.panic``, ``kernel.panic_on_oops``, ``net.ipv4.ip_forward``),
add netfilter tables and chains (``KUBE-FIREWALL``, ``KUBE-KUBELET-CANARY``, ``KUBE-IPTABLES-HINT``), create
cgroups (``/kubepods``, ``/k8s.io``), directories at fixed paths (``/var/log/containers``,
``/var/lib/kubelet``, ``/run/containerd``) and mounts (the kubelet's rshared root dir, pods' volumes).

Shape ("decisions as data"): :func:`capture` reads a :class:`Snapshot` of the host; :func:`restore_plan`
is a pure function from (before, now) to the :class:`Action` list that puts the host back;
:func:`carry_out` is the one actor. :func:`stale_reason` decides, from a snapshot alone, whether a start
would run over a kubelet's leftovers (one line saying what is left and what to run), so state is never
captured "before" on a host that is already changed.

Only what appeared is removed: a sysctl is written back to its old value, a netfilter table or chain
that did not exist is deleted (rules jumping to a deleted chain first), a mount that did not exist is
unmounted (deepest first), a cgroup or fixed path that did not exist is removed (cgroups leaf first).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

SYSCTLS = (
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Fixed paths a kubelet or containerd creates whatever its configured directories are.
FIXED_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/run/containerd",
    "/var/lib/containerd",
    "/etc/cni/net.d",
    "/usr/libexec/kubernetes",
    "/run/netns",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
# A kubelet's own markers: their presence without a record of ours means another node's leftovers.
KUBELET_CGROUPS = ("kubepods", "kubepods.slice")
KUBELET_CHAINS = ("KUBE-KUBELET-CANARY", "KUBE-FIREWALL", "KUBE-IPTABLES-HINT")


@dataclass(frozen=True)
class Snapshot:
    sysctls: dict[str, str] = field(default_factory=dict)
    # "family table" -> chain names
    nft_chains: dict[str, list[str]] = field(default_factory=dict)
    mounts: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        raw: dict[str, Any] = json.loads(text)
        return cls(**raw)


Kind = Literal["sysctl", "unmount", "nft-table", "nft-chain", "cgroup", "path"]


@dataclass(frozen=True)
class Action:
    kind: Kind
    target: str
    value: str = ""

    def describe(self) -> str:
        return f"{self.kind} {self.target}" + (f" = {self.value}" if self.value else "")


# ------------------------------------------------------------------------------------------ reading


def _read_sysctls(names: Iterable[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in names:
        with contextlib.suppress(OSError):
            found[name] = (Path("/proc/sys") / name).read_text().strip()
    return found


def _nft_chains() -> dict[str, list[str]]:
    nft = shutil.which("nft")
    if nft is None:
        return {}
    proc = subprocess.run([nft, "-j", "list", "ruleset"], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return {}
    tables: dict[str, list[str]] = {}
    for item in json.loads(proc.stdout).get("nftables", []):
        if "table" in item:
            tables.setdefault(f"{item['table']['family']} {item['table']['name']}", [])
        elif "chain" in item:
            chain = item["chain"]
            tables.setdefault(f"{chain['family']} {chain['table']}", []).append(chain["name"])
    return {k: sorted(v) for k, v in tables.items()}


def _mounts() -> list[str]:
    # Mount points (field 5 of mountinfo, octal-escaped); a path mounted twice counts twice.
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return sorted(line.split()[4] for line in lines)


def _cgroups() -> list[str]:
    found: list[str] = []
    if not CGROUP_ROOT.is_dir():
        return found
    for hierarchy in sorted(CGROUP_ROOT.iterdir()):
        if not hierarchy.is_dir() or hierarchy.is_symlink():
            continue
        with contextlib.suppress(OSError):
            found += [str(p) for p in hierarchy.iterdir() if p.is_dir() and not p.is_symlink()]
    return sorted(found)


def capture(fixed_paths: Sequence[str] = FIXED_PATHS) -> Snapshot:
    return Snapshot(
        sysctls=_read_sysctls(SYSCTLS),
        nft_chains=_nft_chains(),
        mounts=_mounts(),
        cgroups=_cgroups(),
        paths=sorted(p for p in fixed_paths if os.path.lexists(p)),
    )


# ---------------------------------------------------------------------------------------- decisions


def stale_reason(now: Snapshot, *, own_record: bool) -> str | None:
    """Why a node must not start on this host, or None. ``own_record``: a snapshot of ours is on disk."""
    if own_record:
        return "a node of the test bed was not torn down: run `python -m testbed down` (it restores the host) first"
    for cg in now.cgroups:
        if Path(cg).name in KUBELET_CGROUPS:
            return f"cgroup {cg} exists (a kubelet ran here and was not cleaned up): remove it before starting a node"
    for table, chains in now.nft_chains.items():
        for chain in chains:
            if chain in KUBELET_CHAINS:
                return f"netfilter chain {chain} in table {table} exists (a kubelet's leftover): delete it first"
    for path in now.paths:
        if path in ("/var/lib/kubelet", "/run/containerd"):
            return f"{path} exists (another kubelet or containerd uses this host?): remove it before starting a node"
    return None


def restore_plan(before: Snapshot, now: Snapshot, *, owned_prefixes: Sequence[str] = ()) -> list[Action]:
    """The actions that put ``now`` back to ``before``, in the order they must run.

    Mounts go first (deepest first: nothing can be removed while mounted over), then netfilter chains and
    tables, then cgroups (deepest first: a cgroup with children cannot be removed), then fixed paths, then
    sysctls. Only new mounts under ``owned_prefixes`` (the node's directories and the kubelet's and
    containerd's fixed paths) are unmounted.
    """
    actions: list[Action] = []
    remaining = list(before.mounts)
    new_mounts: list[str] = []
    for m in now.mounts:
        if m in remaining:
            remaining.remove(m)
        else:
            new_mounts.append(m)
    # Only mounts under the node's own directories: other processes on a shared machine mount things too.
    owned = tuple(p.rstrip("/") for p in owned_prefixes)
    for m in sorted(new_mounts, key=lambda p: (-p.count("/"), p)):
        if any(m == o or m.startswith(o + "/") for o in owned):
            actions.append(Action("unmount", m))
    for table, chains in sorted(now.nft_chains.items()):
        if table not in before.nft_chains:
            actions.append(Action("nft-table", table))
            continue
        for chain in chains:
            if chain not in before.nft_chains[table]:
                actions.append(Action("nft-chain", f"{table} {chain}"))
    for cg in sorted(set(now.cgroups) - set(before.cgroups), key=lambda p: (-p.count("/"), p)):
        actions.append(Action("cgroup", cg))
    for path in sorted(set(now.paths) - set(before.paths), key=lambda p: (-p.count("/"), p)):
        actions.append(Action("path", path))
    for name, value in sorted(before.sysctls.items()):
        if now.sysctls.get(name) != value:
            actions.append(Action("sysctl", name, value))
    return actions


# ------------------------------------------------------------------------------------------- actor


def _rmdir_tree(root: Path) -> None:
    # cgroup directories: remove children first; their files cannot (and need not) be deleted.
    for child in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            child.rmdir()
    root.rmdir()


def _unescape_mount(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def _nft(*args: str) -> None:
    subprocess.run(["nft", *args], capture_output=True, text=True, check=True)


def _delete_chain(family: str, table: str, chain: str) -> None:
    # Rules elsewhere in the table that jump to the chain must go before the chain can.
    proc = subprocess.run(
        ["nft", "-a", "-j", "list", "table", family, table], capture_output=True, text=True, check=True
    )
    for item in json.loads(proc.stdout).get("nftables", []):
        rule = item.get("rule")
        if rule and chain in json.dumps(rule.get("expr", [])) and rule["chain"] != chain:
            _nft("delete", "rule", family, table, rule["chain"], "handle", str(rule["handle"]))
    _nft("flush", "chain", family, table, chain)
    _nft("delete", "chain", family, table, chain)


def carry_out(actions: Iterable[Action]) -> list[str]:
    """Run each action; return one line per action that failed (the rest still run)."""
    failures: list[str] = []
    for action in actions:
        try:
            if action.kind == "unmount":
                subprocess.run(
                    ["umount", "--lazy", _unescape_mount(action.target)], capture_output=True, text=True, check=True
                )
            elif action.kind == "nft-table":
                family, table = action.target.split()
                _nft("delete", "table", family, table)
            elif action.kind == "nft-chain":
                family, table, chain = action.target.split()
                _delete_chain(family, table, chain)
            elif action.kind == "cgroup":
                _rmdir_tree(Path(action.target))
            elif action.kind == "path":
                path = Path(action.target)
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            elif action.kind == "sysctl":
                (Path("/proc/sys") / action.target).write_text(action.value + "\n")
        except (OSError, subprocess.CalledProcessError, ValueError) as exc:
            detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
            failures.append(f"{action.describe()}: {detail}")
    return failures
