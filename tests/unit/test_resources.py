"""Views of BaseModel / ClusterBaseModel objects (docs/ome-compatibility.md#12-spec-fields (to 1.6))."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from model_agent.model.resources import (
    DownloadPolicy,
    InvalidModel,
    ModelKind,
    ModelObject,
    ModelRef,
    StorageSpec,
    effective_download_policy,
    reserve_artifact,
    skip_config_parsing,
)

# The three examples of docs/ome-compatibility.md#16-minimal-valid-examples.
CLUSTER_HF = """
apiVersion: ome.io/v1beta1
kind: ClusterBaseModel
metadata:
  name: qwen3-8b
spec:
  storage:
    storageUri: hf://Qwen/Qwen3-8B
    path: /mnt/data/models/Qwen/Qwen3-8B
"""

NAMESPACED_OCI = """
apiVersion: ome.io/v1beta1
kind: BaseModel
metadata:
  name: llama-3-1-8b-instruct
  namespace: team-a
spec:
  storage:
    storageUri: oci://n/mytenancy/b/models/o/meta/llama-3.1-8b-instruct
    path: /mnt/data/models/team-a/llama-3.1-8b-instruct
    parameters:
      auth: InstancePrincipal
      region: us-ashburn-1
"""

EVERYTHING = """
apiVersion: ome.io/v1beta1
kind: BaseModel
metadata:
  name: private-llm
  namespace: team-b
  uid: 0b0e3c5e-1111-2222-3333-444455556666
  resourceVersion: "12345"
  generation: 3
  labels:
    models.ome/reserve-model-artifact: "true"
  annotations:
    ome.oracle.com/skip-config-parsing: "false"
spec:
  displayName: Private LLM
  version: "1.2"
  disabled: true
  modelConfiguration: {a: 1}
  modelFormat:
    name: safetensors
    weight: 1
  additionalMetadata:
    type: Serving
  storage:
    storageUri: hf://my-org/private-llm@v1.2
    path: /mnt/data/models/team-b/private-llm
    schemaPath: /schema
    key: hf-credentials
    parameters:
      secretKey: access-token
    downloadPolicy: ReuseIfExists
    nodeSelector:
      nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - {key: node.kubernetes.io/instance-type, operator: In, values: [BM.GPU.H100.8]}
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 1
        preference: {matchExpressions: [{key: a, operator: Exists}]}
