"""Unit tests for model_agent.model.metadata and model_agent.local.metadata_files: config discovery, loaders,
safetensors headers, hostile input.

Model directories are built in tmp_path with the real ``safetensors.numpy.save_file`` and real JSON
config files; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from model_agent.local import metadata_files
from model_agent.local.metadata_files import (
    MAX_SAFETENSORS_HEADER_BYTES,
    count_directory_parameters,
    count_safetensors_parameters,
    find_config_file,
    parse_model_dir,
    read_safetensors_header,
)
from model_agent.model import metadata
from model_agent.model.metadata import (
    DECODED_CONFIGURATION_KEYS,
    MetadataError,
    bytes_per_parameter,
    determine_capabilities,
    estimate_model_size_bytes,
    format_parameter_size,
    load_json_bytes,
    quantization_from_method,
)

LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "max_position_embeddings": 131072,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3", "original_max_position_embeddings": 8192},
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
}


def write_json(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def write_tensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: Any = np.float16) -> int:
    """Write a real safetensors file; return its element count excluding scalars."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: np.zeros(s, dtype=dtype) for k, s in shapes.items()}, str(path), metadata={"format": "pt"})
    return sum(int(np.prod(s)) for s in shapes.values() if s)


def write_raw_safetensors(path: Path, header: bytes, claimed_len: int | None = None, data: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(header) if claimed_len is None else claimed_len
    path.write_bytes(struct.pack("<Q", n) + header + data)
    return path


def llama_dir(root: Path, **overrides: Any) -> Path:
    write_json(root / "config.json", {**LLAMA_CONFIG, **overrides})
    return root


# ---------------------------------------------------------------------------------------------------------
# Pure rules


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (999, "999"),
        (1000, "1K"),
        (1500000, "1.5M"),
        (1250000000, "1.2B"),
        (7241732096, "7.24B"),
        (8030261248, "8.03B"),
        (685000000000, "685B"),
        (1100000000000, "1.10T"),
        (0, "0"),
        (70_000_000_000, "70B"),
        (1080, "1.1K"),  # v*100 integral => one decimal, as in Go
        (1234, "1.23K"),
    ],
)
def test_format_parameter_size_go_vectors(count: int, expected: str) -> None:
    assert format_parameter_size(count) == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1000, max_value=2**63 - 1))
def test_format_parameter_size_is_close_to_the_count(count: int) -> None:
    text = format_parameter_size(count)
    units = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
    assert text[-1] in units
    value = float(text[:-1]) * units[text[-1]]
    # %.1f is used whenever v*100 is integral (Go's rule), so the error can reach half a tenth.
    assert abs(value - count) <= 0.0501 * units[text[-1]]


@pytest.mark.parametrize(
    ("dtype", "size"),
    [("float32", 4), ("bfloat16", 2), ("BF16", 2), ("float16", 2), ("int8", 1), ("fp8", 1), ("int4", 0.5),
     ("", 4), ("complex64", 4)],
)  # fmt: skip
def test_bytes_per_parameter(dtype: str, size: float) -> None:
    assert bytes_per_parameter(dtype) == size


def test_estimate_model_size_bytes() -> None:
    assert estimate_model_size_bytes(8030261248, "bfloat16") == 16060522496
    assert estimate_model_size_bytes(3, "int4") == 1  # truncated like Go
    assert estimate_model_size_bytes(0, "float32") == 0


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("fp8", "fp8"),
        ("fbgemm_fp8", "fp8"),
        ("FP8", "fp8"),
        ("int4", "int4"),
        ("w4a16_int4_fp8", "int4"),
        ("awq", None),
        ("gptq", None),
        ("mxfp4", None),
        ("compressed-tensors", None),
        ("", None),
        (None, None),
    ],
)
def test_quantization_from_method(method: str | None, expected: str | None) -> None:
    assert quantization_from_method(method) == expected


