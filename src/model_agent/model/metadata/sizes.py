"""Parameter counts and sizes as OME writes them: the size string, bytes per dtype, the model size, quantization.

Role: pure functions from numbers and dtype/quantization names to the entry's fields
(docs/ome-compatibility.md#73-extraction). Same float arithmetic as the Go agent, so the same strings. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from model_agent.model.metadata.limits import INT64_MAX

_SIZE_UNITS: Final = ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K"))

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


def format_parameter_size(count: int) -> str:
    """Human-readable parameter count exactly as the Go agent writes it (``8.03B``, ``70B``, ``999``).

    ``v = float(count) / float(unit)`` for the first unit among 1e12 ``T``, 1e9 ``B``, 1e6 ``M``,
    1e3 ``K`` that ``count`` reaches; integral ``v`` is printed without decimals, else ``%.1f`` when
    ``v*100`` is integral in float64, else ``%.2f``. Below 1000 the plain integer. The same float
    arithmetic as Go's, so the same float noise: 1.1e12 gives ``1.10T``.
    """
    count = min(count, INT64_MAX)
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
    return min(int(float(parameter_count) * bytes_per_parameter(dtype)), INT64_MAX)


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
