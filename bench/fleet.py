"""Fleet benchmark: N agents on one real API server, counting every request they make.

Reproduce: ``.venv/bin/python -m bench.fleet`` (defaults: N in {10, 50, 200}, M in {50, 200}) or
``--agents 10 --models 50`` for one cell. Each cell starts its own control plane; N agents run in this
process (each with its own Node identity, API client, caches and models root on tmpfs) and talk to the API
server through the project's fault proxy, which counts requests by verb and resource and injects events.
Models are ``local://`` with config parsing skipped, so disks and parsing do not dominate.

Phases per cell, each measured from a counter reset:
1. start-up: all N agents start at once; until every agent shows M Ready labels on its Node;
2. steady state: 20 s of nothing happening;
3. storm: a ``DELETED`` for every model injected into every agent's watch; until every agent has
   confirmed every model alive (nothing may be removed) — run twice, with coalesced confirmation (one
   consistent LIST per kind) and with one GET per candidate, on fresh fleets;
4. a real server-side apply of a changed ClusterBaseModel CRD: until every agent relisted and is idle.
Writes ``bench/results/fleet.json`` and ``bench/FLEET.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from model_agent.agent.runtime import Agent
from model_agent.agent.settings import Settings
from model_agent.kube.client import KubeClient
from model_agent.kube.resources import CLUSTERBASEMODELS, NODES
from model_agent.ops import logging as agent_logging
from testbed.proxies.faultproxy import FaultProxy
from testbed.servers import controlplane as cp

ROOT = Path(__file__).resolve().parents[1]

CBM_PATH = r"/apis/ome\.io/v1beta1/clusterbasemodels$"


def counts(proxy: FaultProxy) -> dict[str, int]:
    c: Counter[str] = Counter()
    for r in proxy.requests():
        c[f"{r.verb} {r.resource}"] += 1
    return dict(sorted(c.items()))


async def wait(predicate: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out after {timeout}s: {what}")
        await asyncio.sleep(0.2)
    return time.monotonic() - start


def ready_everywhere(agents: list[Agent], m: int) -> bool:
    return all(sum(1 for v in a.labels.model_labels().values() if v == "Ready") >= m for a in agents)


def idle(agents: list[Agent]) -> bool:
    return all(a.queue.depth == 0 and a.queue.processing_count == 0 for a in agents)


def metric(agents: list[Agent], name: str, **labels: str) -> float:
    total = 0.0
    for a in agents:
        total += a.metrics.registry.get_sample_value(name, labels or None) or 0.0
    return total


class Fleet:
    def __init__(self, work: Path, n: int, m: int, *, batch_threshold: int) -> None:
        self.work = work
        self.n = n
        self.m = m
        self.batch_threshold = batch_threshold
        self.plane = cp.ControlPlane(work / "cp")
        self.proxy: FaultProxy | None = None
        self.admin: KubeClient | None = None
        self.agents: list[Agent] = []

    async def up(self) -> None:
        await asyncio.to_thread(self.plane.up, [])
        self.admin = await KubeClient.connect(self.plane.kubeconfig)
        self.proxy = FaultProxy.from_kubeconfig(self.plane.kubeconfig)
        self.proxy.start()
        kubeconfig = self.proxy.write_kubeconfig(self.work / "proxy-kubeconfig")
        weights = Path(tempfile.mkdtemp(prefix="fleet-weights-", dir="/dev/shm"))
        self.shm = [weights]
        sem = asyncio.Semaphore(32)

        async def model(i: int) -> None:
            d = weights / f"m{i:04d}"
            d.mkdir()
            (d / "config.json").write_text("{}")
            body = {
                "apiVersion": "ome.io/v1beta1",
                "kind": "ClusterBaseModel",
                "metadata": {"name": f"fleet-m{i:04d}", "annotations": {"ome.oracle.com/skip-config-parsing": "true"}},
                "spec": {"storage": {"storageUri": f"local://{d}", "path": str(d)}},
            }
            async with sem:
                assert self.admin is not None
                await self.admin.request("POST", CLUSTERBASEMODELS.path(), body=body, timeout=60)

        async def node(i: int) -> None:
            async with sem:
                assert self.admin is not None
                await self.admin.request("POST", NODES.path(), body=cp.node_manifest(f"fleet-{i:03d}"), timeout=60)

        await asyncio.gather(*(model(i) for i in range(self.m)), *(node(i) for i in range(self.n)))
        roots = Path(tempfile.mkdtemp(prefix="fleet-roots-", dir="/dev/shm"))
        self.shm.append(roots)
        for i in range(self.n):
            settings = Settings(
                NODE_NAME=f"fleet-{i:03d}",
                models_root_dir=roots / f"n{i:03d}",
                kubeconfig=kubeconfig,
                resync_interval_s=3600,
                verify_interval_s=86400,
                confirm_batch_threshold=self.batch_threshold,
                delete_settle_s=5,
                workers=32,
            )
            client = await KubeClient.connect(kubeconfig)
            self.agents.append(Agent(settings, client))

    async def start_agents(self) -> None:
        await asyncio.gather(*(a.start() for a in self.agents))

    async def down(self) -> None:
        await asyncio.gather(*(a.stop() for a in self.agents), return_exceptions=True)
        for a in self.agents:
            await a.client.close()
        if self.admin is not None:
            await self.admin.close()
        if self.proxy is not None:
            self.proxy.stop()
        await asyncio.to_thread(self.plane.down)
        for d in getattr(self, "shm", []):
            shutil.rmtree(d, ignore_errors=True)


async def storm(fleet: Fleet, timeout: float = 900) -> dict[str, Any]:
    assert fleet.proxy is not None and fleet.admin is not None
    items = (await fleet.admin.request("GET", CLUSTERBASEMODELS.path(), timeout=60))["items"]
    before_alive = metric(fleet.agents, "model_agent_delete_confirmations_total", outcome="alive_same_uid")
    fleet.proxy.reset()
    t0 = time.monotonic()
    events = []
    for obj in items:
        obj.setdefault("kind", "ClusterBaseModel")
        obj.setdefault("apiVersion", "ome.io/v1beta1")
        events.append({"type": "DELETED", "object": obj})
    # Every agent receives a DELETED for every model in one burst, as a relist or a mass delete delivers them.
    reached = await fleet.proxy.ainject_watch_events(CBM_PATH, events)
    assert reached >= fleet.n, (reached, fleet.n)
    want = before_alive + fleet.n * fleet.m

    def settled() -> bool:
        alive = metric(fleet.agents, "model_agent_delete_confirmations_total", outcome="alive_same_uid")
        return alive >= want and idle(fleet.agents)

    done = True
    try:
        await wait(settled, timeout, "storm settled")
    except SystemExit:
        done = False  # a baseline too slow to finish: report what it did within the time box
    seconds = time.monotonic() - t0
    removed = metric(fleet.agents, "model_agent_delete_confirmations_total", outcome="confirmed_gone")
    confirmed = metric(fleet.agents, "model_agent_delete_confirmations_total", outcome="alive_same_uid") - before_alive
    labels_ok = ready_everywhere(fleet.agents, fleet.m)
    return {
        "seconds": round(seconds, 2),
        "requests": counts(fleet.proxy),
        "removed": removed,
        "all_ready": labels_ok,
        "settled": done,
        "candidates": fleet.n * fleet.m,
        "confirmed_alive": int(confirmed),
    }


async def cell(n: int, m: int, work: Path, baseline_timeout: float) -> dict[str, Any]:
    result: dict[str, Any] = {"agents": n, "models": m}
    for mode, threshold in (("coalesced", 3), ("get_per_candidate", -1)):
        fleet = Fleet(work / f"{n}-{m}-{mode}", n, m, batch_threshold=threshold)
        try:
            await fleet.up()
            assert fleet.proxy is not None
            fleet.proxy.reset()
            t0 = time.monotonic()
            await fleet.start_agents()
            await wait(lambda: ready_everywhere(fleet.agents, m) and idle(fleet.agents), 1800, "fleet Ready")
            if mode == "coalesced":
                result["startup"] = {"seconds": round(time.monotonic() - t0, 2), "requests": counts(fleet.proxy)}
                fleet.proxy.reset()
                await asyncio.sleep(20)  # the steady-state window being measured, not a synchronisation
                steady = counts(fleet.proxy)
                result["steady"] = {
                    "seconds": 20,
                    "requests": steady,
                    "rate_per_s": round(sum(steady.values()) / 20, 3),
                }
            result[f"storm_{mode}"] = await storm(fleet, 900 if mode == "coalesced" else baseline_timeout)
            if mode == "coalesced":
                assert fleet.admin is not None
                relists = metric(fleet.agents, "model_agent_relists_total", resource="clusterbasemodels")
                original = next(d for d in cp.crd_documents() if d["metadata"]["name"] == "clusterbasemodels.ome.io")
                changed = copy.deepcopy(original)
                changed["spec"]["versions"][0]["additionalPrinterColumns"].append(
                    {"name": "Bench", "type": "string", "jsonPath": ".spec.vendor"}
                )
                fleet.proxy.reset()
                t0 = time.monotonic()
                await cp.apply_crd(fleet.admin, changed)

                def relisted() -> bool:
                    now = metric(fleet.agents, "model_agent_relists_total", resource="clusterbasemodels")
                    return now >= relists + n and idle(fleet.agents)

                await wait(relisted, 900, "every agent relisted after the CRD apply")
                result["crd_apply"] = {
                    "seconds": round(time.monotonic() - t0, 2),
                    "requests": counts(fleet.proxy),
                    "removed": metric(fleet.agents, "model_agent_delete_confirmations_total", outcome="confirmed_gone"),
                    "all_ready": ready_everywhere(fleet.agents, m),
                }
        finally:
            await fleet.down()
        print(json.dumps(result, indent=1), flush=True)
    return result


async def origin(n: int, slots: int, work: Path) -> dict[str, Any]:
    """N agents want one Hugging Face model at once: concurrent fetchers and hub API calls, seen by the mirror."""
    from testbed.models import tiny_llama
    from testbed.proxies.countingproxy import max_concurrent_clients
    from testbed.servers.olah import OlahServer, create_model_repo

    mirrors = work / f"origin-{n}-{slots}-mirrors"
    repo = "acme/origin-bench"
    await asyncio.to_thread(create_model_repo, mirrors, repo, tiny_llama(1, padding_bytes=8 << 20))
    fleet = Fleet(work / f"origin-{n}-{slots}", n, 0, batch_threshold=3)
    with OlahServer(mirrors, work / f"origin-{n}-{slots}-olah") as mirror:
        os.environ["HF_ENDPOINT"] = mirror.endpoint
        try:
            await fleet.up()
            for a in fleet.agents:
                # Settings are frozen: rebuild the agents with the origin limit and the mirror.
                await a.client.close()
            kubeconfig = fleet.work / "proxy-kubeconfig"
            roots = fleet.shm[-1]
            fleet.agents = []
            for i in range(n):
                settings = Settings(
                    NODE_NAME=f"fleet-{i:03d}",
                    models_root_dir=roots / f"o{i:03d}",
                    kubeconfig=kubeconfig,
                    max_concurrent_origin_fetches=slots,
                    origin_lease_s=15,
                    HF_ENDPOINT=mirror.endpoint,
                    workers=8,
                )
                fleet.agents.append(Agent(settings, await KubeClient.connect(kubeconfig)))
            await fleet.start_agents()
            mirror.reset_stats()
            assert fleet.admin is not None
            body = {
                "apiVersion": "ome.io/v1beta1",
                "kind": "ClusterBaseModel",
                "metadata": {"name": "origin-bench"},
                "spec": {"storage": {"storageUri": f"hf://{repo}", "path": str(roots / "shared-path-unused")}},
            }
            # Every node wants it at once; each agent's root differs, so give each its own object pinned to it.
            for i in range(n):
                b = json.loads(json.dumps(body))
                b["metadata"]["name"] = f"origin-bench-{i:03d}"
                b["spec"]["storage"]["path"] = str(roots / f"o{i:03d}" / "m")
                b["spec"]["storage"]["nodeSelector"] = {"kubernetes.io/hostname": f"fleet-{i:03d}"}
                await fleet.admin.request("POST", CLUSTERBASEMODELS.path(), body=b)
            t0 = time.monotonic()
            await wait(lambda: ready_everywhere(fleet.agents, 1), 1800, "every node fetched the model")
            seconds = time.monotonic() - t0
            records = mirror.requests()
            return {
                "agents": n,
                "slots": slots,
                "seconds": round(seconds, 2),
                "max_concurrent_fetching_nodes": max_concurrent_clients(records, f"/{repo}/resolve/"),
                "hub_api_calls": sum(1 for r in records if f"/api/models/{repo}" in r.path),
                "file_requests": sum(1 for r in records if f"/{repo}/resolve/" in r.path),
            }
        finally:
            os.environ.pop("HF_ENDPOINT", None)
            await fleet.down()


def total(reqs: dict[str, int], prefix: str) -> int:
    return sum(v for k, v in reqs.items() if k.startswith(prefix))


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        "# Fleet benchmark",
        "",
        "N agents (in one process, each with its own Node, API client and caches) against one real kube-apiserver",
        "+ etcd on the 2-core machine; M `local://` ClusterBaseModels. Requests counted at the project's proxy.",
        "Reproduce: `.venv/bin/python -m bench.fleet` (raw numbers in `bench/results/fleet.json`).",
        "",
        "| N | M | start-up s | start-up requests (list / watch / patch / get) | steady req/s | storm: coalesced GET / LIST, s | storm: GET-per-candidate GET / LIST, s | removed | CRD SSA: requests, s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["startup"]["requests"]
        c = r["storm_coalesced"]
        g = r.get("storm_get_per_candidate") or {"requests": {}, "seconds": "not measured", "removed": 0}
        g_seconds = (
            g["seconds"]
            if g.get("settled", True)
            else f"not settled in {g['seconds']} ({g['confirmed_alive']} of {g['candidates']} confirmed)"
        )
        lists_per_agent = total(c["requests"], "list clusterbasemodels") / r["agents"]
        crd = r["crd_apply"]
        lines.append(
            f"| {r['agents']} | {r['models']} | {r['startup']['seconds']} "
            f"| {total(s, 'list')} / {total(s, 'watch')} / {total(s, 'patch')} / {total(s, 'get')} "
            f"| {r['steady']['rate_per_s']} "
            f"| {total(c['requests'], 'get clusterbasemodels')} / {total(c['requests'], 'list clusterbasemodels')} "
            f"({lists_per_agent:g} per agent), {c['seconds']} "
            f"| {total(g['requests'], 'get clusterbasemodels')} / {total(g['requests'], 'list clusterbasemodels')}, {g_seconds} "
            f"| {int(c['removed'] + g['removed'] + crd['removed'])} "
            f"| {sum(crd['requests'].values())}, {crd['seconds']} |"
        )
    origin_json = ROOT / "bench" / "results" / "fleet-origin.json"
    if origin_json.exists():
        lines += [
            "",
            "Origin protection (`python -m bench.fleet --origin 50`): every node wants one Hugging Face model (8 MiB) at once,",
            "served by a real mirror (olah) that records each request's client and duration.",
            "",
            "| agents | origin slots | max nodes fetching at once (at the server) | hub API calls | file requests | seconds |",
            "|---|---|---|---|---|---|",
        ]
        for o in json.loads(origin_json.read_text()):
            lines.append(
                f"| {o['agents']} | {o['slots'] or 'unlimited'} | {o['max_concurrent_fetching_nodes']} "
                f"| {o['hub_api_calls']} | {o['file_requests']} | {o['seconds']} |"
            )
    lines += [
        "",
        "![confirmation reads in a storm](fleet.png)",
        "",
        "Targets: a storm settles with ≤ 1 consistent LIST per kind per agent and 0 GETs per event (coalesced),",
        "instead of M GETs per agent; nothing is removed; steady state makes no requests beyond the watches.",
        "",
        "Reading the table: the storm is a `DELETED` for every model delivered to every agent's watch in one burst.",
        "Coalesced, each agent confirms the whole storm with one consistent LIST, although its reconcile workers",
        "(32 in this benchmark) carry the candidates a batch at a time: a LIST that started after the agent heard",
        "the rumours decides every later candidate of that storm (presence only; an object missing from it would",
        "be read again with its own GET), and a LIST in flight is joined. One GET per candidate costs M GETs per",
        "agent, more when the API server's priority-and-fairness answers 429 and the reads are retried; it is",
        "time-boxed (`--baseline-timeout`), and a baseline that did not settle shows how far it got. Nothing was",
        "removed in any run. All N agents run in one Python process on the 2-core machine that also runs the API",
        "server, so the seconds are upper bounds; the request counts are the result.",
        "",
    ]
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, nargs="*", default=[10, 50, 200])
    parser.add_argument("--models", type=int, nargs="*", default=[50, 200])
    parser.add_argument("--origin", type=int, default=0, help="run only the origin-protection phase with N agents")
    parser.add_argument(
        "--baseline-timeout", type=float, default=300, help="time box of a GET-per-candidate storm, seconds"
    )
    args = parser.parse_args()
    agent_logging.configure("error")
    logging.getLogger().setLevel(logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    if args.origin:
        out = ROOT / "bench" / "results"
        out.mkdir(parents=True, exist_ok=True)
        runs = [await origin(args.origin, slots, work) for slots in (2, 0)]
        print(json.dumps(runs, indent=1))
        (out / "fleet-origin.json").write_text(json.dumps(runs, indent=2))
        shutil.rmtree(work, ignore_errors=True)
        return
    results = []
    for n in args.agents:
        for m in args.models:
            results.append(await cell(n, m, work, args.baseline_timeout))
            out = ROOT / "bench" / "results"
            out.mkdir(parents=True, exist_ok=True)
            # Cells measured by earlier invocations (e.g. the large N run separately) are kept.
            earlier = json.loads((out / "fleet.json").read_text()) if (out / "fleet.json").exists() else []
            mine = {(r["agents"], r["models"]) for r in results}
            merged = [r for r in earlier if (r["agents"], r["models"]) not in mine] + results
            merged.sort(key=lambda r: (r["agents"], r["models"]))
            (out / "fleet.json").write_text(json.dumps(merged, indent=2))
            results_for_report = merged
            (ROOT / "bench" / "FLEET.md").write_text(report(results_for_report))
            subprocess.run([sys.executable, "-m", "bench.plots"], cwd=ROOT, check=False)
    shutil.rmtree(work, ignore_errors=True)
    os.sync()


if __name__ == "__main__":
    asyncio.run(main())
