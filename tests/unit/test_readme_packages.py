"""The README's package table lists every package of the tree, and nothing that is gone.

The packages are read from the filesystem (every directory with an ``__init__.py`` directly under
``src/model_agent/``, the top-level ``testbed/`` and its subpackages), so a package added or moved without a
row in the README's "Source layout" table — or a row left behind by a removed package — fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PRODUCT = ROOT / "src" / "model_agent"
TESTBED = ROOT / "testbed"


def packages_on_disk() -> set[str]:
    """Names as the table writes them: ``kube/`` for ``src/model_agent/kube``, ``testbed/servers/``."""
    found = {f"{d.name}/" for d in PRODUCT.iterdir() if (d / "__init__.py").is_file()}
    if (TESTBED / "__init__.py").is_file():
        found.add("testbed/")
        found |= {f"testbed/{d.name}/" for d in TESTBED.iterdir() if (d / "__init__.py").is_file()}
    return found


def table_rows() -> dict[str, str]:
    """The ``| `name/` | role |`` rows of the table that follows "Source layout"."""
    text = README.read_text()
    start = text.index("Source layout")
    table = re.search(r"\| package \| role \|\n\|[-|]+\|\n((?:\|.*\|\n)+)", text[start:])
    assert table is not None, "README: no '| package | role |' table after 'Source layout'"
    rows: dict[str, str] = {}
    for line in table.group(1).splitlines():
        m = re.fullmatch(r"\| `([^`]+)` \| (.+) \|", line)
        assert m is not None, f"README: malformed package row {line!r}"
        rows[m[1]] = m[2].strip()
    return rows


def test_every_package_has_a_row() -> None:
    missing = packages_on_disk() - set(table_rows())
    assert not missing, f"packages without a row in README.md's Source layout table: {sorted(missing)}"


def test_every_row_names_a_package_that_exists() -> None:
    stale = set(table_rows()) - packages_on_disk()
    assert not stale, f"README.md lists packages that are not in the tree: {sorted(stale)}"


def test_every_row_says_what_the_package_is_for() -> None:
    assert all(len(role) >= 20 for role in table_rows().values())


def test_the_scan_sees_the_known_packages() -> None:
    # Guards the scan itself: an empty or wrong root would make both checks above pass vacuously.
    assert {"kube/", "model/", "agent/", "cli/"} <= packages_on_disk()
