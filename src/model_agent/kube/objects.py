"""Typed reads of a raw API object's ``metadata``: the one place that tolerates its missing or odd fields.

Objects reach the agent as decoded JSON (plain dicts): from a LIST, a watch, a live GET, or a cache. Their
``metadata`` may be absent (a hand-made object, a partial answer), ``null``, or carry a field of a wrong type
(someone else's write). Every accessor here answers with the field's zero value then — ``""``, ``{}``,
``False`` — and never raises, so callers compare and branch without repeating ``(obj.get("metadata") or {})``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The object's ``metadata`` mapping, ``{}`` when it has none (or something that is not a mapping)."""
    value = obj.get("metadata") if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _text(obj: Mapping[str, Any] | None, field: str) -> str:
    value = meta(obj).get(field)
    return "" if value is None else str(value)


def name(obj: Mapping[str, Any] | None) -> str:
    """``metadata.name``, or ``""``."""
    return _text(obj, "name")


def namespace(obj: Mapping[str, Any] | None) -> str:
    """``metadata.namespace``, or ``""`` (a cluster-scoped object has none)."""
    return _text(obj, "namespace")


def uid(obj: Mapping[str, Any] | None) -> str:
    """``metadata.uid``, or ``""``: what tells a recreated object from the one that was deleted."""
    return _text(obj, "uid")


def resource_version(obj: Mapping[str, Any] | None) -> str:
    """``metadata.resourceVersion``, or ``""``; opaque: compared for equality only, never ordered."""
    return _text(obj, "resourceVersion")


def deleting(obj: Mapping[str, Any] | None) -> bool:
    """Whether ``metadata.deletionTimestamp`` is set (the object is going, finalizers may hold it)."""
    return bool(meta(obj).get("deletionTimestamp"))


def _string_map(obj: Mapping[str, Any] | None, field: str) -> dict[str, str]:
    value = meta(obj).get(field)
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


def labels(obj: Mapping[str, Any] | None) -> dict[str, str]:
    """``metadata.labels`` as strings, ``{}`` when absent."""
    return _string_map(obj, "labels")


def annotations_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    """``metadata.annotations`` as strings, ``{}`` when absent."""
    return _string_map(obj, "annotations")
