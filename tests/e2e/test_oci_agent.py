"""The agent with ``oci://`` models served by FakeOciObjectStorage (the real OCI service cannot run here).

The agent runs as a subprocess against the real control plane, with user-principal auth from a throwaway
API signing key and SDK config file; the fake verifies every request's signature with the public key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import pytest

from model_agent.model.keys import configmap_key, node_label_key
from testbed.models import tiny_llama
from tests.e2e.conftest import AgentFactory
from tests.support.fake_oci import FakeOciObjectStorage, UserPrincipal, write_user_principal
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
NS = "faketenancy"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory) -> UserPrincipal:
    return write_user_principal(tmp_path_factory.mktemp("oci-identity"))


@pytest.fixture(scope="module")
def fake_oci(identity: UserPrincipal) -> Iterator[FakeOciObjectStorage]:
    with FakeOciObjectStorage(NS, {identity.key_id: identity.public_key}) as server:
        yield server


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def ready(kube: Kube, node: str, name: str) -> bool:
    labels = await kube.node_labels(node)
    entry = await kube.entry(node, configmap_key(CBM, "", name)) or {}
    return labels.get(node_label_key(CBM, "", name)) == "Ready" and entry.get("status") == "Ready"


async def test_oci_model_reaches_ready_with_identical_files(
    kube: Kube, fake_oci: FakeOciObjectStorage, identity: UserPrincipal, make_agent: AgentFactory, unique: str
) -> None:
    files = tiny_llama(43)
    files["shards/extra.bin"] = os.urandom(20 * MiB)  # several ranged parts
    bucket = f"models-{unique}".replace("_", "-")
    for rel, data in files.items():
        fake_oci.put(bucket, f"llama/{rel}", data)
    agent = await make_agent(env={"OCI_CONFIG_PATH": str(identity.config_path)})
    name = f"oci-{unique}"
    dest = agent.models_root / name
    await kube.apply(
        cbm(
            name,
            f"oci://n/{NS}/b/{bucket}/o/llama",
            str(dest),
            key="no-such-secret",  # not used for OCI (docs/ome-compatibility.md#101-client): must not fail the model
            parameters={"auth": "UserPrincipal", "endpoint": fake_oci.endpoint},
        )
    )

    async def model_ready() -> bool:
        return await ready(kube, agent.node, name)

    await eventually(model_ready, timeout=90, what="oci model Ready")
    for rel, data in files.items():
        assert sha256((dest / rel).read_bytes()) == sha256(data), rel
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == sorted(files)
    entry = await kube.entry(agent.node, configmap_key(CBM, "", name))
    assert entry is not None and entry["config"]["modelArchitecture"] == "LlamaForCausalLM"
    mine = [r for r in fake_oci.requests if f"/b/{bucket}/" in r.path]
    assert {r.operation for r in mine} == {"ListObjects", "HeadObject", "GetObject"}
    assert all(r.status in (200, 206) for r in mine)  # every request carried a valid signature
    labels = {"model_type": CBM, "namespace": "", "name": name}
    assert agent.metric("model_agent_download_bytes_total", **labels) == sum(len(d) for d in files.values())
    assert agent.metric("model_agent_verifications_total", result="success", **labels) == 1
    await kube.delete_model(CBM, name)


async def test_tensorrt_llm_model_gets_only_its_shape(
    kube: Kube, fake_oci: FakeOciObjectStorage, identity: UserPrincipal, make_agent: AgentFactory, unique: str
) -> None:
    bucket = f"trt-{unique}".replace("_", "-")
    engines = {f"engines/{shape}/rank0.engine": os.urandom(4096) for shape in ("H100", "A100-80G", "B200")}
    for key, data in engines.items():
        fake_oci.put(bucket, key, data)
    # The node's instance type BM.GPU.H100.8 maps to the shape alias H100 (docs/ome-compatibility.md#31-node-facts).
    agent = await make_agent(
        labels={"node.kubernetes.io/instance-type": "BM.GPU.H100.8"},
        env={"OCI_CONFIG_PATH": str(identity.config_path)},
    )
    name = f"trt-{unique}"
    dest = agent.models_root / name
    model = cbm(
        name,
        f"oci://n/{NS}/b/{bucket}/o/engines",
        str(dest),
        parameters={"auth": "UserPrincipal", "endpoint": fake_oci.endpoint},
    )
    model["spec"]["modelFormat"] = {"name": "tensorrtllm"}
    await kube.apply(model)

    async def model_ready() -> bool:
        return await ready(kube, agent.node, name)

    await eventually(model_ready, timeout=60, what="tensorrt-llm model Ready")
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == ["H100/rank0.engine"]
    assert (dest / "H100" / "rank0.engine").read_bytes() == engines["engines/H100/rank0.engine"]
    await kube.delete_model(CBM, name)
