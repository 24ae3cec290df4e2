"""Start-up and memory benchmark: one agent, N ClusterBaseModels with ``local://`` sources, until every label is Ready.

Reproduce: ``.venv/bin/python -m bench.startup`` (defaults ``--models 1000 --idle-models 200``; builds/starts
its own control plane). Three agent runs against one real kube-apiserver + etcd, each measured from the moment
the agent process is spawned:

* idle: ``--idle-models`` models exist; a fresh node and models root; once every model is Ready the agent is
  left alone for ``--idle-seconds`` and its RSS (VmRSS from /proc) is sampled every second: the idle figure is
  the largest sample (a conservative reading: whatever start-up left allocated counts);
* cold: the rest of the ``--models`` are created; another fresh node and models root, until the Node carries N
  ``models.ome.io/clusterbasemodel.*=Ready`` labels and the ConfigMap holds N Ready entries;
* warm: the same agent restarted (manifests on disk, labels already Ready) until it has reconciled every model.

For each: seconds, peak RSS (VmHWM), CPU seconds and API requests by verb and resource (the agent's own
metrics). Also the RSS of the bare import of the agent's runtime module (what every agent pays before it has
any data). The agent runs with the memory-relevant environment the Helm chart gives it (:data:`CHART_ENV`).
Writes ``bench/results/startup-<N>.json``, rewrites ``bench/STARTUP.md`` with PASS/FAIL verdicts and has
``bench/plots.py`` redraw ``bench/startup.png`` (needs matplotlib, from the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from model_agent.kube.client import KubeClient
from model_agent.kube.resources import CLUSTERBASEMODELS, CONFIGMAPS, NODES
from testbed.agent_process import AgentProcess
from testbed.servers.controlplane import ControlPlane, node_manifest

ROOT = Path(__file__).resolve().parents[1]

TARGET_SECONDS = 20.0
TARGET_PEAK_RSS_MIB = 100.0  # peak with 1,000 models, below the Go agent's 103 MiB
TARGET_IDLE_RSS_MIB = 80.0  # idle with 200 models
# OME's Go model agent, side by side on the same control plane with 1,000 local:// models;
# a reference, not measured by this script.
GO_AGENT_PEAK_RSS_MIB = 103.0
# Environment the Helm chart sets that changes the agent's memory use: none. MALLOC_ARENA_MAX=2 was measured
# (docs/performance.md, section 5): 1-3 MiB lower peaks, within run-to-run noise, so the chart does not set it.
CHART_ENV: dict[str, str] = {}
EXTRA_ARGS: tuple[str, ...] = tuple(os.environ.get("BENCH_AGENT_ARGS", "").split())


def proc_stats(pid: int) -> tuple[float, float, float]:
    """(peak RSS MiB, current RSS MiB, CPU seconds) of a live process."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    hwm = int(status["VmHWM"].split()[0]) / 1024
    rss = int(status["VmRSS"].split()[0]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return hwm, rss, cpu


def import_rss_mib() -> float:
    """Peak RSS of a fresh interpreter that imports the agent's runtime module and nothing else."""
    code = (
        "import model_agent.agent.runtime, pathlib;"
        "print(next(l.split()[1] for l in pathlib.Path('/proc/self/status').read_text().splitlines()"
        " if l.startswith('VmHWM:')))"
    )
    env = {**os.environ, **CHART_ENV}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    return round(int(out.stdout.strip()) / 1024, 1)


async def create_models(client: KubeClient, first: int, last: int, base: Path) -> None:
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

    await asyncio.gather(*(one(i) for i in range(first, last)))


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


async def measure(
    agent: AgentProcess, client: KubeClient, n: int, timeout: float, idle_seconds: float = 0.0
) -> dict[str, Any]:
    started = time.monotonic()
    agent.start()
    assert agent.proc is not None
    pid = agent.proc.pid
    while True:
        peak, _, cpu = proc_stats(pid)
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
    result: dict[str, Any] = {
        "seconds": round(elapsed, 2),
        "peak_rss_mib": round(peak, 1),
        "cpu_seconds": round(cpu, 2),
        "requests": verbs,
    }
    if idle_seconds > 0:
        samples = []
        idle_until = time.monotonic() + idle_seconds
        while time.monotonic() < idle_until:
            samples.append(proc_stats(pid)[1])
            await asyncio.sleep(1.0)
        result["idle_rss_mib"] = round(max(samples), 1)
        result["idle_rss_last_mib"] = round(samples[-1], 1)
        result["idle_seconds"] = idle_seconds
    return result


def make_agent(plane: ControlPlane, work: Path, node: str) -> AgentProcess:
    env = dict(CHART_ENV)
    if "MODEL_AGENT_PROFILE" in os.environ:
        env["MODEL_AGENT_PROFILE"] = os.environ["MODEL_AGENT_PROFILE"]
    return AgentProcess(
        kubeconfig=plane.kubeconfig,
        node=node,
        models_root=work / f"root-{node}",
        log_path=work / f"agent-{node}.log",
        args=("--log-level", "warning", *EXTRA_ARGS),
        env=env,
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--idle-models", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    n, n_idle = args.models, min(args.idle_models, args.models)
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    imported = import_rss_mib()
    print(f"import of model_agent.agent.runtime: {imported} MiB peak RSS")
    plane = ControlPlane(work / "cp")
    await asyncio.to_thread(plane.up, [], echo=print)
    client = await KubeClient.connect(plane.kubeconfig)
    try:
        for node in ("bench-idle", "bench-node"):
            await client.request("POST", NODES.path(), body=node_manifest(node))
        await create_models(client, 0, n_idle, work / "weights")
        agent = make_agent(plane, work, "bench-idle")
        try:
            idle = await measure(agent, client, n_idle, args.timeout, idle_seconds=args.idle_seconds)
            print(f"idle with {n_idle} models:", idle)
            agent.stop()
        finally:
            agent.kill()
        t0 = time.monotonic()
        await create_models(client, n_idle, n, work / "weights")
        print(f"created {n} models in {time.monotonic() - t0:.1f}s")
        agent = make_agent(plane, work, "bench-node")
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
        "idle_models": n_idle,
        "import_rss_mib": imported,
        "idle": idle,
        "cold": cold,
        "warm": warm,
        "agent_env": CHART_ENV,
        "targets": {
            "seconds": TARGET_SECONDS,
            "peak_rss_mib": TARGET_PEAK_RSS_MIB,
            "idle_rss_mib": TARGET_IDLE_RSS_MIB,
        },
        "reference": {"go_agent_peak_rss_mib": GO_AGENT_PEAK_RSS_MIB},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"startup-{n}.json").write_text(json.dumps(result, indent=2))
    write_report(result)


def verdict(value: float, target: float) -> str:
    return "PASS" if value <= target else "FAIL"


def write_report(r: dict[str, Any]) -> None:
    idle, cold, warm, t = r["idle"], r["cold"], r["warm"], r["targets"]
    n, n_idle = r["models"], r["idle_models"]
    env = " ".join(f"{k}={v}" for k, v in r["agent_env"].items()) or "none"

    def seconds_cell(run: dict[str, Any]) -> str:
        return f"{run['seconds']} | ≤ {t['seconds']:g} ({verdict(run['seconds'], t['seconds'])})"

    lines = [
        "# Start-up and memory benchmark",
        "",
        f"One agent, `local://` ClusterBaseModels, real kube-apiserver + etcd on loopback, "
        f"{r['machine']['cpus']} cores, Python {r['machine']['python']}, agent environment as the chart sets it "
        f"({env}). Measured {r['measured_at']} with `.venv/bin/python -m bench.startup --models {n} "
        f"--idle-models {n_idle}`.",
        "",
        "## Memory",
        "",
        "| measurement | MiB | target | verdict |",
        "|---|---|---|---|",
        f"| peak RSS (VmHWM), cold start, {n} models | {cold['peak_rss_mib']} | ≤ {t['peak_rss_mib']:g} "
        f"| {verdict(cold['peak_rss_mib'], t['peak_rss_mib'])} |",
        f"| peak RSS (VmHWM), warm restart, {n} models | {warm['peak_rss_mib']} | ≤ {t['peak_rss_mib']:g} "
        f"| {verdict(warm['peak_rss_mib'], t['peak_rss_mib'])} |",
        f"| idle RSS (largest VmRSS over {idle['idle_seconds']:g} s after all Ready), {n_idle} models "
        f"| {idle['idle_rss_mib']} | ≤ {t['idle_rss_mib']:g} | {verdict(idle['idle_rss_mib'], t['idle_rss_mib'])} |",
        f"| peak RSS, {n_idle} models (the idle run's start-up) | {idle['peak_rss_mib']} | | |",
        f"| import of `model_agent.agent.runtime` alone (VmHWM) | {r['import_rss_mib']} | | |",
        f"| reference: OME's Go agent, peak with 1,000 models (issue 21; not measured here) "
        f"| {r['reference']['go_agent_peak_rss_mib']:g} | | |",
        "",
        "## Time",
        "",
        "| run | seconds to all Ready | target | peak RSS MiB | agent CPU s |",
        "|---|---|---|---|---|",
        f"| {n_idle} models, cold (empty node) | {seconds_cell(idle)} | {idle['peak_rss_mib']} "
        f"| {idle['cpu_seconds']} |",
        f"| {n} models, cold (empty node) | {seconds_cell(cold)} | {cold['peak_rss_mib']} | {cold['cpu_seconds']} |",
        f"| {n} models, warm restart | {seconds_cell(warm)} | {warm['peak_rss_mib']} | {warm['cpu_seconds']} |",
        "",
        "![start-up time and memory](startup.png)",
        "",
        f"API requests made by the agent ({n} models, cold start), by verb and resource:",
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
    subprocess.run([sys.executable, "-m", "bench.plots"], cwd=ROOT, check=False)


if __name__ == "__main__":
    asyncio.run(main())
