"""Every ``docs/<file>.md#<anchor>`` citation in the code resolves (tools/check_doc_refs.py).

The repository check is the guard ("a test fails on a dangling reference"); the temporary-tree
tests show the checker itself finds a dangling anchor and a missing document, and computes anchors as
GitHub does, so the guard can fail.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The sample citations below are built from this prefix, so this file holds no citation of its own for the
# repository check to find.
D = "docs" + "/"


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_doc_refs", ROOT / "tools" / "check_doc_refs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


def test_every_doc_reference_in_the_repository_resolves(capsys: pytest.CaptureFixture[str]) -> None:
    code = checker.main(["--root", str(ROOT)])
    out = capsys.readouterr().out
    assert code == 0, f"dangling documentation references:\n{out}"


GUIDE = """# Guide

## 3. Data flow

### 6.3 ConfigMap entry value

## Notes

## Notes

```markdown
## 9. Not a heading (inside a fence)
```
"""


def _tree(tmp_path: Path, code: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(GUIDE)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "mod.py").write_text(code)
    return tmp_path


def test_checker_reports_only_the_dangling_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(
        tmp_path,
        f'"""Shutdown order: {D}guide.md#3-data-flow; the entry: {D}guide.md#63-configmap-entry-value."""\n'
        f"# notes: {D}guide.md#notes-1 and the guide itself, {D}guide.md\n"
        f"# gone: {D}guide.md#4-storage-uris\n"
        f"# fenced heading: {D}guide.md#9-not-a-heading-inside-a-fence\n",
    )
    found = checker.dangling(root, [root / "src"])
    assert [(d.reference.line, d.reference.text) for d in found] == [
        (3, f"{D}guide.md#4-storage-uris"),
        (4, f"{D}guide.md#9-not-a-heading-inside-a-fence"),
    ]
    assert checker.main(["--root", str(root), "src"]) == 1
    out = capsys.readouterr().out
    assert f"src/mod.py:3: {D}guide.md#4-storage-uris: no heading with anchor #4-storage-uris" in out


def test_checker_reports_a_missing_document(tmp_path: Path) -> None:
    root = _tree(tmp_path, f"# see {D}design.md#2-invariants and {D}guide.md#3-data-flow\n")
    found = checker.dangling(root, [root / "src"])
    assert [(d.reference.text, d.why) for d in found] == [
        (f"{D}design.md#2-invariants", f"no such document {D}design.md"),
    ]


def test_checker_passes_a_tree_without_dangling_references(tmp_path: Path) -> None:
    root = _tree(tmp_path, f"# {D}guide.md#3-data-flow, {D}guide.md#notes, ./{D}guide.md#notes-1\n")
    assert checker.dangling(root, [root / "src"]) == []
    assert checker.main(["--root", str(root)]) == 0  # default trees: src, tests, bench (absent ones skipped)


def test_paths_that_merely_end_in_docs_are_not_references(tmp_path: Path) -> None:
    root = _tree(tmp_path, f"# OME's site/content/en/{D}intro.md and my{D}x.md are not ours\n")
    assert list(checker.references([root / "src"])) == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("3. Data flow", "3-data-flow"),
        ("6.3 ConfigMap entry value", "63-configmap-entry-value"),
        ("1.2 `spec` fields", "12-spec-fields"),
        ("15. Weaknesses of OME's Go agent", "15-weaknesses-of-omes-go-agent"),
        ("11. Metrics, health, CLI, environment, logging", "11-metrics-health-cli-environment-logging"),
        ("See [the runbook](operations.md) first", "see-the-runbook-first"),
        ("snake_case and **bold**", "snake_case-and-bold"),
        ("3.3 TensorRT-LLM shape filter", "33-tensorrt-llm-shape-filter"),
    ],
)
def test_anchors_are_computed_as_github_does(heading: str, anchor: str) -> None:
    assert checker.slug(heading) == anchor


def test_repeated_headings_are_numbered_and_fenced_ones_ignored() -> None:
    assert checker.anchors(GUIDE) == {"guide", "3-data-flow", "63-configmap-entry-value", "notes", "notes-1"}


# Citations of documents that live outside the repository (the old numbered spec, the design notes beside
# it); built from pieces so this file does not match itself.
OUTSIDE_CITATION = (
    r"\bspec [0-9]+(?:\.[0-9]+)+\b|" + "DESIGN" + r"\.md|\.\./" + "shared/|" + "ome-model-agent-" + "spec"
)


def test_the_code_cites_no_document_outside_the_repository() -> None:
    import re

    pattern = re.compile(OUTSIDE_CITATION)
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for tree in ("src", "testbed", "bench", "tools", "tests")
        for path in sorted((ROOT / tree).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "cite docs/<file>.md#<section> instead:\n" + "\n".join(found)
