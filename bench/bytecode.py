"""Compiled bytecode for the agents a benchmark starts, as the image has it.

The image installs the agent with pip, which compiles every module; a run from this source tree (an editable
install) with ``PYTHONDONTWRITEBYTECODE`` set, as on the benchmark box, would instead compile each module from
source in every agent process, at start-up and again for each module imported lazily during the first fetch of a
kind (measured in ``bench.fleet_fetch``: about a tenth of an agent's Python time during its first Hub fetch).
:func:`compile_product` writes the ``__pycache__`` files (ignored by git) before the agents start.
"""

from __future__ import annotations

import compileall
import importlib.util
from pathlib import Path


def compile_product() -> Path:
    """Compile the ``model_agent`` package the agents will import; returns its folder."""
    spec = importlib.util.find_spec("model_agent")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("model_agent is not importable")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not compileall.compile_dir(folder, quiet=1, workers=1):
        raise RuntimeError(f"could not compile {folder}")
    return folder
