"""The agent does not pay for SDKs it does not use: heavy packages load only when a model needs them.

Each is several to tens of MiB of RSS at import (kubernetes_asyncio ~35, boto3 ~35, oci, huggingface_hub ~8;
bench/STARTUP.md), so importing the runtime, or the CLI entry point the container runs, must not import them.
Checked in a fresh interpreter, since this test process has imported them already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("kubernetes_asyncio", "boto3", "botocore", "oci", "huggingface_hub", "obstore", "google.cloud", "azure")


def imported_after(module: str) -> list[str]:
    code = (
        f"import json, sys, {module}; "
        f"print(json.dumps(sorted({{m for m in sys.modules for h in {HEAVY!r} if m == h or m.startswith(h + '.')}})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)
    found: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("module", ["model_agent.agent.runtime", "model_agent.cli.run", "model_agent.kube.client"])
def test_no_heavy_sdk_is_imported_until_a_model_needs_it(module: str) -> None:
    assert imported_after(module) == []
