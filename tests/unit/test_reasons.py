"""The reason vocabulary (model/reasons.py): complete, documented, and byte-identical on the wire.

Three properties keep the words operators alert on trustworthy:

* every value is documented where operators look (docs/operations.md or docs/ome-compatibility.md);
* every reason the code writes as a literal (a ``SourceError``, a tenancy refusal, an ``Invalid`` spec, a
  ``_fail`` or an Event) is a value of the vocabulary, so a new word cannot slip in undocumented;
* a member is its wire string: the entry, the Event and the log carry the same bytes as a bare string did.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from model_agent.model.errors import SourceError
from model_agent.model.reasons import EventReason, Reason
from model_agent.sources.base import SourceError as SourceErrorFromBase

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "model_agent"
DOCS = [ROOT / "docs" / "operations.md", ROOT / "docs" / "ome-compatibility.md"]

ALL = [*Reason, *EventReason]

# The calls that write a reason, and the position of the reason among their arguments.
WRITERS = {"SourceError": 0, "refused": 0, "Invalid": 0, "_fail": 2, "emit": 2}


def _documented() -> str:
    return "\n".join(p.read_text() for p in DOCS)


@pytest.mark.parametrize("reason", ALL, ids=str)
def test_every_reason_is_documented_for_operators(reason: str) -> None:
    # As code (`Reason`), so a word that merely occurs in prose ("Removed") does not count.
    assert re.search(rf"`{re.escape(reason)}`", _documented()), f"{reason} is not documented in docs/operations.md"


def _written_literals() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = str(getattr(node.func, "id", None) or getattr(node.func, "attr", ""))
            at = WRITERS.get(name)
            if at is None or len(node.args) <= at:
                continue
            arg = node.args[at]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.setdefault(arg.value, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_every_reason_the_code_writes_is_in_the_vocabulary() -> None:
    known = {str(r) for r in ALL}
    written = _written_literals()
    assert written, "the scan found no reason at all: the writers' names changed"
    unknown = {word: where for word, where in written.items() if word not in known}
    assert not unknown, f"reasons written but missing from model/reasons.py (add and document them): {unknown}"


def test_values_are_unique_across_both_enums() -> None:
    values = [str(r) for r in ALL]
    assert len(values) == len(set(values))


def test_a_member_is_its_wire_string() -> None:
    assert str(Reason.UNSAFE_FILE_PATH) == "UnsafeFilePath"
    assert f"{Reason.NO_OBJECTS}: nothing under the prefix" == "NoObjects: nothing under the prefix"
    assert json.dumps({"reason": EventReason.CONFIGMAP_FULL}) == '{"reason": "ConfigMapFull"}'
    assert str.__eq__(Reason.INSUFFICIENT_DISK, "InsufficientDisk")  # compares equal to the bare string


def test_source_error_keeps_a_plain_string_reason() -> None:
    # Logs render reprs: a member would show as <Reason.X: 'X'> where a bare string showed 'X'.
    exc = SourceError(Reason.SECRET_NOT_FOUND, "Secret ome/x does not exist")
    assert type(exc.reason) is str and exc.reason == "SecretNotFound"
    assert repr(exc.reason) == "'SecretNotFound'"


def test_sources_base_still_exports_the_same_error_type() -> None:
    assert SourceErrorFromBase is SourceError


def test_both_unsafe_path_reasons_are_kept_and_explained() -> None:
    # Both are written today (a listed name vs. the publish step's own check): merging them would change
    # what an alert on either matches.
    assert {str(Reason.UNSAFE_PATH), str(Reason.UNSAFE_FILE_PATH)} == {"UnsafePath", "UnsafeFilePath"}
    docs = _documented()
    assert "`UnsafeFilePath` and `UnsafePath` are two words on purpose" in docs
