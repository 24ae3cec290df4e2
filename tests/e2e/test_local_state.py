"""Local state you can trust: drift in labels, the ConfigMap and the disk is repaired from the manifests."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from model_agent.kube.resources import CONFIGMAPS
from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, LabelHistory, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
RESYNC = ("--resync-interval", "5")


async def model_state(kube: Kube, agent: AgentProcess, name: str) -> tuple[str | None, str | None]:
    labels = await kube.node_labels(agent.node)
    entry = await kube.entry(agent.node, configmap_key(CBM, "", name))
    return labels.get(node_label_key(CBM, "", name)), (entry or {}).get("status")


async def wait_state(
    kube: Kube, agent: AgentProcess, name: str, want: tuple[str | None, str | None], **kw: float
) -> None:
    async def probe() -> bool:
        return await model_state(kube, agent, name) == want

    await eventually(probe, what=f"{name} {want}", **kw)


async def hf_model(
    kube: Kube, agent: AgentProcess, mirrors_root: Path, name: str, seed: int = 0
) -> tuple[Path, dict[str, bytes], str]:
    files = tiny_llama(seed)
    repo = f"acme/{name}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    dest = agent.models_root / name
    await kube.apply(cbm(name, f"hf://{repo}", str(dest)))
    await wait_state(kube, agent, name, ("Ready", "Ready"), timeout=30)
    return dest, files, repo


async def test_label_and_configmap_drift_is_repaired(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent(args=RESYNC)
    name = f"drift-{unique}"
    await hf_model(kube, agent, mirrors_root, name)
    label = node_label_key(CBM, "", name)
    key = configmap_key(CBM, "", name)
    cm_path = CONFIGMAPS.path("ome", agent.node)
    merge = "application/merge-patch+json"

    # A label removed by someone else, then one changed by someone else.
    await kube.label_node(agent.node, {label: None})
    await wait_state(kube, agent, name, ("Ready", "Ready"), timeout=10)
    await kube.label_node(agent.node, {label: "Failed"})
    await wait_state(kube, agent, name, ("Ready", "Ready"), timeout=10)
    assert agent.metric("model_agent_workqueue_wait_seconds_count") > 0

    # A missing entry, then a garbled one.
    good = await kube.entry(agent.node, key)
    await kube.c.request("PATCH", cm_path, body={"data": {key: None}}, content_type=merge)
    await wait_state(kube, agent, name, ("Ready", "Ready"), timeout=10)
    await kube.c.request("PATCH", cm_path, body={"data": {key: "{not json"}}, content_type=merge)
    await wait_state(kube, agent, name, ("Ready", "Ready"), timeout=10)
    assert await kube.entry(agent.node, key) == good

    # The ConfigMap stripped of the label the OME controller selects by.
    await kube.c.request(
        "PATCH", cm_path, body={"metadata": {"labels": {"models.ome/basemodel-status": None}}}, content_type=merge
    )

    async def relabelled() -> bool:
        cm = await kube.configmap(agent.node)
        return bool(cm and cm["metadata"].get("labels", {}).get("models.ome/basemodel-status") == "true")

    await eventually(relabelled, timeout=10, what="ConfigMap label restored")

    # The whole ConfigMap deleted: recreated with its label, annotations and the entry.
    await kube.c.request("DELETE", cm_path)

    async def recreated() -> bool:
        cm = await kube.configmap(agent.node)
        if not cm:
            return False
        meta = cm["metadata"]
        return bool(
            meta.get("labels", {}).get("models.ome/basemodel-status") == "true"
            and meta.get("annotations", {}).get("models.ome.io/node-name") == agent.node
            and json.loads(cm["data"][key])["status"] == "Ready"
        )

    await eventually(recreated, timeout=10, what="ConfigMap recreated with identity and entry")

    # A model label and an entry for a model that does not exist: confirmed gone, removed at the next resync.
    ghost = f"ghost-{unique}"
    await kube.label_node(agent.node, {node_label_key(CBM, "", ghost): "Ready"})
    await kube.c.request(
        "PATCH",
        cm_path,
        body={"data": {configmap_key(CBM, "", ghost): '{"name":"x","status":"Ready"}'}},
        content_type=merge,
    )
    await wait_state(kube, agent, ghost, (None, None), timeout=20)
    await wait_state(kube, agent, name, ("Ready", "Ready"), timeout=5)
    await kube.delete_model(CBM, name)


async def test_missing_file_is_fetched_again_alone(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent(args=RESYNC)
    name = f"missing-{unique}"
    dest, files, _ = await hf_model(kube, agent, mirrors_root, name)
    olah.reset_stats()
    (dest / "model.safetensors").unlink()

    async def repaired() -> bool:
        present = (dest / "model.safetensors").exists()
        return present and await model_state(kube, agent, name) == ("Ready", "Ready")

    await eventually(repaired, timeout=20, what="missing file fetched again within a resync")
    assert (dest / "model.safetensors").read_bytes() == files["model.safetensors"]
    fetched = [r.path for r in olah.requests() if "/resolve/" in r.path and r.method == "GET"]
    assert fetched and all(p.endswith("/model.safetensors") for p in fetched), fetched
    await kube.delete_model(CBM, name)


async def test_corrupted_byte_is_found_by_verify_and_only_that_file_refetched(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent(args=RESYNC)
    name = f"corrupt-{unique}"
    dest, files, _ = await hf_model(kube, agent, mirrors_root, name)
    weights = dest / "model.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    import os

    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only a re-hash can tell
    olah.reset_stats()
    async with LabelHistory(kube, agent.node, node_label_key(CBM, "", name)) as history:
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "model_agent", "verify", f"{CBM}//{name}", "--port", str(agent.port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1, result.stdout + result.stderr
        assert "DAMAGED" in result.stdout and "model.safetensors" in result.stdout

        async def repaired() -> bool:
            ok = await model_state(kube, agent, name) == ("Ready", "Ready")
            return ok and history.values[-1:] == ["Ready"] and weights.read_bytes() == files["model.safetensors"]

        await eventually(repaired, timeout=30, what="repaired after verify")
    assert "Updating" in history.values, f"the label should leave Ready until repaired: {history.values}"
    served = [(r.path, r.bytes_sent) for r in olah.requests() if "/resolve/" in r.path and r.method == "GET"]
    assert served and all(p.endswith("/model.safetensors") for p, _ in served), served
    assert sum(b for _, b in served) == len(files["model.safetensors"])
    again = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "model_agent", "verify", "--all", "--port", str(agent.port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0, again.stdout
    await kube.delete_model(CBM, name)


async def test_staging_leftovers_are_cleaned_and_unmanaged_dirs_reported(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    root = tmp_path / "root-inventory"
    stale = root / ".model-agent" / "staging" / "deadbeefdeadbeefdeadbeef"
    stale.mkdir(parents=True)
    (stale / "partial.bin").write_bytes(b"x" * 100)
    stray = root / "someone-elses-weights"
    stray.mkdir()
    (stray / "w.bin").write_bytes(b"keep me")
    ome_records = root / ".ome" / "manifests"  # OME's v1.3 agents' integrity manifests at the root
    ome_records.mkdir(parents=True)
    (ome_records / "m.json").write_text('{"files": []}')
    agent = await make_agent(args=RESYNC, models_root=root)
    name = f"inv-{unique}"
    await hf_model(kube, agent, mirrors_root, name)

    async def cleaned() -> bool:
        return not stale.exists()

    await eventually(cleaned, timeout=15, what="stale staging removed")
    status = json.loads(agent.http("/status")[1])
    assert str(stray) in status["unmanaged"]
    assert agent.metric("model_agent_unmanaged_directories") == 1  # the stray one; .ome/ is not a model
    assert not [u for u in status["unmanaged"] if ".ome" in u]
    assert (stray / "w.bin").read_bytes() == b"keep me"
    assert (ome_records / "m.json").read_text() == '{"files": []}'  # left alone
    await kube.delete_model(CBM, name)


async def test_restart_with_200_ready_models_rehashes_nothing(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    files = tiny_llama(7, padding_bytes=1 << 20)  # 200 x 1 MiB: more than the agent reads to start at all
    repo = f"acme/many-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    agent = await make_agent()
    names = [f"many-{unique}-{i:03d}" for i in range(200)]
    for n in names:
        await kube.apply(cbm(n, f"hf://{repo}", str(agent.models_root / n)))

    async def all_ready() -> bool:
        labels = await kube.node_labels(agent.node)
        return all(labels.get(node_label_key(CBM, "", n)) == "Ready" for n in names)

    await eventually(all_ready, timeout=240, what="200 models Ready", interval=0.5)
    requests = olah.request_count()
    agent.stop()
    t0 = time.monotonic()
    agent.start()
    await asyncio.to_thread(agent.wait_ready)

    async def reconciled_all() -> bool:
        return await all_ready() and agent.metric("model_agent_reconcile_duration_seconds_count") >= 200

    await eventually(reconciled_all, timeout=30, what="every model looked at after restart")
    elapsed = time.monotonic() - t0  # reported, not asserted: restart speed is bench/startup.py's to measure
    assert olah.request_count() == requests
    assert (
        agent.metric("model_agent_verifications_total", model_type=CBM, namespace="", name=names[0], result="success")
        == 0
    )
    assert agent.metric("model_agent_fetched_bytes_total") == 0
    assert agent.proc is not None
    io = dict(line.split(": ") for line in Path(f"/proc/{agent.proc.pid}/io").read_text().splitlines())
    weights = 200 * sum(len(v) for v in files.values())
    assert int(io["rchar"]) < weights, f"read {io['rchar']} bytes; the weights are {weights}"
    print(f"restart with 200 Ready models: {elapsed:.2f}s to all reconciled; read {io['rchar']} bytes")
    for n in names:
        await kube.delete_model(CBM, n)


async def test_configmap_with_500_models_stays_under_1_mib(
    kube: Kube, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    agent = await make_agent()
    base = tmp_path / "local-500"
    config = tiny_llama(0)["config.json"]
    names = [f"cm-{unique}-{i:03d}" for i in range(500)]
    sem = asyncio.Semaphore(16)

    async def create(n: str) -> None:
        d = base / n
        d.mkdir(parents=True)
        (d / "config.json").write_bytes(config)
        async with sem:
            await kube.apply(cbm(n, f"local://{d}", str(d)))

    await asyncio.gather(*(create(n) for n in names))

    async def all_entries() -> bool:
        cm = await kube.configmap(agent.node)
        data = (cm or {}).get("data") or {}
        return sum(1 for n in names if '"status":"Ready"' in data.get(configmap_key(CBM, "", n), "")) == 500

    await eventually(all_entries, timeout=120, what="500 Ready entries", interval=0.5)
    cm = await kube.configmap(agent.node)
    assert cm is not None
    size = len(json.dumps(cm, separators=(",", ":")).encode())
    print(f"ConfigMap with 500 models: {size} bytes ({size / 1048576:.2f} MiB)")
    assert size < 1024 * 1024 * 0.75, size  # keep a 25 % margin under the 1 MiB object limit
    await asyncio.gather(*(kube.delete_model(CBM, n) for n in names))


async def test_a_new_source_is_switched_in_and_the_old_copy_goes_to_the_trash(
    kube: Kube, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    agent = await make_agent(args=RESYNC)
    name = f"switch-{unique}"
    dest, old_files, _ = await hf_model(kube, agent, mirrors_root, name, seed=61)
    new_files = tiny_llama(62)
    new_repo = f"acme/{name}-v2"
    await asyncio.to_thread(create_model_repo, mirrors_root, new_repo, new_files)

    def switch_source(live: dict[str, Any]) -> None:
        live["spec"]["storage"]["storageUri"] = f"hf://{new_repo}"

    async with LabelHistory(kube, agent.node, node_label_key(CBM, "", name)) as history:
        await kube.update_model(CBM, name, switch_source)

        async def switched() -> bool:
            data = (dest / "model.safetensors").read_bytes() if (dest / "model.safetensors").exists() else b""
            return data == new_files["model.safetensors"] and await model_state(kube, agent, name) == ("Ready", "Ready")

        await eventually(switched, timeout=30, what="the new source switched in")
    assert "Updating" in history.values
    trash = agent.models_root / ".model-agent" / "trash"
    held = [d for d in trash.iterdir() if (d / "data" / "model.safetensors").exists()]
    assert len(held) == 1
    assert (held[0] / "data" / "model.safetensors").read_bytes() == old_files["model.safetensors"]
    await kube.delete_model(CBM, name)
