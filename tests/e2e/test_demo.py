"""``python -m testbed demo`` end to end: one command, real components, exit 0, and nothing left running.

The demo runs as a subprocess exactly as a person would run it (no terminal, so rich prints plain final
frames). It starts its own control plane in ``<work-dir>/controlplane``, separate from the session's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.numpy import load

from testbed.models import tiny_llama
from testbed.servers.controlplane import ControlPlane, repo_root

REPO_ROOT = repo_root()

pytestmark = pytest.mark.e2e

DEMO_TIMEOUT_S = 300


def pids_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker`` (every process the demo starts names its work dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


def test_demo_shows_ready_then_removal_and_stops_everything(tmp_path: Path) -> None:
    work = (tmp_path / "demo").resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "COLUMNS"))}
    env["PYTHONPATH"] = str(REPO_ROOT)  # the test bed runs from the source checkout
    argv = [sys.executable, "-m", "testbed", "demo", "--work-dir", str(work)]
    plane = ControlPlane(work / "controlplane")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S, env=env, check=False)
    finally:
        # Record what is left first, then make sure a failing run leaks nothing into the test session.
        left_plane = plane.running()
        left_pids = pids_mentioning(str(work))
        plane.down()
        for pid in pids_mentioning(str(work)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n--- stdout\n{out}\n--- stderr\n{done.stderr}"
    assert left_plane is None, "the demo left its control plane running"
    assert left_pids == [], f"the demo left processes running: {left_pids}"

    assert "Ready after" in out
    assert "models.ome.io/clusterbasemodel.tiny-llama=Ready" in out  # the --show-labels line
    assert '"status": "Ready"' in out  # the ConfigMap entry, pretty-printed
    assert "models on node demo-node" in out  # the /status table
    assert "weights moved to the trash" in out
    assert f"{work}/models/.model-agent/trash/" in out
    assert "ClusterBaseModel//tiny-llama" in out  # the trash entry's model
    assert 'model_agent_delete_confirmations_total{outcome="confirmed_gone"}' in out
    assert "control plane stopped" in out
    assert "demo finished" in out

    # A given work dir is kept: the weights are in the trash, the model directory is gone.
    entries = list((work / "models" / ".model-agent" / "trash").glob("*/entry.json"))
    assert len(entries) == 1
    record = json.loads(entries[0].read_text())
    assert record["manifest"]["dest"] == str(work / "models" / "tiny-llama")
    assert (entries[0].parent / "data" / "model.safetensors").is_file()
    assert not (work / "models" / "tiny-llama").exists()


def test_demo_model_is_a_valid_llama() -> None:
    files = tiny_llama()
    tensors = load(files["model.safetensors"])
    assert sum(t.size for t in tensors.values()) == 4 * 128 * 64
    assert json.loads(files["config.json"])["architectures"] == ["LlamaForCausalLM"]
