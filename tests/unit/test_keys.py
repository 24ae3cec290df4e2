"""Label keys, ConfigMap keys and related names (docs/ome-compatibility.md#51-label-keys, 5.3, 6.1, 6.2)."""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_agent.model.keys import (
    MODEL_LABEL_NAME_MAX,
    ModelKind,
    ModelState,
    ParsedConfigMapKey,
    configmap_annotations,
    configmap_key,
    configmap_labels,
    json_pointer_escape,
    node_label_key,
    node_label_patch_path,
    parse_configmap_key,
    trunc,
)

CBM = ModelKind.CLUSTER_BASE_MODEL
BM = ModelKind.BASE_MODEL

# docs/ome-compatibility.md#51-label-keys, produced by compiling OME's Go functions verbatim.
LABEL_GOLDEN = [
    (CBM, "", "llama-3-70b-instruct", "models.ome.io/clusterbasemodel.llama-3-70b-instruct"),
    (
        CBM,
        "",
        "abcdefghijabcdefghijabcdefghij12",
        "models.ome.io/clusterbasemodel.abcdefghijabcdefghijabcdefghij12",
    ),
    (
        CBM,
        "",
        "abcdefghijabcdefghijabcdefghij123",
        "models.ome.io/clusterbasemodel.88c644f7-abcdefghijabcdefghij123",
    ),
    (
        CBM,
        "",
        "deepseek-r1-distill-qwen-32b-instruct-fp8",
        "models.ome.io/clusterbasemodel.918b9325-l-qwen-32b-instruct-fp8",
    ),
    (BM, "team-a", "llama-3-8b", "models.ome.io/team-a.basemodel.llama-3-8b"),
    (
        BM,
        "research-team",
        "qwen2-5-72b-instruct",
        "models.ome.io/research-team.basemodel.qwen2-5-72b-instruct",
    ),
    (
        BM,
        "default",
        "meta-llama-3-1-70b-instruct-awq-int4",
        "models.ome.io/default.basemodel.6db1c435--70b-instruct-awq-int4",
    ),
    (
        BM,
        "very-long-namespace-name",
        "mistral-7b-instruct-v0-3",
        "models.ome.io/2a1e5a1f.basemodel.mistral-7b-instruct-v0-3",
    ),
]


@pytest.mark.parametrize(("kind", "namespace", "name", "expected"), LABEL_GOLDEN)
def test_label_key_golden_vectors(kind: ModelKind, namespace: str, name: str, expected: str) -> None:
    assert node_label_key(kind, namespace, name) == expected


def test_label_key_accepts_plain_kind_strings() -> None:
    assert node_label_key("BaseModel", "team-a", "llama-3-8b") == "models.ome.io/team-a.basemodel.llama-3-8b"
    assert node_label_key("ClusterBaseModel", "ignored", "x") == "models.ome.io/clusterbasemodel.x"


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError):
        node_label_key("Pod", "a", "b")
    with pytest.raises(ValueError):
        configmap_key("Pod", "a", "b")


