"""Start-up benchmark: one agent, N ClusterBaseModels with ``local://`` sources, until every label is Ready.

Reproduce: ``.venv/bin/python bench/startup.py --models 1000`` (builds/starts its own control plane).
Measures, from the moment the agent process is spawned:
* seconds until the Node carries N ``models.ome.io/clusterbasemodel.*=Ready`` labels and the ConfigMap
  holds N Ready entries;
* the agent's peak RSS (VmHWM from /proc) and CPU seconds at that moment;
* API requests the agent made, by verb (from its own metrics);
then restarts the agent and measures the same for a warm restart (manifests on disk, labels already Ready).
Writes ``bench/results/startup-<N>.json`` and rewrites ``bench/STARTUP.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model_agent.kube.client import KubeClient  # noqa: E402
from model_agent.kube.resources import CLUSTERBASEMODELS, CONFIGMAPS, NODES  # noqa: E402
from testbed.agent_process import AgentProcess  # noqa: E402
from testbed.servers.controlplane import ControlPlane, node_manifest  # noqa: E402

TARGET_SECONDS = 20.0
TARGET_RSS_MB = 150.0
EXTRA_ARGS: tuple[str, ...] = tuple(os.environ.get("BENCH_AGENT_ARGS", "").split())


def proc_stats(pid: int) -> tuple[float, float]:
    """(peak RSS MiB, CPU seconds) of a live process."""
    status = Path(f"/proc/{pid}/status").read_text()
    hwm_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return hwm_kb / 1024, cpu


async def create_models(client: KubeClient, n: int, base: Path) -> None:
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        d = base / f"m{i:04d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(
            json.dumps(
                {
                    "model_type": "llama",
                    "architectures": ["LlamaForCausalLM"],
                    "max_position_embeddings": 4096,
                    "hidden_size": 64,
                    "num_hidden_layers": 2,
                    "vocab_size": 128,
                }
            )
        )
        body = {
            "apiVersion": "ome.io/v1beta1",
            "kind": "ClusterBaseModel",
            "metadata": {"name": f"bench-m{i:04d}"},
            "spec": {"storage": {"storageUri": f"local://{d}", "path": str(d)}},
        }
        async with sem:
            await client.request("POST", CLUSTERBASEMODELS.path(), body=body, timeout=30)

    await asyncio.gather(*(one(i) for i in range(n)))


async def count_ready(client: KubeClient, node: str) -> tuple[int, int]:
    obj = await client.request("GET", NODES.path(name=node), timeout=30)
    labels = obj["metadata"].get("labels") or {}
    n_labels = sum(1 for k, v in labels.items() if k.startswith("models.ome.io/clusterbasemodel.") and v == "Ready")
    try:
        cm = await client.request("GET", CONFIGMAPS.path("ome", node), timeout=30)
        n_entries = sum(1 for v in (cm.get("data") or {}).values() if '"status":"Ready"' in v)
    except Exception:
        n_entries = 0
    return n_labels, n_entries


def reconciled(agent: AgentProcess) -> float:
    """How many reconciles the agent finished (a warm restart is done when it has looked at every model)."""
    try:
        return agent.metric("model_agent_reconcile_duration_seconds_count")
    except OSError:
        return 0.0


async def measure(agent: AgentProcess, client: KubeClient, n: int, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    agent.start()
    assert agent.proc is not None
    pid = agent.proc.pid
    peak, cpu = 0.0, 0.0
    while True:
        peak, cpu = proc_stats(pid)
        labels, entries = await count_ready(client, agent.node)
        if labels >= n and entries >= n and agent.ready() and reconciled(agent) >= n:
            break
        if time.monotonic() - started > timeout:
            raise SystemExit(f"not Ready after {timeout}s: {labels} labels, {entries} entries\n{agent.tail()}")
        await asyncio.sleep(0.5)
    elapsed = time.monotonic() - started
    metrics = agent.metrics()
    verbs: dict[str, float] = {}
    for key, value in metrics.items():
        if key.startswith("model_agent_api_request_duration_seconds_count{"):
            verb = key.split('verb="')[1].split('"')[0]
            resource = key.split('resource="')[1].split('"')[0]
            verbs[f"{verb} {resource}"] = verbs.get(f"{verb} {resource}", 0) + value
    return {
        "seconds": round(elapsed, 2),
        "peak_rss_mib": round(peak, 1),
        "cpu_seconds": round(cpu, 2),
        "requests": verbs,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    n = args.models
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    plane = ControlPlane(work / "cp")
    await asyncio.to_thread(plane.up, [], echo=print)
    client = await KubeClient.connect(plane.kubeconfig)
    try:
        node = "bench-node"
        await client.request("POST", NODES.path(), body=node_manifest(node))
        t0 = time.monotonic()
        await create_models(client, n, work / "weights")
        print(f"created {n} models in {time.monotonic() - t0:.1f}s")
        agent = AgentProcess(
            kubeconfig=plane.kubeconfig,
            node=node,
            models_root=work / "root",
            log_path=work / "agent.log",
            args=("--log-level", "warning", *EXTRA_ARGS),
            env={"MODEL_AGENT_PROFILE": os.environ["MODEL_AGENT_PROFILE"]}
            if "MODEL_AGENT_PROFILE" in os.environ
            else None,
        )
        try:
            cold = await measure(agent, client, n, args.timeout)
            print("cold start:", cold)
            agent.stop()
            warm = await measure(agent, client, n, args.timeout)
            print("warm restart:", warm)
            agent.stop()
        finally:
            agent.kill()
    finally:
        await client.close()
        plane.down()
    result = {
        "models": n,
        "cold": cold,
        "warm": warm,
        "targets": {"seconds": TARGET_SECONDS, "peak_rss_mib": TARGET_RSS_MB},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"startup-{n}.json").write_text(json.dumps(result, indent=2))
    write_report(result)


def write_report(r: dict[str, Any]) -> None:
    def verdict(value: float, target: float) -> str:
        return "pass" if value <= target else "FAIL"

    cold, warm = r["cold"], r["warm"]
    lines = [
        "# Start-up benchmark",
        "",
        f"One agent, {r['models']} ClusterBaseModels with `local://` sources, real kube-apiserver + etcd on",
        f"loopback, {r['machine']['cpus']} cores. Measured {r['measured_at']} with `bench/startup.py --models "
        f"{r['models']}`.",
        "",
        "| run | seconds to all Ready | target | peak RSS MiB | target | agent CPU s |",
        "|---|---|---|---|---|---|",
        f"| cold (empty node) | {cold['seconds']} | ≤ {TARGET_SECONDS:g} ({verdict(cold['seconds'], TARGET_SECONDS)}) "
        f"| {cold['peak_rss_mib']} | ≤ {TARGET_RSS_MB:g} ({verdict(cold['peak_rss_mib'], TARGET_RSS_MB)}) "
        f"| {cold['cpu_seconds']} |",
        f"| warm restart | {warm['seconds']} | ≤ {TARGET_SECONDS:g} ({verdict(warm['seconds'], TARGET_SECONDS)}) "
        f"| {warm['peak_rss_mib']} | ≤ {TARGET_RSS_MB:g} ({verdict(warm['peak_rss_mib'], TARGET_RSS_MB)}) "
        f"| {warm['cpu_seconds']} |",
        "",
        "![start-up time and memory](startup.png)",
        "",
        "API requests made by the agent (cold start), by verb and resource:",
        "",
        "| verb resource | requests |",
        "|---|---|",
        *[f"| {k} | {int(v)} |" for k, v in sorted(cold["requests"].items())],
        "",
        "Warm restart requests:",
        "",
        "| verb resource | requests |",
        "|---|---|",
        *[f"| {k} | {int(v)} |" for k, v in sorted(warm["requests"].items())],
        "",
    ]
    (ROOT / "bench" / "STARTUP.md").write_text("\n".join(lines))
    import subprocess

    subprocess.run([sys.executable, str(ROOT / "bench" / "plots.py")], check=False)


if __name__ == "__main__":
    asyncio.run(main())
