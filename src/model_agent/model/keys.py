"""Names the agent shares with OME: node label keys, ConfigMap keys and identity, label values.

Role: the single source of every string that another OME component reads back — the scheduler-side
node selector (``models.ome.io/...`` label keys), the OME controller (ConfigMap keys, the ConfigMap's
identifying label) and the web console. Everything here is pure and deterministic.

Contract:

* :func:`node_label_key` reproduces OME's label-key function byte for byte (docs/ome-compatibility.md#51-label-keys),
  including the
  49-character budget for the name part and the SHA-256 based truncation :func:`trunc`. The scheduler
  computes the same function, so a difference here means pods never find the weights.
* :func:`configmap_key` reproduces OME's ConfigMap data key (docs/ome-compatibility.md#62-configmap-keys) and
  :func:`parse_configmap_key`
  is the controller's reverse parse. Truncated keys do not round-trip (that is OME's format, not a bug
  here).
* Lengths are byte lengths of the UTF-8 encoding, as in Go. Kubernetes names are ASCII, where bytes and
  characters coincide; for a non-ASCII input the kept tail is cut on a byte boundary and a partial
  leading character is dropped, so the result can be shorter than the budget but never longer.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Final, NamedTuple

# --- model kinds ----------------------------------------------------------------------------------------


class ModelKind(StrEnum):
    """The two OME model kinds (``ome.io/v1beta1``). Defined here, the lowest layer, to avoid cycles."""

    BASE_MODEL = "BaseModel"
    CLUSTER_BASE_MODEL = "ClusterBaseModel"


# --- node labels ----------------------------------------------------------------------------------------

MODEL_LABEL_DOMAIN: Final = "models.ome.io"
# OME's constant is "63 - 13 - 1" (13 = len("models.ome.io")); stricter than Kubernetes' 63, but the
# scheduler computes the same function, so it must be reproduced.
MODEL_LABEL_NAME_MAX: Final = 49

_CLUSTER_PREFIX: Final = "clusterbasemodel."
_BASEMODEL_INFIX: Final = ".basemodel."
_HASH_LEN: Final = 8
# Budget for len(ns) + len(name) in a BaseModel label: 49 - len("basemodel.") - 1 (the dot after ns).
_LABEL_BASEMODEL_BUDGET: Final = MODEL_LABEL_NAME_MAX - len("basemodel.") - 1  # 38
_LABEL_CLUSTER_BUDGET: Final = MODEL_LABEL_NAME_MAX - len(_CLUSTER_PREFIX)  # 32
# ConfigMap keys are limited to 253 characters.
_CONFIGMAP_KEY_MAX: Final = 253
_CONFIGMAP_CLUSTER_BUDGET: Final = _CONFIGMAP_KEY_MAX - len(_CLUSTER_PREFIX)  # 236
_CONFIGMAP_BASEMODEL_BUDGET: Final = _CONFIGMAP_KEY_MAX - len(_BASEMODEL_INFIX)  # 242


class ModelState(StrEnum):
    """Per-node state of a model: the node label value and the ConfigMap entry ``status`` (exact case).

    OME also defines ``Deleted`` but never writes it: removal deletes the label and the entry.
    """

    READY = "Ready"
    UPDATING = "Updating"
    FAILED = "Failed"


# --- per-node ConfigMap identity (docs/ome-compatibility.md#61-configmap-identity) ------------------------------------

CONFIGMAP_STATUS_LABEL: Final = "models.ome/basemodel-status"
CONFIGMAP_STATUS_LABEL_VALUE: Final = "true"
CONFIGMAP_NODE_LABEL: Final = "node"
CONFIGMAP_NODE_NAME_ANNOTATION: Final = "models.ome.io/node-name"
CONFIGMAP_MANAGED_BY_ANNOTATION: Final = "models.ome.io/managed-by"
CONFIGMAP_MANAGED_BY_VALUE: Final = "model-agent"

# --- markers on the model objects (docs/ome-compatibility.md#15-metadata-the-agent-uses) ------------------------------

# Label; value "true" (case-insensitive) keeps the weights on delete.
RESERVE_MODEL_ARTIFACT_LABEL: Final = "models.ome/reserve-model-artifact"
# Annotation; value "true" (case-insensitive) skips config parsing. The docs' "ome.io/..." has no effect.
SKIP_CONFIG_PARSING_ANNOTATION: Final = "ome.oracle.com/skip-config-parsing"


def configmap_labels(node_name: str) -> dict[str, str]:
    """Labels that identify a node's model-status ConfigMap to the OME controller and console."""
    return {CONFIGMAP_STATUS_LABEL: CONFIGMAP_STATUS_LABEL_VALUE, CONFIGMAP_NODE_LABEL: node_name}


def configmap_annotations(node_name: str) -> dict[str, str]:
    """Annotations OME's agent puts on the ConfigMap it creates."""
    return {
        CONFIGMAP_NODE_NAME_ANNOTATION: node_name,
        CONFIGMAP_MANAGED_BY_ANNOTATION: CONFIGMAP_MANAGED_BY_VALUE,
    }