"""


def _load(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


class TestExamples:
    def test_cluster_hf(self) -> None:
        obj = ModelObject.from_dict("ClusterBaseModel", _load(CLUSTER_HF))
        assert obj.kind is ModelKind.CLUSTER_BASE_MODEL
        assert obj.metadata.name == "qwen3-8b"
        assert obj.metadata.namespace == ""
        assert obj.spec.storage.storage_uri == "hf://Qwen/Qwen3-8B"
        assert obj.spec.storage.path == "/mnt/data/models/Qwen/Qwen3-8B"
        assert obj.spec.storage.parameters == {}
        assert obj.spec.storage.node_selector == {}
        assert obj.spec.storage.node_affinity is None
        assert obj.ref == ModelRef(ModelKind.CLUSTER_BASE_MODEL, "", "qwen3-8b")
        assert obj.ref.key == "ClusterBaseModel//qwen3-8b"
        assert obj.ref.label_key == "models.ome.io/clusterbasemodel.qwen3-8b"
        assert obj.ref.configmap_key == "clusterbasemodel.qwen3-8b"
        assert not obj.deleting
        assert effective_download_policy(obj.spec.storage) is DownloadPolicy.ALWAYS_DOWNLOAD

    def test_namespaced_oci(self) -> None:
        obj = ModelObject.from_dict(ModelKind.BASE_MODEL, _load(NAMESPACED_OCI))
        assert obj.ref.key == "BaseModel/team-a/llama-3-1-8b-instruct"
        assert obj.ref.label_key == "models.ome.io/team-a.basemodel.llama-3-1-8b-instruct"
        assert obj.ref.configmap_key == "team-a.basemodel.llama-3-1-8b-instruct"
        assert obj.spec.storage.parameters == {"auth": "InstancePrincipal", "region": "us-ashburn-1"}

    def test_everything(self) -> None:
        obj = ModelObject.from_dict("BaseModel", _load(EVERYTHING))
        meta = obj.metadata
        assert (meta.uid, meta.resource_version, meta.generation) == (
            "0b0e3c5e-1111-2222-3333-444455556666",
            "12345",
            3,
        )
        storage = obj.spec.storage
        assert storage.key == "hf-credentials"
        assert storage.schema_path == "/schema"
        assert storage.parameters == {"secretKey": "access-token"}
        assert storage.download_policy is DownloadPolicy.REUSE_IF_EXISTS
        assert effective_download_policy(storage) is DownloadPolicy.REUSE_IF_EXISTS
        assert storage.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert storage.node_affinity is not None and storage.node_affinity.required is not None
        (term,) = storage.node_affinity.required.node_selector_terms
        (req,) = term.match_expressions
        assert (req.key, req.operator, req.values) == (
            "node.kubernetes.io/instance-type",
            "In",
            ["BM.GPU.H100.8"],
        )
        assert term.match_fields == []
        assert obj.spec.model_format is not None and obj.spec.model_format.name == "safetensors"
        assert obj.spec.additional_metadata == {"type": "Serving"}
        assert obj.spec.display_name == "Private LLM"
        assert reserve_artifact(obj)
        assert not skip_config_parsing(obj)


class TestHelpers:
    @pytest.mark.parametrize(("value", "expected"), [("true", True), ("TRUE", True), ("True", True), ("yes", False)])
    def test_reserve_and_skip_are_case_insensitive(self, value: str, expected: bool) -> None:
        raw = _load(CLUSTER_HF)
        raw["metadata"]["labels"] = {"models.ome/reserve-model-artifact": value}
        raw["metadata"]["annotations"] = {"ome.oracle.com/skip-config-parsing": value}
        obj = ModelObject.from_dict("ClusterBaseModel", raw)
        assert reserve_artifact(obj) is expected
        assert skip_config_parsing(obj) is expected

    def test_docs_annotation_has_no_effect(self) -> None:
        raw = _load(CLUSTER_HF)
        raw["metadata"]["annotations"] = {"ome.io/skip-config-parsing": "true"}
        assert not skip_config_parsing(ModelObject.from_dict("ClusterBaseModel", raw))

    def test_deletion_timestamp(self) -> None:
        raw = _load(CLUSTER_HF)
        raw["metadata"]["deletionTimestamp"] = "2026-05-01T12:00:00Z"
        obj = ModelObject.from_dict("ClusterBaseModel", raw)
        assert obj.deleting
        assert obj.metadata.deletion_timestamp == datetime(2026, 5, 1, 12, tzinfo=UTC)

    def test_snake_case_names_are_accepted(self) -> None:
        storage = StorageSpec.model_validate({"storage_uri": "hf://a/b", "download_policy": "AlwaysDownload"})
        assert storage.storage_uri == "hf://a/b"
        assert storage.download_policy is DownloadPolicy.ALWAYS_DOWNLOAD

    def test_cluster_namespace_is_dropped(self) -> None:
        raw = _load(CLUSTER_HF)
        raw["metadata"]["namespace"] = "oops"
        assert ModelObject.from_dict("ClusterBaseModel", raw).metadata.namespace == ""

    def test_nulls_mean_absent(self) -> None:
        raw = _load(NAMESPACED_OCI)
        raw["metadata"]["labels"] = None
        raw["spec"]["storage"]["parameters"] = None
        raw["spec"]["storage"]["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": None}
        obj = ModelObject.from_dict("BaseModel", raw)
        assert obj.metadata.labels == {}
        assert obj.spec.storage.parameters == {}
        assert obj.spec.storage.node_affinity is not None
        assert obj.spec.storage.node_affinity.required is None

    def test_path_absent_versus_empty(self) -> None:
        raw = _load(CLUSTER_HF)
        del raw["spec"]["storage"]["path"]
        assert ModelObject.from_dict("ClusterBaseModel", raw).spec.storage.path is None
        raw["spec"]["storage"]["path"] = ""
        assert ModelObject.from_dict("ClusterBaseModel", raw).spec.storage.path == ""

    def test_view_is_frozen(self) -> None:
        obj = ModelObject.from_dict("ClusterBaseModel", _load(CLUSTER_HF))
        with pytest.raises(ValueError):
            obj.metadata.name = "other"  # type: ignore[misc]


class TestInvalid:
    def _mutated(self, path: list[str], value: Any) -> dict[str, Any]:
        raw = _load(EVERYTHING)
        node = raw
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value  # None: an explicit null means "absent"
        return raw

    @pytest.mark.parametrize(
        ("path", "value", "reason"),
        [
            (["spec"], None, "spec.storage is missing"),
            (["spec", "storage"], None, "spec.storage is missing"),
            (["spec", "storage", "storageUri"], None, "spec.storage.storageUri: Field required"),
            (["spec", "storage", "storageUri"], 5, "spec.storage.storageUri: Input should be a valid string"),
            (["spec", "storage", "parameters"], {"auth": 1}, "spec.storage.parameters.auth"),
            (["spec", "storage", "parameters"], ["a"], "spec.storage.parameters"),
            (["spec", "storage", "nodeSelector"], "gpu", "spec.storage.nodeSelector"),
            (["spec", "storage", "downloadPolicy"], "Sometimes", "spec.storage.downloadPolicy"),
            (
                ["spec", "storage", "nodeAffinity"],
                {"requiredDuringSchedulingIgnoredDuringExecution": []},
                "spec",
            ),
            (["metadata", "name"], None, "metadata.name: Field required"),
            (["metadata", "generation"], "3", "metadata.generation"),
            (["metadata", "generation"], True, "metadata.generation"),
            (["metadata", "labels"], {"a": 1}, "metadata.labels.a"),
            (["metadata", "namespace"], None, "a BaseModel needs metadata.namespace"),
            (["metadata", "namespace"], "", "a BaseModel needs metadata.namespace"),
            (["metadata", "deletionTimestamp"], "yesterday", "metadata.deletionTimestamp"),
            (["metadata"], None, "metadata is missing"),
        ],
    )
    def test_reasons(self, path: list[str], value: Any, reason: str) -> None:
        raw = self._mutated(path, value)
        with pytest.raises(InvalidModel) as info:
            ModelObject.from_dict("BaseModel", raw)
        assert reason in info.value.reason

    def test_empty_name(self) -> None:
        raw = _load(CLUSTER_HF)
        raw["metadata"]["name"] = ""
        with pytest.raises(InvalidModel, match=r"metadata\.name is empty"):
            ModelObject.from_dict("ClusterBaseModel", raw)

    @pytest.mark.parametrize("raw", [None, 1, "x", [], {"metadata": "x"}, {"metadata": {}, "spec": "x"}])
    def test_not_an_object(self, raw: Any) -> None:
        with pytest.raises(InvalidModel):
            ModelObject.from_dict("BaseModel", raw)

    def test_unknown_kind(self) -> None:
        with pytest.raises(InvalidModel, match="unknown model kind"):
            ModelObject.from_dict("Pod", _load(CLUSTER_HF))

    def test_many_errors_are_summarised(self) -> None:
        raw = _load(EVERYTHING)
        raw["metadata"]["labels"] = {str(i): i for i in range(10)}
        with pytest.raises(InvalidModel, match="and 7 more"):
            ModelObject.from_dict("BaseModel", raw)


class TestModelRef:
    def test_key_round_trip(self) -> None:
        for ref in (
            ModelRef(ModelKind.CLUSTER_BASE_MODEL, "", "qwen3-8b"),
            ModelRef(ModelKind.BASE_MODEL, "team-a", "llama.v1"),
        ):
            assert ModelRef.from_key(ref.key) == ref
            assert str(ref) == ref.key
            assert hash(ref) == hash(ModelRef.from_key(ref.key))

    @pytest.mark.parametrize(
        "key", ["", "BaseModel", "BaseModel/ns", "Pod/ns/x", "BaseModel//x", "ClusterBaseModel/ns/x"]
    )
    def test_bad_keys(self, key: str) -> None:
        with pytest.raises(ValueError):
            ModelRef.from_key(key)

    def test_refs_are_usable_as_dict_keys_and_sortable(self) -> None:
        a = ModelRef(ModelKind.BASE_MODEL, "a", "x")
        b = ModelRef(ModelKind.BASE_MODEL, "b", "x")
        assert {a: 1, b: 2}[ModelRef(ModelKind.BASE_MODEL, "a", "x")] == 1
        assert sorted([b, a]) == [a, b]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    raw=st.fixed_dictionaries(
        {},
        optional={
            "metadata": st.fixed_dictionaries({}, optional={"name": _json, "namespace": _json, "labels": _json}),
            "spec": st.fixed_dictionaries(
                {},
                optional={
                    "storage": st.fixed_dictionaries(
                        {}, optional={"storageUri": _json, "nodeAffinity": _json, "parameters": _json}
                    )
                    | _json
                },
            ),
        },
    )
    | _json
)
def test_from_dict_raises_only_invalid_model(raw: Any) -> None:
    for kind in ModelKind:
        try:
            ModelObject.from_dict(kind, raw)
        except InvalidModel as exc:
            assert exc.reason


@pytest.mark.parametrize(
    ("obj", "key"),
    [
        ({"kind": "ClusterBaseModel", "metadata": {"name": "m"}}, "ClusterBaseModel//m"),
        ({"kind": "BaseModel", "metadata": {"name": "m", "namespace": "team"}}, "BaseModel/team/m"),
        ({"kind": "Pod", "metadata": {"name": "m"}}, None),
        ({"kind": "BaseModel", "metadata": {}}, None),
        ({"kind": "BaseModel"}, None),
        ({"kind": "BaseModel", "metadata": "nonsense"}, None),
    ],
)
def test_model_ref_from_object(obj: dict[str, Any], key: str | None) -> None:
    if key is None:
        with pytest.raises(ValueError):
            ModelRef.from_object(obj)
    else:
        assert ModelRef.from_object(obj).key == key