@pytest.mark.parametrize(
    ("arch", "mtype", "vision", "embedding", "diffusers", "expected"),
    [
        # rule 1: diffusers pipelines by class name
        ("StableDiffusionXLImg2ImgPipeline", "diffusers", True, False, True, ["IMAGE_TEXT_TO_IMAGE"]),
        ("QwenImageEditPipeline", "diffusers", True, False, True, ["IMAGE_TEXT_TO_IMAGE"]),
        ("StableDiffusionInpaintPipeline", "diffusers", True, False, True, ["IMAGE_TEXT_TO_IMAGE"]),
        ("StableDiffusionXLPipeline", "diffusers", True, False, True, ["TEXT_TO_IMAGE"]),
        ("PixArtSigmaPipeline", "diffusers", True, False, True, ["TEXT_TO_IMAGE"]),
        ("TextToVideoSDPipeline", "diffusers", True, False, True, ["TEXT_TO_VIDEO"]),
        ("WanT2VPipeline", "diffusers", True, False, True, ["TEXT_TO_VIDEO"]),
        ("StableVideoDiffusionPipeline", "diffusers", True, False, True, ["IMAGE_TEXT_TO_VIDEO"]),
        # rule 1 falls through, rule 3 catches it (diffusers always say vision)
        ("FluxPipeline", "diffusers", True, False, True, ["IMAGE_TEXT_TO_TEXT"]),
        # rule 2
        ("X", "nemotronh_nano_vl", False, False, False,
         ["IMAGE_TEXT_TO_TEXT", "TEXT_TO_TEXT", "AUDIO_TO_TEXT"]),
        # rule 3 beats everything after it
        ("Qwen2_5OmniModel", "qwen2_5_omni", True, False, False, ["IMAGE_TEXT_TO_TEXT"]),
        # a non-diffusers architecture containing "image" is not rule 1
        ("ImageGPTForCausalImageModeling", "imagegpt", False, False, False, ["TEXT_TO_TEXT"]),
        # rule 4
        ("Qwen2_5OmniModel", "qwen2_5_omni", False, False, False,
         ["TEXT_TO_AUDIO", "IMAGE_TEXT_TO_AUDIO", "VIDEO_TEXT_TO_AUDIO", "AUDIO_TO_TEXT", "AUDIO_TO_AUDIO"]),
        # rule 5
        ("WhisperForConditionalGeneration", "whisper", False, False, False, ["AUDIO_TO_TEXT"]),
        ("Wav2Vec2ForCTC", "wav2vec2", False, False, False, ["AUDIO_TO_TEXT"]),
        ("HubertForCTC", "hubert", False, False, False, ["AUDIO_TO_TEXT"]),
        ("Speech2TextForSpeechToText", "speech_to_text", False, False, False, ["AUDIO_TO_TEXT"]),
        # rule 6
        ("Qwen3Model", "qwen3", False, True, False, ["EMBEDDING"]),
        ("NewEmbeddingModel", "new", False, False, False, ["EMBEDDING"]),
        ("SentenceModel", "x", False, False, False, ["EMBEDDING"]),
        ("XLMRobertaModel", "xlm-roberta", False, False, False, ["EMBEDDING"]),  # "roBERTa"
        ("BertModel", "bert", False, False, False, ["EMBEDDING"]),
        ("MistralModel", "mistral", False, False, False, ["EMBEDDING"]),
        ("MistralForCausalLM", "mistral", False, False, False, ["TEXT_TO_TEXT"]),
        # rule 7
        ("LlamaForCausalLM", "llama", False, False, False, ["TEXT_TO_TEXT"]),
        ("", "", False, False, False, ["TEXT_TO_TEXT"]),
    ],
)  # fmt: skip
def test_capability_rules(
    arch: str, mtype: str, vision: bool, embedding: bool, diffusers: bool, expected: list[str]
) -> None:
    got = determine_capabilities(arch, mtype, has_vision=vision, is_embedding=embedding, is_diffusers=diffusers)
    assert got == expected


def test_non_finite_tokens_match_go_rewrite() -> None:
    data = b'{"a": NaN, "b": Infinity, "c": -Infinity, "d": [Infinity, NaN], "e": 1e999, "f": "NaN"}'
    assert load_json_bytes(data, "x") == {
        "a": None,
        "b": 1e308,
        "c": -1e308,
        "d": [1e308, None],
        "e": 1e308,
        "f": "NaN",
    }


# ---------------------------------------------------------------------------------------------------------
# A llama-like model, end to end


def test_llama_like_model(tmp_path: Path) -> None:
    model = llama_dir(tmp_path / "llama")
    expected = write_tensors(
        model / "model.safetensors",
        {
            "model.embed_tokens.weight": (64, 16),
            "lm_head.weight": (64, 16),
            "model.norm.weight": (16,),
            "step": (),
        },
    )
    meta = parse_model_dir(model)
    assert meta.model_type == "llama"
    assert meta.model_architecture == "LlamaForCausalLM"
    assert meta.model_framework.name == "transformers"
    assert meta.model_framework.version == "4.43.0.dev0"
    assert (meta.model_format.name, meta.model_format.version) == ("safetensors", "1.0.0")
    assert meta.parameter_count == expected == 2064
    assert meta.parameter_count_source == "safetensors"
    assert meta.model_parameter_size == "2.06K"
    assert meta.max_tokens == 131072
    assert meta.capabilities == ["TEXT_TO_TEXT"]
    assert meta.quantization is None
    assert meta.diffusion_pipeline is None
    assert meta.warnings == ()
    assert list(meta.decoded_configuration) == sorted(DECODED_CONFIGURATION_KEYS)
    assert meta.decoded_configuration == {
        "architecture": "LlamaForCausalLM",
        "context_length": 131072,
        "has_vision": False,
        "is_embedding": False,
        "model_size_bytes": 2064 * 2,
        "model_type": "llama",
        "parameter_count": "2.06K",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
    }


def test_config_entry_shape(tmp_path: Path) -> None:
    model = llama_dir(tmp_path / "m")
    write_tensors(model / "model.safetensors", {"w": (10, 10)})
    meta = parse_model_dir(model)
    entry = meta.to_config_entry()
    assert list(entry) == [
        "modelType",
        "modelArchitecture",
        "modelFramework",
        "modelFormat",
        "modelParameterSize",
        "maxTokens",
        "modelCapabilities",
        "decodedModelConfiguration",
        "artifact",
    ]
    assert entry["artifact"] == {"sha": "", "parentPath": None, "childrenPaths": None}
    assert entry["modelFramework"] == {"name": "transformers", "version": "4.43.0.dev0"}
    assert json.loads(json.dumps(entry)) == entry
    artifact = {"sha": "abc", "parentPath": {"clusterbasemodel.m": "/models/m"}, "childrenPaths": []}
    assert meta.to_config_entry(artifact)["artifact"] == artifact


