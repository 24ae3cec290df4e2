"""Shared model roots end to end: several agents (subprocesses, one Node each) over ONE models root directory.

What a cluster on NFS/GPFS sees, on one machine: every agent's ``--models-root-dir`` is the same directory, so
they share weights, staging, trash and (no ``--state-dir``) manifests. The root is detected as shared from the
agents' node markers alone (no ``--shared-root``). Origin fetches are counted at the origin's proxy: olah's
for the first test, a counting proxy in front of S3 (moto) for the SIGKILL test.

AGENTS agents: the issue asks for 6; this machine has 2 cores shared with other work, and 6 agents with a
real API server ran within the deadlines here, so 6 it is (3 in the SIGKILL test, whose file is 256 MiB).

The SIGKILL test checks the takeover (one other node, after the Lease expired), that the taker continues
the dead holder's part map on the shared root (its done parts never drop), and that the origin served the
file's bytes once plus at most the parts the victim had in flight. Its origin is S3 (moto), not olah: olah
answers every resolve GET with 200 and the whole body, ignoring Range (see testbed/servers/olah.py), so a
resume from olah has to read the file from byte 0 whatever the part map says, and the origin's bytes could
not show the resume.

The verification test runs three agents with a 2 s ``--verify-interval``: the scheduled re-hash is spread,
so the agents' metrics summed show about one verification of the model per interval (each of its files
hashed once), not one per agent.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.shared_root import VERDICT_TTL_S, WAITING_FOR_PEER
from model_agent.kube.resources import CLUSTERBASEMODELS
from model_agent.model.keys import configmap_key, node_label_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.proxies.countingproxy import CountingProxy
from testbed.servers.moto import MotoServer, create_bucket, upload_objects
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, LabelHistory, cbm
from tests.support.waiting import always, eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
AGENTS = 6
MiB = 1 << 20
PART_MIB = 1
CONCURRENCY = 2


def status(agent: AgentProcess) -> dict[str, Any]:
    code, body = agent.http("/status")
    assert code == 200, body
    doc: dict[str, Any] = json.loads(body)
    return doc


def done_parts(part_map: Path) -> int:
    """How many parts a part map records as on disk (0 when it is gone)."""
    try:
        done = base64.b64decode(json.loads(part_map.read_text())["done"])
    except (OSError, ValueError, KeyError):
        return 0
    return sum(bin(byte).count("1") for byte in done)


def trash_dirs(root: Path) -> list[Path]:
    trash = root / ".model-agent" / "trash"
    return sorted(p for p in trash.iterdir() if p.is_dir()) if trash.is_dir() else []


async def test_a_shared_root_fetches_once_keeps_files_a_node_stops_wanting_and_trashes_once(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    files = tiny_llama(41, padding_bytes=64 << 20)  # big enough that the other nodes see the fetch under way
    repo = f"acme/shared-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    shared = tmp_path / "shared-models"
    group = {"shared-root-test": unique}
    agents = [await make_agent(models_root=shared, labels=group) for _ in range(AGENTS)]

    async def all_see_shared() -> bool:  # each agent saw the others' markers: the root is shared, by detection
        return all(status(agent)["sharedRoots"][0]["shared"] is True for agent in agents)

    # A verdict of "not shared" is re-read every VERDICT_TTL_S: agents that all started within it see it then.
    await eventually(all_see_shared, timeout=3 * VERDICT_TTL_S, what="every agent seeing the root shared")
    olah.reset_stats()
    name = f"shared-{unique}"
    dest = shared / "m"
    label = node_label_key(CBM, "", name)
    key = configmap_key(CBM, "", name)
    await kube.apply(cbm(name, f"hf://{repo}", str(dest), nodeSelector=group))

    phases: dict[str, set[str]] = {a.node: set() for a in agents}

    async def all_ready() -> bool:
        ready = 0
        for agent in agents:
            entry = await kube.entry(agent.node, key) or {}
            phase = (entry.get("progress") or {}).get("phase")
            if phase:
                phases[agent.node].add(phase)
            ready += (await kube.node_labels(agent.node)).get(label) == "Ready"
        return ready == AGENTS

    await eventually(all_ready, timeout=120, what=f"{AGENTS} nodes Ready on one shared root", interval=0.05)
    fetches = [r for r in olah.requests() if r.method == "GET" and f"/{repo}/resolve/" in r.path]
    fetchers = {re.sub(r".*model-agent/", "", r.client) for r in fetches}  # the User-Agent names the agent's node
    served = sum(r.bytes_sent for r in fetches)
    total = sum(len(b) for b in files.values())
    print(f"shared root, {AGENTS} nodes: {len(fetches)} GETs from {fetchers}, {served} bytes served for {total}")
    assert len(fetchers) == 1, fetchers  # exactly one node fetched from the origin
    assert served <= 1.1 * total, (served, total)  # and the model's bytes once
    waiting = [n for n, seen in phases.items() if WAITING_FOR_PEER in seen]
    assert waiting, phases  # the others showed Updating / waiting-for-peer while one fetched
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data

    # The selection leaves every node but the first: the others drop their label and entry, the files stay.
    keeper, leavers = agents[0], agents[1:]
    async with LabelHistory(kube, keeper.node, label) as history:
        await kube.c.request(
            "PATCH",
            CLUSTERBASEMODELS.path(None, name),
            body={
                "spec": {"storage": {"nodeSelector": {"shared-root-test": None, "kubernetes.io/hostname": keeper.node}}}
            },
            content_type="application/merge-patch+json",
        )

        async def leavers_gone() -> bool:
            for agent in leavers:
                if label in await kube.node_labels(agent.node) or await kube.entry(agent.node, key) is not None:
                    return False
            return True

        await eventually(leavers_gone, timeout=60, what="the deselected nodes' labels and entries gone")

        async def files_stay() -> bool:
            kept = all((dest / rel).is_file() for rel in files) and trash_dirs(shared) == []
            return kept and (await kube.node_labels(keeper.node)).get(label) == "Ready"

        await always(files_stay, duration=3, what="the files in place and the remaining node Ready")
    assert set(history.values) <= {"Ready"}, history.values  # the remaining node never left Ready
    removed = [e for e in await kube.events_for(name) if e.get("reason") == "Removed"]
    assert removed and all("weights kept: shared root" in e.get("message", "") for e in removed), removed
    assert (dest / "model.safetensors").read_bytes() == files["model.safetensors"]

    # The model deleted: quarantined once, by one node, and restorable.
    await kube.delete_model(CBM, name)

    async def trashed() -> bool:
        return not dest.exists() and len(trash_dirs(shared)) == 1 and label not in await kube.node_labels(keeper.node)

    await eventually(trashed, timeout=60, what="the model quarantined into the shared trash")

    async def trashed_once() -> bool:
        return len(trash_dirs(shared)) == 1 and not dest.exists()

    await always(trashed_once, duration=3, what="one trash entry, nothing else moved")
    quarantined = sum(a.metric("model_agent_quarantined_total") for a in agents)
    assert quarantined == 1, quarantined

    olah.reset_stats()
    await kube.apply(cbm(name, f"hf://{repo}", str(dest), nodeSelector=group))

    async def all_ready_again() -> bool:
        labels = [(await kube.node_labels(a.node)).get(label) for a in agents]
        return labels == ["Ready"] * AGENTS

    await eventually(all_ready_again, timeout=90, what="every node Ready again from the trash")
    assert olah.request_count(method="GET", path_contains=f"/{repo}/resolve/") == 0  # restored, not fetched

    async def stays_restored() -> bool:
        labels = [(await kube.node_labels(a.node)).get(label) for a in agents]
        return trash_dirs(shared) == [] and dest.is_dir() and labels == ["Ready"] * AGENTS

    # A node whose removal of the old object was still settling must not move the restored copy away again.
    await always(stays_restored, duration=4, what="the restored copy in place, every node Ready")
    assert sum(a.metric("model_agent_quarantined_total") for a in agents) == 1
    assert sum(a.metric("model_agent_restored_total") for a in agents) == 1  # one node restored, once
    crashed = [a.node for a in agents if "reconcile crashed" in a.log_text()]
    assert crashed == [], crashed
    assert (dest / "model.safetensors").read_bytes() == files["model.safetensors"]
    await kube.delete_model(CBM, name)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto-shared-root")) as server:
        yield server


async def test_a_fetcher_killed_at_half_is_taken_over_and_resumed_from_the_shared_part_map(
    kube: Kube, moto: MotoServer, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    files = tiny_llama(43, padding_bytes=256 << 20)
    bucket = f"shared-kill-{unique}".replace("_", "-").lower()
    client = moto.client(read_timeout=300)
    await asyncio.to_thread(create_bucket, client, bucket)
    await asyncio.to_thread(upload_objects, client, bucket, {f"m/{k}": v for k, v in files.items()})
    for rel in files:  # fetched anonymously: the objects are public
        await asyncio.to_thread(client.put_object_acl, Bucket=bucket, Key=f"m/{rel}", ACL="public-read")
    shared = tmp_path / "shared-models"
    group = {"shared-root-kill": unique}
    args = (
        "--origin-lease-seconds",
        "6",
        "--multipart-part-size",
        f"{PART_MIB}Mi",
        "--multipart-concurrency",
        str(CONCURRENCY),
    )
    big = "model.safetensors"
    total = len(files[big])
    with CountingProxy(moto.endpoint) as proxy:  # S3 honours Range: a resume asks only for the missing parts
        agents = [await make_agent(models_root=shared, labels=group, args=args) for _ in range(3)]
        name = f"shared-kill-{unique}"
        label = node_label_key(CBM, "", name)
        params = {"endpoint": proxy.endpoint, "anonymous": "true"}
        await kube.apply(cbm(name, f"s3://{bucket}/m", str(shared / "m"), nodeSelector=group, parameters=params))

        def big_served() -> int:
            return proxy.bytes_sent(f"/m/{big}")

        async def half_fetched() -> bool:
            return big_served() >= total // 2

        await eventually(half_fetched, timeout=60, what="half the big file fetched", interval=0.01)
        fetching = [a for a in agents if "fetching for the nodes sharing this root" in a.log_text()]
        assert len(fetching) == 1, [a.node for a in fetching]  # one node fetches for the root
        victim = fetching[0]
        victim.kill()
        at_kill = big_served()
        assert at_kill < total, "the download finished before the kill: nothing to take over"
        survivors = [a for a in agents if a is not victim]
        part_map = next(
            p for p in (shared / ".model-agent" / "staging").rglob("*.json") if f'"size": {total}' in p.read_text()
        )
        at_kill_parts = done_parts(part_map)
        counts: list[int] = []

        async def taker_progressed() -> bool:  # the taker records new parts on the same map: it resumed it
            counts.append(done_parts(part_map))
            return counts[-1] > at_kill_parts

        await eventually(taker_progressed, timeout=60, what="the taker continuing the dead holder's part map")
        assert min(counts) >= at_kill_parts, (at_kill_parts, counts)  # never started the file over

        async def survivors_ready() -> bool:
            labels = [(await kube.node_labels(a.node)).get(label) for a in survivors]
            return labels == ["Ready"] * len(survivors)

        await eventually(survivors_ready, timeout=120, what="the surviving nodes Ready after the takeover")
        served = big_served()
    takers = [a.node for a in survivors if "fetching for the nodes sharing this root" in a.log_text()]
    refetched = served - total
    print(
        f"killed {victim.node} at {at_kill} of {total} bytes ({at_kill_parts} parts recorded); taken over by "
        f"{takers}; origin served {served} bytes in all, {refetched} of them again"
    )
    assert len(takers) == 1, takers  # one taker: never both survivors
    # What the taker may fetch again: the parts the victim had in flight at the kill. The engine holds a
    # download slot until the part it fetched is durably recorded in the part map, so at most CONCURRENCY
    # parts were served (wholly or in part) without being recorded; every recorded part is on the shared
    # disk and the taker, resuming the map, asks S3 only for the others (ranged GETs).
    assert 0 <= refetched <= CONCURRENCY * PART_MIB * MiB, (served, total, at_kill)
    assert (shared / "m" / big).read_bytes() == files[big]
    await kube.delete_model(CBM, name)


async def test_the_scheduled_verification_of_a_shared_root_hashes_each_file_once_per_interval(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    files = tiny_llama(47)
    repo = f"acme/shared-verify-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    shared = tmp_path / "shared-models"
    group = {"shared-root-verify": unique}
    interval = 2.0
    args = ("--verify-interval", str(interval))
    agents = [await make_agent(models_root=shared, labels=group, args=args) for _ in range(3)]
    name = f"shared-verify-{unique}"
    label = node_label_key(CBM, "", name)
    await kube.apply(cbm(name, f"hf://{repo}", str(shared / "m"), nodeSelector=group))

    async def all_ready() -> bool:
        labels = [(await kube.node_labels(a.node)).get(label) for a in agents]
        return labels == ["Ready"] * len(agents)

    await eventually(all_ready, timeout=60, what="3 nodes Ready on one shared root")

    def counts() -> tuple[float, float, float]:
        """(verifications of the model, files hashed, passes left to a peer) summed over the agents, each
        agent's from one scrape (so its verification and file counts agree)."""
        wanted = f'model_agent_verifications_total{{model_type="{CBM}",name="{name}",namespace="",result="success"}}'
        verified = hashed = skipped = 0.0
        for agent in agents:
            sample = agent.metrics()
            verified += sample.get(wanted, 0.0)
            hashed += sample.get("model_agent_verified_files_total", 0.0)
            skipped += sum(v for k, v in sample.items() if k.startswith("model_agent_verifications_skipped_total{"))
        return verified, hashed, skipped

    async def first_round() -> bool:
        return counts()[0] >= 1

    await eventually(first_round, timeout=30, what="the model verified once")
    published = [p for p in (shared / "m").rglob("*") if p.is_file()]  # the manifest's files (the repo's own too)
    before, started = counts(), time.monotonic()
    after = before

    async def rounds_passed() -> bool:  # the other two nodes' passes have come round a few times each
        nonlocal after
        after = counts()
        return after[2] - before[2] >= 6

    await eventually(rounds_passed, timeout=60, what="six verify passes left to a peer")
    elapsed = time.monotonic() - started
    verified, hashed = after[0] - before[0], after[1] - before[1]
    print(
        f"{elapsed:.1f}s ({elapsed / interval:.1f} intervals): the model ({len(published)} files) re-hashed "
        f"{verified:g} times by 3 nodes, {hashed:g} files hashed"
    )
    assert hashed == verified * len(published), (hashed, verified, published)  # each file once per verification
    # One verification per round: a clean record stands for 0.8 of the interval, so at most one per 0.8 interval
    # (plus the round under way). Every node hashing on its own would be about 3 per interval.
    assert 1 <= verified <= elapsed / (0.8 * interval) + 1, (verified, elapsed)
    records = list((shared / ".model-agent" / "shared" / "verified").glob("*.json"))
    assert len(records) == 1, records
    record = json.loads(records[0].read_text())
    assert record["result"] == "success" and record["node"] in {a.node for a in agents}, record
    await kube.delete_model(CBM, name)
