"""Diffusers pipelines: what a decoded ``model_index.json`` and its text encoder's config say.

Role: pure functions from decoded dicts to :class:`DiffusionPipeline` and :class:`Facts`
(docs/ome-compatibility.md#72-which-file). Names and component counts are cut to the limits so one index
cannot fill the entry. No I/O: the per-component parameter counts are the file reader's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from model_agent.model.metadata.facts import Facts, as_int
from model_agent.model.metadata.limits import MAX_METADATA_STRING, MAX_PIPELINE_COMPONENTS
from model_agent.model.metadata.results import DiffusionComponent, DiffusionPipeline, MetadataError


def _string_field(obj: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value[:MAX_METADATA_STRING]
    return ""


def _diffusers_component(value: object) -> DiffusionComponent | None:
    # model_index.json writes a component as [library, class]; [null, null] means "not present".
    if isinstance(value, list):
        parts = [v[:MAX_METADATA_STRING] if isinstance(v, str) else "" for v in value[:2]]
        if not parts:
            return None
        library, type_ = ("", parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    elif isinstance(value, dict):
        type_ = _string_field(value, "_class_name", "class_name", "className", "type")
        library = _string_field(value, "_library", "library")
    else:
        return None
    if not library and not type_:
        return None
    return DiffusionComponent(library=library, type=type_)


def parse_pipeline(raw: Mapping[str, Any], path: Path) -> DiffusionPipeline:
    """The pipeline a decoded ``model_index.json`` describes; :class:`MetadataError` when it has no
    ``_class_name`` (then it is not a diffusers index). ``path`` only names the file in the error."""
    class_name = _string_field(raw, "_class_name", "class_name", "className")
    if not class_name:
        raise MetadataError(f"{path}: no _class_name: not a diffusers pipeline index")
    known: dict[str, DiffusionComponent | None] = dict.fromkeys(
        ("scheduler", "text_encoder", "tokenizer", "transformer", "vae")
    )
    additional: dict[str, DiffusionComponent] = {}
    for key in sorted(raw):
        if key.startswith("_"):
            continue
        component = _diffusers_component(raw[key])
        if component is None:
            continue
        slot = "transformer" if key.lower() == "unet" else key.lower()
        if slot in known:
            if known[slot] is None:
                known[slot] = component
        elif len(additional) < MAX_PIPELINE_COMPONENTS:
            additional[key[:MAX_METADATA_STRING]] = component
    return DiffusionPipeline(
        class_name=class_name,
        diffusers_version=_string_field(raw, "_diffusers_version", "diffusers_version"),
        scheduler=known["scheduler"],
        text_encoder=known["text_encoder"],
        tokenizer=known["tokenizer"],
        transformer=known["transformer"],
        vae=known["vae"],
        additional_components=additional,
    )


def diffusers_facts(pipeline: DiffusionPipeline, text_encoder_config: Mapping[str, Any] | None) -> Facts:
    """The facts of a pipeline before its parameters are counted: type ``diffusers``, the pipeline class as
    architecture, always vision, and the context length of the text encoder (0 when its config is absent)."""
    facts = Facts(
        model_type="diffusers",
        architecture=pipeline.class_name,
        has_vision=True,
        pipeline=pipeline,
    )
    if text_encoder_config is not None:
        facts.context_length = as_int(text_encoder_config.get("max_position_embeddings"))
    return facts