def test_framework_version_omitted_when_unknown(tmp_path: Path) -> None:
    cfg = {k: v for k, v in LLAMA_CONFIG.items() if k != "transformers_version"}
    write_json(tmp_path / "config.json", cfg)
    meta = parse_model_dir(tmp_path)
    assert meta.model_framework.version is None
    assert meta.to_config_entry()["modelFramework"] == {"name": "transformers"}


def test_estimate_when_no_safetensors(tmp_path: Path) -> None:
    meta = parse_model_dir(llama_dir(tmp_path))
    h, layers, vocab = 4096, 32, 128256
    assert meta.parameter_count == vocab * h + layers * 12 * h * h
    assert meta.parameter_count_source == "estimate"
    assert any("no .safetensors files" in w for w in meta.warnings)


def test_moe_estimate(tmp_path: Path) -> None:
    cfg = {
        "model_type": "some_moe",
        "hidden_size": 100,
        "num_hidden_layers": 2,
        "intermediate_size": 300,
        "moe_intermediate_size": 50,
        "vocab_size": 1000,
        "num_local_experts": 8,
        "n_shared_experts": 1,
    }
    write_json(tmp_path / "config.json", cfg)
    h = 100
    per_layer = 4 * h * h + 1 * 2 * h * 300 + 8 * 2 * h * 50 + h * 8 + 2 * h
    assert parse_model_dir(tmp_path).parameter_count == h * 1000 + 2 * per_layer


def test_total_size_bytes_used_only_when_count_unknown(tmp_path: Path) -> None:
    write_json(tmp_path / "a" / "config.json", {"model_type": "mystery"})
    meta = parse_model_dir(tmp_path / "a", total_size_bytes=12345)
    assert meta.parameter_count == 0
    assert meta.model_parameter_size == "0"
    assert meta.parameter_count_source == "none"
    assert meta.decoded_configuration["model_size_bytes"] == 12345
    model = llama_dir(tmp_path / "b")
    write_tensors(model / "model.safetensors", {"w": (10,)})
    assert parse_model_dir(model, total_size_bytes=12345).decoded_configuration["model_size_bytes"] == 20


def test_unknown_dtype_counts_four_bytes_and_dtype_key_fallback(tmp_path: Path) -> None:
    write_json(tmp_path / "a" / "config.json", {"model_type": "x", "torch_dtype": "weird"})
    write_tensors(tmp_path / "a" / "model.safetensors", {"w": (10,)})
    assert parse_model_dir(tmp_path / "a").decoded_configuration["model_size_bytes"] == 40
    # transformers >= 4.56 writes "dtype"
    write_json(tmp_path / "b" / "config.json", {"model_type": "x", "dtype": "bfloat16"})
    write_tensors(tmp_path / "b" / "model.safetensors", {"w": (10,)})
    decoded = parse_model_dir(tmp_path / "b").decoded_configuration
    assert (decoded["torch_dtype"], decoded["model_size_bytes"]) == ("bfloat16", 20)


# ---------------------------------------------------------------------------------------------------------
# Loaders


def test_generic_max_sequence_length_fallback(tmp_path: Path) -> None:
    write_json(tmp_path / "config.json", {"model_type": "mpt", "max_sequence_length": 2048})
    assert parse_model_dir(tmp_path).max_tokens == 2048


def test_generic_nested_text_config_fallbacks(tmp_path: Path) -> None:
    cfg = {
        "model_type": "some_vlm",
        "architectures": ["SomeVLMForConditionalGeneration"],
        "llm_config": {
            "max_position_embeddings": 32768,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.50.0",
            "hidden_size": 10,
            "num_hidden_layers": 2,
            "vocab_size": 7,
        },
    }
    write_json(tmp_path / "config.json", cfg)
    meta = parse_model_dir(tmp_path)
    assert meta.max_tokens == 32768
    assert meta.decoded_configuration["torch_dtype"] == "bfloat16"
    assert meta.model_framework.version == "4.50.0"
    assert meta.parameter_count == 7 * 10 + 2 * 12 * 100
    assert meta.has_vision is False
    assert meta.capabilities == ["TEXT_TO_TEXT"]


def test_vision_config_means_vision(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llava_next",
        "architectures": ["LlavaNextForConditionalGeneration"],
        "text_config": {"max_position_embeddings": 4096},
        "vision_config": {"hidden_size": 1024},
    }
    write_json(tmp_path / "config.json", cfg)
    meta = parse_model_dir(tmp_path)
    assert meta.has_vision is True
    assert meta.decoded_configuration["has_vision"] is True
    assert meta.capabilities == ["IMAGE_TEXT_TO_TEXT"]
    assert meta.max_tokens == 4096


def test_qwen2_prefers_seq_length(tmp_path: Path) -> None:
    write_json(
        tmp_path / "a" / "config.json",
        {"model_type": "qwen2", "seq_length": 8192, "max_position_embeddings": 32768},
    )
    assert parse_model_dir(tmp_path / "a").max_tokens == 8192
    write_json(tmp_path / "b" / "config.json", {"model_type": "qwen2", "max_position_embeddings": 32768})
    assert parse_model_dir(tmp_path / "b").max_tokens == 32768


