"""The CRDs carry OME's fields of 2026, and the agent leaves every field it does not own as it was.

A ClusterBaseModel written as OME's users write them now — ``diffusionPipeline``, ``apiCapabilities``,
``distribution``, ``servingMode``, free-form ``additionalMetadata`` and ``modelConfiguration`` — with a
status as OME's controller writes it (``conditions``, ``nodesEvicted``, ``observedGeneration``, ``cache``,
state ``Evicted``), served by the API server with the CRDs of ``deploy/crds``: every one of those fields
survives the API server's pruning (a CRD without them drops them silently on write) and the agent's spec
enrichment, which fills only the empty fields (here ``modelType``, among others) with one merge patch.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from model_agent.kube.resources import CLUSTERBASEMODELS
from model_agent.model.keys import node_label_key
from testbed.models import tiny_llama
from tests.e2e.conftest import AgentFactory
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"

NOT_OURS: dict[str, Any] = {
    "apiCapabilities": ["OPENAI_V1_CHAT_COMPLETIONS", "OPENAI_V1_COMPLETIONS"],
    "diffusionPipeline": {
        "className": "StableDiffusionXLPipeline",
        "scheduler": {"library": "diffusers", "type": "EulerDiscreteScheduler"},
        "textEncoder": {"library": "transformers", "type": "CLIPTextModel"},
        "tokenizer": {"library": "transformers", "type": "CLIPTokenizer"},
        "transformer": {"library": "diffusers", "type": "UNet2DConditionModel"},
        "vae": {"library": "diffusers", "type": "AutoencoderKL"},
        "additionalComponents": {"text_encoder_2": {"library": "transformers", "type": "CLIPTextModelWithProjection"}},
    },
    "distribution": "PerNode",
    "servingMode": ["Disaggregated"],
    "additionalMetadata": {"team": "search", "type": "Serving"},
    "modelConfiguration": {"anything": {"nested": [1, 2]}},
    "vendor": "acme",
    "displayName": "Tiny Llama",
}
STATUS: dict[str, Any] = {
    "state": "Evicted",
    "nodesEvicted": ["node-x"],
    "observedGeneration": 1,
    "lastReconcileTime": "2026-12-01T00:00:00Z",
    "cache": {"backend": "local", "sourceUri": "hf://acme/tiny"},
    "conditions": [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Evicted",
            "message": "evicted from node-x",
            "lastTransitionTime": "2026-12-01T00:00:00Z",
        }
    ],
}


async def test_fields_the_agent_does_not_own_survive_the_crds_and_the_enrichment(
    kube: Kube, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    weights = tmp_path / f"weights-{unique}"
    weights.mkdir()
    for name, data in tiny_llama(23).items():
        (weights / name).write_bytes(data)
    name = f"fields-{unique}"
    body = cbm(name, f"local://{weights}", str(weights))
    body["spec"].update(copy.deepcopy(NOT_OURS))
    await kube.apply(body)
    path = CLUSTERBASEMODELS.path(None, name)
    await kube.c.request(
        "PATCH", f"{path}/status", body={"status": STATUS}, content_type="application/merge-patch+json"
    )
    agent = await make_agent()

    async def enriched() -> bool:
        labels = await kube.node_labels(agent.node)
        spec = (await kube.get_model(CBM, name))["spec"]
        return labels.get(node_label_key(CBM, "", name)) == "Ready" and bool(spec.get("modelType"))

    await eventually(enriched, timeout=60, what=f"{name} Ready and its empty spec fields filled")
    live = await kube.get_model(CBM, name)
    assert live["spec"]["modelType"] == "llama", live["spec"]
    for field, value in NOT_OURS.items():
        assert live["spec"][field] == value, field
    assert live["spec"]["storage"] == body["spec"]["storage"]
    assert live["status"] == STATUS
