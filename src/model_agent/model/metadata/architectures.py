"""Per-architecture rules: what a decoded transformers ``config.json`` means, family by family.

Role: pure functions from an already-decoded config dict to :class:`Facts`
(docs/ome-compatibility.md#73-extraction): architecture defaults, dtype, context-length keys per family,
vision and embedding flags, parameter estimates from dimensions (generic, MoE, DBRX, published sizes).
The tables are the data; the functions only look things up. No I/O: counting safetensors headers and
reading a sentence-transformers config are the file reader's (``model_agent.local.metadata_files``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from model_agent.model.metadata.facts import Facts, as_float, as_int, as_str, first_int, is_json_int
from model_agent.model.metadata.limits import INT64_MAX

REGISTERED_MODEL_TYPES: Final = frozenset(
    {
        "baichuan", "bert", "chatglm", "cohere", "command-r", "dbrx", "deepseek_v3", "deepseek_vl_v2",
        "exaone", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt_oss", "internlm", "internlm2", "janus",
        "kimi_k2", "llama", "llama4", "llava", "minicpm", "minicpm3", "mistral", "mixtral", "mllama",
        "multi_modality", "phi", "phi3", "phi3_v", "phi3small", "phimoe", "qwen", "qwen2", "qwen2_5_vl",
        "qwen2_vl", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe", "stablelm",
        "xverse",
    }
)  # fmt: skip
"""``model_type`` values the Go agent has a dedicated loader for (docs/ome-compatibility.md#73-extraction).
Informational: the
behaviours that matter are folded into the tables below; every other type uses the generic rules."""


_ALWAYS_VISION_TYPES: Final = frozenset(
    {
        "deepseek_vl_v2", "gemma3", "janus", "llava", "mllama", "multi_modality", "qwen2_5_vl", "qwen2_vl",
        "qwen3_5", "qwen3_5_moe", "qwen3_vl", "qwen3_vl_moe",
    }
)  # fmt: skip
_EMBEDDING_TYPES: Final = frozenset({"bert"})
# Context-length keys tried before the generic ones, per model type.
# Qwen v1 and Qwen3 read ``seq_length`` first like OME: for Qwen-7B it is the trained window (8192) while
# ``max_position_embeddings`` (32768) is only the RoPE table; serving engines take the smaller too.
_CONTEXT_KEYS_FIRST: Final[Mapping[str, tuple[str, ...]]] = {
    "qwen": ("seq_length",),
    "qwen2": ("seq_length",),
    "qwen3": ("seq_length",),
    "chatglm": ("seq_length",),
    "baichuan": ("model_max_length",),
    "dbrx": ("max_seq_len",),
}
# dtype assumed for the size estimate when the config names none.
_DEFAULT_SIZE_DTYPE: Final[Mapping[str, str]] = {"chatglm": "float16"}
_NESTED_LLM_KEYS: Final = ("text_config", "llm_config", "language_config")
# Architecture written when a config has no ``architectures`` list: the class transformers (or the
# model's remote code) loads for that type, the name OME's loaders fill in. Not for mistral: OME's
# "MistralModel" default would turn every list-less mistral checkpoint into an embedding model.
_DEFAULT_ARCHITECTURE: Final[Mapping[str, str]] = {
    "dbrx": "DbrxForCausalLM",
    "deepseek_vl_v2": "DeepseekVLV2ForCausalLM",
    "janus": "JanusMultiModalityCausalLM",
    "llama": "LlamaForCausalLM",
    "llama4": "Llama4ForConditionalGeneration",
    "multi_modality": "JanusMultiModalityCausalLM",
}
# Checkpoints whose size OME states from a (hidden_size, num_hidden_layers) match when no safetensors can
# be read: the published nominal sizes, which the dimension formula misses by several percent (it says
# 65.48B for Llama 3 70B). A 685B DeepSeek-V3 is 671B of main model and 14B of multi-token prediction.
_KNOWN_SIZES: Final[Mapping[str, Mapping[tuple[int, int], int]]] = {
    "llama": {
        (8192, 80): 70_000_000_000,
        (16384, 126): 405_000_000_000,
        (3072, 28): 3_000_000_000,
        (2048, 16): 1_000_000_000,
    },
    "deepseek_v3": {(7168, 61): 685_000_000_000},
    "mistral": {(4096, 32): 7_000_000_000},
    "qwen": {(4096, 32): 7_000_000_000, (5120, 40): 14_000_000_000, (8192, 80): 72_000_000_000},
    "qwen3": {(2560, 36): 4_000_000_000},
}

# Gemma 3 multimodal checkpoints omit max_position_embeddings and rely on transformers' default.
_GEMMA3_DEFAULT_CONTEXT: Final = 131072


def _nested_llm_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    for key in _NESTED_LLM_KEYS:
        value = raw.get(key)
        if isinstance(value, dict):
            return value
    return {}


def _expert_count(raw: Mapping[str, Any], nested: Mapping[str, Any]) -> int:
    # Same precedence as the Go generic loader.
    return (
        as_int(raw.get("n_routed_experts"))
        or first_int([nested], "n_routed_experts", "num_local_experts", "num_experts")
        or first_int([raw], "num_local_experts", "num_experts")
    )


def _estimate_parameters(raw: Mapping[str, Any], nested: Mapping[str, Any]) -> int:
    """Rough count from dimensions when no safetensors can be read (Go's generic / MoE formulas)."""
    both = (raw, nested)
    hidden = first_int(both, "hidden_size")
    layers = first_int(both, "num_hidden_layers", "num_layers")
    if not hidden or not layers:
        return 0
    vocab = first_int(both, "vocab_size", "padded_vocab_size")
    experts = _expert_count(raw, nested)
    if experts:
        intermediate = first_int(both, "intermediate_size")
        moe_intermediate = first_int(both, "moe_intermediate_size") or intermediate
        shared = first_int(both, "n_shared_experts")
        per_layer = (
            4 * hidden * hidden
            + shared * 2 * hidden * intermediate
            + experts * 2 * hidden * moe_intermediate
            + hidden * experts
            + 2 * hidden
        )
        total = hidden * vocab + layers * per_layer
    else:
        total = vocab * hidden + layers * 12 * hidden * hidden
    return total if total <= INT64_MAX else 0


def _sub_object(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def _dbrx_parameters(raw: Mapping[str, Any]) -> int:
    """DBRX from its own keys (``d_model``, ``n_layers``, ``ffn_config``, ``attn_config``), which the
    generic formula does not read (it would say 0).

    Embeddings and an untied head, grouped-query attention (``kv_n_heads``), and per layer
    ``moe_num_experts`` gated experts of three ``d_model × ffn_hidden_size`` matrices plus the router:
    131.6B for the published 40-layer checkpoints (132B nominal). OME hard-codes 132B for a 48-layer
    shape no checkpoint has, and its fallback counts two matrices per expert (91.8B for the real one).
    """
    hidden = as_int(raw.get("d_model"))
    layers = as_int(raw.get("n_layers"))
    if not hidden or not layers:
        return 0
    ffn = _sub_object(raw, "ffn_config")
    attn = _sub_object(raw, "attn_config")
    experts = as_int(ffn.get("moe_num_experts")) or 1
    ffn_hidden = as_int(ffn.get("ffn_hidden_size")) or 4 * hidden
    heads = as_int(raw.get("n_heads"))
    kv_heads = as_int(attn.get("kv_n_heads"))
    kv_dim = kv_heads * (hidden // heads) if heads and kv_heads else hidden
    vocab = as_int(raw.get("vocab_size"))
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_dim + experts * 3 * hidden * ffn_hidden + hidden * experts
    per_layer += 2 * hidden
    tied = raw.get("tie_word_embeddings") is True
    total = vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden
    return total if total <= INT64_MAX else 0


def _known_size(model_type: str, raw: Mapping[str, Any]) -> int:
    """A published checkpoint's nominal size, recognised by its dimensions (:data:`_KNOWN_SIZES`)."""
    table = _KNOWN_SIZES.get(model_type)
    if not table:
        return 0
    return table.get((as_int(raw.get("hidden_size")), as_int(raw.get("num_hidden_layers"))), 0)


def _llama4_float8(raw: Mapping[str, Any]) -> bool:
    """An FP8 Llama 4 checkpoint (compressed-tensors ``float-quantized``, 8-bit float weights in
    ``group_0``): its weights take one byte each whatever ``torch_dtype`` says, so the dtype is
    ``float8``, as OME reports it."""
    quant = raw.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("format") != "float-quantized":
        return False
    groups = quant.get("config_groups")
    group = groups.get("group_0") if isinstance(groups, dict) else None
    weights = group.get("weights") if isinstance(group, dict) else None
    if not isinstance(weights, dict):
        return False
    bits = weights.get("num_bits")
    return is_json_int(bits) and bits == 8 and weights.get("type") == "float"


def _gemma3_context_length(raw: Mapping[str, Any], text: Mapping[str, Any]) -> int:
    """Gemma 3 (multimodal) context length.

    The Go agent returns ``text_config.sliding_window × rope_scaling.factor`` (else the sliding window,
    else 8192). The sliding window is the span of Gemma's *local* attention layers, not the context, and
    the linear RoPE factor already went into the model's real limit; for the published 4B/12B/27B
    checkpoints (window 1024, factor 8) that formula says 8192 while the models serve 131072 tokens.
    Here: an explicit ``max_position_embeddings`` (text_config, then top level) wins; else
    ``original_max_position_embeddings × factor`` when the RoPE block states its base; else 131072,
    the value transformers uses for these checkpoints, which omit the key.
    """
    explicit = first_int((text, raw), "max_position_embeddings")
    if explicit:
        return explicit
    rope = text.get("rope_scaling")
    if not isinstance(rope, dict):
        rope = raw.get("rope_scaling")
    if isinstance(rope, dict):
        factor = as_float(rope.get("factor"))
        base = as_int(rope.get("original_max_position_embeddings"))
        if factor and base:
            # A product beyond int64 (inf for an absurd factor) is out of range: assemble reads it as unknown.
            return int(min(base * factor, INT64_MAX))
    return _GEMMA3_DEFAULT_CONTEXT


def _context_length(model_type: str, raw: Mapping[str, Any], nested: Mapping[str, Any]) -> int:
    if model_type == "gemma3":
        return _gemma3_context_length(raw, nested)
    first = _CONTEXT_KEYS_FIRST.get(model_type, ())
    if first:
        value = first_int([raw], *first)
        if value:
            return value
    return first_int((raw, nested), "max_position_embeddings") or as_int(raw.get("max_sequence_length"))


def transformers_facts(raw: Mapping[str, Any], config_path: Path) -> Facts:
    """What a transformers ``config.json`` says by itself: type, architecture, dtype, context, vision.

    Everything except what only other files can tell: ``is_embedding`` here comes from the model type
    alone (the file reader adds a sentence-transformers config's verdict, :func:`declares_similarity_function`)
    and the parameter count is left for :func:`settle_parameter_count`. ``config_path`` only names the file
    in warnings.
    """
    facts = Facts()
    nested = _nested_llm_config(raw)
    facts.model_type = as_str(raw.get("model_type"))
    if not facts.model_type:
        facts.warnings.append(f"{config_path}: no model_type; using the generic rules")
    architectures = raw.get("architectures")
    if isinstance(architectures, list) and architectures:
        facts.architecture = as_str(architectures[0])
    if not facts.architecture:
        facts.architecture = _DEFAULT_ARCHITECTURE.get(facts.model_type, "")
    facts.transformers_version = as_str(raw.get("transformers_version")) or as_str(nested.get("transformers_version"))
    # transformers >= 4.56 writes "dtype" where older versions wrote "torch_dtype".
    facts.torch_dtype = next(
        (
            value
            for value in (
                as_str(raw.get("torch_dtype")),
                as_str(nested.get("torch_dtype")),
                as_str(raw.get("dtype")),
                as_str(nested.get("dtype")),
            )
            if value
        ),
        "",
    )
    if facts.model_type == "llama4" and _llama4_float8(raw):
        facts.torch_dtype = "float8"
    facts.size_dtype = facts.torch_dtype or _DEFAULT_SIZE_DTYPE.get(facts.model_type, "")
    facts.context_length = _context_length(facts.model_type, raw, nested)
    facts.has_vision = (
        facts.model_type in _ALWAYS_VISION_TYPES
        or raw.get("vision_config") is not None
        or (facts.model_type == "phi3_v" and raw.get("img_processor") is not None)
    )
    facts.is_embedding = facts.model_type in _EMBEDDING_TYPES
    quant = raw.get("quantization_config")
    if isinstance(quant, dict):
        facts.quant_method = as_str(quant.get("quant_method"))
    return facts


def settle_parameter_count(facts: Facts, raw: Mapping[str, Any], counted: int) -> None:
    """Record the parameter count: ``counted`` from safetensors headers when positive, else the estimate
    from the config's dimensions (a published checkpoint's nominal size first, DBRX by its own keys).

    Why a separate step: counting reads every shard's header, which is the file reader's job; the choice
    between a count and an estimate is a rule, kept here with the other rules.
    """
    nested = _nested_llm_config(raw)
    if counted > 0:
        facts.parameter_count, facts.parameter_count_source = counted, "safetensors"
    else:
        if facts.model_type == "dbrx":
            estimate = _dbrx_parameters(raw)
        else:
            estimate = _known_size(facts.model_type, raw) or _estimate_parameters(raw, nested)
        if estimate > 0:
            facts.parameter_count, facts.parameter_count_source = estimate, "estimate"


def declares_similarity_function(sentence_transformers_config: Mapping[str, Any]) -> bool:
    """Whether a ``config_sentence_transformers.json`` names a similarity function, which marks an embedding
    model whatever its architecture says."""
    return bool(as_str(sentence_transformers_config.get("similarity_fn_name")))