def test_chatglm_seq_length_and_estimate(tmp_path: Path) -> None:
    cfg = {
        "model_type": "chatglm",
        "architectures": ["ChatGLMModel"],
        "seq_length": 131072,
        "max_position_embeddings": 2048,
        "hidden_size": 16,
        "num_layers": 3,
        "padded_vocab_size": 100,
    }
    write_json(tmp_path / "config.json", cfg)
    meta = parse_model_dir(tmp_path)
    assert meta.max_tokens == 131072
    assert meta.parameter_count == 100 * 16 + 3 * 12 * 16 * 16
    # no torch_dtype: ChatGLM checkpoints are float16, so the size estimate uses 2 bytes
    assert meta.decoded_configuration["torch_dtype"] == ""
    assert meta.decoded_configuration["model_size_bytes"] == meta.parameter_count * 2


GEMMA3_CONFIG: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 5376,
        "num_hidden_layers": 62,
        "model_type": "gemma3_text",
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"},
}


def test_gemma3_context_is_not_sliding_window_times_factor(tmp_path: Path) -> None:
    # Published Gemma 3 27B config: window 1024, linear factor 8, no max_position_embeddings.
    # Go says 1024 * 8 = 8192; the model serves 131072 tokens (transformers' default for gemma3).
    write_json(tmp_path / "config.json", GEMMA3_CONFIG)
    meta = parse_model_dir(tmp_path)
    assert meta.max_tokens == 131072
    assert meta.has_vision is True
    assert meta.capabilities == ["IMAGE_TEXT_TO_TEXT"]


def test_gemma3_explicit_and_original_context(tmp_path: Path) -> None:
    explicit = json.loads(json.dumps(GEMMA3_CONFIG))
    explicit["text_config"]["max_position_embeddings"] = 32768
    write_json(tmp_path / "a" / "config.json", explicit)
    assert parse_model_dir(tmp_path / "a").max_tokens == 32768
    scaled = json.loads(json.dumps(GEMMA3_CONFIG))
    scaled["text_config"]["rope_scaling"]["original_max_position_embeddings"] = 16384
    write_json(tmp_path / "b" / "config.json", scaled)
    assert parse_model_dir(tmp_path / "b").max_tokens == 131072


@pytest.mark.parametrize(
    ("factor", "max_tokens"),
    [
        (2.0, 32768),
        (10**400, 131072),  # beyond float64: no factor, the default
        ([8], 131072),
        ("8", 131072),
        (True, 131072),
        (None, 131072),
        (1e308, None),  # a product beyond int64 (inf): out of range, unknown
        (1e12, None),
    ],
    ids=["factor 2", "huge integer", "a list", "a string", "a bool", "null", "product infinite", "product huge"],
)
def test_gemma3_scaled_context_with_a_factor_of_any_shape(tmp_path: Path, factor: Any, max_tokens: int | None) -> None:
    cfg = json.loads(json.dumps(GEMMA3_CONFIG))
    cfg["text_config"]["rope_scaling"] = {"factor": factor, "original_max_position_embeddings": 16384}
    write_json(tmp_path / "config.json", cfg)
    assert parse_model_dir(tmp_path).max_tokens == max_tokens


def test_gemma3_text_uses_max_position_embeddings(tmp_path: Path) -> None:
    cfg = {"model_type": "gemma3_text", "max_position_embeddings": 32768, "sliding_window": 512}
    write_json(tmp_path / "config.json", cfg)
    meta = parse_model_dir(tmp_path)
    assert meta.max_tokens == 32768
    assert meta.has_vision is False


def test_quantization_from_config(tmp_path: Path) -> None:
    llama_dir(tmp_path / "a", quantization_config={"quant_method": "fbgemm_fp8"})
    assert parse_model_dir(tmp_path / "a").quantization == "fp8"
    llama_dir(tmp_path / "b", quantization_config={"quant_method": "awq", "bits": 4})
    assert parse_model_dir(tmp_path / "b").quantization is None
    llama_dir(tmp_path / "c")
    meta = parse_model_dir(tmp_path / "c")
    assert meta.quantization is None
    assert "quantization" not in meta.to_config_entry()


