"""Assembling the result: from :class:`Facts` to the :class:`ParsedMetadata` the agent writes.

Role: one pure function that applies the output rules every family shares (clamping to the Go field
ranges, the size string, framework and format, capabilities, the decoded configuration) so the entry never
contradicts itself. No I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_agent.model.metadata.capabilities import CAPABILITY_EMBEDDING, determine_capabilities
from model_agent.model.metadata.facts import Facts
from model_agent.model.metadata.limits import INT32_MAX, INT64_MAX
from model_agent.model.metadata.results import ModelFormat, ModelFramework, ParsedMetadata
from model_agent.model.metadata.sizes import estimate_model_size_bytes, format_parameter_size, quantization_from_method


def assemble(facts: Facts, config_path: Path, total_size_bytes: int | None) -> ParsedMetadata:
    """Turn the gathered facts into :class:`ParsedMetadata`: clamp counts, format the size, pick framework,
    format and quantization, classify capabilities, and build ``decodedModelConfiguration``.

    ``total_size_bytes`` (the weights on disk, if known) is the model size only when the parameter count is
    unknown. ``config_path`` is recorded, never opened.
    """
    params = max(0, min(facts.parameter_count, INT64_MAX))
    size_text = format_parameter_size(params)
    context = facts.context_length if 0 < facts.context_length <= INT32_MAX else 0
    if params > 0:
        size_bytes = estimate_model_size_bytes(params, facts.size_dtype)
    elif total_size_bytes is not None and 0 < total_size_bytes <= INT64_MAX:
        size_bytes = total_size_bytes
    else:
        size_bytes = 0
    pipeline = facts.pipeline
    if pipeline is not None:
        version = pipeline.diffusers_version
        framework = ModelFramework("diffusers", version)
        model_format = ModelFormat("diffusers", version)
        quantization = None
    else:
        framework = ModelFramework("transformers", facts.transformers_version or None)
        model_format = ModelFormat("safetensors", "1.0.0")
        quantization = quantization_from_method(facts.quant_method)
    capabilities = determine_capabilities(
        facts.architecture,
        facts.model_type,
        has_vision=facts.has_vision,
        is_embedding=facts.is_embedding,
        is_diffusers=pipeline is not None,
    )
    # The entry must not contradict itself: a model classified EMBEDDING by its architecture (e.g. an
    # e5-mistral ``MistralModel``) is an embedding model in ``decodedModelConfiguration`` too.
    is_embedding = facts.is_embedding or capabilities == [CAPABILITY_EMBEDDING]
    decoded: dict[str, Any] = {
        "architecture": facts.architecture,
        "context_length": context,
        "has_vision": facts.has_vision,
        "is_embedding": is_embedding,
        "model_size_bytes": size_bytes,
        "model_type": facts.model_type,
        "parameter_count": size_text,
        "torch_dtype": facts.torch_dtype,
        "transformers_version": facts.transformers_version,
    }
    return ParsedMetadata(
        model_type=facts.model_type,
        model_architecture=facts.architecture,
        model_framework=framework,
        model_format=model_format,
        parameter_count=params,
        model_parameter_size=size_text,
        max_tokens=context or None,
        capabilities=capabilities,
        quantization=quantization,
        decoded_configuration=decoded,
        diffusion_pipeline=pipeline,
        config_path=config_path,
        has_vision=facts.has_vision,
        is_embedding=is_embedding,
        parameter_count_source=facts.parameter_count_source if params > 0 else "none",
        warnings=tuple(facts.warnings),
    )
