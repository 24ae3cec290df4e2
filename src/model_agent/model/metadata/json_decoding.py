"""Bounded JSON decoding of bytes a model ships, the way the agent reads every model file.

Role: bytes in, a decoded value or :class:`MetadataError` out. The element count is checked before
decoding (memory is bounded by what decoding allocates, not by bytes), non-finite constants are mapped as
the Go agent maps them, and deep nesting is an error, not a crash. No I/O: the caller reads the bytes.
"""

from __future__ import annotations

import json
import math
from typing import Any

from model_agent.model.metadata.limits import MAX_JSON_ELEMENTS
from model_agent.model.metadata.results import MetadataError


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
