"""Operability end to end: metrics after a real download, readiness that waits for the caches, health that fails."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from model_agent.model.keys import configmap_key
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.proxies.faultproxy import FaultProxy, Rule, stall
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"


async def test_metrics_after_a_download_have_ome_names_and_ours(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    files = tiny_llama(21)
    repo = f"acme/metrics-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, files)
    agent = await make_agent()
    name = f"metrics-{unique}"
    await kube.apply(cbm(name, f"hf://{repo}", str(agent.models_root / name)))

    async def ready() -> bool:
        entry = await kube.entry(agent.node, configmap_key(CBM, "", name))
        return bool(entry and entry["status"] == "Ready")

    await eventually(ready, timeout=30, what="Ready")
    labels = {"model_type": CBM, "namespace": "", "name": name}

    async def counted() -> bool:
        return agent.metric("model_agent_models", state="Ready") == 1

    await eventually(counted, timeout=15, what="model_agent_models gauge")
    m = agent.metrics()
    assert agent.metric("model_agent_downloads_success_total", **labels) == 1
    assert agent.metric("model_agent_downloads_failed_total", **labels) == 0
    assert agent.metric("model_agent_download_duration_seconds_count", **labels) == 1
    assert 0 < agent.metric("model_agent_download_duration_seconds_sum", **labels) < 60
    for family in (
        "model_agent_verifications_total",
        "model_agent_md5_checksum_failed_total",
        "model_agent_rate_limit_total",
        "model_agent_download_bytes_total",
        "model_agent_rate_limit_wait_seconds",
        "model_agent_verification_duration_seconds",
    ):
        assert any(k.startswith(family) for k in agent.http("/metrics")[1].splitlines() if not k.startswith("#")) or (
            f"# TYPE {family.removesuffix('_total')}" in agent.http("/metrics")[1]
        ), family
    on_disk = sum(p.stat().st_size for p in (agent.models_root / name).rglob("*") if p.is_file())
    assert agent.metric("model_agent_fetched_bytes_total") == on_disk
    assert agent.metric("model_agent_relists_total", resource="clusterbasemodels") >= 1
    assert agent.metric("model_agent_workqueue_wait_seconds_count") >= 1
    assert any(k.startswith('model_agent_api_request_duration_seconds_count{code="200"') for k in m)
    assert agent.metric("model_agent_delete_breaker_open") == 0
    await kube.delete_model(CBM, name)

    async def quarantined() -> bool:
        return agent.metric("model_agent_quarantined_total") == 1

    await eventually(quarantined, timeout=20, what="removal quarantined")
    assert agent.metric("model_agent_delete_confirmations_total", outcome="confirmed_gone") >= 1


async def test_readyz_is_false_until_the_caches_sync(
    kube: Kube, make_agent: AgentFactory, proxy: FaultProxy, tmp_path: Path, unique: str
) -> None:
    # The first LIST is held, then passes; 15 s leaves a slow start on a loaded machine time to answer /readyz
    # while it is still held.
    gate = proxy.add_rule(
        Rule(r"/apis/ome\.io/v1beta1/clusterbasemodels$", stall(15.0, then="forward"), verb="list", times=1)
    )
    node = f"readyz-{unique}"
    await kube.create_node(node)
    agent = AgentProcess(
        kubeconfig=proxy.kubeconfig,  # type: ignore[attr-defined]
        node=node,
        models_root=tmp_path / "root",
        log_path=tmp_path / "agent.log",
    )
    agent.start()
    try:
        seen: list[int] = []

        async def answered_500() -> bool:
            try:
                seen.append(agent.http("/readyz")[0])
            except OSError:
                return False
            return seen[-1] == 500

        async def list_held() -> bool:
            return gate.fired == 1

        # /readyz is 500 from the start, before the LIST is even sent (it once was, and the check raced it):
        # first see the LIST held at the proxy, then the 500 while it is.
        await eventually(list_held, timeout=20, what="the agent's LIST of ClusterBaseModels held at the proxy")
        await eventually(answered_500, timeout=10, what="/readyz answering 500 while the LIST is stalled")
        assert gate.fired == 1
        body = agent.http("/readyz?verbose")[1]
        assert "cache-clusterbasemodels failed: not synced yet" in body

        async def answered_200() -> bool:
            return agent.http("/readyz")[0] == 200

        await eventually(answered_200, timeout=30, what="/readyz 200 after sync")
        assert agent.http("/livez")[0] == 200
    finally:
        agent.stop()


async def test_healthz_fails_when_the_records_directory_is_not_writable(make_agent: AgentFactory) -> None:
    # /healthz asks for write access only where the agent must write: its records (the manifests), not the
    # models root itself (OME issue #787: a read-only root of pre-provisioned models is healthy).
    agent = await make_agent()
    assert agent.http("/healthz")[0] == 200
    root = agent.models_root
    records = root / ".model-agent" / "manifests"
    assert records.is_dir()
    subprocess.run(["chattr", "+i", str(root)], check=True)
    try:
        status, body = agent.http("/healthz?verbose")
        assert status == 200, body  # the root alone unwritable: still healthy
    finally:
        subprocess.run(["chattr", "-i", str(root)], check=True)
    subprocess.run(["chattr", "+i", str(records)], check=True)
    try:
        status, body = agent.http("/healthz?verbose")
        assert status == 500, body
        assert "not writable" in body and str(records) in body
    finally:
        subprocess.run(["chattr", "-i", str(records)], check=True)
    assert agent.http("/healthz")[0] == 200
