"""The agent with an ``s3://`` model served by a real S3 server (moto in server mode)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.models import tiny_llama
from testbed.servers.moto import MotoServer, create_bucket, upload_objects
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto-agent")) as server:
        yield server


async def test_s3_model_reaches_ready_with_identical_files(
    kube: Kube, moto: MotoServer, make_agent: AgentFactory, unique: str
) -> None:
    files = tiny_llama(41)
    files["shards/extra.bin"] = os.urandom(20 * MiB)  # multipart upload: an ETag that is not an MD5
    bucket = f"models-{unique}".replace("_", "-")
    client = moto.client()
    await asyncio.to_thread(create_bucket, client, bucket)
    await asyncio.to_thread(
        upload_objects, client, bucket, {f"llama/{k}": v for k, v in files.items()}, multipart_threshold=16 * MiB
    )
    secret = f"s3-creds-{unique}"
    await kube.create_secret("ome", secret, {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    agent = await make_agent()
    name = f"s3-{unique}"
    dest = agent.models_root / name
    await kube.apply(
        cbm(
            name,
            f"s3://{bucket}/llama",
            str(dest),
            key=secret,
            parameters={"endpoint": moto.endpoint, "region": "us-east-1"},
        )
    )

    async def ready() -> bool:
        labels = await kube.node_labels(agent.node)
        entry = await kube.entry(agent.node, configmap_key(CBM, "", name)) or {}
        return labels.get(node_label_key(CBM, "", name)) == "Ready" and entry.get("status") == "Ready"

    await eventually(ready, timeout=60, what="s3 model Ready")
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data, rel
    entry = await kube.entry(agent.node, configmap_key(CBM, "", name))
    assert entry is not None and entry["config"]["modelArchitecture"] == "LlamaForCausalLM"
    await kube.delete_model(CBM, name)
