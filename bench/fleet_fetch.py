"""Fleet fetch benchmark: N real agents, each in its own network namespace, fetch one model from a capped origin.

Reproduce (from the repository root, as root, ``ip``, ``tc`` and ``curl`` installed):
``flock /tmp/e2e.lock flock /tmp/heavy.lock nice .venv/bin/python -m bench.fleet_fetch run`` (options below;
the exact command of the last measurement is at the top of ``bench/FLEET_FETCH.md``);
``python -m bench.fleet_fetch report`` rewrites the Markdown and plot from the JSON;
``python -m bench.fleet_fetch cleanup`` removes a crashed run's namespaces.

Set-up per cell: one real control plane (kube-apiserver + etcd on 127.0.0.1), one origin (olah serving a
Hugging Face repository, behind the testbed's counting proxy, which counts the bytes it serves), a private
bridge with one namespace per node (testbed/netns.py: no default route, no NAT, nothing leaves the machine).
Each node is capped with tbf at ``--node-cap`` both ways; the bridge device's egress (everything the host
sends into the namespaces, i.e. the origin) at ``--origin-cap``. The agents reach the origin at the bridge
address through a forwarder (so origin bytes cross the capped links) and the API server at their own
namespace's 127.0.0.1 through a forwarder listening inside the namespace (the serving certificate names
127.0.0.1). Each agent is ``ip netns exec <ns> python -m model_agent run`` with its own Node, importing compiled
bytecode as the image's agent does (:mod:`bench.bytecode`).

Modes: (a) every node from the origin, no slot limit; (b) Lease origin slots only (``--slots``); (c) peer
distribution: the same origin slots (the slot holders seed) plus ``--peer-*``: each agent serves on its
namespace address, advertises it on its node's status ConfigMap, presents a TokenRequest token of one
ServiceAccount for the peer audience bound to its Node (checked by the API server's TokenReview; admitted only
from the address that node advertises) and paces uploads at ``--peer-upload-cap``;
(d) one shared models root for all agents (``--shared-root``; one directory on the same local disk, not a
network filesystem). Every mode has one ClusterBaseModel for the whole fleet (a trusted owner), as users run it;
in (a)-(c) each node keeps it at the same path on its own root (the agent's root bind-mounted at one path in the
private mount namespace ``ip netns exec`` gives it).

Measured per cell: seconds until every Node carries the model's Ready label (and when each did), origin
bytes served (at the proxy), per node the bytes by source and the peer upload bytes (the agent's /metrics,
scraped inside its namespace), the bytes its link sent and received and its peak upload rate over 2 s and
5 s windows (host-side veth counters sampled every 0.5 s), CPU seconds (/proc of the agent: its whole life, and
from the model's creation on), every request the origin answered with its times, and one node alone at the same
caps (the baseline of the time ratios). Writes ``bench/results/fleet_fetch.json``, ``bench/FLEET_FETCH.md`` and
``bench/FLEET_FETCH.png`` (``--results``/``--report`` for a dev run elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.bytecode import compile_product
from model_agent.agent.settings import Settings
from model_agent.kube.client import ApiError, KubeClient
from model_agent.kube.resources import CLUSTERBASEMODELS, NODES
from model_agent.peers import DEFAULT_AUDIENCE
from testbed import netns
from testbed.models import tiny_llama
from testbed.servers import controlplane as cp
from testbed.servers.olah import OlahServer, create_model_repo

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
PREFIX = "mafx"
SUBNET = "10.213.7"
REPO = "bench/fleet-fetch"
RESULTS = ROOT / "bench" / "results" / "fleet_fetch.json"
REPORT = ROOT / "bench" / "FLEET_FETCH.md"
AGENT_NAMESPACE = "ome"
PEER_SA = "model-agent-peer-bench"
PEER_PORT = 9200
METRICS_PORT = 9100
# The agents' client-side API token bucket full again after start-up (burst / rate of the defaults: 2 s).
API_SETTLE_S = Settings.model_fields["api_burst"].default / Settings.model_fields["api_qps"].default
# Upload rates are measured over these windows (s). The agent's pacer is a token bucket with one second's
# worth of burst, so over W seconds it may send cap x (W + 1) bytes by contract; the verdict uses the 5 s window.
RATE_WINDOWS_S = (2.0, 5.0)
FRAMING = 1.03  # link counters include Ethernet/IP/TCP headers, the agent's cap counts body bytes
MODES = {
    "a": "every node from the origin",
    "b": "Lease origin slots (default)",
    "c": "peer distribution",
    "d": "shared root",
}


class Forwarder:
    """TCP forwarders on their own event loop thread: listening sockets (host or in a namespace) -> target."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[asyncio.AbstractServer] = []

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()

    def add(self, sock: socket.socket, target: tuple[str, int]) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

        async def start() -> None:
            self.servers.append(await asyncio.start_server(handle, sock=sock))

        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            for s in self.servers:
                s.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def peer_flags_available() -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "model_agent", "run", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    return "--peer" in out.stdout


