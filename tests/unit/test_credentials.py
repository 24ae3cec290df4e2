"""Which token a Hugging Face fetch sends (agent/credentials.py): the platform HF_TOKEN serves trusted models only.

A tenant's own Secret and its plain-text ``parameters.token`` are its own; the process-wide ``HF_TOKEN`` is
the platform's and never goes out on a tenant's behalf (it fetched gated repos for any tenant before).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any, cast

import pytest

from model_agent.agent.credentials import model_owner, resolve_hf_token
from model_agent.kube.client import KubeClient
from model_agent.model.resources import ModelObject
from model_agent.sources import egress
from model_agent.sources.egress import CLUSTER_KIND, NAMESPACED_KIND, Owner, TenancyPolicy

PLATFORM = "hf_platformTokenNeverForTenants"


class _Secrets:
    """A stand-in for the API client: Secrets by path, and every path asked for."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets
        self.asked: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.asked.append(path)
        data = self.secrets[path]
        return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def _model(kind: str, namespace: str = "", **storage: Any) -> ModelObject:
    meta: dict[str, Any] = {"name": "m", "uid": "u1"}
    if namespace:
        meta["namespace"] = namespace
    return ModelObject.from_dict(kind, {"metadata": meta, "spec": {"storage": {"storageUri": "hf://a/b", **storage}}})


@pytest.fixture(autouse=True)
def policy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HF_TOKEN", PLATFORM)
    before = egress.current()
    egress.configure(TenancyPolicy.build(trusted_namespaces=["team-trusted"]))
    yield
    egress.configure(before)


@pytest.mark.parametrize(
    ("kind", "namespace", "token", "origin"),
    [
        ("ClusterBaseModel", "", PLATFORM, "environment"),
        ("BaseModel", "team-trusted", PLATFORM, "environment"),
        ("BaseModel", "team-evil", None, "anonymous"),
    ],
)
async def test_platform_token_serves_trusted_models_only(
    kind: str, namespace: str, token: str | None, origin: str
) -> None:
    client = _Secrets({})
    resolved = await resolve_hf_token(cast(KubeClient, client), _model(kind, namespace), "ome")
    assert (resolved.token, resolved.origin) == (token, origin)
    assert client.asked == []


async def test_a_tenant_keeps_its_own_tokens() -> None:
    client = _Secrets({"/api/v1/namespaces/team-evil/secrets/mine": {"token": "hf_tenantOwnToken000"}})
    keyed = await resolve_hf_token(cast(KubeClient, client), _model("BaseModel", "team-evil", key="mine"), "ome")
    assert (keyed.token, keyed.origin) == ("hf_tenantOwnToken000", "secret")
    assert client.asked == ["/api/v1/namespaces/team-evil/secrets/mine"]  # its own namespace, never the agent's
    inline = _model("BaseModel", "team-evil", parameters={"token": "hf_inlineTenantToken0"})
    assert (await resolve_hf_token(cast(KubeClient, client), inline, "ome")).token == "hf_inlineTenantToken0"


def test_model_owner() -> None:
    assert model_owner(_model("ClusterBaseModel")) == Owner(CLUSTER_KIND)
    assert model_owner(_model("BaseModel", "team-evil")) == Owner(NAMESPACED_KIND, "team-evil")


async def test_only_credential_values_of_a_tenant_secret_are_masked_in_logs() -> None:
    """A tenant's Secret values like "Failed" or "BaseModel/team-a" must not mask ordinary log text."""
    from model_agent.agent.credentials import read_storage_secret
    from model_agent.ops import logging as agent_logging

    secret = {
        "AWS_SECRET_ACCESS_KEY": "tenant-secret-access-key-0001",
        "sasToken": "sv=2024&sig=tenantSasSignature0001",
        "note": "Failed: BaseModel/team-a/llama model",
        "region": "us-east-1-and-more",
    }
    client = _Secrets({"/api/v1/namespaces/team-evil/secrets/s3": secret})
    obj = ModelObject.from_dict(
        "BaseModel",
        {
            "metadata": {"name": "m", "namespace": "team-evil", "uid": "u1"},
            "spec": {"storage": {"storageUri": "s3://b/p", "key": "s3"}},
        },
    )
    before = agent_logging.registered_count()
    try:
        data = await read_storage_secret(cast(KubeClient, client), obj, "ome")
        assert data == secret  # every value is still handed to the source
        assert agent_logging.registered_count() == before + 2
        line = agent_logging._mask("Failed: BaseModel/team-a/llama model in us-east-1-and-more")
        assert line == "Failed: BaseModel/team-a/llama model in us-east-1-and-more"
        assert "tenant-secret-access-key-0001" not in agent_logging._mask("key tenant-secret-access-key-0001")
    finally:
        for value in secret.values():
            agent_logging.forget_secret(value)
