"""The product wheel holds the product only: no test bed, no demo, no dev CLI, no tests.

Built from a copy of the source tree (so the build leaves nothing in the checkout) with the same backend
``pip install .`` and the Dockerfile use; the image installs exactly this wheel's files.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _wheel_names(tmp_path: Path) -> list[str]:
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path / "wheel"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "-q", "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("model_agent-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_wheel_contains_the_product_and_nothing_of_the_test_bed(tmp_path: Path) -> None:
    names = _wheel_names(tmp_path)
    top = {name.split("/", 1)[0] for name in names}
    assert top == {"model_agent", "model_agent-0.1.0.dist-info"}, top
    packages = {name.split("/")[1] for name in names if name.startswith("model_agent/") and name.count("/") > 1}
    assert packages == {"agent", "cli", "kube", "local", "model", "ops", "peers", "sources", "transfer"}, packages
    for forbidden in ("testbed", "devenv", "demo", "tests/", "conftest", "faultproxy", "countingproxy"):
        assert not [name for name in names if forbidden in name], forbidden
    cli = sorted(Path(name).stem for name in names if name.startswith("model_agent/cli/"))
    assert cli == ["__init__", "main", "preflight", "run", "status", "trash", "verify"]
    assert "model_agent/py.typed" in names
