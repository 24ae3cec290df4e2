"""Golden vectors: parsed model metadata as the ConfigMap entry bytes OME's controller reads.

Each case writes one model family's real ``config.json`` shape (abridged to the keys parsers read and
their usual neighbours) into a temporary directory, with small real safetensors files where the case is
not about the parameter estimate, parses it with :func:`parse_model_dir`, and encodes the entry through
the entry codec (:class:`ModelEntry`), exactly the bytes written to the node's ConfigMap.

Where this agent writes what OME's Go agent writes, the vector is OME's output; where it deliberately does
not, the case says so and ``docs/ome-compatibility.md`` (section 17) gives the reason. ``OME:`` notes give
what OME's loaders produce for the same directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from model_agent.local.metadata_files import parse_model_dir
from model_agent.model.entry import ModelEntry

_ARTIFACT = '"artifact":{"sha":"","parentPath":null,"childrenPaths":null}'


@dataclass(frozen=True)
class Golden:
    name: str
    files: dict[str, Any]
    """Relative path -> JSON document written there (``config.json``, ``model_index.json``, ...)."""
    expected: str
    """The entry's ``config`` object, as the codec writes it (without the artifact, appended below)."""
    tensors: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    """Relative path of a safetensors file -> tensor shapes (float16 zeros)."""


def _entry(config: str) -> str:
    return '{"name":"m","status":"Ready","config":{' + config + "," + _ARTIFACT + "}}"


def _decoded(**fields: Any) -> str:
    """``decodedModelConfiguration`` in the sorted key order Go writes for a map."""
    return '"decodedModelConfiguration":' + json.dumps(dict(sorted(fields.items())), separators=(",", ":"))


_SMALL = {"model.safetensors": {"embed": (1000, 8), "norm": (8,)}}  # 8008 parameters: "8.01K"

LLAMA3_70B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
}

QWEN_7B: dict[str, Any] = {
    "architectures": ["QWenLMHeadModel"],
    "auto_map": {
        "AutoConfig": "configuration_qwen.QWenConfig",
        "AutoModelForCausalLM": "modeling_qwen.QWenLMHeadModel",
    },
    "model_type": "qwen",
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "kv_channels": 128,
    "max_position_embeddings": 32768,
    "seq_length": 8192,
    "vocab_size": 151936,
    "use_dynamic_ntk": True,
    "use_logn_attn": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.32.0",
}

LLAVA_15_FLAT: dict[str, Any] = {  # liuhaotian/llava-v1.5-7b: the language model's keys at the top level
    "_name_or_path": "llava-v1.5-7b",
    "architectures": ["LlavaLlamaForCausalLM"],
    "model_type": "llava",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "mm_hidden_size": 1024,
    "mm_projector_type": "mlp2x_gelu",
    "mm_vision_tower": "openai/clip-vit-large-patch14-336",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "torch_dtype": "float16",
    "transformers_version": "4.31.0",
    "vocab_size": 32000,
}

LLAVA_15_HF: dict[str, Any] = {  # llava-hf/llava-1.5-7b-hf: the language model nested in text_config
    "architectures": ["LlavaForConditionalGeneration"],
    "image_token_index": 32000,
    "model_type": "llava",
    "projector_hidden_act": "gelu",
    "text_config": {
        "_name_or_path": "lmsys/vicuna-7b-v1.5",
        "architectures": ["LlamaForCausalLM"],
        "max_position_embeddings": 4096,
        "model_type": "llama",
        "torch_dtype": "float16",
        "vocab_size": 32064,
    },
    "torch_dtype": "float16",
    "transformers_version": "4.36.0.dev0",
    "vision_config": {"hidden_size": 1024, "image_size": 336, "model_type": "clip_vision_model", "patch_size": 14},
    "vocab_size": 32064,
}

