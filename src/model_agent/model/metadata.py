"""Model metadata: what a downloaded model directory says about itself
(docs/ome-compatibility.md#7-model-config-parsing, ConfigMap 6.3).

Role
----
After the weights of a model are in place, the agent describes them in its ConfigMap entry and in the
model's spec: model type, architecture, framework and format, parameter count and its human-readable
size, context length, capabilities, quantization, and a small "decoded configuration" object. This
module computes that description from the files alone:

* :func:`find_config_file` picks the file to read (``model_index.json`` for a diffusers pipeline, else
  ``config.json``; docs/ome-compatibility.md#72-which-file);
* :func:`parse_model_dir` parses it with a loader chosen by ``model_type`` and returns a
  :class:`ParsedMetadata` (docs/ome-compatibility.md#73-extraction (to 7.5));
* the safetensors helpers count parameters from file *headers* only; no tensor data is read.

Contract
--------
* Read-only and synchronous. It never writes, never talks to Kubernetes, and may take a while on a
  slow disk, so async callers run it in a worker thread.
* Confined: nothing is read outside the real path of ``model_dir``. A symlink that leads out of it
  (config file, shard, safetensors file) is ignored or refused, never followed. A ``model_dir`` that is
  itself a symlink (a ReuseIfExists child, docs/ome-compatibility.md#83-reuseifexists) is resolved first and its target
  is the root.
* Bounded: config files are read only up to :data:`MAX_CONFIG_FILE_BYTES`, shard indexes up to
  :data:`MAX_INDEX_FILE_BYTES`, safetensors headers up to :data:`MAX_SAFETENSORS_HEADER_BYTES` (checked
  against the claimed length *and* the real file size before anything is allocated). The recursive
  search stops at :data:`MAX_WALK_DEPTH` levels and :data:`MAX_WALK_ENTRIES` directory entries. JSON
  nested too deeply is an error, not a crash. Non-regular files (FIFOs, devices) are refused unread.
  Memory is bounded by what decoding allocates, not by bytes: a document with more than
  :data:`MAX_JSON_ELEMENTS` values is refused before it is decoded (a 64 MiB file of ``{}`` would
  otherwise become tens of millions of dicts). Strings taken from a model's files into the entry are
  cut to :data:`MAX_METADATA_STRING` characters and a pipeline keeps at most
  :data:`MAX_PIPELINE_COMPONENTS` extra components, so one model cannot fill the node's ConfigMap.
* One error type: :class:`MetadataError` (with ``reason``) means "no usable metadata": no directory,
  no config file, or a config file that cannot be read or is not a JSON object. A problem counting
  parameters (garbage, truncated or oversized safetensors header, a shard outside the model directory,
  no safetensors at all) is *not* an error: the loader's estimate is used instead and the problem is
  recorded in :attr:`ParsedMetadata.warnings` for the caller to log.
* Deterministic: directory listings and shard sets are processed in sorted order; the same files give
  the same result.
* Compatible: the output vocabulary and formatting (parameter size strings, capability names, the
  ``decodedModelConfiguration`` keys, ``Infinity``/``NaN`` handling) are those of OME's Go agent, so a
  mixed Go/Python fleet writes interchangeable entries. Deliberate departures are noted where made.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

__all__ = [
    "CAPABILITY_AUDIO_TO_AUDIO",
    "CAPABILITY_AUDIO_TO_TEXT",
    "CAPABILITY_EMBEDDING",
    "CAPABILITY_IMAGE_TEXT_TO_AUDIO",
    "CAPABILITY_IMAGE_TEXT_TO_IMAGE",
    "CAPABILITY_IMAGE_TEXT_TO_TEXT",
    "CAPABILITY_IMAGE_TEXT_TO_VIDEO",
    "CAPABILITY_TEXT_TO_AUDIO",
    "CAPABILITY_TEXT_TO_IMAGE",
    "CAPABILITY_TEXT_TO_TEXT",
    "CAPABILITY_TEXT_TO_VIDEO",
    "CAPABILITY_VIDEO_TEXT_TO_AUDIO",
    "DECODED_CONFIGURATION_KEYS",
    "MAX_CONFIG_FILE_BYTES",
    "MAX_INDEX_FILE_BYTES",
    "MAX_JSON_ELEMENTS",
    "MAX_METADATA_STRING",
    "MAX_PIPELINE_COMPONENTS",
    "MAX_SAFETENSORS_FILES",
    "MAX_SAFETENSORS_HEADER_BYTES",
    "MAX_WALK_DEPTH",
    "MAX_WALK_ENTRIES",
    "REGISTERED_MODEL_TYPES",
    "DiffusionComponent",
    "DiffusionPipeline",
    "MetadataError",
    "ModelFormat",
    "ModelFramework",
    "ParsedMetadata",
    "bytes_per_parameter",
    "count_directory_parameters",
    "count_safetensors_parameters",
    "determine_capabilities",
    "estimate_model_size_bytes",
    "find_config_file",
    "format_parameter_size",
    "load_json_bytes",
    "parse_model_dir",
    "quantization_from_method",
    "read_safetensors_header",
]

# --------------------------------------------------------------------------------------------------
# Limits and names

MAX_SAFETENSORS_HEADER_BYTES: Final = 10 * 1024 * 1024
"""Largest safetensors JSON header accepted (the Go agent's limit)."""
MAX_CONFIG_FILE_BYTES: Final = 16 * 1024 * 1024
"""Largest config.json / model_index.json / sentence-transformers config read (real ones are KiBs)."""
MAX_INDEX_FILE_BYTES: Final = 64 * 1024 * 1024
"""Largest ``*.safetensors.index.json`` read (the largest public ones are around 10 MiB)."""
MAX_SAFETENSORS_FILES: Final = 10_000
"""Most safetensors files (or distinct shards) counted for one directory."""
MAX_WALK_DEPTH: Final = 6
"""Deepest directory level (the model directory is level 0) the recursive config search enters."""
MAX_WALK_ENTRIES: Final = 10_000
# Values one JSON document may hold (objects, arrays and scalars, counted from the delimiters before
# decoding). The largest real shard index (~100k tensors) uses about a tenth of it; at the limit the
# decoded objects stay near 100 MiB.
MAX_JSON_ELEMENTS: Final = 1_000_000
# Characters kept of a string that a model's files put in the entry (model type, architecture, dtype...).
MAX_METADATA_STRING: Final = 256
# Extra components (beyond the five named ones) kept of a diffusers pipeline index.
MAX_PIPELINE_COMPONENTS: Final = 32
"""Most directory entries the recursive config search looks at before giving up."""

MODEL_INDEX_FILE: Final = "model_index.json"
CONFIG_FILE: Final = "config.json"
_CONFIG_SUBDIRS: Final = ("safetensors", "pytorch_model", "model")
_INDEX_FILES: Final = ("model.safetensors.index.json", "diffusion_pytorch_model.safetensors.index.json")
_SENTENCE_TRANSFORMERS_CONFIG: Final = "config_sentence_transformers.json"

_INT32_MAX: Final = 2**31 - 1
_SIZE_UNITS: Final = ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K"))
_INT64_MAX: Final = 2**63 - 1

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

# Loaders that are multimodal whatever the config says (the Go loaders answer "vision" unconditionally).
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

_BYTES_PER_PARAMETER: Final[Mapping[str, float]] = {
    "float32": 4.0,
    "float": 4.0,
    "bfloat16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "fp16": 2.0,
    "half": 2.0,
    "int8": 1.0,
    "fp8": 1.0,
    "float8": 1.0,
    "e4m3": 1.0,
    "int4": 0.5,
    "4bit": 0.5,
}

CAPABILITY_TEXT_TO_TEXT: Final = "TEXT_TO_TEXT"
CAPABILITY_EMBEDDING: Final = "EMBEDDING"
CAPABILITY_TEXT_TO_AUDIO: Final = "TEXT_TO_AUDIO"
CAPABILITY_TEXT_TO_IMAGE: Final = "TEXT_TO_IMAGE"
CAPABILITY_TEXT_TO_VIDEO: Final = "TEXT_TO_VIDEO"
CAPABILITY_IMAGE_TEXT_TO_TEXT: Final = "IMAGE_TEXT_TO_TEXT"
CAPABILITY_IMAGE_TEXT_TO_AUDIO: Final = "IMAGE_TEXT_TO_AUDIO"
CAPABILITY_IMAGE_TEXT_TO_IMAGE: Final = "IMAGE_TEXT_TO_IMAGE"
CAPABILITY_IMAGE_TEXT_TO_VIDEO: Final = "IMAGE_TEXT_TO_VIDEO"
CAPABILITY_VIDEO_TEXT_TO_AUDIO: Final = "VIDEO_TEXT_TO_AUDIO"
CAPABILITY_AUDIO_TO_TEXT: Final = "AUDIO_TO_TEXT"
CAPABILITY_AUDIO_TO_AUDIO: Final = "AUDIO_TO_AUDIO"


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
        for key, component in (
            ("scheduler", self.scheduler),
            ("textEncoder", self.text_encoder),
            ("tokenizer", self.tokenizer),
            ("transformer", self.transformer),
            ("vae", self.vae),
        ):
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


# --------------------------------------------------------------------------------------------------
# Pure rules


def format_parameter_size(count: int) -> str:
    """Human-readable parameter count exactly as the Go agent writes it (``8.03B``, ``70B``, ``999``).

    ``v = float(count) / float(unit)`` for the first unit among 1e12 ``T``, 1e9 ``B``, 1e6 ``M``,
    1e3 ``K`` that ``count`` reaches; integral ``v`` is printed without decimals, else ``%.1f`` when
    ``v*100`` is integral in float64, else ``%.2f``. Below 1000 the plain integer. The same float
    arithmetic as Go's, so the same float noise: 1.1e12 gives ``1.10T``.
    """
    count = min(count, _INT64_MAX)
    unit, suffix = next(((u, s) for u, s in _SIZE_UNITS if count >= u), (0, ""))
    if not unit:
        return str(count)
    value = float(count) / float(unit)
    if value == float(int(value)):
        return f"{int(value)}{suffix}"
    if value * 100 == float(int(value * 100)):
        return f"{value:.1f}{suffix}"
    return f"{value:.2f}{suffix}"


def bytes_per_parameter(dtype: str) -> float:
    """Bytes one parameter takes in ``dtype`` (case-insensitive); unknown or empty ⇒ 4 (float32)."""
    return _BYTES_PER_PARAMETER.get(dtype.lower(), 4.0)


def estimate_model_size_bytes(parameter_count: int, dtype: str) -> int:
    """``parameter_count × bytes_per_parameter(dtype)``, truncated like Go's ``int64(float64 × float64)``."""
    if parameter_count <= 0:
        return 0
    return min(int(float(parameter_count) * bytes_per_parameter(dtype)), _INT64_MAX)


def quantization_from_method(quant_method: str | None) -> str | None:
    """``quantization_config.quant_method`` ⇒ ``int4`` / ``fp8`` / None (docs/ome-compatibility.md#73-extraction;
    ``int4`` wins)."""
    if not quant_method:
        return None
    lowered = quant_method.lower()
    if "int4" in lowered:
        return "int4"
    if "fp8" in lowered:
        return "fp8"
    return None


def determine_capabilities(
    architecture: str,
    model_type: str,
    *,
    has_vision: bool,
    is_embedding: bool,
    is_diffusers: bool,
) -> list[str]:
    """Capabilities by the first matching rule of docs/ome-compatibility.md#75-capabilities (lower-cased substring
    tests)."""
    arch = architecture.lower()
    mtype = model_type.lower()

    def has(*needles: str) -> bool:
        return any(n in arch for n in needles)

    if is_diffusers:
        if has("imageedit", "pix2pix", "img2img", "inpaint"):
            return [CAPABILITY_IMAGE_TEXT_TO_IMAGE]
        if has("image", "pix", "stablediffusion"):
            return [CAPABILITY_TEXT_TO_IMAGE]
        if has("texttovideo", "t2v"):
            return [CAPABILITY_TEXT_TO_VIDEO]
        if has("video"):
            return [CAPABILITY_IMAGE_TEXT_TO_VIDEO]
    if "nemotronh_nano" in mtype:
        return [CAPABILITY_IMAGE_TEXT_TO_TEXT, CAPABILITY_TEXT_TO_TEXT, CAPABILITY_AUDIO_TO_TEXT]
    if has_vision:
        return [CAPABILITY_IMAGE_TEXT_TO_TEXT]
    if has("omni"):
        return [
            CAPABILITY_TEXT_TO_AUDIO,
            CAPABILITY_IMAGE_TEXT_TO_AUDIO,
            CAPABILITY_VIDEO_TEXT_TO_AUDIO,
            CAPABILITY_AUDIO_TO_TEXT,
            CAPABILITY_AUDIO_TO_AUDIO,
        ]
    if has("whisper", "wav2vec2", "hubert", "fortc", "forspeechtotext"):
        return [CAPABILITY_AUDIO_TO_TEXT]
    if (
        is_embedding
        or has("embedding", "sentence")
        or "bert" in mtype
        or ("mistral" in mtype and "mistralmodel" in arch)
    ):
        return [CAPABILITY_EMBEDDING]
    return [CAPABILITY_TEXT_TO_TEXT]


# --------------------------------------------------------------------------------------------------
# JSON and bounded file reads


def _non_finite_constant(token: str) -> float | None:
    # Same result as the Go agent's rewrite of bare Infinity / -Infinity / NaN before decoding.
    if token == "Infinity":
        return 1e308
    if token == "-Infinity":
        return -1e308
    return None  # NaN


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # e.g. 1e999: clamp like Infinity instead of carrying inf around
        return math.copysign(1e308, value)
    return value


def load_json_bytes(data: bytes, what: str) -> Any:
    """Decode JSON the way the agent reads model files; any failure is a :class:`MetadataError`.

    ``Infinity``, ``-Infinity`` and ``NaN`` become ``1e308``, ``-1e308`` and ``None`` (as the Go agent's
    pre-decoding rewrite makes them); a UTF-8 byte-order mark is tolerated; nesting deeper than the
    interpreter's recursion limit is reported as an error, and so is a document of more than
    :data:`MAX_JSON_ELEMENTS` values.
    """
    # Every value after the first is preceded by ',' or opens a container; delimiters inside strings count
    # too, so this over-counts, never under-counts, and costs one C-speed pass over the bytes.
    elements = data.count(b",") + data.count(b"{") + data.count(b"[") + 1
    if elements > MAX_JSON_ELEMENTS:
        raise MetadataError(f"{what}: more than {MAX_JSON_ELEMENTS} JSON values; refused unread")
    try:
        text = data.decode("utf-8-sig")
        return json.loads(text, parse_constant=_non_finite_constant, parse_float=_finite_float)
    except RecursionError:
        raise MetadataError(f"{what}: JSON is nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise MetadataError(f"{what}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:  # json.JSONDecodeError, and int literals beyond the digit limit
        raise MetadataError(f"{what}: invalid JSON: {exc}") from None


def _open_regular(path: Path) -> tuple[int, int]:
    """Open ``path`` read-only; return (fd, size). Non-regular files are refused before opening (and,
    against a swap in between, the open is non-blocking and re-checked), so a FIFO never hangs us."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise MetadataError(f"{path}: not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise MetadataError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MetadataError(f"{path}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _read_fd_exactly(fd: int, count: int, path: Path) -> bytes:
    chunks: list[bytes] = []
    remaining = count
    while remaining > 0:
        try:
            chunk = os.read(fd, min(remaining, 1 << 20))
        except OSError as exc:
            raise MetadataError(f"{path}: read failed: {exc.strerror or exc}") from None
        if not chunk:
            raise MetadataError(f"{path}: truncated (expected {count} bytes, got {count - remaining})")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_bounded(path: Path, limit: int) -> bytes:
    fd, size = _open_regular(path)
    try:
        if size > limit:
            raise MetadataError(f"{path}: {size} bytes exceeds the {limit}-byte limit for this file")
        data = _read_fd_exactly(fd, size, path)
        try:
            extra = os.read(fd, 1)
        except OSError:
            extra = b""
        if extra:
            raise MetadataError(f"{path}: file grew while being read")
        return data
    finally:
        os.close(fd)


def _load_json_object(path: Path, limit: int) -> dict[str, Any]:
    value = load_json_bytes(_read_bounded(path, limit), str(path))
    if not isinstance(value, dict):
        raise MetadataError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------------------------------
# Paths: confinement and the config-file search


def _real_directory(path: Path) -> Path | None:
    real = Path(os.path.realpath(path))
    return real if real.is_dir() else None


def _inside(real: Path, root: Path) -> bool:
    return real == root or real.is_relative_to(root)


def _confined_file(path: Path, root: Path) -> Path | None:
    """The real path of ``path`` if it is a regular file inside ``root`` (after symlinks), else None."""
    try:
        real = Path(os.path.realpath(path))
        if not _inside(real, root):
            return None
        if not stat.S_ISREG(os.stat(real).st_mode):
            return None
    except (OSError, ValueError):
        return None
    return real


def _walk_for(root: Path, names: Iterable[str]) -> dict[str, Path]:
    """Breadth-first search below ``root`` for files named ``names``; first (shallowest, then
    lexically first) match per name. Never enters symlinked or hidden directories; bounded by
    :data:`MAX_WALK_DEPTH` and :data:`MAX_WALK_ENTRIES`."""
    wanted = set(names)
    found: dict[str, Path] = {}
    queue: deque[tuple[Path, int]] = deque([(root, 0)])
    seen_entries = 0
    while queue and wanted - found.keys():
        directory, depth = queue.popleft()
        budget = MAX_WALK_ENTRIES - seen_entries
        try:
            with os.scandir(directory) as it:
                # Never hold more than the remaining budget of entries, however big the directory.
                entries = sorted(itertools.islice(it, budget + 1), key=lambda e: e.name)
        except OSError:
            continue
        if len(entries) > budget:
            return found  # an incomplete listing would make "first match" depend on disk order
        for entry in entries:
            seen_entries += 1
            if entry.name in wanted and entry.name not in found:
                real = _confined_file(Path(entry.path), root)
                if real is not None:
                    found[entry.name] = real
                    continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir and depth < MAX_WALK_DEPTH and not entry.name.startswith("."):
                queue.append((Path(entry.path), depth + 1))
    return found


def find_config_file(model_dir: Path) -> Path | None:
    """The file that describes the model in ``model_dir`` (docs/ome-compatibility.md#72-which-file), as a real path, or
    None.

    Order: ``model_index.json`` at the top, else anywhere below (a diffusers pipeline; used
    exclusively); then ``config.json`` at the top, in ``safetensors/``, ``pytorch_model/``,
    ``model/``; then anywhere below. "Anywhere below" is a bounded breadth-first walk (shallowest
    match wins, ties by name) that skips hidden directories and never follows a symlink out of
    ``model_dir``. None when ``model_dir`` is not a directory or nothing is found.
    """
    root = _real_directory(model_dir)
    if root is None:
        return None
    top_index = _confined_file(root / MODEL_INDEX_FILE, root)
    if top_index is not None:
        return top_index
    walked = _walk_for(root, (MODEL_INDEX_FILE, CONFIG_FILE))
    if MODEL_INDEX_FILE in walked:
        return walked[MODEL_INDEX_FILE]
    for candidate in (root / CONFIG_FILE, *(root / sub / CONFIG_FILE for sub in _CONFIG_SUBDIRS)):
        real = _confined_file(candidate, root)
        if real is not None:
            return real
    return walked.get(CONFIG_FILE)


# --------------------------------------------------------------------------------------------------
# Safetensors headers


def _open_safetensors(path: Path) -> tuple[dict[str, Any], int]:
    """(header object, length of the data section) of a safetensors file, read without its tensors."""
    fd, size = _open_regular(path)
    try:
        if size < 8:
            raise MetadataError(f"{path}: {size} bytes is too short for a safetensors file")
        header_len = int.from_bytes(_read_fd_exactly(fd, 8, path), "little")
        if header_len > MAX_SAFETENSORS_HEADER_BYTES:
            raise MetadataError(
                f"{path}: safetensors header length {header_len} exceeds the {MAX_SAFETENSORS_HEADER_BYTES}-byte limit"
            )
        if header_len > size - 8:
            raise MetadataError(
                f"{path}: truncated safetensors file: header claims {header_len} bytes, only {size - 8} follow"
            )
        if header_len < 2:
            raise MetadataError(f"{path}: safetensors header length {header_len} is too small")
        raw = _read_fd_exactly(fd, header_len, path)
    finally:
        os.close(fd)
    header = load_json_bytes(raw, f"{path}: safetensors header")
    if not isinstance(header, dict):
        raise MetadataError(f"{path}: safetensors header is not a JSON object")
    return header, size - 8 - header_len


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The parsed JSON header of a safetensors file. Only the first 8 + header-length bytes are read;
    the header must be ≤ :data:`MAX_SAFETENSORS_HEADER_BYTES` and fit in the file, else
    :class:`MetadataError`."""
    return _open_safetensors(path)[0]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def count_safetensors_parameters(path: Path) -> int:
    """Total element count of the tensors in one safetensors file, from its header alone.

    ``__metadata__`` and scalar tensors (empty shape) are skipped. A tensor entry that is not an
    object, a shape that is not a list of non-negative integers, ``data_offsets`` that are malformed
    or point past the end of the file, or a total beyond int64 is a :class:`MetadataError`.
    (Zero-sized dimensions are legal safetensors and count 0; the Go agent rejects them.)
    """
    header, data_len = _open_safetensors(path)
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise MetadataError(f"{path}: tensor {name!r}: entry is not an object")
        shape = entry.get("shape")
        if not isinstance(shape, list):
            raise MetadataError(f"{path}: tensor {name!r}: missing or invalid shape")
        offsets = entry.get("data_offsets")
        if offsets is not None:
            if (
                not isinstance(offsets, list)
                or len(offsets) != 2
                or not all(_is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]
            ):
                raise MetadataError(f"{path}: tensor {name!r}: invalid data_offsets")
            if offsets[1] > data_len:
                raise MetadataError(
                    f"{path}: truncated safetensors file: tensor {name!r} ends at byte {offsets[1]} "
                    f"of a {data_len}-byte data section"
                )
        if not shape:
            continue
        count = 1
        for dim in shape:
            if not _is_int(dim) or dim < 0:
                raise MetadataError(f"{path}: tensor {name!r}: invalid dimension {dim!r}")
            count *= dim
            if count > _INT64_MAX:
                raise MetadataError(f"{path}: tensor {name!r}: element count overflows int64")
        total += count
        if total > _INT64_MAX:
            raise MetadataError(f"{path}: parameter count overflows int64")
    return total


def _count_index(index: Path, directory: Path, root: Path) -> int:
    data = _load_json_object(index, MAX_INDEX_FILE_BYTES)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise MetadataError(f"{index}: no weight_map entries")
    shards: set[str] = set()
    for shard in weight_map.values():
        if not isinstance(shard, str) or not shard:
            raise MetadataError(f"{index}: weight_map has an empty or non-string shard name")
        shards.add(shard)
    if len(shards) > MAX_SAFETENSORS_FILES:
        raise MetadataError(f"{index}: {len(shards)} shards exceeds the limit of {MAX_SAFETENSORS_FILES}")
    total = 0
    for shard in sorted(shards):
        rel = PurePosixPath(shard)
        if rel.is_absolute() or ".." in rel.parts or "\x00" in shard:
            raise MetadataError(f"{index}: shard {shard!r} is not a plain relative path")
        real = _confined_file(directory / shard, root)
        if real is None:
            raise MetadataError(f"{index}: shard {shard!r} is missing or outside the model directory")
        total += count_safetensors_parameters(real)
        if total > _INT64_MAX:
            raise MetadataError(f"{index}: parameter count overflows int64")
    return total


def count_directory_parameters(directory: Path, *, root: Path | None = None) -> int:
    """Parameters of the checkpoint in ``directory``, from safetensors headers only.

    With ``model.safetensors.index.json`` (or, for diffusers components,
    ``diffusion_pytorch_model.safetensors.index.json``) the distinct shards it references are
    counted; otherwise every ``*.safetensors`` regular file in ``directory`` (not below it). Every
    file read must resolve inside ``root`` (default: ``directory``). Any unreadable or invalid file,
    or no safetensors file at all, is a :class:`MetadataError`: a partial count is never returned.
    """
    real_dir = _real_directory(directory)
    if real_dir is None:
        raise MetadataError(f"{directory}: not a directory")
    real_root = _real_directory(root) if root is not None else real_dir
    if real_root is None or not _inside(real_dir, real_root):
        raise MetadataError(f"{directory}: outside the model directory")
    for name in _INDEX_FILES:
        index = _confined_file(real_dir / name, real_root)
        if index is not None:
            return _count_index(index, real_dir, real_root)
    try:
        with os.scandir(real_dir) as it:
            matching = (e.name for e in it if e.name.endswith(".safetensors"))
            names = sorted(itertools.islice(matching, MAX_SAFETENSORS_FILES + 1))
    except OSError as exc:
        raise MetadataError(f"{directory}: cannot list: {exc.strerror or exc}") from None
    if len(names) > MAX_SAFETENSORS_FILES:
        raise MetadataError(f"{directory}: more than {MAX_SAFETENSORS_FILES} safetensors files")
    files: list[Path] = []
    for name in names:
        candidate = real_dir / name
        if os.path.isdir(candidate):
            continue
        real = _confined_file(candidate, real_root)
        if real is None:
            raise MetadataError(f"{candidate}: not a regular file inside the model directory")
        files.append(real)
    if not files:
        raise MetadataError(f"no .safetensors files found in {directory}")
    total = 0
    for path in files:
        total += count_safetensors_parameters(path)
        if total > _INT64_MAX:
            raise MetadataError(f"{directory}: parameter count overflows int64")
    return total


# --------------------------------------------------------------------------------------------------
# Loaders


def _as_int(value: object) -> int:
    """A positive JSON integer (or integral float) within int64; 0 for anything else."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value if 0 < value <= _INT64_MAX else 0
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and 0 < value <= _INT64_MAX:
        return int(value)
    return 0


def _as_float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    result = float(value)
    return result if math.isfinite(result) and result > 0 else 0.0


def _as_str(value: object) -> str:
    return value[:MAX_METADATA_STRING] if isinstance(value, str) else ""


def _first_int(sources: Iterable[Mapping[str, Any]], *keys: str) -> int:
    for source in sources:
        for key in keys:
            value = _as_int(source.get(key))
            if value:
                return value
    return 0


@dataclass
class _Facts:
    model_type: str = ""
    architecture: str = ""
    torch_dtype: str = ""
    size_dtype: str = ""
    transformers_version: str = ""
    context_length: int = 0
    has_vision: bool = False
    is_embedding: bool = False
    quant_method: str = ""
    parameter_count: int = 0
    parameter_count_source: str = "none"
    pipeline: DiffusionPipeline | None = None
    warnings: list[str] = field(default_factory=list)


def _nested_llm_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    for key in _NESTED_LLM_KEYS:
        value = raw.get(key)
        if isinstance(value, dict):
            return value
    return {}


def _expert_count(raw: Mapping[str, Any], nested: Mapping[str, Any]) -> int:
    # Same precedence as the Go generic loader.
    return (
        _as_int(raw.get("n_routed_experts"))
        or _first_int([nested], "n_routed_experts", "num_local_experts", "num_experts")
        or _first_int([raw], "num_local_experts", "num_experts")
    )


def _estimate_parameters(raw: Mapping[str, Any], nested: Mapping[str, Any]) -> int:
    """Rough count from dimensions when no safetensors can be read (Go's generic / MoE formulas)."""
    both = (raw, nested)
    hidden = _first_int(both, "hidden_size")
    layers = _first_int(both, "num_hidden_layers", "num_layers")
    if not hidden or not layers:
        return 0
    vocab = _first_int(both, "vocab_size", "padded_vocab_size")
    experts = _expert_count(raw, nested)
    if experts:
        intermediate = _first_int(both, "intermediate_size")
        moe_intermediate = _first_int(both, "moe_intermediate_size") or intermediate
        shared = _first_int(both, "n_shared_experts")
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
    return total if total <= _INT64_MAX else 0


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
    hidden = _as_int(raw.get("d_model"))
    layers = _as_int(raw.get("n_layers"))
    if not hidden or not layers:
        return 0
    ffn = _sub_object(raw, "ffn_config")
    attn = _sub_object(raw, "attn_config")
    experts = _as_int(ffn.get("moe_num_experts")) or 1
    ffn_hidden = _as_int(ffn.get("ffn_hidden_size")) or 4 * hidden
    heads = _as_int(raw.get("n_heads"))
    kv_heads = _as_int(attn.get("kv_n_heads"))
    kv_dim = kv_heads * (hidden // heads) if heads and kv_heads else hidden
    vocab = _as_int(raw.get("vocab_size"))
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_dim + experts * 3 * hidden * ffn_hidden + hidden * experts
    per_layer += 2 * hidden
    tied = raw.get("tie_word_embeddings") is True
    total = vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden
    return total if total <= _INT64_MAX else 0


def _known_size(model_type: str, raw: Mapping[str, Any]) -> int:
    """A published checkpoint's nominal size, recognised by its dimensions (:data:`_KNOWN_SIZES`)."""
    table = _KNOWN_SIZES.get(model_type)
    if not table:
        return 0
    return table.get((_as_int(raw.get("hidden_size")), _as_int(raw.get("num_hidden_layers"))), 0)


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
    return _is_int(bits) and bits == 8 and weights.get("type") == "float"


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
    explicit = _first_int((text, raw), "max_position_embeddings")
    if explicit:
        return explicit
    rope = text.get("rope_scaling")
    if not isinstance(rope, dict):
        rope = raw.get("rope_scaling")
    if isinstance(rope, dict):
        factor = _as_float(rope.get("factor"))
        base = _as_int(rope.get("original_max_position_embeddings"))
        if factor and base:
            return int(base * factor)
    return _GEMMA3_DEFAULT_CONTEXT


def _context_length(model_type: str, raw: Mapping[str, Any], nested: Mapping[str, Any]) -> int:
    if model_type == "gemma3":
        return _gemma3_context_length(raw, nested)
    first = _CONTEXT_KEYS_FIRST.get(model_type, ())
    if first:
        value = _first_int([raw], *first)
        if value:
            return value
    return _first_int((raw, nested), "max_position_embeddings") or _as_int(raw.get("max_sequence_length"))


def _sentence_transformers_embedding(config_dir: Path, root: Path) -> bool:
    """A ``config_sentence_transformers.json`` naming a similarity function marks an embedding model."""
    path = _confined_file(config_dir / _SENTENCE_TRANSFORMERS_CONFIG, root)
    if path is None:
        return False
    try:
        data = _load_json_object(path, MAX_CONFIG_FILE_BYTES)
    except MetadataError:
        return False
    return bool(_as_str(data.get("similarity_fn_name")))


def _count_or_warn(directory: Path, root: Path, facts: _Facts) -> int:
    try:
        return count_directory_parameters(directory, root=root)
    except MetadataError as exc:
        facts.warnings.append(f"parameter count from safetensors unavailable: {exc.reason}")
        return 0


def _load_transformers(raw: dict[str, Any], config_path: Path, root: Path) -> _Facts:
    facts = _Facts()
    nested = _nested_llm_config(raw)
    facts.model_type = _as_str(raw.get("model_type"))
    if not facts.model_type:
        facts.warnings.append(f"{config_path}: no model_type; using the generic rules")
    architectures = raw.get("architectures")
    if isinstance(architectures, list) and architectures:
        facts.architecture = _as_str(architectures[0])
    if not facts.architecture:
        facts.architecture = _DEFAULT_ARCHITECTURE.get(facts.model_type, "")
    facts.transformers_version = _as_str(raw.get("transformers_version")) or _as_str(nested.get("transformers_version"))
    # transformers >= 4.56 writes "dtype" where older versions wrote "torch_dtype".
    facts.torch_dtype = next(
        (
            value
            for value in (
                _as_str(raw.get("torch_dtype")),
                _as_str(nested.get("torch_dtype")),
                _as_str(raw.get("dtype")),
                _as_str(nested.get("dtype")),
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
    facts.is_embedding = facts.model_type in _EMBEDDING_TYPES or _sentence_transformers_embedding(
        config_path.parent, root
    )
    quant = raw.get("quantization_config")
    if isinstance(quant, dict):
        facts.quant_method = _as_str(quant.get("quant_method"))

    counted = _count_or_warn(config_path.parent, root, facts)
    if counted > 0:
        facts.parameter_count, facts.parameter_count_source = counted, "safetensors"
    else:
        if facts.model_type == "dbrx":
            estimate = _dbrx_parameters(raw)
        else:
            estimate = _known_size(facts.model_type, raw) or _estimate_parameters(raw, nested)
        if estimate > 0:
            facts.parameter_count, facts.parameter_count_source = estimate, "estimate"
    return facts


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


def _parse_pipeline(raw: Mapping[str, Any], path: Path) -> DiffusionPipeline:
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


def _is_plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\x00" not in name


def _diffusers_parameters(base: Path, root: Path, pipeline: DiffusionPipeline, facts: _Facts) -> int:
    """Sum over text_encoder, transformer (or unet), vae (all required) plus any additional component
    folder that has a config.json and countable safetensors (optional). A required part that is
    missing or uncountable makes the whole count 0 (unknown), as in the Go agent."""
    transformer = "transformer" if (base / "transformer" / CONFIG_FILE).exists() else "unet"
    total = 0
    for part in ("text_encoder", transformer, "vae"):
        if _confined_file(base / part / CONFIG_FILE, root) is None:
            facts.warnings.append(f"diffusers part {part!r} has no config.json; parameter count unknown")
            return 0
        count = _count_or_warn(base / part, root, facts)
        if count <= 0:
            return 0
        total += count
    for name in sorted(pipeline.additional_components):
        if not _is_plain_name(name) or _confined_file(base / name / CONFIG_FILE, root) is None:
            continue
        try:
            total += count_directory_parameters(base / name, root=root)
        except MetadataError:
            continue
    return total if total <= _INT64_MAX else 0


def _diffusers_context_length(base: Path, root: Path) -> int:
    path = _confined_file(base / "text_encoder" / CONFIG_FILE, root)
    if path is None:
        return 0
    try:
        data = _load_json_object(path, MAX_CONFIG_FILE_BYTES)
    except MetadataError:
        return 0
    return _as_int(data.get("max_position_embeddings"))


def _load_diffusers(raw: dict[str, Any], index_path: Path, root: Path) -> _Facts:
    pipeline = _parse_pipeline(raw, index_path)
    base = index_path.parent
    facts = _Facts(
        model_type="diffusers",
        architecture=pipeline.class_name,
        has_vision=True,
        pipeline=pipeline,
    )
    facts.context_length = _diffusers_context_length(base, root)
    count = _diffusers_parameters(base, root, pipeline, facts)
    if count > 0:
        facts.parameter_count, facts.parameter_count_source = count, "safetensors"
    return facts


# --------------------------------------------------------------------------------------------------
# Entry point


def parse_model_dir(model_dir: Path, *, total_size_bytes: int | None = None) -> ParsedMetadata:
    """Parse the model in ``model_dir`` into :class:`ParsedMetadata` (docs/ome-compatibility.md#72-which-file (to 7.5)).

    ``total_size_bytes`` is the size of the weights on disk if the caller knows it (e.g. from the
    download manifest). It is used only for ``model_size_bytes`` when the parameter count is unknown
    (0), where the spec's ``params × bytes-per-dtype`` would say 0.

    Raises :class:`MetadataError` when ``model_dir`` is not a directory, when neither
    ``model_index.json`` nor ``config.json`` is found, or when the chosen file cannot be read or is
    not a JSON object (including a diffusers index with no ``_class_name``). The caller decides what
    "no metadata" means (docs/ome-compatibility.md#72-which-file: a missing directory is not an error for the agent).
    """
    root = _real_directory(model_dir)
    if root is None:
        raise MetadataError(f"model directory {model_dir} does not exist or is not a directory")
    config_path = find_config_file(root)
    if config_path is None:
        raise MetadataError(f"no {MODEL_INDEX_FILE} or {CONFIG_FILE} found in {model_dir}")
    raw = _load_json_object(config_path, MAX_CONFIG_FILE_BYTES)
    if config_path.name == MODEL_INDEX_FILE:
        facts = _load_diffusers(raw, config_path, root)
    else:
        facts = _load_transformers(raw, config_path, root)
    return _assemble(facts, config_path, total_size_bytes)


def _assemble(facts: _Facts, config_path: Path, total_size_bytes: int | None) -> ParsedMetadata:
    params = max(0, min(facts.parameter_count, _INT64_MAX))
    size_text = format_parameter_size(params)
    context = facts.context_length if 0 < facts.context_length <= _INT32_MAX else 0
    if params > 0:
        size_bytes = estimate_model_size_bytes(params, facts.size_dtype)
    elif total_size_bytes is not None and 0 < total_size_bytes <= _INT64_MAX:
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
