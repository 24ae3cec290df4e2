"""The pre-flight judge (agent/preflight.py): which models this agent shows differently from OME's, and the setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.preflight import (
    ALLOWED_ROOT,
    ENDPOINT_ALLOW,
    TENANT_LOCAL_ALLOW,
    THE_SPEC,
    TRUSTED_NAMESPACE,
    judge,
)
from model_agent.local.layout import Layout
from model_agent.model.resources import ModelObject
from model_agent.sources.egress import TenancyPolicy

ROOT = "/mnt/data/models"


def model(uri: str, path: str | None = None, namespace: str = "team-a", **parameters: str) -> ModelObject:
    storage: dict[str, Any] = {"storageUri": uri}
    if path is not None:
        storage["path"] = path
    if parameters:
        storage["parameters"] = parameters
    meta: dict[str, Any] = {"name": "m", "uid": "u1"}
    kind = "BaseModel" if namespace else "ClusterBaseModel"
    if namespace:
        meta["namespace"] = namespace
    raw = {"apiVersion": "ome.io/v1beta1", "kind": kind, "metadata": meta, "spec": {"storage": storage}}
    return ModelObject.from_dict(kind, raw)


CASES: list[tuple[str, ModelObject, tuple[str, str] | None]] = [
    ("a tenant's local path outside the root", model("local:///srv/llama"), ("InvalidPath", TENANT_LOCAL_ALLOW)),
    ("a tenant's local path in the root", model(f"local://{ROOT}/llama"), None),
    ("a tenant's local path the admin allows", model("local:///shared/models/llama"), None),
    ("an admin's local path outside the root", model("local:///srv/llama", namespace=""), None),
    ("a path outside every root", model("s3://b/m", "/srv/m", namespace=""), ("PathRefused", ALLOWED_ROOT)),
    ("no path for a fetched model", model("s3://b/m", namespace=""), ("PathRefused", THE_SPEC)),
    (
        "a registry reference",
        model("oci://registry.example/org/m:v1", f"{ROOT}/m"),
        ("UnsupportedStorageUri", THE_SPEC),
    ),
    (
        "a tenant's native oci:// fetch",
        model("oci://n/ns/b/bk/o/m", f"{ROOT}/m"),
        ("CredentialRefused", TRUSTED_NAMESPACE),
    ),
    ("a tenant's S3-compatible oci:// fetch", model("ocios://n/ns/b/bk/o/m", f"{ROOT}/m", s3Compat="true"), None),
    ("an admin's native oci:// fetch", model("oci://n/ns/b/bk/o/m", f"{ROOT}/m", namespace=""), None),
    (
        "a tenant's endpoint not allowed",
        model("s3://b/m", f"{ROOT}/m", endpoint="http://minio.local:9000"),
        ("EndpointRefused", ENDPOINT_ALLOW),
    ),
    (
        "a tenant's endpoint on the public list",
        model("s3://b/m", f"{ROOT}/m", endpoint="https://s3.amazonaws.com"),
        None,
    ),
    (
        "a trusted namespace's endpoint",
        model("s3://b/m", f"{ROOT}/m", "platform", endpoint="http://minio.local:9000"),
        None,
    ),
    ("a trusted namespace's native oci:// fetch", model("oci://n/ns/b/bk/o/m", f"{ROOT}/m", "platform"), None),
    ("vendor", model("vendor://nvidia/models/x"), None),
    ("hf", model("hf://org/m", f"{ROOT}/m"), None),
]


@pytest.mark.parametrize(("what", "obj", "expected"), CASES, ids=[c[0] for c in CASES])
def test_judge(what: str, obj: ModelObject, expected: tuple[str, str] | None, tmp_path: Path) -> None:
    layout = Layout(Path(ROOT), [])
    policy = TenancyPolicy.build(trusted_namespaces=["platform"])
    change = judge(obj, layout, policy, ("/shared/models",))
    if expected is None:
        assert change is None
        return
    assert change is not None
    assert (change.reason, change.setting) == expected
    assert change.state == "Failed" and change.key == obj.ref.key and change.message
