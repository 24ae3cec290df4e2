"""Node selection (docs/ome-compatibility.md#32-the-match-function, with Kubernetes semantics) and instance-shape
aliases (docs/ome-compatibility.md#31-node-facts)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_agent.model.resources import StorageSpec
from model_agent.model.selection import (
    DEFAULT_INSTANCE_TYPE_MAP,
    instance_shape_alias,
    node_selected,
    parse_instance_type_map,
)

NODE = "gpu-node-1"
LABELS = {
    "node.kubernetes.io/instance-type": "BM.GPU.H100.8",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "gpu-count": "8",
    "zone": "a",
}


def storage(
    uri: str = "hf://org/model",
    selector: dict[str, str] | None = None,
    terms: list[dict[str, Any]] | None = None,
    affinity: dict[str, Any] | None = None,
) -> StorageSpec:
    raw: dict[str, Any] = {"storageUri": uri}
    if selector is not None:
        raw["nodeSelector"] = selector
    if terms is not None:
        raw["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    if affinity is not None:
        raw["nodeAffinity"] = affinity
    return StorageSpec.model_validate(raw)


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


def selected(spec: StorageSpec, labels: dict[str, str] = LABELS, name: str = NODE) -> bool:
    return node_selected(spec, labels, name)


class TestBasics:
    def test_no_constraints_selects(self) -> None:
        assert selected(storage())

    def test_pvc_is_never_selected(self) -> None:
        assert not selected(storage("pvc://claim/models"))
        assert not selected(storage("pvc://claim/models", selector={"zone": "a"}))

    def test_unknown_scheme_is_still_placed(self) -> None:
        assert selected(storage("ftp://x"))

    def test_node_selector_exact_match(self) -> None:
        assert selected(storage(selector={"zone": "a", "gpu-count": "8"}))
        assert not selected(storage(selector={"zone": "b"}))
        assert not selected(storage(selector={"missing": ""}))
        assert selected(storage(selector={}))

    def test_preferred_terms_are_ignored(self) -> None:
        affinity = {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": expr("zone", "In", "b")}]
        }
        assert selected(storage(affinity=affinity))

    def test_selector_and_affinity_both_apply(self) -> None:
        assert not selected(storage(selector={"zone": "b"}, terms=[expr("zone", "In", "a")]))
        assert selected(storage(selector={"zone": "a"}, terms=[expr("zone", "In", "a")]))


class TestTerms:
    def test_any_term_may_match(self) -> None:
        assert selected(storage(terms=[expr("zone", "In", "b"), expr("zone", "In", "a")]))
        assert not selected(storage(terms=[expr("zone", "In", "b"), expr("zone", "In", "c")]))

    def test_all_expressions_of_a_term_must_match(self) -> None:
        term = {
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]},
                {"key": "gpu-count", "operator": "In", "values": ["4"]},
            ]
        }
        assert not selected(storage(terms=[term]))

    def test_empty_term_matches_nothing(self) -> None:  # OME: everything
        assert not selected(storage(terms=[{}]))
        assert not selected(storage(terms=[{"matchExpressions": [], "matchFields": []}]))
        assert selected(storage(terms=[{}, expr("zone", "In", "a")]))

    def test_zero_terms_match_nothing(self) -> None:  # OME: constraint ignored
        assert not selected(storage(terms=[]))
        assert selected(storage(affinity={}))
        assert selected(storage(affinity={"requiredDuringSchedulingIgnoredDuringExecution": None}))

    @pytest.mark.parametrize(
        ("term", "expected"),
        [
            (expr("zone", "In", "a", "b"), True),
            (expr("zone", "In", "b"), False),
            (expr("missing", "In", "a"), False),
            (expr("zone", "NotIn", "b"), True),
            (expr("zone", "NotIn", "a"), False),
            (expr("missing", "NotIn", "a"), True),  # OME: false
            (expr("zone", "Exists"), True),
            (expr("missing", "Exists"), False),
            (expr("zone", "DoesNotExist"), False),
            (expr("missing", "DoesNotExist"), True),
            (expr("gpu-count", "Gt", "4"), True),
            (expr("gpu-count", "Gt", "8"), False),
            (expr("gpu-count", "Lt", "10"), True),  # numeric: a string comparison would say "8" > "10"
            (expr("gpu-count", "Lt", "8"), False),
            (expr("zone", "Gt", "1"), False),  # label not an integer; OME compares strings
            (expr("gpu-count", "Gt", "x"), False),  # bound not an integer
            (expr("gpu-count", "Gt", "1", "2"), False),  # exactly one value
            (expr("gpu-count", "Gt"), False),
            (expr("missing", "Gt", "1"), False),
            (expr("gpu-count", "Gt", "99999999999999999999"), False),  # beyond int64
            (expr("zone", "In"), False),  # In needs values
            (expr("missing", "NotIn"), False),  # NotIn needs values
            (expr("zone", "Exists", "a"), False),  # Exists takes no values
            (expr("missing", "DoesNotExist", "a"), False),
            (expr("zone", "Equals", "a"), False),  # unknown operator
            (expr("bad key!", "DoesNotExist"), False),  # invalid label key
            (expr("zone", "NotIn", "not a label value"), False),  # invalid label value
            (expr("example.com/zone", "DoesNotExist"), True),
            (expr("Example.com/zone", "DoesNotExist"), False),  # prefix must be a lowercase DNS subdomain
            (expr("metadata.name", "In", NODE), False),  # expressions never read the node name (OME: true)
        ],
    )
    def test_expression_operators(self, term: dict[str, Any], expected: bool) -> None:
        assert selected(storage(terms=[term])) is expected

    @pytest.mark.parametrize(
        ("requirement", "expected"),
        [
            ({"key": "metadata.name", "operator": "In", "values": [NODE]}, True),
            ({"key": "metadata.name", "operator": "In", "values": ["other"]}, False),
            ({"key": "metadata.name", "operator": "NotIn", "values": ["other"]}, True),
            ({"key": "metadata.name", "operator": "NotIn", "values": [NODE]}, False),
            ({"key": "metadata.name", "operator": "In", "values": [NODE, "other"]}, False),  # one value only
            ({"key": "metadata.name", "operator": "Exists", "values": []}, False),
            ({"key": "metadata.uid", "operator": "In", "values": ["x"]}, False),
            ({"key": "zone", "operator": "In", "values": ["a"]}, False),  # fields are not labels
        ],
    )
    def test_match_fields(self, requirement: dict[str, Any], expected: bool) -> None:
        assert selected(storage(terms=[{"matchFields": [requirement]}])) is expected

    def test_fields_and_expressions_combine(self) -> None:
        term = {
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["other"]}],
        }
        assert not selected(storage(terms=[term]))

    def test_invalid_term_does_not_spoil_the_others(self) -> None:
        assert selected(storage(terms=[expr("zone", "Bogus", "a"), expr("zone", "In", "a")]))


class TestInstanceTypes:
    def test_alias_from_default_map(self) -> None:
        assert instance_shape_alias(LABELS, DEFAULT_INSTANCE_TYPE_MAP) == "H100"

    def test_unknown_type_maps_to_itself(self) -> None:
        labels = {"node.kubernetes.io/instance-type": "VM.Standard.E4"}
        assert instance_shape_alias(labels, DEFAULT_INSTANCE_TYPE_MAP) == "VM.Standard.E4"

    def test_beta_label_only_when_the_ga_label_is_absent(self) -> None:
        beta = {"beta.kubernetes.io/instance-type": "p5.48xlarge"}
        assert instance_shape_alias(beta, DEFAULT_INSTANCE_TYPE_MAP) == "H100"
        both = {"node.kubernetes.io/instance-type": "", **beta}
        assert instance_shape_alias(both, DEFAULT_INSTANCE_TYPE_MAP) == ""
        assert instance_shape_alias({}, DEFAULT_INSTANCE_TYPE_MAP) == ""

    def test_default_map_contents(self) -> None:
        assert len(DEFAULT_INSTANCE_TYPE_MAP) == 19
        assert DEFAULT_INSTANCE_TYPE_MAP["BM.GPU.A100-v2.8"] == "A100-80G"
        assert DEFAULT_INSTANCE_TYPE_MAP["gpu-l40s"] == "L40S"
        assert DEFAULT_INSTANCE_TYPE_MAP["gd-8xl40-i128"] == "L40"

    @pytest.mark.parametrize("raw", [None, "", "{}", "null", " {} "])
    def test_parse_defaults(self, raw: str | None) -> None:
        assert parse_instance_type_map(raw) is DEFAULT_INSTANCE_TYPE_MAP

    def test_parse_custom(self) -> None:
        parsed = parse_instance_type_map('{"my-shape": "H100", "other": "B200"}')
        assert dict(parsed) == {"my-shape": "H100", "other": "B200"}
        assert instance_shape_alias({"node.kubernetes.io/instance-type": "BM.GPU.H100.8"}, parsed) == "BM.GPU.H100.8"

    @pytest.mark.parametrize("raw", ["{", "[]", '"x"', "1", '{"a": 1}', '{"a": null}', "  "])
    def test_parse_invalid(self, raw: str) -> None:
        with pytest.raises(ValueError, match="INSTANCE_TYPE_MAP"):
            parse_instance_type_map(raw)


_label_key = st.sampled_from(["zone", "gpu-count", "missing", "example.com/x", "bad key"])
_value = st.sampled_from(["a", "b", "8", "10", "-1", "", "x y"])
_requirement = st.fixed_dictionaries(
    {
        "key": _label_key | st.just("metadata.name"),
        "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Other"]),
        "values": st.lists(_value | st.just(NODE), max_size=3),
    }
)
_term = st.fixed_dictionaries(
    {},
    optional={
        "matchExpressions": st.lists(_requirement, max_size=3),
        "matchFields": st.lists(_requirement, max_size=2),
    },
)


@settings(max_examples=200, deadline=None)
@given(terms=st.lists(_term, max_size=3), labels=st.dictionaries(_label_key, _value, max_size=4))
def test_terms_are_an_or_of_ands(terms: list[dict[str, Any]], labels: dict[str, str]) -> None:
    whole = selected(storage(terms=terms), labels)
    each = [selected(storage(terms=[t]), labels) for t in terms]
    assert whole == any(each)