DEEPSEEK_VL2_TINY: dict[str, Any] = {  # no "architectures" list
    "model_type": "deepseek_vl_v2",
    "language_config": {
        "hidden_size": 1280,
        "max_position_embeddings": 4096,
        "model_type": "deepseek_v2",
        "num_hidden_layers": 12,
        "torch_dtype": "bfloat16",
        "vocab_size": 129280,
    },
    "projector_config": {"model_type": "mlp_projector", "n_embed": 1280},
    "tile_tag": "2D",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.38.2",
    "vision_config": {"layers": 27, "model_name": "siglip_so400m_patch14_384", "width": 1152},
}

JANUS_13B: dict[str, Any] = {  # deepseek-ai/Janus-1.3B: model_type multi_modality, no "architectures"
    "aligner_config": {"cls": "MlpProjector", "params": {"depth": 2, "input_dim": 1024, "n_embed": 2048}},
    "language_config": {
        "hidden_size": 2048,
        "max_position_embeddings": 16384,
        "model_type": "llama",
        "num_hidden_layers": 24,
        "torch_dtype": "bfloat16",
        "vocab_size": 102400,
    },
    "model_type": "multi_modality",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "vision_config": {
        "cls": "CLIPVisionTower",
        "params": {"image_size": 384, "model_name": "siglip_large_patch16_384"},
    },
}

LLAMA4_MAVERICK_FP8: dict[str, Any] = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "model_type": "llama4",
    "quantization_config": {
        "config_groups": {
            "group_0": {
                "input_activations": {"dynamic": True, "num_bits": 8, "strategy": "token", "type": "float"},
                "targets": ["Linear"],
                "weights": {"dynamic": False, "num_bits": 8, "strategy": "channel", "type": "float"},
            }
        },
        "format": "float-quantized",
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    },
    "text_config": {
        "hidden_size": 5120,
        "max_position_embeddings": 1048576,
        "model_type": "llama4_text",
        "num_hidden_layers": 48,
        "num_local_experts": 128,
        "vocab_size": 202048,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0.dev0",
    "vision_config": {"hidden_size": 1408, "model_type": "llama4_vision_model"},
}

SD15_INDEX: dict[str, Any] = {
    "_class_name": "StableDiffusionPipeline",
    "feature_extractor": ["transformers", "CLIPImageProcessor"],
    "safety_checker": [None, None],
    "scheduler": ["diffusers", "PNDMScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "unet": ["diffusers", "UNet2DConditionModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}

MISTRAL_7B: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0",
    "vocab_size": 32768,
}

E5_MISTRAL: dict[str, Any] = {
    **MISTRAL_7B,
    "architectures": ["MistralModel"],
    "torch_dtype": "float16",
    "transformers_version": "4.34.0",
    "vocab_size": 32000,
}

GTE_QWEN2_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "auto_map": {"AutoModel": "modeling_qwen.Qwen2Model"},
    "model_type": "qwen2",
    "hidden_size": 3584,
    "max_position_embeddings": 131072,
    "num_hidden_layers": 28,
    "torch_dtype": "float32",
    "transformers_version": "4.41.2",
    "vocab_size": 151646,
}

QWEN3_EMBEDDING: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "max_position_embeddings": 32768,
    "num_hidden_layers": 28,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.3",
    "vocab_size": 151669,
}

GEMMA3_4B: dict[str, Any] = {  # google/gemma-3-4b-it: no max_position_embeddings anywhere
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "image_token_index": 262144,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27},
}

DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "first_k_dense_replace": 3,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "vocab_size": 129280,
}  # fmt: skip

DBRX_INSTRUCT: dict[str, Any] = {
    "architectures": ["DbrxForCausalLM"],
    "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "model_type": "", "rope_theta": 500000},
    "d_model": 6144,
    "ffn_config": {"ffn_hidden_size": 10752, "model_type": "", "moe_jitter_eps": 0, "moe_loss_weight": 0.05,
                   "moe_num_experts": 16, "moe_top_k": 4},
    "max_seq_len": 32768,
    "model_type": "dbrx",
    "n_heads": 48,
    "n_layers": 40,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.38.2",
    "vocab_size": 100352,
}  # fmt: skip

TRANSFORMERS_TF = '"modelFramework":{"name":"transformers","version":"%s"}'
SAFETENSORS = '"modelFormat":{"name":"safetensors","version":"1.0.0"}'