def test_embedding_models(tmp_path: Path) -> None:
    write_json(tmp_path / "bert" / "config.json", {"model_type": "bert", "architectures": ["BertModel"]})
    assert parse_model_dir(tmp_path / "bert").is_embedding is True
    qwen = tmp_path / "qwen3emb"
    write_json(qwen / "config.json", {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    write_json(qwen / "config_sentence_transformers.json", {"similarity_fn_name": "cosine"})
    meta = parse_model_dir(qwen)
    assert meta.is_embedding is True
    assert meta.capabilities == ["EMBEDDING"]
    # a plain mistral chat model is not an embedding model (the Go loader says it is)
    write_json(tmp_path / "mis" / "config.json", {"model_type": "mistral", "architectures": ["MistralForCausalLM"]})
    assert parse_model_dir(tmp_path / "mis").capabilities == ["TEXT_TO_TEXT"]


def test_non_finite_config_values(tmp_path: Path) -> None:
    text = json.dumps({**LLAMA_CONFIG, "max_position_embeddings": 0})
    text = text.replace('"max_position_embeddings": 0', '"max_position_embeddings": Infinity, "x": NaN, "y": -Infinity')
    (tmp_path / "config.json").write_text(text)
    meta = parse_model_dir(tmp_path)
    assert meta.max_tokens is None  # 1e308 is no int32 context length
    assert meta.decoded_configuration["context_length"] == 0
    assert meta.model_type == "llama"


def test_missing_model_type_is_tolerated(tmp_path: Path) -> None:
    write_json(tmp_path / "config.json", {"architectures": ["Foo"], "max_position_embeddings": 512})
    meta = parse_model_dir(tmp_path)
    assert (meta.model_type, meta.model_architecture, meta.max_tokens) == ("", "Foo", 512)
    assert any("no model_type" in w for w in meta.warnings)


# ---------------------------------------------------------------------------------------------------------
# Diffusers


def diffusers_dir(root: Path, class_name: str = "StableDiffusionXLPipeline", unet: bool = True) -> tuple[Path, int]:
    index = {
        "_class_name": class_name,
        "_diffusers_version": "0.30.0",
        "scheduler": ["diffusers", "EulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "tokenizer_2": ["transformers", "CLIPTokenizer"],
        "unet" if unet else "transformer": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "feature_extractor": [None, None],
    }
    write_json(root / "model_index.json", index)
    write_json(root / "text_encoder" / "config.json", {"max_position_embeddings": 77})
    total = write_tensors(root / "text_encoder" / "model.safetensors", {"a": (10, 10)})
    write_json(root / "text_encoder_2" / "config.json", {"max_position_embeddings": 77})
    total += write_tensors(root / "text_encoder_2" / "model.safetensors", {"a": (5,)})
    part = "unet" if unet else "transformer"
    write_json(root / part / "config.json", {})
    total += write_tensors(root / part / "diffusion_pytorch_model.safetensors", {"a": (20, 3)})
    write_json(root / "vae" / "config.json", {})
    total += write_tensors(root / "vae" / "diffusion_pytorch_model.safetensors", {"a": (7,)})
    (root / "tokenizer").mkdir()
    return root, total


def test_diffusers_layout(tmp_path: Path) -> None:
    model, total = diffusers_dir(tmp_path / "sdxl")
    write_json(model / "config.json", {"model_type": "llama"})  # ignored: model_index.json wins
    meta = parse_model_dir(model)
    assert meta.config_path.name == "model_index.json"
    assert meta.is_diffusers
    assert meta.model_type == "diffusers"
    assert meta.model_architecture == "StableDiffusionXLPipeline"
    assert meta.model_framework.name == "diffusers"
    assert meta.model_framework.version == "0.30.0"
    assert (meta.model_format.name, meta.model_format.version) == ("diffusers", "0.30.0")
    assert meta.parameter_count == total == 100 + 5 + 60 + 7
    assert meta.max_tokens == 77
    assert meta.capabilities == ["TEXT_TO_IMAGE"]
    assert meta.quantization is None
    assert meta.decoded_configuration["has_vision"] is True
    assert meta.decoded_configuration["model_size_bytes"] == total * 4
    pipeline = meta.diffusion_pipeline
    assert pipeline is not None
    assert pipeline.to_spec() == {
        "className": "StableDiffusionXLPipeline",
        "scheduler": {"library": "diffusers", "type": "EulerDiscreteScheduler"},
        "textEncoder": {"library": "transformers", "type": "CLIPTextModel"},
        "tokenizer": {"library": "transformers", "type": "CLIPTokenizer"},
        "transformer": {"library": "diffusers", "type": "UNet2DConditionModel"},
        "vae": {"library": "diffusers", "type": "AutoencoderKL"},
        "additionalComponents": {
            "text_encoder_2": {"library": "transformers", "type": "CLIPTextModelWithProjection"},
            "tokenizer_2": {"library": "transformers", "type": "CLIPTokenizer"},
        },
    }


def test_diffusers_transformer_folder_and_missing_part(tmp_path: Path) -> None:
    model, total = diffusers_dir(tmp_path / "flux", class_name="FluxPipeline", unet=False)
    meta = parse_model_dir(model)
    assert meta.parameter_count == total
    assert meta.capabilities == ["IMAGE_TEXT_TO_TEXT"]  # rule 1 falls through, rule 3 catches it
    # a missing required part makes the count unknown
    (model / "vae" / "config.json").unlink()
    meta = parse_model_dir(model)
    assert meta.parameter_count == 0
    assert meta.model_parameter_size == "0"
    assert any("'vae'" in w for w in meta.warnings)


def test_diffusers_index_found_below_root(tmp_path: Path) -> None:
    diffusers_dir(tmp_path / "repo" / "pipeline")
    meta = parse_model_dir(tmp_path / "repo")
    assert meta.config_path == (tmp_path / "repo" / "pipeline" / "model_index.json").resolve()
    assert meta.max_tokens == 77


def test_diffusers_hostile_component_names_ignored(tmp_path: Path) -> None:
    model, total = diffusers_dir(tmp_path / "m")
    outside = tmp_path / "outside"
    write_json(outside / "config.json", {})
    write_tensors(outside / "model.safetensors", {"a": (1000,)})
    index = json.loads((model / "model_index.json").read_text())
    index["../outside"] = ["transformers", "Evil"]
    write_json(model / "model_index.json", index)
    assert parse_model_dir(model).parameter_count == total


def test_diffusers_index_without_class_name_is_an_error(tmp_path: Path) -> None:
    write_json(tmp_path / "model_index.json", {"vae": ["diffusers", "AutoencoderKL"]})
    write_json(tmp_path / "config.json", LLAMA_CONFIG)  # not a fallback: model_index.json is exclusive
    with pytest.raises(MetadataError, match="_class_name"):
        parse_model_dir(tmp_path)


# ---------------------------------------------------------------------------------------------------------
# Config discovery


def test_find_config_order(tmp_path: Path) -> None:
    root = tmp_path / "m"
    write_json(root / "a" / "config.json", {})
    write_json(root / "model" / "config.json", {})
    assert find_config_file(root) == (root / "model" / "config.json").resolve()
    write_json(root / "safetensors" / "config.json", {})
    assert find_config_file(root) == (root / "safetensors" / "config.json").resolve()
    write_json(root / "config.json", {})
    assert find_config_file(root) == (root / "config.json").resolve()
    write_json(root / "deep" / "er" / "model_index.json", {})
    assert find_config_file(root) == (root / "deep" / "er" / "model_index.json").resolve()
    write_json(root / "model_index.json", {})
    assert find_config_file(root) == (root / "model_index.json").resolve()


def test_walk_prefers_shallowest_then_name(tmp_path: Path) -> None:
    write_json(tmp_path / "b" / "config.json", {})
    write_json(tmp_path / "a" / "x" / "config.json", {})
    assert find_config_file(tmp_path) == (tmp_path / "b" / "config.json").resolve()
    write_json(tmp_path / "a2" / "config.json", {})
    assert find_config_file(tmp_path) == (tmp_path / "a2" / "config.json").resolve()


def test_walk_is_depth_limited_and_skips_hidden(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*[f"d{i}" for i in range(10)])
    write_json(deep / "config.json", {})
    write_json(tmp_path / ".cache" / "config.json", {})
    assert find_config_file(tmp_path) is None
    with pytest.raises(MetadataError, match=r"no model_index\.json or config\.json"):
        parse_model_dir(tmp_path)


def test_walk_is_entry_count_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(10):
        (tmp_path / f"a{i}").mkdir()
    write_json(tmp_path / "z" / "config.json", {})
    assert find_config_file(tmp_path) == (tmp_path / "z" / "config.json").resolve()
    monkeypatch.setattr(metadata_files, "MAX_WALK_ENTRIES", 5)
    assert find_config_file(tmp_path) is None


def test_walk_never_follows_symlinks_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write_json(outside / "config.json", LLAMA_CONFIG)
    write_json(outside / "model_index.json", {"_class_name": "X"})
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    os.symlink(outside, model / "linkdir")
    os.symlink(outside / "config.json", model / "sub" / "config.json")
    os.symlink(outside / "model_index.json", model / "model_index.json")
    assert find_config_file(model) is None


def test_symlinked_file_inside_root_is_accepted(tmp_path: Path) -> None:
    write_json(tmp_path / "blobs" / "abc", LLAMA_CONFIG)
    os.symlink(tmp_path / "blobs" / "abc", tmp_path / "config.json")
    assert find_config_file(tmp_path) == (tmp_path / "blobs" / "abc").resolve()
    assert parse_model_dir(tmp_path).model_type == "llama"


def test_symlinked_model_dir_is_resolved(tmp_path: Path) -> None:
    parent = llama_dir(tmp_path / "parent")
    write_tensors(parent / "model.safetensors", {"w": (3, 3)})
    child = tmp_path / "child"
    os.symlink("parent", child)  # a ReuseIfExists child is a relative symlink
    meta = parse_model_dir(child)
    assert meta.parameter_count == 9
    assert meta.config_path == (parent / "config.json").resolve()


def test_missing_dir_and_bad_config(tmp_path: Path) -> None:
    assert find_config_file(tmp_path / "nope") is None
    with pytest.raises(MetadataError, match="does not exist"):
        parse_model_dir(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(MetadataError, match="invalid JSON"):
        parse_model_dir(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(MetadataError, match="expected a JSON object"):
        parse_model_dir(tmp_path)
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(MetadataError, match="UTF-8"):
        parse_model_dir(tmp_path)


def test_deeply_nested_config_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(MetadataError, match="nested too deeply"):
        parse_model_dir(tmp_path)


def test_config_fifo_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "config.json")
    assert find_config_file(tmp_path) is None


# ---------------------------------------------------------------------------------------------------------
# Safetensors headers and shard indexes


def test_header_is_read_without_tensors(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    write_tensors(path, {"a": (2, 3), "b": (4,), "scalar": ()})
    header = read_safetensors_header(path)
    assert header["__metadata__"] == {"format": "pt"}
    assert header["a"]["shape"] == [2, 3]
    assert count_safetensors_parameters(path) == 10


def test_index_shards(tmp_path: Path) -> None:
    model = llama_dir(tmp_path / "m")
    n1 = write_tensors(model / "model-00001-of-00002.safetensors", {"a": (4, 4), "b": (2,)})
    n2 = write_tensors(model / "model-00002-of-00002.safetensors", {"c": (3, 5)})
    write_tensors(model / "consolidated.safetensors", {"x": (1000,)})  # not in the index: ignored
    write_json(
        model / "model.safetensors.index.json",
        {
            "metadata": {"total_size": 123},
            "weight_map": {
                "a": "model-00001-of-00002.safetensors",
                "b": "model-00001-of-00002.safetensors",
                "c": "model-00002-of-00002.safetensors",
            },
        },
    )
    assert count_directory_parameters(model) == n1 + n2 == 33
    assert parse_model_dir(model).parameter_count == 33


def test_directory_without_index_sums_all_files(tmp_path: Path) -> None:
    a = write_tensors(tmp_path / "a.safetensors", {"a": (4,)})
    b = write_tensors(tmp_path / "b.safetensors", {"b": (6,)})
    (tmp_path / "dir.safetensors").mkdir()
    assert count_directory_parameters(tmp_path) == a + b


@pytest.mark.parametrize(
    "shard",
    ["../outside.safetensors", "/etc/passwd", "missing.safetensors", "link.safetensors"],
)
def test_index_shards_must_stay_inside(tmp_path: Path, shard: str) -> None:
    write_tensors(tmp_path / "outside.safetensors", {"a": (10,)})
    model = llama_dir(tmp_path / "m")
    os.symlink(tmp_path / "outside.safetensors", model / "link.safetensors")
    write_json(model / "model.safetensors.index.json", {"weight_map": {"a": shard}})
    with pytest.raises(MetadataError):
        count_directory_parameters(model)
    meta = parse_model_dir(model)
    assert meta.parameter_count_source == "estimate"
    assert any("safetensors" in w for w in meta.warnings)


def test_safetensors_symlink_out_of_root_refused(tmp_path: Path) -> None:
    write_tensors(tmp_path / "outside.safetensors", {"a": (10,)})
    model = llama_dir(tmp_path / "m")
    os.symlink(tmp_path / "outside.safetensors", model / "model.safetensors")
    with pytest.raises(MetadataError, match="inside the model directory"):
        count_directory_parameters(model)


@pytest.mark.parametrize(
    ("index", "match"),
    [
        ({"weight_map": {}}, "no weight_map"),
        ({"weight_map": {"a": ""}}, "empty or non-string"),
        ({"weight_map": {"a": 5}}, "empty or non-string"),
        ([], "expected a JSON object"),
    ],
)
def test_bad_index(tmp_path: Path, index: Any, match: str) -> None:
    write_json(tmp_path / "model.safetensors.index.json", index)
    with pytest.raises(MetadataError, match=match):
        count_directory_parameters(tmp_path)


def hostile(tmp_path: Path, name: str) -> Path:
    return tmp_path / name / "model.safetensors"


def framed(body: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(body)) + body + data


HOSTILE_CASES: list[tuple[str, bytes, str]] = [
    ("short", b"\x01\x02", "too short"),
    ("len_beyond_file", struct.pack("<Q", 5000) + b'{"a":1}', "truncated"),
    ("claims_100MiB", struct.pack("<Q", 100 * 1024 * 1024) + b"{}" * 10, "exceeds"),
    ("claims_2_64", b"\xff" * 8 + b"{}", "exceeds"),
    ("tiny_len", struct.pack("<Q", 0), "too small"),
    ("garbage", framed(b"\x00\xffgarb"), "UTF-8|invalid JSON"),
    ("not_json", framed(b"hello!"), "invalid JSON"),
    ("not_object", framed(b"[]"), "not a JSON object"),
    ("nested_100k", framed(b"[" * 100_000 + b"]" * 100_000), "nested too deeply"),
    ("entry_not_object", framed(b'{"a": 1}'), "not an object"),
    ("no_shape", framed(b'{"a": {}}'), "invalid shape"),
    ("negative_dim", framed(b'{"a":{"shape":[-1]}}'), "invalid dimension"),
    ("bool_dim", framed(b'{"a":{"shape":[true]}}'), "invalid dimension"),
    ("float_dim", framed(b'{"a":{"shape":[2.0]}}'), "invalid dimension"),
    ("overflow", framed(b'{"a":{"shape":[4294967296,4294967296,4]}}'), "overflows"),
    ("bad_offsets", framed(b'{"a":{"shape":[2],"data_offsets":[4]}}'), "data_offsets"),
    ("data_truncated", framed(b'{"a":{"shape":[2],"data_offsets":[0,8]}}', b"\x00" * 4), "truncated"),
]


@pytest.mark.parametrize(("name", "content", "match"), HOSTILE_CASES, ids=[c[0] for c in HOSTILE_CASES])
def test_hostile_safetensors(tmp_path: Path, name: str, content: bytes, match: str) -> None:
    path = hostile(tmp_path, name)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    started = time.monotonic()
    with pytest.raises(MetadataError, match=match):
        count_safetensors_parameters(path)
    # and through the whole pipeline: the model still parses, with an estimate and a warning
    llama_dir(path.parent)
    meta = parse_model_dir(path.parent)
    assert meta.parameter_count_source == "estimate"
    assert meta.warnings
    assert time.monotonic() - started < 5


def test_hundred_mib_claim_allocates_nothing_big(tmp_path: Path) -> None:
    # A header just over the limit on a file that really is that big is refused before reading it.
    path = tmp_path / "big.safetensors"
    with path.open("wb") as f:
        f.write(struct.pack("<Q", MAX_SAFETENSORS_HEADER_BYTES + 1))
        f.truncate(MAX_SAFETENSORS_HEADER_BYTES + 64)  # sparse
    with pytest.raises(MetadataError, match="exceeds"):
        read_safetensors_header(path)


def test_zero_sized_dimension_counts_zero(tmp_path: Path) -> None:
    path = tmp_path / "z.safetensors"
    write_tensors(path, {"empty": (0, 5), "w": (3,)})
    assert count_safetensors_parameters(path) == 3


def test_fifo_safetensors_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(MetadataError):
        count_directory_parameters(tmp_path)


# ---------------------------------------------------------------------------------------------------------
# Properties: arbitrary bytes never escape as anything but MetadataError, and finish fast


def check_bytes(path: Path, blob: bytes) -> None:
    path.write_bytes(blob)
    started = time.monotonic()
    try:
        count = count_safetensors_parameters(path)
    except MetadataError as exc:
        assert exc.reason
    else:
        assert 0 <= count <= 2**63 - 1
    assert time.monotonic() - started < 1.0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=512))
def test_arbitrary_bytes(tmp_path: Path, blob: bytes) -> None:
    check_bytes(tmp_path / "x.safetensors", blob)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=512), slack=st.integers(min_value=-8, max_value=8))
def test_arbitrary_body_with_plausible_length(tmp_path: Path, body: bytes, slack: int) -> None:
    check_bytes(tmp_path / "x.safetensors", struct.pack("<Q", max(0, len(body) + slack)) + body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    header=st.dictionaries(
        st.text(max_size=8),
        json_values
        | st.fixed_dictionaries({"shape": st.lists(st.integers(min_value=-2, max_value=2**40), max_size=5)}),
        max_size=6,
    ),
    data=st.binary(max_size=64),
)
def test_arbitrary_json_headers(tmp_path: Path, header: dict[str, Any], data: bytes) -> None:
    raw = json.dumps(header).encode()
    check_bytes(tmp_path / "x.safetensors", struct.pack("<Q", len(raw)) + raw + data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=256))
