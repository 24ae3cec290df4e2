"""Small real models for the tests, the benchmarks and the demo.

A llama-shaped ``config.json``, a real safetensors file (made with ``safetensors``, seeded, so each seed gives
other bytes) and a ``tokenizer_config.json``: enough for the agent to parse real metadata from.
"""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import save

HIDDEN = 64
LAYERS = 2
VOCAB = 128


def tiny_llama(seed: int = 0, *, max_positions: int = 4096, padding_bytes: int = 0) -> dict[str, bytes]:
    """The files of a tiny llama-shaped model (``config.json``, ``model.safetensors``, ``tokenizer_config.json``).

    The same ``seed`` gives the same bytes (a model can be served twice and compared); ``padding_bytes`` adds a
    tensor to make the weights as large as a download test needs.
    """
    rng = np.random.default_rng(seed)
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((HIDDEN * 2, HIDDEN), dtype=np.float32),
        "model.layers.1.mlp.up_proj.weight": rng.standard_normal((HIDDEN * 2, HIDDEN), dtype=np.float32),
        "lm_head.weight": rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32),
    }
    if padding_bytes:
        tensors["padding"] = np.full((padding_bytes // 4,), seed, dtype=np.float32)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_position_embeddings": max_positions,
        "torch_dtype": "float32",
        "transformers_version": "4.43.0",
    }
    return {
        "config.json": json.dumps(config, indent=2).encode(),
        "model.safetensors": save(tensors),
        "tokenizer_config.json": json.dumps({"model_max_length": max_positions}).encode(),
    }


def parameter_count() -> int:
    """The parameter count the agent must report for a :func:`tiny_llama` without padding: the tests' expected value."""
    return VOCAB * HIDDEN * 2 + 2 * (HIDDEN * 2 * HIDDEN)
