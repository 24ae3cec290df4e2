"""The agent with ``gs://`` and ``az://`` models served by real emulators (fake-gcs-server, Azurite)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.models import tiny_llama
from testbed.servers import azurite as az
from testbed.servers import fakegcs
from testbed.servers.azurite import AzuriteServer
from testbed.servers.fakegcs import FakeGcsServer
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"


async def wait_for_state(kube: Kube, node: str, name: str, state: str, what: str) -> dict[str, Any]:
    async def reached() -> bool:
        labels = await kube.node_labels(node)
        entry = await kube.entry(node, configmap_key(CBM, "", name)) or {}
        return labels.get(node_label_key(CBM, "", name)) == state and entry.get("status") == state

    await eventually(reached, timeout=60, what=what)
    entry = await kube.entry(node, configmap_key(CBM, "", name))
    assert entry is not None
    return entry


def assert_identical(dest: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        assert hashlib.sha256((dest / rel).read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest(), rel


async def test_gcs_and_azure_models_reach_ready_with_identical_files(
    kube: Kube, fake_gcs: FakeGcsServer, azurite: AzuriteServer, make_agent: AgentFactory, unique: str
) -> None:
    files = tiny_llama(43)
    bucket = f"models-{unique}"
    await asyncio.to_thread(fakegcs.create_bucket, fake_gcs.endpoint, bucket)
    await asyncio.to_thread(
        fakegcs.upload_objects, fake_gcs.endpoint, bucket, {f"llama/{k}": v for k, v in files.items()}
    )
    await asyncio.to_thread(az.create_container, azurite.endpoint, bucket)
    await asyncio.to_thread(az.upload_blobs, azurite.endpoint, bucket, {f"llama/{k}": v for k, v in files.items()})
    await kube.create_secret("ome", f"gcs-{unique}", {"serviceAccountKey": fakegcs.service_account_key()})
    await kube.create_secret("ome", f"az-{unique}", {"accountKey": az.ACCOUNT_KEY})
    agent = await make_agent()
    models = {
        f"gcs-{unique}": (f"gs://{bucket}/llama", fake_gcs.endpoint),
        f"az-{unique}": (f"az://{az.ACCOUNT}/{bucket}/llama", azurite.endpoint),
    }
    for name, (uri, endpoint) in models.items():
        await kube.apply(cbm(name, uri, str(agent.models_root / name), key=name, parameters={"endpoint": endpoint}))
    for name in models:
        entry = await wait_for_state(kube, agent.node, name, "Ready", f"{name} Ready")
        assert entry["config"]["modelArchitecture"] == "LlamaForCausalLM"
        assert_identical(agent.models_root / name, files)
    for name in models:
        await kube.delete_model(CBM, name)


async def test_wrong_azure_key_fails_with_a_reason(
    kube: Kube, azurite: AzuriteServer, make_agent: AgentFactory, unique: str
) -> None:
    container = f"models-{unique}"
    await asyncio.to_thread(az.create_container, azurite.endpoint, container)
    await asyncio.to_thread(az.upload_blobs, azurite.endpoint, container, {"llama/config.json": b"{}"})
    await kube.create_secret("ome", f"az-bad-{unique}", {"accountKey": "d3Jvbmcga2V5"})
    agent = await make_agent()
    name = f"az-bad-{unique}"
    await kube.apply(
        cbm(
            name,
            f"az://{az.ACCOUNT}/{container}/llama",
            str(agent.models_root / name),
            key=name,
            parameters={"endpoint": azurite.endpoint},
        )
    )
    entry = await wait_for_state(kube, agent.node, name, "Failed", "wrong key Failed")
    assert str(entry.get("reason", "")).startswith("AccessDenied"), entry
    assert not (agent.models_root / name).exists()
    await kube.delete_model(CBM, name)