def test_arbitrary_config_bytes(tmp_path: Path, blob: bytes) -> None:
    (tmp_path / "config.json").write_bytes(blob)
    try:
        meta = parse_model_dir(tmp_path)
    except MetadataError as exc:
        assert exc.reason
    else:
        assert set(meta.decoded_configuration) == set(DECODED_CONFIGURATION_KEYS)


# ---------------------------------------------------------------------------------------------------------
# Hostile sizes: memory is bounded by what decoding would allocate, and one model cannot fill an entry


def test_an_index_full_of_empty_objects_is_refused_before_decoding(tmp_path: Path) -> None:
    """64 MiB of ``{}`` decodes to tens of millions of dicts; it must be refused unread, in bounded memory."""
    import tracemalloc

    model = llama_dir(tmp_path / "m")
    blob = b'{"weight_map":[' + b"{}," * (8 * 1024 * 1024) + b"{}]}"  # 24 MiB, 8M values
    (model / "model.safetensors.index.json").write_bytes(blob)
    tracemalloc.start()
    try:
        meta = parse_model_dir(model)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert meta.parameter_count_source == "estimate"  # the index was refused; the config still parsed
    assert any("JSON values" in w for w in meta.warnings)
    assert peak < 3 * len(blob)  # the bytes once (read) plus slack, never the decoded objects