def _transformers(
    model_type: str,
    arch: str,
    version: str,
    *,
    size: str,
    tokens: int,
    caps: str,
    dtype: str,
    size_bytes: int,
    vision: bool = False,
    embedding: bool = False,
    quantization: str = "",
) -> str:
    parts = [
        f'"modelType":"{model_type}"',
        f'"modelArchitecture":"{arch}"',
        TRANSFORMERS_TF % version,
        SAFETENSORS,
        f'"modelParameterSize":"{size}"',
    ]
    if tokens:
        parts.append(f'"maxTokens":{tokens}')
    parts.append(f'"modelCapabilities":["{caps}"]')
    parts.append(
        _decoded(
            architecture=arch,
            context_length=tokens,
            has_vision=vision,
            is_embedding=embedding,
            model_size_bytes=size_bytes,
            model_type=model_type,
            parameter_count=size,
            torch_dtype=dtype,
            transformers_version=version,
        )
    )
    if quantization:
        parts.append(f'"quantization":"{quantization}"')
    return ",".join(parts)


SENTENCE_TRANSFORMERS = {
    "__version__": {"sentence_transformers": "3.0.1"},
    "prompts": {},
    "similarity_fn_name": "cosine",
}

CASES = [
    # OME reads seq_length first for Qwen v1 (8192, the trained window; 32768 is only the RoPE table).
    Golden(
        "qwen_v1_seq_length",
        {"config.json": QWEN_7B},
        _transformers(
            "qwen",
            "QWenLMHeadModel",
            "4.32.0",
            size="8.01K",
            tokens=8192,
            caps="TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=16016,
        ),
        _SMALL,
    ),
    # Deliberate: OME reads the llava context only from text_config, so the original flat llava-v1.5
    # config gets none (maxTokens omitted, context_length 0); here the top-level 4096.
    Golden(
        "llava_v15_flat_context",
        {"config.json": LLAVA_15_FLAT},
        _transformers(
            "llava",
            "LlavaLlamaForCausalLM",
            "4.31.0",
            size="8.01K",
            tokens=4096,
            caps="IMAGE_TEXT_TO_TEXT",
            dtype="float16",
            size_bytes=16016,
            vision=True,
        ),
        _SMALL,
    ),
    # Same as OME: the llava-hf layout has the context in text_config.
    Golden(
        "llava_v15_hf_text_config",
        {"config.json": LLAVA_15_HF},
        _transformers(
            "llava",
            "LlavaForConditionalGeneration",
            "4.36.0.dev0",
            size="8.01K",
            tokens=4096,
            caps="IMAGE_TEXT_TO_TEXT",
            dtype="float16",
            size_bytes=16016,
            vision=True,
        ),
        _SMALL,
    ),
    # Same as OME: no "architectures" list -> the loader's class name.
    Golden(
        "deepseek_vl_v2_default_architecture",
        {"config.json": DEEPSEEK_VL2_TINY},
        _transformers(
            "deepseek_vl_v2",
            "DeepseekVLV2ForCausalLM",
            "4.38.2",
            size="8.01K",
            tokens=4096,
            caps="IMAGE_TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=16016,
            vision=True,
        ),
        _SMALL,
    ),
    Golden(
        "janus_default_architecture",
        {"config.json": JANUS_13B},
        _transformers(
            "multi_modality",
            "JanusMultiModalityCausalLM",
            "4.33.1",
            size="8.01K",
            tokens=16384,
            caps="IMAGE_TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=16016,
            vision=True,
        ),
        _SMALL,
    ),
    Golden(
        "janus_type_default_architecture",
        {"config.json": {**JANUS_13B, "model_type": "janus"}},
        _transformers(
            "janus",
            "JanusMultiModalityCausalLM",
            "4.33.1",
            size="8.01K",
            tokens=16384,
            caps="IMAGE_TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=16016,
            vision=True,
        ),
        _SMALL,
    ),
    # Same as OME: an FP8 Llama 4 is float8 (one byte per weight), not the bfloat16 of torch_dtype.
    Golden(
        "llama4_fp8_dtype",
        {"config.json": LLAMA4_MAVERICK_FP8},
        _transformers(
            "llama4",
            "Llama4ForConditionalGeneration",
            "4.51.0.dev0",
            size="8.01K",
            tokens=1048576,
            caps="IMAGE_TEXT_TO_TEXT",
            dtype="float8",
            size_bytes=8008,
            vision=True,
        ),
        _SMALL,
    ),
    # Same as OME: a pipeline index without _diffusers_version writes "version":"" in both objects.
    Golden(
        "diffusers_without_version",
        {"model_index.json": SD15_INDEX},
        '"modelType":"diffusers","modelArchitecture":"StableDiffusionPipeline",'
        '"modelFramework":{"name":"diffusers","version":""},"modelFormat":{"name":"diffusers","version":""},'
        '"modelParameterSize":"0","modelCapabilities":["TEXT_TO_IMAGE"],'
        + _decoded(
            architecture="StableDiffusionPipeline",
            context_length=0,
            has_vision=True,
            is_embedding=False,
            model_size_bytes=0,
            model_type="diffusers",
            parameter_count="0",
            torch_dtype="",
            transformers_version="",
        ),
    ),
    Golden(
        "diffusers_with_version",
        {"model_index.json": {**SD15_INDEX, "_diffusers_version": "0.6.0"}},
        '"modelType":"diffusers","modelArchitecture":"StableDiffusionPipeline",'
        '"modelFramework":{"name":"diffusers","version":"0.6.0"},"modelFormat":{"name":"diffusers","version":"0.6.0"},'
        '"modelParameterSize":"0","modelCapabilities":["TEXT_TO_IMAGE"],'
        + _decoded(
            architecture="StableDiffusionPipeline",
            context_length=0,
            has_vision=True,
            is_embedding=False,
            model_size_bytes=0,
            model_type="diffusers",
            parameter_count="0",
            torch_dtype="",
            transformers_version="",
        ),
    ),
    # An ordinary mistral is a text model (OME: EMBEDDING for every mistral, a bug).
    Golden(
        "mistral_text",
        {"config.json": MISTRAL_7B},
        _transformers(
            "mistral",
            "MistralForCausalLM",
            "4.42.0.dev0",
            size="8.01K",
            tokens=32768,
            caps="TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=16016,
        ),
        _SMALL,
    ),
    # An embedding mistral (e5-mistral, MistralModel): EMBEDDING and is_embedding agree.
    Golden(
        "e5_mistral_embedding",
        {"config.json": E5_MISTRAL, "config_sentence_transformers.json": SENTENCE_TRANSFORMERS},
        _transformers(
            "mistral",
            "MistralModel",
            "4.34.0",
            size="8.01K",
            tokens=32768,
            caps="EMBEDDING",
            dtype="float16",
            size_bytes=16016,
            embedding=True,
        ),
        _SMALL,
    ),
    Golden(
        "mistral_model_without_sentence_transformers",
        {"config.json": E5_MISTRAL},
        _transformers(
            "mistral",
            "MistralModel",
            "4.34.0",
            size="8.01K",
            tokens=32768,
            caps="EMBEDDING",
            dtype="float16",
            size_bytes=16016,
            embedding=True,
        ),
        _SMALL,
    ),
    # Deliberate: a sentence-transformers model of any family is an embedding model (OME: only qwen3).
    Golden(
        "gte_qwen2_sentence_transformers",
        {"config.json": GTE_QWEN2_7B, "config_sentence_transformers.json": SENTENCE_TRANSFORMERS},
        _transformers(
            "qwen2",
            "Qwen2ForCausalLM",
            "4.41.2",
            size="8.01K",
            tokens=131072,
            caps="EMBEDDING",
            dtype="float32",
            size_bytes=32032,
            embedding=True,
        ),
        _SMALL,
    ),
    Golden(
        "qwen3_embedding_sentence_transformers",
        {"config.json": QWEN3_EMBEDDING, "config_sentence_transformers.json": SENTENCE_TRANSFORMERS},
        _transformers(
            "qwen3",
            "Qwen3ForCausalLM",
            "4.51.3",
            size="8.01K",
            tokens=32768,
            caps="EMBEDDING",
            dtype="bfloat16",
            size_bytes=16016,
            embedding=True,
        ),
        _SMALL,
    ),
    # Deliberate: Gemma 3 serves 131072 tokens; OME says 8192 (sliding window x RoPE factor).
    Golden(
        "gemma3_context",
        {"config.json": GEMMA3_4B},
        _transformers(
            "gemma3",
            "Gemma3ForConditionalGeneration",
            "4.50.0.dev0",
            size="8.01K",
            tokens=131072,
            caps="IMAGE_TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=16016,
            vision=True,
        ),
        _SMALL,
    ),
    # Without safetensors: the published sizes OME states for known shapes (same as OME).
    Golden(
        "llama3_70b_estimate",
        {"config.json": LLAMA3_70B},
        _transformers(
            "llama",
            "LlamaForCausalLM",
            "4.40.0.dev0",
            size="70B",
            tokens=8192,
            caps="TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=140_000_000_000,
        ),
    ),
    Golden(
        "deepseek_v3_estimate",
        {"config.json": DEEPSEEK_V3},
        _transformers(
            "deepseek_v3",
            "DeepseekV3ForCausalLM",
            "4.33.1",
            size="685B",
            tokens=163840,
            caps="TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=1_370_000_000_000,
            quantization="fp8",
        ),
    ),
    Golden(
        "qwen_v1_7b_estimate",
        {"config.json": QWEN_7B},
        _transformers(
            "qwen",
            "QWenLMHeadModel",
            "4.32.0",
            size="7B",
            tokens=8192,
            caps="TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=14_000_000_000,
        ),
    ),
    # Deliberate: DBRX counted from its own keys (OME: 91.8B from two matrices per expert).
    Golden(
        "dbrx_estimate",
        {"config.json": DBRX_INSTRUCT},
        _transformers(
            "dbrx",
            "DbrxForCausalLM",
            "4.38.2",
            size="131.60B",
            tokens=32768,
            caps="TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=263_193_047_040,
        ),
    ),
    # Kept: transformers >= 4.56 writes "dtype"; OME reads only torch_dtype.
    Golden(
        "dtype_key",
        {"config.json": {k: v for k, v in LLAMA3_70B.items() if k != "torch_dtype"} | {"dtype": "bfloat16"}},
        _transformers(
            "llama",
            "LlamaForCausalLM",
            "4.40.0.dev0",
            size="8.01K",
            tokens=8192,
            caps="TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=16016,
        ),
        _SMALL,
    ),
    # Kept: a context beyond int32 is unknown (OME's int32 conversion writes a negative maxTokens).
    Golden(
        "context_above_int32",
        {"config.json": {**LLAMA3_70B, "max_position_embeddings": 2**31}},
        _transformers(
            "llama",
            "LlamaForCausalLM",
            "4.40.0.dev0",
            size="8.01K",
            tokens=0,
            caps="TEXT_TO_TEXT",
            dtype="bfloat16",
            size_bytes=16016,
        ),
        _SMALL,
    ),
]


def _write_model(root: Path, case: Golden) -> None:
    for rel, document in case.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document))
    for rel, shapes in case.tensors.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: np.zeros(s, dtype=np.float16) for k, s in shapes.items()}, str(path))


def entry_bytes(model_dir: Path) -> str:
    """The ConfigMap entry of a Ready model parsed from ``model_dir``, through the entry codec."""
    parsed = parse_model_dir(model_dir)
    document = {"name": "m", "status": "Ready", "config": parsed.to_config_entry()}
    entry = ModelEntry.from_json(json.dumps(document))
    assert entry is not None
    return entry.to_json()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_entry_bytes(case: Golden, tmp_path: Path) -> None:
    _write_model(tmp_path, case)
    assert entry_bytes(tmp_path) == _entry(case.expected)


def test_case_names_are_unique() -> None:
    assert len({c.name for c in CASES}) == len(CASES)
