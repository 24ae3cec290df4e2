"""JSON the agent reads back from places it does not control alone: disk, a shared root, ConfigMaps, Secrets.

Role: :func:`loads` is :func:`json.loads` with one difference: a document nested past the interpreter's recursion
limit (well-formed, a couple of kilobytes) is a :class:`ValueError` like any other text that is not the JSON
expected, instead of a :class:`RecursionError` that no ``except ValueError`` of a reader catches. It lives in
``model/`` (the bottom layer) so that every reader, whatever its layer, treats such a document as its contract
says (absent, untrusted, or its documented error). A document of the wrong shape is still the reader's to check.
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """The decoded document; ValueError for text that is not JSON, or JSON nested past the recursion limit."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested past the recursion limit") from None