# --- truncation -----------------------------------------------------------------------------------------


def trunc(s: str, limit: int) -> str:
    """OME's truncation rule: ``s`` if it fits in ``limit`` bytes, else ``hash8[-tail]``.

    ``hash8`` is the first 8 lowercase hex digits of SHA-256(s). When ``limit - 9 <= 0`` only
    ``hash8[:limit]`` is returned; otherwise ``hash8 + "-" + `` the last ``limit - 9`` bytes of ``s``.
    """
    raw = s.encode("utf-8")
    if len(raw) <= limit:
        return s
    digest = hashlib.sha256(raw).hexdigest()[:_HASH_LEN]
    tail_len = limit - _HASH_LEN - 1
    if tail_len <= 0:
        return digest[: max(limit, 0)]
    # A tail cut inside a multi-byte character loses that character (only possible for non-ASCII).
    tail = raw[len(raw) - tail_len :].decode("utf-8", errors="ignore")
    return f"{digest}-{tail}"


def _split_budget(namespace: str, name: str, budget: int) -> tuple[str, str]:
    """Namespace-first split shared by label and ConfigMap keys for BaseModels."""
    ns_len = len(namespace.encode("utf-8"))
    if ns_len + len(name.encode("utf-8")) <= budget:
        return namespace, name
    # A short namespace is kept whole; a long one is squeezed to its 8-char hash.
    ns_budget = ns_len if ns_len <= _HASH_LEN else _HASH_LEN
    return trunc(namespace, ns_budget), trunc(name, budget - ns_budget)


def _name_part(kind: ModelKind | str, namespace: str, name: str, cluster_budget: int, bm_budget: int) -> str:
    if kind == ModelKind.CLUSTER_BASE_MODEL:
        return _CLUSTER_PREFIX + trunc(name, cluster_budget)
    if kind == ModelKind.BASE_MODEL:
        ns, nm = _split_budget(namespace, name, bm_budget)
        return ns + _BASEMODEL_INFIX + nm
    raise ValueError(f"unknown model kind {kind!r}")


def node_label_key(kind: ModelKind | str, namespace: str, name: str) -> str:
    """Node label key for a model (docs/ome-compatibility.md#51-label-keys), e.g.
    ``models.ome.io/team-a.basemodel.llama-3-8b``.

    ``namespace`` is ignored for ClusterBaseModels. Raises ``ValueError`` for an unknown kind.
    """
    part = _name_part(kind, namespace, name, _LABEL_CLUSTER_BUDGET, _LABEL_BASEMODEL_BUDGET)
    return f"{MODEL_LABEL_DOMAIN}/{part}"


def configmap_key(kind: ModelKind | str, namespace: str, name: str) -> str:
    """ConfigMap data key for a model (docs/ome-compatibility.md#62-configmap-keys), e.g. ``clusterbasemodel.qwen3-8b``.

    ``namespace`` is ignored for ClusterBaseModels. Raises ``ValueError`` for an unknown kind.
    """
    return _name_part(kind, namespace, name, _CONFIGMAP_CLUSTER_BUDGET, _CONFIGMAP_BASEMODEL_BUDGET)


class ParsedConfigMapKey(NamedTuple):
    """A ConfigMap key read back: ``namespace`` is ``""`` for a ClusterBaseModel."""

    kind: ModelKind
    namespace: str
    name: str


def parse_configmap_key(key: str) -> ParsedConfigMapKey | None:
    """Reverse of :func:`configmap_key`, as the OME controller does it; ``None`` if it is not a model key.

    Prefix ``clusterbasemodel.`` means a cluster model named by the rest; otherwise the key is split on
    the first ``.basemodel.``. Keys with an empty name or namespace are rejected (no object can have
    them). Inherent ambiguity of the format, shared with OME: a BaseModel in a namespace literally named
    ``clusterbasemodel`` reads back as a ClusterBaseModel.
    """
    if key.startswith(_CLUSTER_PREFIX):
        name = key[len(_CLUSTER_PREFIX) :]
        return ParsedConfigMapKey(ModelKind.CLUSTER_BASE_MODEL, "", name) if name else None
    namespace, sep, name = key.partition(_BASEMODEL_INFIX)
    if not sep or not namespace or not name:
        return None
    return ParsedConfigMapKey(ModelKind.BASE_MODEL, namespace, name)


# --- JSON patch -----------------------------------------------------------------------------------------


def json_pointer_escape(token: str) -> str:
    """Escape one JSON-Pointer reference token (RFC 6901): ``~`` -> ``~0``, then ``/`` -> ``~1``.

    OME escapes only ``/``. Escaping ``~`` too is what RFC 6901 requires and changes nothing for label
    keys, which cannot contain ``~``; the order matters so that ``/`` -> ``~1`` is not re-escaped.
    """
    return token.replace("~", "~0").replace("/", "~1")


def node_label_patch_path(label_key: str) -> str:
    """JSON-patch path of a node label, e.g. ``/metadata/labels/models.ome.io~1clusterbasemodel.x``."""
    return "/metadata/labels/" + json_pointer_escape(label_key)
