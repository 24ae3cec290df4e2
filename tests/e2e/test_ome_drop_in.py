"""OME's own deployment, pointed at this agent: it starts with every flag OME's v1.3 chart passes and serves a model.

The flags are those OME's v1.3 chart and operator docs give its model agent (its DaemonSet's ``args``): OME's
original ones and the three added in 2026 (``--num-high-priority-worker``, ``--same-path-wait-timeout``,
``--model-verification-concurrency``). One of the new ones does not apply here; the agent accepts it and logs one
warning, naming what does that job instead.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.models import tiny_llama
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

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
    name = f"ome13-{unique}"
    dest = agent.models_root / "m"
    await kube.apply(cbm(name, f"hf://{repo}", str(dest), nodeSelector={"kubernetes.io/hostname": agent.node}))

    async def ready() -> bool:
        label = (await kube.node_labels(agent.node)).get(node_label_key(CBM, "", name))
        entry = await kube.entry(agent.node, configmap_key(CBM, "", name)) or {}
        return label == "Ready" and entry.get("status") == "Ready"

    await eventually(ready, timeout=60, what="the model Ready")
    assert {p: (dest / p).read_bytes() for p in files} == files
    warned = [json.loads(line) for line in agent.log_text().splitlines() if "ignored" in line and line.startswith("{")]
    flags = {w.get("flag") for w in warned if w.get("event") == "flag accepted for OME compatibility and ignored"}
    assert {"--same-path-wait-timeout", "--download-retry", "--concurrency"} <= flags
    assert "--num-high-priority-worker" not in flags  # mapped: the removal lane's workers
    await kube.delete_model(CBM, name)
