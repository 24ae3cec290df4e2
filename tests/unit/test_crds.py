"""Unit tests for deploy/crds: the BaseModel and ClusterBaseModel CRDs match
docs/ome-compatibility.md#1-custom-resources-the-agent-consumes.

Loads both YAML files with PyYAML and checks identity (1.1), the spec/storage/status schema (1.2-1.4)
and that the two schemas are identical, so they can only differ in names, kind and scope.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "crds"

KINDS = {
    "basemodels": ("BaseModel", "Namespaced"),
    "clusterbasemodels": ("ClusterBaseModel", "Cluster"),
}

PRINTER_COLUMNS = [
    ("Disabled", "boolean", ".spec.disabled"),
    ("Version", "string", ".spec.version"),
    ("Vendor", "string", ".spec.vendor"),
    ("Framework", "string", ".spec.modelFramework.name"),
    ("FrameworkVersion", "string", ".spec.modelFramework.version"),
    ("ModelFormat", "string", ".spec.modelFormat.name"),
    ("Architecture", "string", ".spec.modelArchitecture"),
    ("Capabilities", "string", ".spec.modelCapabilities[*]"),
    ("Size", "string", ".spec.modelParameterSize"),
    ("CompartmentID", "string", ".spec.compartmentID"),
    ("Ready", "string", ".status.state"),
    ("Age", "date", ".metadata.creationTimestamp"),
]

SPEC_FIELDS = {
    "additionalMetadata",
    "apiCapabilities",
    "compartmentID",
    "diffusionPipeline",
    "disabled",
    "displayName",
    "distribution",
    "maxTokens",
    "modelArchitecture",
    "modelCapabilities",
    "modelConfiguration",
    "modelFormat",
    "modelFramework",
    "modelParameterSize",
    "modelType",
    "quantization",
    "servingMode",
    "storage",
    "vendor",
    "version",
}

STORAGE_FIELDS = {
    "downloadPolicy",
    "key",
    "nodeAffinity",
    "nodeSelector",
    "parameters",
    "path",
    "schemaPath",
    "storageUri",
}


def load(plural: str) -> dict[str, Any]:
    with (CRD_DIR / f"ome.io_{plural}.yaml").open() as f:
        doc = yaml.safe_load(f)
    assert isinstance(doc, dict)
    return doc


def version(doc: dict[str, Any]) -> dict[str, Any]:
    versions = doc["spec"]["versions"]
    assert len(versions) == 1
    v = versions[0]
    assert isinstance(v, dict)
    return v


def schema(doc: dict[str, Any]) -> dict[str, Any]:
    s = version(doc)["schema"]["openAPIV3Schema"]
    assert isinstance(s, dict)
    return s


def strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def walk_schemas(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, child in node.get("properties", {}).items():
        out += walk_schemas(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        out += walk_schemas(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += walk_schemas(node["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize("plural", sorted(KINDS))
def test_identity(plural: str) -> None:
    doc = load(plural)
    kind, scope = KINDS[plural]
    assert doc["apiVersion"] == "apiextensions.k8s.io/v1"
    assert doc["kind"] == "CustomResourceDefinition"
    assert doc["metadata"]["name"] == f"{plural}.ome.io"
    assert doc["spec"]["group"] == "ome.io"
    assert doc["spec"]["scope"] == scope
    assert doc["spec"]["names"] == {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": plural[:-1],
    }
    v = version(doc)
    assert (v["name"], v["served"], v["storage"]) == ("v1beta1", True, True)
    assert v["subresources"] == {"status": {}}


@pytest.mark.parametrize("plural", sorted(KINDS))
def test_printer_columns(plural: str) -> None:
    columns = version(load(plural))["additionalPrinterColumns"]
    assert [(c["name"], c["type"], c["jsonPath"]) for c in columns] == PRINTER_COLUMNS


@pytest.mark.parametrize("plural", sorted(KINDS))
def test_spec_schema(plural: str) -> None:
    root = schema(load(plural))
    assert root["type"] == "object"
    spec = root["properties"]["spec"]
    assert set(spec["properties"]) == SPEC_FIELDS
    assert spec["required"] == ["storage"]
    storage = spec["properties"]["storage"]
    assert set(storage["properties"]) == STORAGE_FIELDS
    assert storage["required"] == ["storageUri"]
    assert storage["properties"]["downloadPolicy"]["enum"] == ["AlwaysDownload", "ReuseIfExists"]
    assert storage["properties"]["nodeSelector"]["x-kubernetes-map-type"] == "atomic"
    assert storage["properties"]["parameters"]["additionalProperties"] == {"type": "string"}

    config = spec["properties"]["modelConfiguration"]
    assert config["type"] == "object"
    assert config["x-kubernetes-preserve-unknown-fields"] is True

    for name in ("modelFormat", "modelFramework"):
        obj = spec["properties"][name]
        assert obj["required"] == ["name"]
        props = obj["properties"]
        assert set(props) == {"name", "operator", "version", "weight"}
        assert props["operator"]["default"] == "Equal"
        assert (props["weight"]["type"], props["weight"]["format"], props["weight"]["default"]) == (
            "integer",
            "int64",
            1,
        )
    max_tokens = spec["properties"]["maxTokens"]
    assert (max_tokens["type"], max_tokens["format"]) == ("integer", "int32")

    for name in ("modelCapabilities", "apiCapabilities", "servingMode"):
        field = spec["properties"][name]
        assert field["type"] == "array"
        assert field["items"] == {"type": "string"}
        assert field["x-kubernetes-list-type"] == "atomic"

    pipeline = spec["properties"]["diffusionPipeline"]["properties"]
    assert set(pipeline) == {
        "additionalComponents",
        "className",
        "scheduler",
        "textEncoder",
        "tokenizer",
        "transformer",
        "vae",
    }
    assert pipeline["additionalComponents"]["x-kubernetes-map-type"] == "atomic"
    for part in ("scheduler", "textEncoder", "tokenizer", "transformer", "vae"):
        assert set(pipeline[part]["properties"]) == {"library", "type"}
    assert set(pipeline["additionalComponents"]["additionalProperties"]["properties"]) == {"library", "type"}


@pytest.mark.parametrize("plural", sorted(KINDS))
def test_node_affinity_is_written_out(plural: str) -> None:
    affinity = schema(load(plural))["properties"]["spec"]["properties"]["storage"]["properties"]["nodeAffinity"]
    required = affinity["properties"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["required"] == ["nodeSelectorTerms"]
    assert required["x-kubernetes-map-type"] == "atomic"
    terms = required["properties"]["nodeSelectorTerms"]
    assert terms["x-kubernetes-list-type"] == "atomic"
    term = terms["items"]
    assert term["x-kubernetes-map-type"] == "atomic"
    preferred = affinity["properties"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["x-kubernetes-list-type"] == "atomic"
    assert preferred["items"]["required"] == ["preference", "weight"]
    assert preferred["items"]["properties"]["weight"]["format"] == "int32"
    preference = preferred["items"]["properties"]["preference"]
    # a preferred term's preference has exactly the shape of a required node selector term
    assert strip_descriptions(preference) == strip_descriptions(term)
    for selector in ("matchExpressions", "matchFields"):
        requirements = term["properties"][selector]
        assert requirements["x-kubernetes-list-type"] == "atomic"
        item = requirements["items"]
        assert item["required"] == ["key", "operator"]
        assert set(item["properties"]) == {"key", "operator", "values"}
        assert item["properties"]["values"]["x-kubernetes-list-type"] == "atomic"


@pytest.mark.parametrize("plural", sorted(KINDS))
def test_status_schema(plural: str) -> None:
    status = schema(load(plural))["properties"]["status"]
    assert status["required"] == ["state"]
    assert set(status["properties"]) == {
        "cache",
        "conditions",
        "lastReconcileTime",
        "lifecycle",
        "nodesEvicted",
        "nodesFailed",
        "nodesReady",
        "observedGeneration",
        "state",
    }
    assert status["properties"]["state"]["enum"] == [
        "Creating",
        "Importing",
        "In_Transit",
        "In_Training",
        "Ready",
        "Failed",
        "Evicted",
    ]
    for name in ("nodesReady", "nodesFailed", "nodesEvicted"):
        assert status["properties"][name]["x-kubernetes-list-type"] == "atomic"
    conditions = status["properties"]["conditions"]
    assert (conditions["x-kubernetes-list-type"], conditions["x-kubernetes-list-map-keys"]) == ("map", ["type"])
    assert set(conditions["items"]["required"]) == {"lastTransitionTime", "message", "reason", "status", "type"}
    assert set(status["properties"]["cache"]["properties"]) == {"backend", "sourceUri"}


@pytest.mark.parametrize("plural", sorted(KINDS))
def test_schema_is_structural(plural: str) -> None:
    # every node says its type, except the preserve-unknown-fields object which still says object
    for path, node in walk_schemas(schema(load(plural))):
        assert "type" in node, path
        if node["type"] == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "properties" in node or "additionalProperties" in node or path == ".metadata", path


def test_the_two_crds_differ_only_in_names_kind_and_scope() -> None:
    base, cluster = load("basemodels"), load("clusterbasemodels")
    assert schema(base) == schema(cluster)
    assert version(base) == version(cluster)
    for doc in (base, cluster):
        doc["metadata"].pop("name")
        doc["spec"].pop("names")
        doc["spec"].pop("scope")
    assert base == cluster
