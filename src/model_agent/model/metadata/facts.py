"""Reading values out of decoded config dicts, and the facts gathered about one model.

Role: the coercions every rule uses (a JSON value is trusted for nothing: a wrong type, a bool, a
non-finite or out-of-range number reads as "absent") and :class:`Facts`, the working record the rules and
the file reader fill in before it is assembled. No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from model_agent.model.metadata.limits import INT64_MAX, MAX_METADATA_STRING
from model_agent.model.metadata.results import DiffusionPipeline


def is_json_int(value: object) -> bool:
    """Whether ``value`` is a JSON integer (Python's bool is an int subclass, and is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_int(value: object) -> int:
    """A positive JSON integer (or integral float) within int64; 0 for anything else."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value if 0 < value <= INT64_MAX else 0
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and 0 < value <= INT64_MAX:
        return int(value)
    return 0


def as_float(value: object) -> float:
    """A positive finite JSON number as float; 0.0 for anything else (bools, strings, NaN, infinities)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    try:
        result = float(value)
    except OverflowError:  # an integer literal beyond float64
        return 0.0
    return result if math.isfinite(result) and result > 0 else 0.0


def as_str(value: object) -> str:
    """A JSON string cut to :data:`MAX_METADATA_STRING`; "" for anything else, so one file cannot fill the entry."""
    return value[:MAX_METADATA_STRING] if isinstance(value, str) else ""


def first_int(sources: Iterable[Mapping[str, Any]], *keys: str) -> int:
    """The first positive integer found, trying every key in each source in turn; 0 when none is."""
    for source in sources:
        for key in keys:
            value = as_int(source.get(key))
            if value:
                return value
    return 0


@dataclass
class Facts:
    """What the rules learned about one model so far; the file reader fills in what only the disk knows,
    and :func:`~model_agent.model.metadata.assemble.assemble` turns it into :class:`ParsedMetadata`."""

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
