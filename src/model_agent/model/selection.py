"""Which models belong on this node (docs/ome-compatibility.md#32-the-match-function), and the node's instance-shape
alias (docs/ome-compatibility.md#31-node-facts).

Role: pure functions over a model's :class:`StorageSpec` and the node's labels and name. The
reconciler evaluates :func:`node_selected` against the live, watched Node on every pass, so a relabelled
node (de)selects models — which OME never did.

Contract of :func:`node_selected`, in order:

1. a ``pvc://`` model is never selected (PVC models are the controller's business);
2. every ``nodeSelector`` entry must be a node label with exactly that value;
3. if ``nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`` is present, at least one of its
   ``nodeSelectorTerms`` must match; ``preferredDuringScheduling...`` is ignored;
4. otherwise the model is selected.

Terms are evaluated with Kubernetes' own semantics (``k8s.io/component-helpers`` nodeaffinity, the
scheduler's), so the agent places weights where the scheduler would place pods with the same rules.
Where OME's hand-written matcher differs, we follow Kubernetes:

* an empty term (no expressions, no fields) matches nothing — OME: matches everything;
* a present ``required`` selector with zero terms matches nothing — OME: ignored (matches everything);
* a missing label satisfies ``NotIn`` (and ``DoesNotExist``) — OME: only ``DoesNotExist``;
* ``Gt``/``Lt`` need exactly one value that is a base-10 int64, compared with the label parsed as an
  int64; anything else does not match — OME: falls back to a string comparison;
* a requirement that Kubernetes would reject — invalid label key or value, ``In``/``NotIn`` without
  values, ``Exists``/``DoesNotExist`` with values, an unknown operator — makes its term match nothing
  (other terms still count) — OME: only the unknown operator fails;
* ``matchFields`` supports only key ``metadata.name`` with ``In``/``NotIn`` and exactly one value, and
  ``matchExpressions`` never consult the node name — OME: uses the node name for any ``metadata.name``
  key, in both lists, with any operator.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from model_agent.model.resources import NodeSelectorRequirement, NodeSelectorTerm, StorageSpec
from model_agent.model.uris import InvalidStorageUri, StorageType, storage_type

INSTANCE_TYPE_LABEL: Final = "node.kubernetes.io/instance-type"
DEPRECATED_INSTANCE_TYPE_LABEL: Final = "beta.kubernetes.io/instance-type"
INSTANCE_TYPE_MAP_ENV: Final = "INSTANCE_TYPE_MAP"

# OME's built-in map (also shipped in ConfigMap model-agent-config-map, key instance-type-map).
DEFAULT_INSTANCE_TYPE_MAP: Final[Mapping[str, str]] = MappingProxyType(
    {
        # Oracle Cloud
        "BM.GPU.A10.4": "A10",
        "BM.GPU.A100-v2.8": "A100-80G",
        "BM.GPU4.8": "A100-40G",
        "BM.GPU.B4.8": "A100-40G",
        "BM.GPU.H100.8": "H100",
        "BM.GPU.H100-NC.8": "H100",
        "BM.GPU.H200.8": "H200",
        "BM.GPU.H200-NC.8": "H200",
        "BM.GPU.B200.8": "B200",
        # AWS, Azure, Google Cloud
        "p5.48xlarge": "H100",
        "Standard_ND96isr_H100_v5": "H100",
        "a3-highgpu-8g": "H100",
        # CoreWeave
        "gd-8xh100ib-i128": "H100",
        "gd-8xh200ib-i128": "H200",
        "gd-8xl40-i128": "L40",
        # Nebius
        "gpu-h100-sxm": "H100",
        "gpu-h200-sxm": "H200",
        "gpu-b200-sxm": "B200",
        "gpu-l40s": "L40S",
    }
)

_NODE_NAME_FIELD: Final = "metadata.name"
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_DECIMAL_INT: Final = re.compile(r"[+-]?[0-9]+")
# Kubernetes' qualified-name and label-value syntax (apimachinery validation).
_NAME_PART: Final = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS1123_SUBDOMAIN: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
_NAME_PART_MAX: Final = 63
_PREFIX_MAX: Final = 253


def node_selected(storage: StorageSpec, node_labels: Mapping[str, str], node_name: str) -> bool:
    """Whether the model with this storage spec belongs on the node (see the module docstring)."""
    try:
        if storage_type(storage.storage_uri) is StorageType.PVC:
            return False
    except InvalidStorageUri:
        pass  # an unusable URI is reported by the reconciler; selection is about placement only
    for key, wanted in storage.node_selector.items():
        if node_labels.get(key) != wanted:
            return False
    affinity = storage.node_affinity
    if affinity is None or affinity.required is None:
        return True
    return any(_term_matches(term, node_labels, node_name) for term in affinity.required.node_selector_terms)


def parse_instance_type_map(raw: str | None) -> Mapping[str, str]:
    """Parse ``INSTANCE_TYPE_MAP`` (JSON object of instance type -> short name).

    Unset, ``""``, ``null`` or ``{}`` give the built-in default; invalid JSON, a non-object or a
    non-string value raise ``ValueError`` (the agent refuses to start, as OME does).
    """
    if not raw:
        return DEFAULT_INSTANCE_TYPE_MAP
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{INSTANCE_TYPE_MAP_ENV} is not valid JSON: {exc}") from None
    if parsed is None:
        return DEFAULT_INSTANCE_TYPE_MAP
    if not isinstance(parsed, dict):
        raise ValueError(f"{INSTANCE_TYPE_MAP_ENV} must be a JSON object of strings")
    if not all(isinstance(value, str) for value in parsed.values()):
        raise ValueError(f"{INSTANCE_TYPE_MAP_ENV} values must be strings")
    if not parsed:
        return DEFAULT_INSTANCE_TYPE_MAP
    return MappingProxyType(dict(parsed))


def instance_shape_alias(labels: Mapping[str, str], instance_type_map: Mapping[str, str]) -> str:
    """The node's shape alias: its instance type mapped through the map, or the type itself if unknown.

    The instance type is ``node.kubernetes.io/instance-type``, or the deprecated
    ``beta.kubernetes.io/instance-type`` when the first label is absent (not merely empty); ``""`` if
    neither is present.
    """
    if INSTANCE_TYPE_LABEL in labels:
        instance_type = labels[INSTANCE_TYPE_LABEL]
    else:
        instance_type = labels.get(DEPRECATED_INSTANCE_TYPE_LABEL, "")
    return instance_type_map.get(instance_type, instance_type)


# --- term evaluation ------------------------------------------------------------------------------------


def _term_matches(term: NodeSelectorTerm, labels: Mapping[str, str], node_name: str) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False
    return all(_label_requirement_matches(r, labels) for r in term.match_expressions) and all(
        _field_requirement_matches(r, node_name) for r in term.match_fields
    )


def _label_requirement_matches(req: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """``labels.Requirement`` semantics; a requirement Kubernetes would reject matches nothing."""
    if not _is_qualified_name(req.key) or not all(_is_label_value(v) for v in req.values):
        return False
    present = req.key in labels
    value = labels.get(req.key, "")
    match req.operator:
        case "In":
            return bool(req.values) and present and value in req.values
        case "NotIn":
            return bool(req.values) and (not present or value not in req.values)
        case "Exists":
            return not req.values and present
        case "DoesNotExist":
            return not req.values and not present
        case "Gt" | "Lt":
            if len(req.values) != 1:
                return False
            bound = _parse_int64(req.values[0])
            actual = _parse_int64(value) if present else None
            if bound is None or actual is None:
                return False
            return actual > bound if req.operator == "Gt" else actual < bound
        case _:
            return False


def _field_requirement_matches(req: NodeSelectorRequirement, node_name: str) -> bool:
    """Field selectors on nodes: only ``metadata.name`` with ``In``/``NotIn`` and one value."""
    if req.key != _NODE_NAME_FIELD or len(req.values) != 1:
        return False
    if req.operator == "In":
        return node_name == req.values[0]
    if req.operator == "NotIn":
        return node_name != req.values[0]
    return False


def _parse_int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``; ``None`` where Go returns an error."""
    if not _DECIMAL_INT.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _is_qualified_name(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > _PREFIX_MAX or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= _NAME_PART_MAX and bool(_NAME_PART.fullmatch(name))


def _is_label_value(value: str) -> bool:
    return value == "" or (len(value) <= _NAME_PART_MAX and bool(_NAME_PART.fullmatch(value)))