def model_files(model_mib: int, files: int) -> dict[str, bytes]:
    base = tiny_llama(7)
    per = model_mib * MiB // files
    out = dict(base)
    for i in range(files):
        # distinct, incompressible-enough bytes per shard (a repeated block would be fine for tbf, not for dedup)
        block = os.urandom(MiB)
        out[f"shard-{i:02d}.safetensors"] = block * (per // MiB)
    return out


def ready_nodes(nodes: list[dict[str, Any]], names: set[str]) -> set[str]:
    done = set()
    for node in nodes:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        if name in names and any(v == "Ready" for k, v in labels.items() if "models.ome.io" in k or "ome.io" in k):
            done.add(name)
    return done


class LinkSampler:
    """Samples each node's veth byte counters (host end) every ``interval`` s on a thread, for upload rates.

    The host end's ``rx_bytes`` is what the node sent (its upload: peer bytes plus its small requests), its
    ``tx_bytes`` what the node received; read from the host's sysfs, so sampling costs no process per read.
    """

    def __init__(self, devices: list[str], interval: float = 0.5) -> None:
        self.devices = devices
        self.interval = interval
        self.samples: list[tuple[float, list[int], list[int]]] = []
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _read(dev: str, counter: str) -> int:
        try:
            return int(Path(f"/sys/class/net/{dev}/statistics/{counter}").read_text())
        except (OSError, ValueError):
            return 0

    def sample(self) -> None:
        rx = [self._read(d, "rx_bytes") for d in self.devices]
        tx = [self._read(d, "tx_bytes") for d in self.devices]
        self.samples.append((time.monotonic(), rx, tx))

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.sample()

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(5)
        self.sample()

    def uploaded(self) -> list[int]:
        first, last = self.samples[0][1], self.samples[-1][1]
        return [b - a for a, b in zip(first, last, strict=True)]

    def downloaded(self) -> list[int]:
        first, last = self.samples[0][2], self.samples[-1][2]
        return [b - a for a, b in zip(first, last, strict=True)]

    def download_series(self, t0: float, step: float = 1.0) -> list[list[float]]:
        """``[seconds since t0, MiB each node received so far, ...]`` about every ``step`` seconds (who lags whom)."""
        first = self.samples[0][2]
        series: list[list[float]] = []
        for t, _, tx in self.samples:
            if not series or t - t0 - series[-1][0] >= step:
                series.append([round(t - t0, 2), *(round((b - a) / MiB, 2) for a, b in zip(first, tx, strict=True))])
        return series

    def peak_upload(self, window: float) -> list[float]:
        """Per node, the highest upload rate (bytes/s) over any ``window`` seconds between samples."""
        peaks = [0.0] * len(self.devices)
        j = 0
        for i in range(1, len(self.samples)):
            t, rx, _ = self.samples[i]
            while j < i and t - self.samples[j + 1][0] >= window:
                j += 1
            t0, rx0, _ = self.samples[j]
            if t - t0 < window * 0.9:
                continue
            for k in range(len(self.devices)):
                peaks[k] = max(peaks[k], (rx[k] - rx0[k]) / (t - t0))
        return peaks


def scrape(ns: str, port: int) -> dict[str, float]:
    """An agent's /metrics from inside its namespace: ``name{label="v"}`` -> value (empty when unreachable)."""
    argv = ["ip", "netns", "exec", ns, "curl", "-s", "--max-time", "5", f"http://127.0.0.1:{port}/metrics"]
    out = subprocess.run(argv, capture_output=True, text=True)
    samples: dict[str, float] = {}
    if out.returncode != 0:
        return samples
    for family in text_string_to_metric_families(out.stdout):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def agent_ready(ns: str, port: int) -> bool:
    """Whether the agent in ``ns`` answers /readyz with 200 (asked from inside its namespace)."""
    argv = ["ip", "netns", "exec", ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2"]
    out = subprocess.run([*argv, f"http://127.0.0.1:{port}/readyz"], capture_output=True, text=True)
    return out.stdout.strip() == "200"


async def mint_peer_token(admin: KubeClient, path: Path, node: str) -> None:
    """A TokenRequest token of the bench's ServiceAccount for the peer audience, bound to the Node ``node`` (so it
    carries the node claim a peer server requires, as the kubelet's pod-bound token does), written to ``path``."""
    for url, body in (
        (
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}},
        ),
        (
            f"/api/v1/namespaces/{AGENT_NAMESPACE}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": PEER_SA}},
        ),
    ):
        try:
            await admin.request("POST", url, body=body)
        except ApiError as exc:
            if exc.status != 409:
                raise
    uid = (await admin.request("GET", NODES.path(name=node)))["metadata"]["uid"]
    bound = {"kind": "Node", "apiVersion": "v1", "name": node, "uid": uid}
    spec = {"audiences": [DEFAULT_AUDIENCE], "expirationSeconds": 3600, "boundObjectRef": bound}
    answer = await admin.request(
        "POST",
        f"/api/v1/namespaces/{AGENT_NAMESPACE}/serviceaccounts/{PEER_SA}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    path.write_text(answer["status"]["token"])


def _seed_slowdown(cell: dict[str, Any], single_s: float | None) -> tuple[float, float, int] | None:
    """(its Ready time / one node alone, its Ready time, bytes it uploaded) of the node that took the most bytes from
    the origin in a peer cell: its own fetch, made while it served the chain (the slot waits, hub resolve and
    Lease included, which one node alone in mode a does not have)."""
    origin = cell.get("origin_bytes_per_agent") or []
    ready = cell.get("ready_at_s") or []
    uploads = cell.get("peer_upload_bytes_per_agent") or []
    if not single_s or not origin or len(ready) != len(origin) or max(origin) <= 0:
        return None
    i = max(range(len(origin)), key=lambda k: origin[k])
    return ready[i] / single_s, ready[i], int(uploads[i]) if i < len(uploads) else 0


def mode_flags(mode: str, args: argparse.Namespace, node: netns.Node, token: Path) -> list[str]:
    """The agent flags that make ``mode`` (see the module docstring)."""
    slots = ["--max-concurrent-origin-fetches", str(args.slots)]
    if mode == "a":
        return ["--max-concurrent-origin-fetches", "0"]
    if mode == "b":
        return slots
    if mode == "d":
        return ["--shared-root"]
    return [
        *slots,
        "--peer-enabled",
        "--peer-port",
        str(PEER_PORT),
        "--peer-bind-address",
        node.address,
        "--peer-advertise-address",
        f"{node.address}:{PEER_PORT}",
        "--peer-token-file",
        str(token),
        "--peer-audience",
        DEFAULT_AUDIENCE,
        "--peer-allowed-username",
        f"system:serviceaccount:{AGENT_NAMESPACE}:{PEER_SA}",
        "--peer-upload-rate",
        str(int(args.peer_upload_cap * MiB)),
        *(["--peer-relay-part-size", str(args.relay_part_kib * 1024)] if args.relay_part_kib is not None else []),
        *(["--peer-downstreams-per-file", str(args.downstreams)] if args.downstreams is not None else []),
    ]


def start_agent(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


async def cell(mode: str, n: int, args: argparse.Namespace, work: Path, mirrors: Path) -> dict[str, Any]:
    plane = cp.ControlPlane(work / "cp")
    bridge = netns.Bridge(PREFIX, SUBNET)
    fwd = Forwarder()
    agents: list[subprocess.Popen[bytes]] = []
    launches: list[tuple[list[str], dict[str, str], Path]] = []
    admin: KubeClient | None = None
    sampler: LinkSampler | None = None
    node_cap, origin_cap = int(args.node_cap * MiB), int(args.origin_cap * MiB)
    try:
        await asyncio.to_thread(plane.up, [])
        state = plane.read_state()
        assert state is not None
        api_port = state.apiserver_port
        admin = await KubeClient.connect(plane.kubeconfig)
        with OlahServer(mirrors, work / "olah") as mirror:
            origin_port = int(mirror.endpoint.rsplit(":", 1)[1])
            bridge.up()
            bridge.cap_bridge(origin_cap)
            front = socket.create_server((bridge.address, 0))
            front.setblocking(False)
            fwd.add(front, ("127.0.0.1", origin_port))
            hf_endpoint = f"http://{bridge.address}:{front.getsockname()[1]}"
            names = [f"ff-{i:02d}" for i in range(n)]
            group = {"fleet-fetch": "1"}
            shared = work / "shared-root"
            tokens = [work / f"peer-token-{name}" for name in names]
            nodes: list[netns.Node] = []
            for i, name in enumerate(names):
                node = bridge.add_node(i, node_cap=node_cap)
                nodes.append(node)
                fwd.add(netns.listen_in(node.netns, "127.0.0.1", api_port), ("127.0.0.1", api_port))
                await admin.request("POST", NODES.path(), body=cp.node_manifest(name, group))
            if mode == "c":
                for name, token in zip(names, tokens, strict=True):
                    await mint_peer_token(admin, token, name)
            started = time.monotonic()
            # One model for the fleet, as users run it: every node keeps it at the same path on its own disk. Here
            # each agent's own root is bind-mounted at that path in its private mount namespace (``ip netns exec``
            # gives each command one; nothing propagates back to the host); (d) shares one root for real.
            models = shared if mode == "d" else work / "models"
            models.mkdir(parents=True, exist_ok=True)
            for i, name in enumerate(names):
                argv = ["ip", "netns", "exec", nodes[i].netns]
                if mode != "d":
                    own = work / f"root-{name}"
                    own.mkdir(parents=True, exist_ok=True)
                    argv += ["sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(own), str(models)]
                argv += [sys.executable, "-m", "model_agent", "run"]
                argv += ["--kubeconfig", str(plane.kubeconfig), "--models-root-dir", str(models)]
                argv += [
                    "--port",
                    str(METRICS_PORT),
                    "--log-level",
                    "info",
                    *mode_flags(mode, args, nodes[i], tokens[i]),
                ]
                env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODEL_AGENT_"))}
                env |= {"NODE_NAME": name, "HF_ENDPOINT": hf_endpoint, "HF_HOME": str(work / f"hf-{name}")}
                env |= {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}
                launches.append((argv, env, work / f"agent-{name}.log"))
                agents.append(start_agent(*launches[-1]))
            restarts: list[list[dict[str, Any]]] = [[] for _ in names]

            def supervise() -> None:
                """Restart an exited agent, as the kubelet restarts a DaemonSet pod; counted and reported."""
                for i, a in enumerate(agents):
                    if a.poll() is None:
                        continue
                    if len(restarts[i]) >= args.restarts:
                        raise SystemExit(
                            f"an agent exited ({a.returncode}) {len(restarts[i])} times; logs under {work}"
                        )
                    restarts[i].append({"at_s": round(time.monotonic() - started, 2), "exit": a.returncode})
                    agents[i] = start_agent(*launches[i])

            # The clock starts when every agent is up and idle: on a real fleet each node starts on its own
            # CPUs, here N agents share two cores, and their start-up is not what the benchmark measures.
            up: set[int] = set()
            while len(up) < n:
                if time.monotonic() > started + args.timeout:
                    raise SystemExit(f"agents not ready after {args.timeout} s; logs under {work}")
                supervise()
                for i in set(range(n)) - up:
                    if await asyncio.to_thread(agent_ready, nodes[i].netns, METRICS_PORT):
                        up.add(i)
                await asyncio.sleep(0.25)
            startup_s = round(time.monotonic() - started, 2)
            # ...and settled: an agent's start-up LISTs and WATCHes take 9 of the 10 tokens of its client-side API
            # bucket, which a running fleet has long refilled when a model is created.
            await asyncio.sleep(API_SETTLE_S)
            mirror.reset_stats()
            sampler = LinkSampler([node.host_dev for node in nodes])
            sampler.start()
            cpu_at_start = [netns.pid_cpu_seconds(a.pid) for a in agents]
            t0 = time.monotonic()
            created_at = time.time()  # wall clock, to read the agents' logs against
            # (a ClusterBaseModel: a trusted owner, whose fetches take bytes from peers)
            await admin.request("POST", CLUSTERBASEMODELS.path(), body=cbm("ff", str(models / "m"), group))
            deadline = t0 + args.timeout
            want, done = set(names), set[str]()
            ready_at: dict[str, float] = {}
            while done != want:
                if time.monotonic() > deadline:
                    break
                supervise()
                items = (await admin.request("GET", NODES.path(), timeout=30))["items"]
                done = ready_nodes(items, want)
                for name in done - ready_at.keys():
                    ready_at[name] = round(time.monotonic() - t0, 2)
                await asyncio.sleep(0.25)
            seconds = time.monotonic() - t0
            sampler.stop()
            served = mirror.requests()
            origin_bytes = sum(r.bytes_sent for r in served)
            cpu = [netns.pid_cpu_seconds(a.pid) for a in agents]
            metrics = [await asyncio.to_thread(scrape, node.netns, METRICS_PORT) for node in nodes]

            def by_source(m: dict[str, float], source: str) -> int:
                return int(m.get(f'model_agent_fetched_bytes_by_source_total{{source="{source}"}}', 0.0))

            return {
                "mode": mode,
                "agents": n,
                "seconds": round(seconds, 2),
                "all_ready": done == want,
                "ready": len(done),
                "ready_at_s": [ready_at.get(name) for name in names],
                "restarts": restarts,
                "startup_s": startup_s,
                "created_at": round(created_at, 3),
                "single_node_s": args.single_node_s,
                "origin_bytes": origin_bytes,
                "cpu_s_per_agent": [round(c, 2) for c in cpu],
                # every request the origin answered, seconds from the model's creation: when each node asked what
                "origin_requests": [
                    {
                        "node": r.client,
                        "method": r.method,
                        "path": r.path,
                        "status": r.status,
                        "bytes": r.bytes_sent,
                        "started_s": round(r.started - t0, 3),
                        "ended_s": round(r.ended - t0, 3) if r.ended else None,  # (None: not answered to its end)
                    }
                    for r in served
                ],
                # from the model's creation on (an agent restarted meanwhile: its whole life)
                "fetch_cpu_s_per_agent": [
                    round(c - (b if c >= b else 0.0), 2) for c, b in zip(cpu, cpu_at_start, strict=True)
                ],
                "peer_bytes_per_agent": [by_source(m, "peer") for m in metrics],
                "origin_bytes_per_agent": [by_source(m, "origin") for m in metrics],
                "shared_bytes_per_agent": [by_source(m, "shared") for m in metrics],
                "peer_upload_bytes_per_agent": [
                    int(m.get("model_agent_peer_upload_bytes_total", 0.0)) for m in metrics
                ],
                "peers_banned_per_agent": [int(m.get("model_agent_peers_banned_total", 0.0)) for m in metrics],
                "peer_requests_per_agent": [
                    {
                        k.split("{", 1)[1].rstrip("}"): int(v)
                        for k, v in m.items()
                        if k.startswith("model_agent_peer_requests_total{")
                    }
                    for m in metrics
                ],
                "link_upload_bytes_per_agent": sampler.uploaded(),
                "link_download_bytes_per_agent": sampler.downloaded(),
                "link_download_mib_series": sampler.download_series(t0),
                "peak_upload_b_s_per_agent": {
                    str(w): [round(p) for p in sampler.peak_upload(w)] for w in RATE_WINDOWS_S
                },
                "slots": args.slots if mode in ("b", "c") else None,
                "peer_upload_cap_mib_s": args.peer_upload_cap if mode == "c" else None,
                "node_cap_mib_s": args.node_cap,
                "origin_cap_mib_s": args.origin_cap,
                "loadavg": os.getloadavg(),
            }
    finally:
        if sampler is not None:
            sampler.stopping.set()
        for a in agents:
            if a.poll() is None:
                a.send_signal(signal.SIGTERM)
        for a in agents:
            try:
                a.wait(20)
            except subprocess.TimeoutExpired:
                a.kill()
                a.wait(5)
        fwd.close()
        bridge.teardown()
        if admin is not None:
            await admin.close()
        await asyncio.to_thread(plane.down)


def dump(doc: dict[str, Any]) -> str:
    """``doc`` as indented JSON with every list of plain numbers on one line (the download series stay readable)."""
    text = json.dumps(doc, indent=2)
    return re.sub(
        r"\[\s+(-?[0-9.e+-]+(?:,\s+-?[0-9.e+-]+)*)\s+\]",
        lambda m: "[" + ", ".join(m.group(1).split(",\n")).replace(" ", "").replace(",", ", ") + "]",
        text,
    )


def cbm(name: str, path: str, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "ome.io/v1beta1",
        "kind": "ClusterBaseModel",
        "metadata": {"name": name},
        "spec": {"storage": {"storageUri": f"hf://{REPO}", "path": path, "nodeSelector": selector}},
    }


def _mean(xs: list[Any]) -> float:
    vals = [float(x) for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else 0.0


def report(doc: dict[str, Any], plot_name: str | None) -> str:
    size = doc["model_bytes"]
    single = doc.get("single_node_s")
    cap = doc["node_cap_mib_s"]
    peer_cap = doc["peer_upload_cap_mib_s"]
    lines = [
        "# Fleet fetch benchmark",
        "",
        f"Reproduce (from the repo root, as root, `ip`, `tc` and `curl` installed): `{doc['command']}`",
        f"(raw numbers in `bench/results/{RESULTS.name}`; the set-up is in the module docstring of",
        "`bench/fleet_fetch.py`; `python -m bench.fleet_fetch cleanup` removes a crashed run's namespaces).",
        "",
        f"Model: {size / MiB:.1f} MiB in {doc['files']} shards (plus a tiny config). Every node's veth is capped at",
        f"{cap} MiB/s each way (tbf), the origin (everything the host sends into the namespaces) at",
        f"{doc['origin_cap_mib_s']} MiB/s. Origin slots in (b) and (c): {doc['slots']}. Peer upload cap in (c)",
        f"(`--peer-upload-rate`, all peers together): {peer_cap} MiB/s. One node alone (mode a, N = 1, same caps):",
        f"**{single} s** until Ready; the time ratios below are against it.",
        "Mode (d) uses one directory on this machine's local disk as the shared root, not a network filesystem.",
        *(
            f"Re-measured later and merged (each against the one-node baseline of its own invocation, "
            f"{m['single']['seconds']} s): `{m['command']}`."
            for m in doc.get("merged", [])
        ),
        f"Machine: 2 shared cores; load average at the end {tuple(round(x, 2) for x in doc.get('loadavg', ()))}.",
        "",
        "| mode | N | all Ready s | x one node | origin egress / model | from peers MiB per node (mean) "
        "| max upload MiB/s (2 s window) | CPU s per node (mean) | Ready |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cells = sorted(doc["cells"], key=lambda r: (list(MODES).index(r["mode"]), r["agents"]))
    for r in cells:
        label = f"{r['mode']} {MODES[r['mode']]}"
        if r.get("skipped") or r.get("error"):
            why = r.get("skipped") or f"failed: {r['error']}"
            lines.append(f"| {label} | {r['agents']} | {why} | | | | | | |")
            continue
        base = r.get("single_node_s") or single
        ratio = f"{r['seconds'] / base:.2f}" if base else "-"
        peer = _mean(r["peer_bytes_per_agent"]) / MiB
        up = max(r["peak_upload_b_s_per_agent"]["2.0"] or [0]) / MiB
        lines.append(
            f"| {label} | {r['agents']} | {r['seconds']} | {ratio} | {r['origin_bytes'] / size:.2f} | {peer:.1f} "
            f"| {up:.2f} | {_mean(r['cpu_s_per_agent']):.1f} | {r['ready']}/{r['agents']} |"
        )
    lines += [
        "",
        "## Verdicts (the fleet targets)",
        "",
        "| target | cell | measured | verdict |",
        "|---|---|---|---|",
    ]
    for r in cells:
        if r.get("skipped") or r.get("error") or r["mode"] not in ("c", "d"):
            continue
        where = f"({r['mode']}) N={r['agents']}"
        egress = r["origin_bytes"] / size
        lines.append(f"| origin egress <= 1.1 x model | {where} | {egress:.2f} x | {_verdict(egress <= 1.1)} |")
        base = r.get("single_node_s") or single
        if base:
            limit = 1.5 if r["mode"] == "c" else 1.1
            ratio = r["seconds"] / base
            scope = "" if r["mode"] == "d" or r["agents"] == 16 else " (target is for N=16; shown)"
            lines.append(
                f"| all Ready <= {limit} x one node{scope} | {where} | {ratio:.2f} x | "
                f"{_verdict(ratio <= limit) if not scope else ('met' if ratio <= limit else 'not met')} |"
            )
        if not r["all_ready"]:
            lines.append(f"| every node Ready | {where} | {r['ready']}/{r['agents']} | FAIL |")
        if r["mode"] == "c":
            w = RATE_WINDOWS_S[-1]
            peak = max(r["peak_upload_b_s_per_agent"][str(w)] or [0]) / MiB
            bound = peer_cap * (w + 1) / w * FRAMING
            link = max(r["peak_upload_b_s_per_agent"]["2.0"] or [0]) / MiB
            lines.append(
                f"| no node uploads above its cap: {w:.0f} s peak <= {peer_cap} MiB/s x ({w:.0f}+1)/{w:.0f} x "
                f"{FRAMING} = {bound:.2f} | {where} | max {peak:.2f} MiB/s ({peak / peer_cap:.2f} x cap) "
                f"| {_verdict(peak <= bound)} |"
            )
            lines.append(
                f"| no node uploads above its link cap ({cap} MiB/s, tbf), 2 s peak | {where} | max {link:.2f} MiB/s "
                f"| {_verdict(link <= cap * FRAMING)} |"
            )
            seed = _seed_slowdown(r, base)
            if seed is not None:
                slowed, seed_s, uploaded = seed
                lines.append(
                    f"| own fetch slowed <= 10 % while serving: the seed (the node that fetched from the origin) Ready "
                    f"vs one node alone | {where} | {seed_s:.2f} s vs {base:.2f} s = {slowed:.2f} x, while uploading "
                    f"{uploaded / MiB:.0f} MiB | {_verdict(slowed <= 1.1)} |"
                )
    lines += [
        "",
    ]
    timeline = [r for r in doc["cells"] if r["mode"] == "c" and r.get("ready_at_s")]
    if timeline:
        lines += ["Seconds at which each node became Ready in (c) (sorted):", ""]
        for r in timeline:
            times = sorted(t for t in r["ready_at_s"] if t is not None)
            lines.append(f"- N={r['agents']}: " + ", ".join(f"{t:.1f}" for t in times))
        lines.append("")
    if doc.get("notes"):
        lines += ["## Reading", "", *doc["notes"], ""]
    if plot_name:
        lines += [f"![fleet fetch]({plot_name})", ""]
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "**FAIL**"


def write(doc: dict[str, Any], args: argparse.Namespace) -> None:
    results, report_path = Path(args.results), Path(args.report)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(dump(doc))
    plot_path = report_path.with_suffix(".png")
    try:
        from bench.fleet_fetch_plot import draw
    except ImportError:  # matplotlib is in the bench extra
        plot_name = None
    else:
        draw(doc, plot_path)
        plot_name = plot_path.name
    report_path.write_text(report(doc, plot_name))


async def run(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        raise SystemExit("needs root (ip netns, tc)")
    compile_product()  # the agents import bytecode, as from the image (bench/bytecode.py)
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-fetch-", dir=args.work_dir))
    mirrors = work / "mirrors"
    files = model_files(args.model_mib, args.files)
    await asyncio.to_thread(create_model_repo, mirrors, REPO, files)
    doc: dict[str, Any] = {
        "command": args.command_line,
        "model_bytes": sum(len(v) for v in files.values()),
        "files": args.files,
        "node_cap_mib_s": args.node_cap,
        "origin_cap_mib_s": args.origin_cap,
        "slots": args.slots,
        "peer_upload_cap_mib_s": args.peer_upload_cap,
        "cells": [],
    }
    failed = False
    try:
        args.single_node_s = None
        alone = await cell("a", 1, args, work / "single", mirrors)
        args.single_node_s = alone["seconds"]
        if args.merge:
            # cells re-measured later join an earlier run's JSON, each with the baseline of its own invocation
            doc = json.loads(Path(args.results).read_text())
            measured = {(m, n) for m in args.modes for n in args.agents}
            doc["cells"] = [c for c in doc["cells"] if (c["mode"], c["agents"]) not in measured]
            doc.setdefault("merged", []).append({"command": args.command_line, "single": alone})
        else:
            doc["single_node_s"] = alone["seconds"]
            doc["single"] = alone
        print(json.dumps(alone), flush=True)
        peers = peer_flags_available()
        for mode in args.modes:
            for n in args.agents:
                if mode == "c" and not peers:
                    doc["cells"].append({"mode": "c", "agents": n, "skipped": "no --peer flags in model-agent run"})
                    continue
                if mode in ("a", "b") and n > args.max_origin_agents:
                    doc["cells"].append({"mode": mode, "agents": n, "skipped": "above --max-origin-agents (time box)"})
                    continue
                try:
                    r = await cell(mode, n, args, work / f"{mode}-{n}", mirrors)
                except (Exception, SystemExit) as exc:  # one broken cell must not lose the others' numbers
                    failed = True
                    r = {"mode": mode, "agents": n, "error": str(exc)[:300]}
                print(json.dumps(r), flush=True)
                doc["cells"].append(r)
                doc["loadavg"] = os.getloadavg()
                write(doc, args)
        write(doc, args)
    finally:
        netns.cleanup(PREFIX)
        if failed or args.keep:
            print(f"the agents' logs are kept under {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _measurement_argv(argv: list[str]) -> list[str]:
    """``argv`` without the options that only say where files go (they do not change what is measured)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--results", "--report", "--work-dir"):
            skip = True
            continue
        if arg != "--keep":
            out.append(arg)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure and write the report")
    r.add_argument("--agents", type=int, nargs="*", default=[4, 8, 16])
    r.add_argument("--modes", nargs="*", default=["a", "b", "c", "d"], choices=list(MODES))
    r.add_argument("--model-mib", type=int, default=256)
    r.add_argument("--files", type=int, default=4)
    r.add_argument("--node-cap", type=float, default=25.0, help="MiB/s each way per node")
    r.add_argument("--origin-cap", type=float, default=15.0, help="MiB/s the host sends into all namespaces")
    r.add_argument("--slots", type=int, default=1, help="origin slots (Leases) per model in modes b and c")
    r.add_argument(
        "--peer-upload-cap", type=float, default=None, help="MiB/s each agent serves to peers (mode c; 0.75 x node cap)"
    )
    r.add_argument(
        "--relay-part-kib", type=int, default=None, help="mode c: the agents' --peer-relay-part-size (default: theirs)"
    )
    r.add_argument(
        "--downstreams",
        type=int,
        default=None,
        help="mode c: the agents' --peer-downstreams-per-file (default: theirs)",
    )
    r.add_argument("--max-origin-agents", type=int, default=16, help="largest N measured for modes a and b")
    r.add_argument("--timeout", type=float, default=900.0)
    r.add_argument("--work-dir", default=None)
    r.add_argument("--restarts", type=int, default=3, help="restarts of an exited agent (as a kubelet would)")
    r.add_argument("--merge", action="store_true", help="add the cells to --results instead of a new document")
    r.add_argument("--keep", action="store_true", help="keep the work directory (agents' logs) afterwards")
    r.add_argument("--results", default=str(RESULTS), help="where the JSON goes (a dev run: somewhere else)")
    r.add_argument("--report", default=str(REPORT), help="where the Markdown goes; the plot next to it (.png)")
    rep = sub.add_parser("report", help="rewrite the Markdown and the plot from the JSON of a run")
    rep.add_argument("--results", default=str(RESULTS))
    rep.add_argument("--report", default=str(REPORT))
    rep.add_argument("--notes", default=None, help="a text file the report shows under 'Reading'")
    sub.add_parser("cleanup", help="remove every namespace, veth and bridge a crashed run left")
    args = parser.parse_args()
    if args.command == "run":
        if args.peer_upload_cap is None:
            args.peer_upload_cap = round(0.75 * args.node_cap, 3)
        prefix = "flock /tmp/e2e.lock flock /tmp/heavy.lock nice .venv/bin/python -m bench.fleet_fetch"
        args.command_line = " ".join([prefix, *_measurement_argv(sys.argv[1:])])
    if args.command == "cleanup":
        print(" ".join(netns.cleanup(PREFIX)) or "nothing to remove")
        return
    if args.command == "report":
        doc = json.loads(Path(args.results).read_text())
        if args.notes:
            doc["notes"] = Path(args.notes).read_text().strip().splitlines()
        write(doc, args)
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
