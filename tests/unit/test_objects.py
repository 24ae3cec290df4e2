"""kube/objects.py: a raw object's metadata read without ever raising, whatever shape it has."""

from __future__ import annotations

from typing import Any

import pytest

from model_agent.kube import objects

FULL = {
    "metadata": {
        "name": "m",
        "namespace": "team",
        "uid": "u-1",
        "resourceVersion": "42",
        "deletionTimestamp": "2026-12-01T00:00:00Z",
        "labels": {"a": "1", "n": None},
        "annotations": {"b": "2"},
    }
}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (FULL, ("m", "team", "u-1", "42", True, {"a": "1"}, {"b": "2"})),
        ({}, ("", "", "", "", False, {}, {})),
        (None, ("", "", "", "", False, {}, {})),
        ({"metadata": None}, ("", "", "", "", False, {}, {})),
        ({"metadata": "nonsense"}, ("", "", "", "", False, {}, {})),
        ({"metadata": {"labels": ["x"], "annotations": "y", "name": 7}}, ("7", "", "", "", False, {}, {})),
    ],
)
def test_accessors(obj: dict[str, Any] | None, expected: tuple[Any, ...]) -> None:
    got = (
        objects.name(obj),
        objects.namespace(obj),
        objects.uid(obj),
        objects.resource_version(obj),
        objects.deleting(obj),
        objects.labels(obj),
        objects.annotations_of(obj),
    )
    assert got == expected
