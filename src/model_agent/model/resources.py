"""Typed, read-only views of OME's ``BaseModel`` / ``ClusterBaseModel`` objects
(docs/ome-compatibility.md#12-spec-fields (to 1.5)).

Role: the rest of the agent never touches raw API dictionaries; the kube layer hands a raw object to
:meth:`ModelObject.from_dict` and gets either a frozen view or one :class:`InvalidModel` whose
``reason`` says what is wrong (it becomes the model's ``Failed`` reason). Nothing here imports the
Kubernetes client.

Contract:

* Field names on the wire are the CRD's JSON names (``storageUri``, ``nodeSelector``, ``key`` ...);
  the Python attributes are snake_case, and both are accepted on input (``populate_by_name``).
* Unknown fields are ignored (the CRD has many the agent does not read); ``null`` means "absent".
* Types are checked strictly (no ``1`` -> ``"1"`` coercion): a wrong type on a field the agent reads,
  a missing ``spec.storage`` / ``spec.storage.storageUri``, a missing name, or a BaseModel without a
  namespace raise :class:`InvalidModel`; nothing else is raised for any input.
* A ClusterBaseModel's namespace is always ``""``, whatever the input says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from model_agent.model import keys
from model_agent.model.errors import ReasonError
from model_agent.model.keys import ModelKind

__all__ = [
    "DownloadPolicy",
    "InvalidModel",
    "ModelFormatRef",
    "ModelKind",
    "ModelObject",
    "ModelRef",
    "ModelSpec",
    "NodeAffinity",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "ObjectMeta",
    "StorageSpec",
    "effective_download_policy",
    "reserve_artifact",
    "skip_config_parsing",
]

_TRUE: Final = "true"
_MAX_REPORTED_ERRORS: Final = 3


class InvalidModel(ReasonError):
    """A model object the agent cannot work with; ``reason`` is a human-readable sentence."""


class DownloadPolicy(StrEnum):
    """``spec.storage.downloadPolicy``; unset means :attr:`ALWAYS_DOWNLOAD`."""

    ALWAYS_DOWNLOAD = "AlwaysDownload"
    REUSE_IF_EXISTS = "ReuseIfExists"


@dataclass(frozen=True, slots=True, order=True)
class ModelRef:
    """Identity of a model by name (not UID): hashable, usable as a work-queue key.

    ``namespace`` is ``""`` for a ClusterBaseModel. ``key`` is ``Kind/namespace/name``, e.g.
    ``ClusterBaseModel//qwen3-8b`` or ``BaseModel/team-a/llama``.
    """

    kind: ModelKind
    namespace: str
    name: str

    def __post_init__(self) -> None:
        if self.kind == ModelKind.CLUSTER_BASE_MODEL and self.namespace:
            raise ValueError("a ClusterBaseModel has no namespace")
        if self.kind == ModelKind.BASE_MODEL and not self.namespace:
            raise ValueError("a BaseModel needs a namespace")
        if not self.name:
            raise ValueError("a model needs a name")

    @property
    def key(self) -> str:
        """The agent's key for this model, ``kind/namespace/name``: what the work queue, manifests and logs use."""
        return f"{self.kind.value}/{self.namespace}/{self.name}"

    @property
    def label_key(self) -> str:
        """This model's node label key (docs/ome-compatibility.md#51-label-keys)."""
        return keys.node_label_key(self.kind, self.namespace, self.name)

    @property
    def configmap_key(self) -> str:
        """This model's key in the node ConfigMap (docs/ome-compatibility.md#62-configmap-keys)."""
        return keys.configmap_key(self.kind, self.namespace, self.name)

    @classmethod
    def from_key(cls, key: str) -> ModelRef:
        """Inverse of :attr:`key`; ``ValueError`` for anything else."""
        kind, sep1, rest = key.partition("/")
        namespace, sep2, name = rest.partition("/")
        if not (sep1 and sep2):
            raise ValueError(f"not a model key: {key!r}")
        return cls(ModelKind(kind), namespace, name)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ModelRef:
        """The reference of a model object as the API server sends it; ``ValueError`` for another kind or no name.

        The one place that reads ``kind`` and ``metadata`` of a raw model object for its identity, so a missing
        ``metadata`` or namespace (a ClusterBaseModel has none) is handled once.
        """
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        name = str(meta.get("name") or "")
        if not name:
            raise ValueError("a model object without metadata.name")
        return cls(ModelKind(str(obj.get("kind") or "")), str(meta.get("namespace") or ""), name)

    def __str__(self) -> str:
        return self.key


class _View(BaseModel):
    model_config = ConfigDict(populate_by_name=True, strict=True, extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_absent(cls, data: Any) -> Any:
        # The API server and kubectl may send explicit nulls; treat them as missing fields.
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if v is not None}
        return data


class NodeSelectorRequirement(_View):
    """core/v1 ``NodeSelectorRequirement``; ``operator`` is kept verbatim (unknown ones never match)."""

    key: str
    operator: str
    values: list[str] = Field(default_factory=list)


class NodeSelectorTerm(_View):
    """One term of a node affinity: every expression in it must match (terms are ORed)."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list, alias="matchExpressions")
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list, alias="matchFields")


class NodeSelector(_View):
    """A node affinity's required terms: the node is selected when any term matches."""

    node_selector_terms: list[NodeSelectorTerm] = Field(default_factory=list, alias="nodeSelectorTerms")