def test_a_config_with_too_many_values_is_a_metadata_error(tmp_path: Path) -> None:
    doc = {**LLAMA_CONFIG, "id2label": list(range(metadata.MAX_JSON_ELEMENTS))}
    write_json(tmp_path / "m" / "config.json", doc)
    with pytest.raises(MetadataError, match="JSON values"):
        parse_model_dir(tmp_path / "m")


def test_a_large_but_real_config_still_parses(tmp_path: Path) -> None:
    labels = {str(i): f"class, number {i}" for i in range(21_843)}  # ImageNet-21k sized id2label with commas
    llama_dir(tmp_path / "m", id2label=labels)
    assert parse_model_dir(tmp_path / "m").model_type == "llama"


def test_strings_from_the_config_are_cut_to_the_limit(tmp_path: Path) -> None:
    huge = "x" * 1_200_000
    llama_dir(tmp_path / "m", model_type=huge, architectures=[huge], torch_dtype=huge, transformers_version=huge)
    meta = parse_model_dir(tmp_path / "m")
    entry = json.dumps(meta.to_config_entry())
    assert len(entry) < 8 * metadata.MAX_METADATA_STRING + 2048
    assert len(meta.model_type) == len(meta.model_architecture) == metadata.MAX_METADATA_STRING


def test_a_pipeline_keeps_a_bounded_number_of_extra_components(tmp_path: Path) -> None:
    index: dict[str, Any] = {"_class_name": "FluxPipeline", "_diffusers_version": "0.30.0"}
    index.update({f"extra_{i:05d}": ["diffusers", "C" * 5000] for i in range(2000)})
    write_json(tmp_path / "p" / "model_index.json", index)
    meta = parse_model_dir(tmp_path / "p")
    assert meta.diffusion_pipeline is not None
    assert len(meta.diffusion_pipeline.additional_components) == metadata.MAX_PIPELINE_COMPONENTS
    assert len(json.dumps(meta.to_config_entry())) < 64 * 1024
