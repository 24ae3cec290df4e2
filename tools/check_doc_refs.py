"""Check that every ``docs/<file>.md#<anchor>`` reference in the code points at a real section.

Role: the code cites the project's documents by section (``docs/design.md#35-shutdown-order``). A heading
that is renamed or renumbered would leave such a citation dangling without anyone noticing; this script
notices. It scans the given trees (default ``src``, ``tests``, ``bench`` under ``--root``) for references of
the form ``docs/<name>.md`` with an optional ``#<anchor>``, and reports each one whose file does not exist
under ``<root>/docs/`` or whose anchor is not the anchor of a heading in that file.

Anchors are computed the way GitHub renders them, so a link that works here works on GitHub: the heading
text with inline markup removed (code spans keep their text, links keep their label), lower-cased,
every character that is not a letter, digit, ``_``, ``-`` or space dropped, spaces turned into ``-``; a
repeated heading gets ``-1``, ``-2`` ... in order. Headings inside fenced code blocks are not headings.

Exit status: 0 when every reference resolves, 1 when one does not (each is printed as
``path:line: reference: why``), 2 for bad usage. Run from the repository root::

    python tools/check_doc_refs.py
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TREES = ("src", "tests", "bench")
# A reference: "docs/" (not part of a longer path segment such as "mydocs/"), a file name ending in
# ".md", and an optional "#anchor". Anchors are what the slug function can produce.
REFERENCE = re.compile(r"(?<![\w./-])(?:\./)?docs/(?P<file>[\w.-]+(?:/[\w.-]+)*\.md)(?:#(?P<anchor>[\w-]+))?")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(?P<text>.*?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_HTML_TAG = re.compile(r"<[^>]+>")
_NOT_SLUG = re.compile(r"[^\w\- ]", re.UNICODE)
_SKIP_DIRS = {".git", ".venv", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
_MAX_FILE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Reference:
    """One citation found in a scanned file."""

    path: Path
    line: int
    file: str
    anchor: str | None

    @property
    def text(self) -> str:
        return f"docs/{self.file}" + (f"#{self.anchor}" if self.anchor else "")


@dataclass(frozen=True)
class Dangling:
    """A reference that does not resolve, and why."""

    reference: Reference
    why: str


def slug(heading: str) -> str:
    """The GitHub anchor of a heading's text (without the leading ``#``s)."""
    text = _LINK.sub(r"\1", heading)
    text = _HTML_TAG.sub("", text)
    text = text.replace("`", "")
    text = _NOT_SLUG.sub("", text.strip().lower())
    return text.replace(" ", "-")


def headings(markdown: str) -> Iterator[str]:
    """The text of every ATX heading outside fenced code blocks, in order."""
    fence: str | None = None
    for line in markdown.splitlines():
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        match = _HEADING.match(line)
        if match:
            yield match.group("text")


def anchors(markdown: str) -> set[str]:
    """Every anchor GitHub gives the headings of one document (repeats numbered ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for text in headings(markdown):
        base = slug(text)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def _files(tree: Path) -> Iterator[Path]:
    if tree.is_file():
        yield tree
        return
    for path in sorted(tree.rglob("*")):
        if any(part in _SKIP_DIRS for part in path.relative_to(tree).parts):
            continue
        if path.is_file() and path.stat().st_size <= _MAX_FILE_BYTES:
            yield path


def references(trees: Iterable[Path]) -> Iterator[Reference]:
    """Every ``docs/...md[#anchor]`` citation in the text files under ``trees`` (binary files skipped)."""
    for tree in trees:
        for path in _files(tree):
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for number, line in enumerate(text.splitlines(), start=1):
                for match in REFERENCE.finditer(line):
                    yield Reference(path, number, match.group("file"), match.group("anchor"))


def dangling(root: Path, trees: Iterable[Path]) -> list[Dangling]:
    """The references under ``trees`` that do not resolve against ``root/docs``."""
    docs = root / "docs"
    cache: dict[str, set[str] | None] = {}
    out: list[Dangling] = []
    for ref in references(trees):
        if ref.file not in cache:
            doc = docs / ref.file
            cache[ref.file] = anchors(doc.read_text(encoding="utf-8")) if doc.is_file() else None
        known = cache[ref.file]
        if known is None:
            out.append(Dangling(ref, f"no such document {(docs / ref.file).relative_to(root)}"))
        elif ref.anchor is not None and ref.anchor not in known:
            out.append(Dangling(ref, f"no heading with anchor #{ref.anchor} in docs/{ref.file}"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root (holds docs/)")
    parser.add_argument("trees", nargs="*", help=f"files or directories to scan (default: {' '.join(DEFAULT_TREES)})")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    if not (root / "docs").is_dir():
        print(f"error: {root / 'docs'} is not a directory", file=sys.stderr)
        return 2
    trees = [Path(t) if Path(t).is_absolute() else root / t for t in (args.trees or DEFAULT_TREES)]
    trees = [t for t in trees if t.exists()]
    found = dangling(root, trees)
    for item in found:
        ref = item.reference
        shown = ref.path.relative_to(root) if ref.path.resolve().is_relative_to(root) else ref.path
        print(f"{shown}:{ref.line}: {ref.text}: {item.why}")
    if found:
        print(f"{len(found)} dangling documentation reference(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
