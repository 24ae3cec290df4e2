"""OME's own deployment, pointed at this agent: it starts with every flag OME's v1.3 chart passes and serves a model.

The flags are those OME's v1.3 chart and operator docs give its model agent (its DaemonSet's ``args``): OME's
original ones and the three added in 2026 (``--num-high-priority-worker``, ``--same-path-wait-timeout``,
``--model-verification-concurrency``). One of the new ones does not apply here; the agent accepts it and logs one
warning, naming what does that job instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.models import tiny_llama
from testbed.proxies.countingproxy import CountingProxy
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.e2e.test_reconcile_safety import private, state, wait_ready
from tests.support.kube import Kube, LabelHistory, bm, cbm
from tests.support.waiting import always, eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"

# name -> value, as OME's v1.3 chart renders them (its values: numDownloadWorkers, numHighPriorityWorkers,
# samePathWaitTimeout, modelVerificationConcurrency, logLevel, namespace; the models root from hostPath.path).
OME_V13_FLAGS = {
    "--num-download-worker": "2",
    "--num-high-priority-worker": "1",
    "--same-path-wait-timeout": "30m",
    "--model-verification-concurrency": "4",
    "--download-retry": "3",
    "--concurrency": "4",
    "--multipart-concurrency": "4",
    "--node-label-retry": "5",
    "--namespace": "ome",
    "--log-level": "info",
}


async def test_the_agent_starts_with_every_flag_omes_v13_chart_passes_and_serves_a_model(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    files = tiny_llama(81)
    repo = f"acme/ome13-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    args = tuple(part for flag, value in OME_V13_FLAGS.items() for part in (flag, value))
    agent = await make_agent(args=args)
    # A CPU node (OME #746): no instance type, so no GPU shape alias (OME's agent would not start on one).
    await kube.label_node(agent.node, {"node.kubernetes.io/instance-type": None, "nvidia.com/gpu.present": None})
    assert "node.kubernetes.io/instance-type" not in await kube.node_labels(agent.node)
    name = f"ome13-{unique}"
    dest = agent.models_root / "m"
    await kube.apply(cbm(name, f"hf://{repo}", str(dest), nodeSelector={"kubernetes.io/hostname": agent.node}))

    async def ready() -> bool:
        label = (await kube.node_labels(agent.node)).get(node_label_key(CBM, "", name))
        entry = await kube.entry(agent.node, configmap_key(CBM, "", name)) or {}
        return label == "Ready" and entry.get("status") == "Ready"

    await eventually(ready, timeout=60, what="the model Ready")
    assert {p: (dest / p).read_bytes() for p in files} == files
    entry = await kube.entry(agent.node, configmap_key(CBM, "", name)) or {}
    assert (entry.get("storageUri"), entry.get("storagePath")) == (f"hf://{repo}", str(dest))  # the spec it is for
    warned = [json.loads(line) for line in agent.log_text().splitlines() if "ignored" in line and line.startswith("{")]
    flags = {w.get("flag") for w in warned if w.get("event") == "flag accepted for OME compatibility and ignored"}
    assert {"--same-path-wait-timeout", "--download-retry", "--concurrency"} <= flags
    assert "--num-high-priority-worker" not in flags  # mapped: the removal lane's workers
    await kube.delete_model(CBM, name)


# A download that lasts: 8 MiB of weights paced at 128 KiB/s at the mirror (about a minute), so the test acts while
# it runs.
SLOW_PADDING = 8 * 1024 * 1024
SLOW_RATE = 128 * 1024


async def slow_repo(mirrors_root: Path, hub: CountingProxy, repo: str, seed: int) -> str:
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, tiny_llama(seed, padding_bytes=SLOW_PADDING))
    hub.pace(f"/{repo}/resolve/", SLOW_RATE)
    return f"/{repo}/resolve/"


async def test_a_model_deleted_while_its_download_runs_stops_downloading_at_once_and_is_never_ready(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    """OME's deletes-before-downloads rule: the running download of a deleted model stops within 5 s of the delete
    (before the delete breaker's settle period, 10 s here, which holds only the removal), ``Ready`` is never written
    for it (a watch of the Node sees every value its label took), and its staging area ends empty."""
    with CountingProxy(olah.endpoint) as hub:
        name = f"del-dl-{unique}"
        files = await slow_repo(mirrors_root, hub, f"acme/{name}", 91)
        # A settle period longer than the bound: the download must stop before it, not after.
        agent = await make_agent(args=("--delete-settle", "10"), env={"HF_ENDPOINT": hub.endpoint})
        label = node_label_key(CBM, "", name)
        async with LabelHistory(kube, agent.node, label) as history:
            await kube.apply(cbm(name, f"hf://acme/{name}", str(agent.models_root / "m"), nodeSelector=_on(agent.node)))

            async def downloading() -> bool:
                return hub.in_flight(files) > 0 and hub.bytes_sent(files) > 256 * 1024

            await eventually(downloading, timeout=60, what="the weights downloading")
            deleted = time.monotonic()
            await kube.delete_model(CBM, name)

            async def stopped() -> bool:
                return hub.in_flight(files) == 0

            await eventually(stopped, timeout=10, interval=0.05, what="the download stopped")
            stopped_after = time.monotonic() - deleted
            sent = hub.bytes_sent(files)

            async def gone() -> bool:
                return await state(kube, agent, name) == (None, None)

            await eventually(gone, timeout=30, what="label and entry removed")
            assert private(agent, "staging") == [], "the deleted model's staging was left behind"
            assert hub.bytes_sent(files) == sent, "bytes were fetched for the model after its download stopped"
        assert stopped_after <= 5.0, f"the download ran on {stopped_after:.1f} s after the delete"
        assert "Ready" not in history.values, f"the label took {history.values}"
        assert not (agent.models_root / "m").exists()
        print(f"download stopped {stopped_after:.2f} s after the delete; label values {history.values}")


async def test_a_delete_completes_at_once_while_every_download_worker_is_busy(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    """Two download workers busy on slow models, a third model waiting for one of them: deleting the third
    completes (label and entry gone) within 5 s, and the two downloads go on. The settle period is 1 s here
    (``--delete-settle``, this agent's own hold before a confirmed removal acts; OME has none)."""
    with CountingProxy(olah.endpoint) as hub:
        names = [f"busy{i}-{unique}" for i in range(3)]
        paths = [await slow_repo(mirrors_root, hub, f"acme/{n}", 92 + i) for i, n in enumerate(names)]
        agent = await make_agent(
            args=("--num-download-worker", "2", "--num-high-priority-worker", "1", "--delete-settle", "1"),
            env={"HF_ENDPOINT": hub.endpoint},
        )
        for i, name in enumerate(names[:2]):
            dest = str(agent.models_root / name)
            await kube.apply(cbm(name, f"hf://acme/{name}", dest, nodeSelector=_on(agent.node)))

            async def running(path: str = paths[i]) -> bool:
                return hub.in_flight(path) > 0

            await eventually(running, timeout=60, what=f"{name} downloading")
        third = names[2]
        await kube.apply(cbm(third, f"hf://acme/{third}", str(agent.models_root / third), nodeSelector=_on(agent.node)))

        async def waiting() -> bool:
            return (await state(kube, agent, third))[0] == "Updating"

        await eventually(waiting, timeout=30, what="the third model Updating, waiting for a worker")
        assert hub.in_flight(paths[2]) == 0  # it waits for a download worker
        deleted = time.monotonic()
        await kube.delete_model(CBM, third)

        async def gone() -> bool:
            return await state(kube, agent, third) == (None, None)

        await eventually(gone, timeout=30, interval=0.05, what="the third model's label and entry removed")
        took = time.monotonic() - deleted
        assert took <= 5.0, f"the delete took {took:.1f} s"

        async def both_downloading() -> bool:
            return hub.in_flight(paths[0]) > 0 and hub.in_flight(paths[1]) > 0

        await always(both_downloading, duration=1.0, what="the two other downloads still running")
        print(f"delete completed {took:.2f} s after it was made, with 2 of 2 download workers busy")
        for name in names[:2]:
            await kube.delete_model(CBM, name)


def _on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


async def test_the_preflight_check_names_the_tenant_local_model_that_would_fail_and_its_setting(
    kube: Kube, kubeconfig: Path, make_agent: AgentFactory, tmp_path: Path, unique: str
) -> None:
    """Before the switch: ``model-agent preflight`` with the DaemonSet's flags lists a tenant's ``local://`` model
    outside the models root (Ready on OME's agent) as ``Failed: InvalidPath`` with ``--tenant-local-allow``; the
    agent itself, run with the same flags, shows exactly that; with the setting, preflight lists nothing of it."""
    outside = tmp_path / "preprovisioned" / "llama"
    outside.mkdir(parents=True)
    for name, data in tiny_llama(95).items():
        (outside / name).write_bytes(data)
    namespace, name = f"team-{unique}", f"pre-{unique}"
    await kube.ensure_namespace(namespace)
    agent = await make_agent()
    await kube.apply(bm(namespace, name, f"local://{outside}", nodeSelector=_on(agent.node)))
    fine = f"fine-{unique}"
    await kube.apply(cbm(fine, f"local://{outside}", nodeSelector={"kubernetes.io/hostname": "no-such-node"}))

    async def preflight(*extra: str) -> tuple[int, list[dict[str, str]]]:
        args = ["preflight", "--models-root-dir", str(agent.models_root), "--kubeconfig", str(kubeconfig)]
        proc = await asyncio.create_subprocess_exec(
            *_model_agent(), *args, *extra, "--output", "json", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, json.loads(out)

    code, rows = await preflight()
    mine = [r for r in rows if r["key"] == f"BaseModel/{namespace}/{name}"]
    assert code == 1
    assert len(mine) == 1, rows
    assert mine[0]["state"] == "Failed" and mine[0]["reason"] == "InvalidPath"
    assert "--tenant-local-allow" in mine[0]["setting"]
    assert not [r for r in rows if r["key"] == f"ClusterBaseModel//{fine}"]  # an admin's local path may lie anywhere

    async def shown() -> str | None:
        entry = await kube.entry(agent.node, configmap_key("BaseModel", namespace, name)) or {}
        return str(entry.get("reason")) if entry.get("status") == "Failed" else None

    reason = await eventually(shown, timeout=60, what="the agent's verdict on the tenant's model")
    assert reason is not None and reason.startswith("InvalidPath"), reason

    _, rows = await preflight("--tenant-local-allow", str(outside.parent))
    assert not [r for r in rows if r["key"] == f"BaseModel/{namespace}/{name}"], rows
    await kube.delete_model("BaseModel", name, namespace)
    await kube.delete_model(CBM, fine)


def _model_agent() -> list[str]:
    """The console entry of this checkout's install, as the test bed runs the agent."""
    return [sys.executable, "-m", "model_agent"]


# The fields of an entry OME's agent writes and reads (docs/ome-compatibility.md#6-per-node-configmap), and the one
# this agent adds (OME's agent drops it when it rewrites the entry).
OME_ENTRY_FIELDS = {"name", "status", "config", "progress", "storageUri", "storagePath", "reason"}
OWN_ENTRY_FIELDS = {"bytesBySource"}


async def test_what_the_agent_hands_back_to_omes_agent(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, tmp_path: Path, unique: str
) -> None:
    """The way back, as far as it goes without OME's binary: stop the agent with a plain model and a shared snapshot
    (``ReuseIfExists``) Ready, and check what OME's agent would find. The labels stay ``Ready`` under OME's keys;
    each entry holds OME's fields (plus ``bytesBySource``), and its ``config`` reads as OME's; every model's path
    leads to the source's bytes (the shared one through a relative link that stays inside the models root, as
    OME's layout has it); the agent's own records are all under ``<root>/.model-agent``."""
    plain_repo, shared_repo = f"acme/back-{unique}", f"acme/back-shared-{unique}"
    plain_files, shared_files = tiny_llama(96), tiny_llama(97)
    await asyncio.to_thread(create_model_repo, mirrors_root, plain_repo, plain_files)
    commit = await asyncio.to_thread(create_model_repo, mirrors_root, shared_repo, shared_files)
    root = tmp_path / "models"
    agent = await make_agent(models_root=root)
    plain, shared = f"back-{unique}", f"back-shared-{unique}"
    await kube.apply(cbm(plain, f"hf://{plain_repo}", str(root / "plain"), nodeSelector=_on(agent.node)))
    await kube.apply(
        cbm(
            shared,
            f"hf://{shared_repo}@{commit}",
            str(root / "shared"),
            nodeSelector=_on(agent.node),
            downloadPolicy="ReuseIfExists",
        )
    )
    for name in (plain, shared):
        await wait_ready(kube, agent, name, timeout=60)
    await asyncio.to_thread(agent.stop, 30.0)  # the hand-back: this agent is gone from the node

    labels = await kube.node_labels(agent.node)
    for name, files, path in ((plain, plain_files, root / "plain"), (shared, shared_files, root / "shared")):
        assert labels.get(node_label_key(CBM, "", name)) == "Ready"
        entry = await kube.entry(agent.node, configmap_key(CBM, "", name))
        assert entry is not None and entry["status"] == "Ready" and entry["name"] == name
        assert set(entry) <= OME_ENTRY_FIELDS | OWN_ENTRY_FIELDS, set(entry)
        assert (entry.get("config") or {}).get("modelType") == "llama"
        assert {p: (path / p).read_bytes() for p in files} == files
    link = root / "shared"
    assert link.is_symlink() and not Path(os.readlink(link)).is_absolute()  # relative, as OME's children are
    target = link.resolve()
    assert root.resolve() in target.parents and "_artifacts" in target.parts
    private = root / ".model-agent"
    made = {p for p in root.rglob("*") if p.is_file() and private not in p.parents}
    repo_files = {".gitattributes"}  # the mirror's repositories carry one (create_model_repo)
    served = {root / "plain" / p for p in {*plain_files, *repo_files}} | {
        target / p for p in {*shared_files, *repo_files}
    }
    assert {p.resolve() for p in made} == {p.resolve() for p in served}, "files outside .model-agent besides weights"
