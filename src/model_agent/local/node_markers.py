"""Node markers: which nodes use a models root, so an agent can tell that the root is shared.

Role: on a models root mounted on many nodes (NFS, GPFS, Lustre, CephFS, EFS, ...) every node's agent sees
the same ``<root>/.model-agent/``. Each agent leaves a marker naming its node in
``<root>/.model-agent/nodes/<node>`` (JSON: node, host, pid, when written); a marker of *another* node in that
directory is the evidence that the files here are served by other nodes too. The filesystem type of the root
(from ``/proc/self/mountinfo``, what ``statfs`` reports as ``f_type``) is read alongside, for ``/status``:
it is a hint an operator reads, never a decision (a local disk can be bind-mounted into many pods, an NFS
mount can be private to one node).

Contract:

* :func:`write_marker` is atomic (temporary file with a per-process name, fsync, rename): a reader sees the
  previous marker or the new one, never a torn one; an ``OSError`` (a read-only root) is the caller's to report.
* :func:`read_markers` never raises: an unreadable directory or marker reads as no marker (and the unreadable
  names are returned, so a problem is visible); a node name that could not be a marker's file name is skipped.
* :func:`decide_shared` is pure: the flag, this node's name and the node names seen give the verdict.
* Markers are never deleted by the agent: a node that left stays counted, which only errs on the safe side
  (a shared root's rules keep files that a private root's would remove).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from model_agent.local.manifest import fsync_dir
from model_agent.model import json_text

NODES_DIR = "nodes"
# Filesystem types that are network or cluster filesystems: shown in /status as a hint (never decisive).
NETWORK_FS_TYPES = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "gpfs", "lustre", "ceph", "cephfs", "glusterfs", "9p", "beegfs", "afs"}
)


@dataclass(frozen=True)
class SharedVerdict:
    """Whether a root is shared, why (a sentence for logs and ``/status``), and the other nodes seen."""

    shared: bool
    why: str
    peers: tuple[str, ...] = ()


def decide_shared(flag: bool, node: str, seen: list[str]) -> SharedVerdict:
    """The root is shared when ``--shared-root`` says so or a marker of another node is there."""
    peers = tuple(sorted({n for n in seen if n and n != node}))
    if flag:
        return SharedVerdict(True, "--shared-root is set", peers)
    if peers:
        shown = ", ".join(peers[:5]) + (f" and {len(peers) - 5} more" if len(peers) > 5 else "")
        return SharedVerdict(True, f"markers of other nodes are in the root ({shown})", peers)
    return SharedVerdict(False, "no other node's marker in the root", ())


def markers_dir(private: Path) -> Path:
    """Where the markers of the root whose private area is ``private`` live."""
    return private / NODES_DIR


def valid_node_name(node: str) -> bool:
    """A node name usable as a file name (Kubernetes node names always are: DNS subdomains)."""
    return bool(node) and node not in (".", "..") and "/" not in node and "\0" not in node and len(node) <= 253


def write_marker(private: Path, node: str, now: float | None = None) -> Path:
    """Write (or refresh) this node's marker atomically; the marker's path. Raises ``OSError`` or ``ValueError``."""
    if not valid_node_name(node):
        raise ValueError(f"node name {node!r} cannot name a marker file")
    directory = markers_dir(private)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / node
    body = {"node": node, "host": socket.gethostname(), "pid": os.getpid(), "writtenAt": now or time.time()}
    # The temporary name carries the node as well as the pid: two nodes' agents are often both pid 1.
    tmp = directory / f".{node}.{os.getpid()}.tmp"
    with tmp.open("wb") as fh:
        fh.write(json.dumps(body, sort_keys=True).encode())
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    fsync_dir(directory)
    return path


def read_markers(private: Path) -> tuple[list[str], list[str]]:
    """(node names with a readable marker, names that could not be read); never raises."""
    directory = markers_dir(private)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return [], []
    nodes: list[str] = []
    unreadable: list[str] = []
    for name in names:
        if name.startswith(".") or not valid_node_name(name):
            continue  # a temporary file of a write in progress (or left by a kill)
        try:
            body = json_text.loads((directory / name).read_text())
        except (OSError, ValueError):
            unreadable.append(name)
            continue
        # The file's name is the marker's identity; its content must agree, else it is not a marker.
        if isinstance(body, dict) and body.get("node") == name:
            nodes.append(name)
        else:
            unreadable.append(name)
    return nodes, unreadable


def fs_type_from_mountinfo(mountinfo: str, path: str) -> str:
    """The filesystem type of the mount holding ``path`` (resolved), from ``/proc/self/mountinfo``'s text.

    The longest mount point that is ``path`` or one of its parents wins; "" when no line parses. Mount points
    in mountinfo escape spaces and such as octal (``\\040``).
    """
    best, best_type = -1, ""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        point = _unescape(fields[4])
        inside = path == point or point == "/" or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, best_type = len(point), right.split()[0]
    return best_type


def fs_type(path: Path) -> str:
    """The filesystem type of ``path`` on this host ("" when ``/proc/self/mountinfo`` cannot be read)."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return ""
    return fs_type_from_mountinfo(text, os.path.realpath(path))


def _unescape(field: str) -> str:
    out = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1 : i + 4]) == 3 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)
