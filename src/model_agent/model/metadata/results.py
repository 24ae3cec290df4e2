"""What metadata parsing produces: the result types, the one error type, and the decoded-configuration keys.

Role: the vocabulary shared by the pure rules (``model_agent.model.metadata``) and the file reader
(``model_agent.local.metadata_files``), and by the agent that writes the ConfigMap entry and the model spec.
Frozen dataclasses with their JSON renderings; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

DECODED_CONFIGURATION_KEYS: Final = (
    "architecture",
    "context_length",
    "has_vision",
    "is_embedding",
    "model_size_bytes",
    "model_type",
    "parameter_count",
    "torch_dtype",
    "transformers_version",
)
"""Keys of ``decodedModelConfiguration`` / ``spec.modelConfiguration``, in the (sorted) order written."""


class MetadataError(Exception):
    """No usable metadata could be parsed; ``reason`` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------------------------------
# Result types


@dataclass(frozen=True)
class ModelFramework:
    """``modelFramework``: e.g. ``transformers`` 4.43.0.

    ``version`` None omits the key (a transformers config without ``transformers_version``); a string,
    even ``""``, is written (a diffusers index without ``_diffusers_version``: OME writes ``"version":""``).
    """

    name: str
    version: str | None = None

    def to_json(self) -> dict[str, str]:
        """The ``modelFramework`` map as OME writes it: ``version`` left out only when unknown (None)."""
        out = {"name": self.name}
        if self.version is not None:
            out["version"] = self.version
        return out


@dataclass(frozen=True)
class ModelFormat:
    """``modelFormat``: ``safetensors`` 1.0.0, or ``diffusers`` with the pipeline's diffusers version.

    ``version`` is always written, ``""`` included (OME sets the pointer for both formats).
    """

    name: str
    version: str

    def to_json(self) -> dict[str, str]:
        """The ``modelFormat`` map; both keys always written, as OME does."""
        return {"name": self.name, "version": self.version}


@dataclass(frozen=True)
class DiffusionComponent:
    """One component of a diffusers pipeline: the library providing it and its class name."""

    library: str = ""
    type: str = ""

    def to_spec(self) -> dict[str, str]:
        """The component as the model spec carries it: empty fields left out, so an unknown library is not ``""``."""
        out: dict[str, str] = {}
        if self.library:
            out["library"] = self.library
        if self.type:
            out["type"] = self.type
        return out


@dataclass(frozen=True)
class DiffusionPipeline:
    """What ``model_index.json`` says about a diffusers pipeline (``spec.diffusionPipeline``)."""

    class_name: str
    diffusers_version: str
    scheduler: DiffusionComponent | None = None
    text_encoder: DiffusionComponent | None = None
    tokenizer: DiffusionComponent | None = None
    transformer: DiffusionComponent | None = None
    vae: DiffusionComponent | None = None
    additional_components: Mapping[str, DiffusionComponent] = field(default_factory=dict)

    def to_spec(self) -> dict[str, Any]:
        """The object for ``spec.diffusionPipeline`` (CRD field names; empty parts omitted)."""
        out: dict[str, Any] = {}
        if self.class_name:
            out["className"] = self.class_name
        components = {
            "scheduler": self.scheduler,
            "textEncoder": self.text_encoder,
            "tokenizer": self.tokenizer,
            "transformer": self.transformer,
            "vae": self.vae,
        }
        for key, component in components.items():
            if component is not None:
                out[key] = component.to_spec()
        if self.additional_components:
            out["additionalComponents"] = {
                name: self.additional_components[name].to_spec() for name in sorted(self.additional_components)
            }
        return out


@dataclass(frozen=True)
class ParsedMetadata:
    """Everything section 7 derives from a model directory.

    ``decoded_configuration`` has exactly :data:`DECODED_CONFIGURATION_KEYS` (sorted), with
    ``parameter_count`` as the formatted string; it is both ``decodedModelConfiguration`` in the
    ConfigMap and ``spec.modelConfiguration``. ``max_tokens`` is None when no context length is known
    (Go writes 0, which its JSON omits). ``warnings`` lists non-fatal problems (e.g. why the parameter
    count is an estimate) for the caller to log.
    """

    model_type: str
    model_architecture: str
    model_framework: ModelFramework
    model_format: ModelFormat
    parameter_count: int
    model_parameter_size: str
    max_tokens: int | None
    capabilities: list[str]
    quantization: str | None
    decoded_configuration: dict[str, Any]
    diffusion_pipeline: DiffusionPipeline | None
    config_path: Path
    has_vision: bool
    is_embedding: bool
    parameter_count_source: str
    """``safetensors`` (counted from headers), ``estimate`` (from the config's dimensions) or ``none``."""
    warnings: tuple[str, ...] = ()

    @property
    def is_diffusers(self) -> bool:
        """Whether the files are a diffusers pipeline (a ``model_index.json``) rather than one transformers model."""
        return self.diffusion_pipeline is not None

    def to_config_entry(self, artifact: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``config`` object of a ConfigMap entry (docs/ome-compatibility.md#63-configmap-entry-value), ready for
        ``json.dumps``.

        Fields appear in the Go struct's order and are omitted when empty, except ``artifact`` which is
        always present (default ``{"sha": "", "parentPath": null, "childrenPaths": null}``).
        ``apiCapabilities`` is never written (the Go parser never fills it).
        """
        out: dict[str, Any] = {}
        if self.model_type:
            out["modelType"] = self.model_type
        if self.model_architecture:
            out["modelArchitecture"] = self.model_architecture
        out["modelFramework"] = self.model_framework.to_json()
        out["modelFormat"] = self.model_format.to_json()
        if self.model_parameter_size:
            out["modelParameterSize"] = self.model_parameter_size
        if self.max_tokens:
            out["maxTokens"] = self.max_tokens
        if self.capabilities:
            out["modelCapabilities"] = list(self.capabilities)
        out["decodedModelConfiguration"] = dict(self.decoded_configuration)
        if self.quantization:
            out["quantization"] = self.quantization
        if artifact is None:
            out["artifact"] = {"sha": "", "parentPath": None, "childrenPaths": None}
        else:
            out["artifact"] = dict(artifact)
        return out