def _hash8(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[:8]


class TestTrunc:
    def test_fits_unchanged(self) -> None:
        assert trunc("abc", 3) == "abc"
        assert trunc("", 0) == ""

    def test_hash_and_tail(self) -> None:
        s = "abcdefghijklmnopqrstuvwxyz"
        assert trunc(s, 20) == _hash8(s) + "-" + s[-11:]
        assert len(trunc(s, 20)) == 20

    def test_budget_without_room_for_a_tail(self) -> None:
        s = "a-long-namespace"
        assert trunc(s, 9) == _hash8(s)[:9] == _hash8(s)  # 9 - 9 = 0: hash only (8 chars)
        assert trunc(s, 8) == _hash8(s)
        assert trunc(s, 5) == _hash8(s)[:5]
        assert trunc(s, 10) == _hash8(s) + "-" + s[-1:]

    def test_byte_lengths(self) -> None:
        # Three 2-byte characters are 6 bytes: they do not fit in 5.
        s = "ééé"
        out = trunc(s, 5)
        assert out == _hash8(s)[:5]
        # A tail cut inside a character drops that character instead of producing invalid text.
        s2 = "aé" * 10  # 30 bytes
        out2 = trunc(s2, 12)  # tail of 3 bytes: "\xa9" + "aé" -> "aé"
        assert out2 == _hash8(s2) + "-aé"
        assert len(out2.encode()) <= 12


class TestConfigMapKeys:
    def test_cluster_and_namespaced(self) -> None:
        assert configmap_key(CBM, "", "qwen3-8b") == "clusterbasemodel.qwen3-8b"
        assert configmap_key(BM, "team-a", "llama-3-8b") == "team-a.basemodel.llama-3-8b"

    def test_cluster_truncation_at_236(self) -> None:
        name = "a" * 236
        assert configmap_key(CBM, "", name) == "clusterbasemodel." + name
        long_name = "b" * 237
        key = configmap_key(CBM, "", long_name)
        assert key == "clusterbasemodel." + _hash8(long_name) + "-" + "b" * 227
        assert len(key) == 253

    def test_namespaced_truncation_splits_namespace_first(self) -> None:
        ns = "n" * 20
        name = "m" * 240  # 260 > 242: namespace longer than 8 -> hash8, name budget 234
        key = configmap_key(BM, ns, name)
        assert key == _hash8(ns) + ".basemodel." + _hash8(name) + "-" + "m" * 225
        assert len(key) == 253
        short_ns = "ns"
        key2 = configmap_key(BM, short_ns, "x" * 241)  # 243 > 242: name budget 240
        assert key2 == "ns.basemodel." + trunc("x" * 241, 240)
        assert len(key2) == 253

    def test_parse(self) -> None:
        assert parse_configmap_key("clusterbasemodel.qwen3-8b") == ParsedConfigMapKey(CBM, "", "qwen3-8b")
        assert parse_configmap_key("team-a.basemodel.llama") == ParsedConfigMapKey(BM, "team-a", "llama")
        # Split on the first ".basemodel.": names may contain dots.
        assert parse_configmap_key("ns.basemodel.a.basemodel.b") == ParsedConfigMapKey(BM, "ns", "a.basemodel.b")
        assert parse_configmap_key("clusterbasemodel.a.basemodel.b") == ParsedConfigMapKey(CBM, "", "a.basemodel.b")

    @pytest.mark.parametrize(
        "key", ["", "clusterbasemodel.", "clusterbasemodel", "random", ".basemodel.x", "ns.basemodel.", "a.b"]
    )
    def test_parse_rejects(self, key: str) -> None:
        assert parse_configmap_key(key) is None

    def test_known_ambiguity_namespace_named_clusterbasemodel(self) -> None:
        key = configmap_key(BM, "clusterbasemodel", "x")
        assert parse_configmap_key(key) == ParsedConfigMapKey(CBM, "", "basemodel.x")


class TestNamesAndPatchPaths:
    def test_patch_path_matches_ome(self) -> None:
        key = "models.ome.io/clusterbasemodel.qwen3-8b"
        assert node_label_patch_path(key) == "/metadata/labels/models.ome.io~1clusterbasemodel.qwen3-8b"

    def test_pointer_escape_order(self) -> None:
        assert json_pointer_escape("a~1/b") == "a~01~1b"
        assert json_pointer_escape("plain") == "plain"

    def test_configmap_identity(self) -> None:
        assert configmap_labels("node-1") == {"models.ome/basemodel-status": "true", "node": "node-1"}
        assert configmap_annotations("node-1") == {
            "models.ome.io/node-name": "node-1",
            "models.ome.io/managed-by": "model-agent",
        }

    def test_state_values(self) -> None:
        assert [s.value for s in ModelState] == ["Ready", "Updating", "Failed"]
        assert f"{ModelState.READY}" == "Ready"


# --- properties -----------------------------------------------------------------------------------------

_LABEL_NAME_RE = re.compile(r"[a-z0-9A-Z](?:[-a-zA-Z0-9_.]*[a-zA-Z0-9])?")
_dns_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
namespaces = _dns_label
names = st.lists(_dns_label, min_size=1, max_size=5).map(".".join).filter(lambda s: len(s) <= 253)


@settings(max_examples=200, deadline=None)
@given(namespace=namespaces, name=names)
def test_label_keys_are_valid_and_within_budget(namespace: str, name: str) -> None:
    for kind in ModelKind:
        key = node_label_key(kind, namespace, name)
        domain, _, part = key.partition("/")
        assert domain == "models.ome.io"
        assert len(part) <= MODEL_LABEL_NAME_MAX
        assert _LABEL_NAME_RE.fullmatch(part), part


@settings(max_examples=200, deadline=None)
@given(namespace=namespaces, name=names)
def test_configmap_keys_round_trip_when_not_truncated(namespace: str, name: str) -> None:
    if len(name) <= 236:
        assert parse_configmap_key(configmap_key(CBM, "", name)) == (CBM, "", name)
    if len(namespace) + len(name) <= 242 and namespace != "clusterbasemodel":
        assert parse_configmap_key(configmap_key(BM, namespace, name)) == (BM, namespace, name)
    assert len(configmap_key(BM, namespace, name)) <= 253