class NodeAffinity(_View):
    """Only the required part is read; ``preferredDuringScheduling...`` is ignored, as in OME."""

    required: NodeSelector | None = Field(default=None, alias="requiredDuringSchedulingIgnoredDuringExecution")


class StorageSpec(_View):
    """``spec.storage``. ``path`` keeps the difference between absent (``None``) and ``""``."""

    storage_uri: str = Field(alias="storageUri")
    path: str | None = None
    schema_path: str | None = Field(default=None, alias="schemaPath")
    parameters: dict[str, str] = Field(default_factory=dict)
    key: str | None = None  # Secret name; the JSON name really is "key", not "storageKey"
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    node_affinity: NodeAffinity | None = Field(default=None, alias="nodeAffinity")
    # strict=False only so that the JSON string is accepted for the enum.
    download_policy: DownloadPolicy | None = Field(default=None, alias="downloadPolicy", strict=False)


class ModelFormatRef(_View):
    """``spec.modelFormat`` as the author wrote it (the agent fills it only when empty)."""

    name: str | None = None
    version: str | None = None


class ModelSpec(_View):
    """The parts of ``spec`` the agent reads; all other fields are ignored."""

    storage: StorageSpec
    model_format: ModelFormatRef | None = Field(default=None, alias="modelFormat")
    additional_metadata: dict[str, str] = Field(default_factory=dict, alias="additionalMetadata")
    display_name: str | None = Field(default=None, alias="displayName")


class ObjectMeta(_View):
    """The metadata fields the agent reads: identity (UID), the spec's generation, deletion, labels, annotations."""

    name: str
    namespace: str = ""
    uid: str = ""
    resource_version: str = Field(default="", alias="resourceVersion")
    generation: int = 0
    # strict=False so that the RFC 3339 string of the API is parsed (a datetime is accepted as well).
    deletion_timestamp: datetime | None = Field(default=None, alias="deletionTimestamp", strict=False)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ModelObject(_View):
    """One BaseModel or ClusterBaseModel as the agent sees it."""

    kind: ModelKind
    metadata: ObjectMeta
    spec: ModelSpec

    @classmethod
    def from_dict(cls, kind: ModelKind | str, raw: Any) -> ModelObject:
        """Build the view from a raw API object (camelCase dict); :class:`InvalidModel` if unusable."""
        try:
            model_kind = ModelKind(kind)
        except ValueError:
            raise InvalidModel(f"unknown model kind {kind!r}") from None
        if not isinstance(raw, Mapping):
            raise InvalidModel(f"a {model_kind.value} must be an object, got {type(raw).__name__}")
        metadata = raw.get("metadata")
        if not isinstance(metadata, Mapping):
            raise InvalidModel("metadata is missing")
        spec = raw.get("spec")
        if not isinstance(spec, Mapping) or spec.get("storage") is None:
            raise InvalidModel("spec.storage is missing")
        meta = dict(metadata)
        if model_kind == ModelKind.CLUSTER_BASE_MODEL:
            meta.pop("namespace", None)
        try:
            obj = cls.model_validate({"kind": model_kind, "metadata": meta, "spec": spec})
        except ValidationError as exc:
            raise InvalidModel(_describe(exc)) from None
        except (TypeError, ValueError, RecursionError) as exc:  # defensive: never leak anything else
            raise InvalidModel(f"malformed object: {exc}") from None
        if not obj.metadata.name:
            raise InvalidModel("metadata.name is empty")
        if model_kind == ModelKind.BASE_MODEL and not obj.metadata.namespace:
            raise InvalidModel("a BaseModel needs metadata.namespace")
        return obj

    @property
    def ref(self) -> ModelRef:
        """The model's identity without its spec: what outlives the object in queues and manifests."""
        return ModelRef(self.kind, self.metadata.namespace, self.metadata.name)

    @property
    def deleting(self) -> bool:
        """True once the API server set ``deletionTimestamp`` (finalizers may keep it alive)."""
        return self.metadata.deletion_timestamp is not None


def reserve_artifact(obj: ModelObject) -> bool:
    """Label ``models.ome/reserve-model-artifact`` is ``true`` (any case): keep the weights on delete."""
    return obj.metadata.labels.get(keys.RESERVE_MODEL_ARTIFACT_LABEL, "").lower() == _TRUE


def skip_config_parsing(obj: ModelObject) -> bool:
    """Annotation ``ome.oracle.com/skip-config-parsing`` is ``true`` (any case): parse no metadata."""
    return obj.metadata.annotations.get(keys.SKIP_CONFIG_PARSING_ANNOTATION, "").lower() == _TRUE


def effective_download_policy(storage: StorageSpec) -> DownloadPolicy:
    """The download policy with OME's default applied (unset means ``AlwaysDownload``)."""
    return storage.download_policy or DownloadPolicy.ALWAYS_DOWNLOAD


def _describe(exc: ValidationError) -> str:
    """A short sentence from pydantic's errors, locations in the CRD's JSON names."""
    errors = exc.errors(include_url=False, include_input=False)
    parts = []
    for error in errors[:_MAX_REPORTED_ERRORS]:
        location = ".".join(str(item) for item in error["loc"]) or "object"
        parts.append(f"{location}: {error['msg']}")
    if len(errors) > _MAX_REPORTED_ERRORS:
        parts.append(f"and {len(errors) - _MAX_REPORTED_ERRORS} more")
    return "; ".join(parts)
