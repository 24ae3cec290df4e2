"""Network namespaces for benchmarks: a private bridge, one namespace per node, tc rate caps, nothing routed out.

Role: give each benchmark node its own network stack so per-node bandwidth can be capped with ``tc`` and
node-to-node traffic crosses a real (virtual) link. Contract:

* :class:`Bridge` creates a bridge ``<prefix>br`` in the host namespace with ``<subnet>.1/24``; each
  :meth:`Bridge.add_node` creates namespace ``<prefix><i>`` with a veth pair (host end on the bridge, node end
  ``<subnet>.<i+2>/24``). No default route and no NAT are configured, so nothing a namespace sends can leave
  the machine; only the bridge's /24 is reachable from a namespace.
* Caps: ``tbf`` on the host end's egress (the node's download) and on the node end's egress (its upload);
  :meth:`Bridge.cap_bridge` caps the bridge device's own egress, i.e. everything the host sends into the
  namespaces (the origin and the API server), which is how a throttled hub is mimicked.
* :meth:`Bridge.teardown` removes every namespace, veth and the bridge with this prefix, whether or not
  this process created them (a crashed run is cleaned by ``cleanup(prefix)``); it never fails on absences.
* :func:`listen_in` opens a listening TCP socket inside a namespace (``setns`` in a helper thread), so a
  host-side forwarder can accept there; used for the API server, whose certificate names 127.0.0.1.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNET = 0x40000000


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tc", *args], check=check, capture_output=True, text=True)


def _tbf(dev: str, rate_bytes: int, netns: str | None = None) -> None:
    # burst of ~50 ms at the rate (at least 64 KiB) keeps the average exact and the queue short
    burst = max(64 << 10, rate_bytes // 20)
    argv = ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_bytes * 8}bit", "burst", str(burst)]
    argv += ["latency", "100ms"]
    if netns:
        subprocess.run(["ip", "netns", "exec", netns, "tc", *argv], check=True, capture_output=True, text=True)
    else:
        _tc(*argv)


def tx_bytes(dev: str, netns: str | None = None) -> int:
    """Bytes sent by ``dev`` (its egress counter from sysfs)."""
    cmd = ["cat", f"/sys/class/net/{dev}/statistics/tx_bytes"]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    return int(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())


@dataclass
class Node:
    """One namespace: its name, its address on the bridge and the two veth ends."""

    netns: str
    address: str
    host_dev: str
    node_dev: str = "eth0"


@dataclass
class Bridge:
    """A private bridge and its namespaces; ``subnet`` is the first three octets, e.g. ``10.213.7``."""

    prefix: str = "mafx"
    subnet: str = "10.213.7"
    nodes: list[Node] = field(default_factory=list)

    @property
    def device(self) -> str:
        return f"{self.prefix}br"

    @property
    def address(self) -> str:
        return f"{self.subnet}.1"

    def up(self) -> None:
        cleanup(self.prefix)
        _ip("link", "add", self.device, "type", "bridge")
        _ip("addr", "add", f"{self.address}/24", "dev", self.device)
        _ip("link", "set", self.device, "up")

    def add_node(self, index: int, *, node_cap: int) -> Node:
        netns, host_dev = f"{self.prefix}{index}", f"{self.prefix}v{index}"
        node = Node(netns=netns, address=f"{self.subnet}.{index + 2}", host_dev=host_dev)
        _ip("netns", "add", netns)
        _ip("link", "add", host_dev, "type", "veth", "peer", "name", node.node_dev, "netns", netns)
        _ip("link", "set", host_dev, "master", self.device)
        _ip("link", "set", host_dev, "up")
        _ip("-n", netns, "addr", "add", f"{node.address}/24", "dev", node.node_dev)
        _ip("-n", netns, "link", "set", node.node_dev, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _tbf(host_dev, node_cap)  # into the node: its download
        _tbf(node.node_dev, node_cap, netns)  # out of the node: its upload
        self.nodes.append(node)
        return node

    def cap_bridge(self, rate_bytes: int) -> None:
        _tbf(self.device, rate_bytes)

    def teardown(self) -> None:
        cleanup(self.prefix)
        self.nodes.clear()


def cleanup(prefix: str) -> list[str]:
    """Remove every namespace, link and the bridge named with ``prefix``; the names removed."""
    removed: list[str] = []
    names = _ip("netns", "list", check=False).stdout.split()
    for ns in names:
        if ns.startswith(prefix) and ns[len(prefix) :].isdigit():
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            dev = parts[1].strip().split("@")[0]
            if dev.startswith(prefix):
                _ip("link", "del", dev, check=False)
                removed.append(dev)
    return removed


def listen_in(netns: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to ``host:port`` inside namespace ``netns`` (it stays in that namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    result: list[socket.socket | BaseException] = []

    def work() -> None:
        try:
            with open(f"/run/netns/{netns}") as target:
                if libc.setns(target.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns}")
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(128)
                sock.setblocking(False)
                result.append(sock)
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    # A thread that switched namespace is left to end: its namespace dies with it, the socket keeps its own.
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join()
    got = result[0]
    if isinstance(got, BaseException):
        raise got
    return got


def pid_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of a process (from /proc/<pid>/stat), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks
