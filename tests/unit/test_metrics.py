"""The duration histograms: OME's boundaries kept, hour-long downloads measured (not lumped into +Inf)."""

from __future__ import annotations

from prometheus_client import generate_latest

from model_agent.ops.metrics import Metrics


def _buckets(text: str, name: str) -> list[str]:
    return [
        line.split('le="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith(f"{name}_bucket{{") and 'name="m"' in line
    ]


def test_download_duration_buckets_keep_omes_and_reach_hours() -> None:
    metrics = Metrics()
    metrics.download_duration.labels("ClusterBaseModel", "", "m").observe(5400.0)  # a 90-minute download
    text = generate_latest(metrics.registry).decode()
    bounds = _buckets(text, "model_agent_download_duration_seconds")
    ome = [f"{0.1 * 2**k}" for k in range(10)]
    assert all(b in bounds for b in ome), bounds  # 0.1 ... 51.2: queries written for OME's agent still work
    finite = [float(b) for b in bounds if b != "+Inf"]
    assert max(finite) >= 4 * 3600
    below = [line for line in text.splitlines() if 'le="6553.6"' in line and 'name="m"' in line]
    assert below and below[0].endswith(" 1.0"), below  # the observation lands in a finite bucket
