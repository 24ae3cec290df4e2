"""The download benchmark's smoke mode (``python -m bench.download smoke``) runs end to end against a real nginx origin.

It generates a 256 MiB file, starts nginx (installing Debian's nginx-light when missing and running as
root), runs W1 + W4 + W5 for every installed peer and the agent, and writes its report. What must hold
anywhere is asserted: the report carries the resume and corruption verdict rows; a byte flipped in
transit is always caught before anything is published (S3 source, Hub source, raw engine); a download
killed part-way is completed by the same command and the file verifies (the same three). How much the rerun
fetches again is reported, not asserted: the engine records a range only after its fdatasync, so what a kill costs
depends on disk latency at that moment (on this shared box: from 66 MiB to the whole file), and timing
targets belong to bench/, never to tests. Resume itself is asserted deterministically elsewhere
(tests/e2e/test_s3_source.py and the engine's unit tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 900
AGENTS = {"agent-s3", "agent-ranged", "agent-hf"}  # the agent's three faces: S3 source, raw engine, Hub source


@pytest.fixture(autouse=True)
def no_leftover_models() -> None:
    """Overrides the e2e clean-up: this test creates no Kubernetes objects, so it needs no control plane."""


def test_smoke_run_catches_a_flipped_byte_and_completes_a_killed_download(tmp_path: Path) -> None:
    work = tmp_path / "bench"
    tmpfs = Path("/dev/shm") / f"model-agent-bench-test-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "bench.download", "smoke", "--work-dir", str(work), "--tmpfs", str(tmpfs)],
        cwd=ROOT,  # the benchmarks run as modules of the bench package from the repository root
        env=env,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert not tmpfs.exists()

    verdicts = json.loads((work / "download-smoke-verdicts.json").read_text())
    resume = [v for v in verdicts if v["target"].startswith("Resume after SIGKILL")]
    corruption = [v for v in verdicts if v["target"].startswith("Injected byte flip")]
    assert {v["subject"].split()[0] for v in resume} == AGENTS
    assert {v["subject"].split()[0] for v in corruption} == AGENTS
    failed = [v for v in corruption if v["pass"] is not True]
    assert not failed, failed

    report = (work / "REPORT-smoke.md").read_text()
    assert "| Resume after SIGKILL" in report
    assert "| Injected byte flip is caught" in report
    records = [json.loads(line) for line in (work / "download-smoke.jsonl").read_text().splitlines()]
    runs = [r for r in records if r["kind"] == "run"]
    assert {r["workload"] for r in runs} == {"W1", "W4", "W5"}
    for killed in (r for r in runs if r["workload"] == "W4" and r["tool"] in AGENTS):
        assert killed["killed_first"], killed
        assert killed["verified"], killed
