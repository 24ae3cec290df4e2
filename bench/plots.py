"""Plots (PNG) for the benchmark reports, drawn from their JSON results with matplotlib (headless)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

BENCH = Path(__file__).resolve().parent


def startup(result: dict[str, Any], out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    runs = ["cold", "warm"]
    left.bar(runs, [result[r]["seconds"] for r in runs], color=["#4c72b0", "#55a868"])
    left.axhline(result["targets"]["seconds"], color="red", linestyle="--", label="target")
    left.set_ylabel("seconds until all Ready")
    left.set_title(f"{result['models']} models: time")
    left.legend()
    right.bar(runs, [result[r]["peak_rss_mib"] for r in runs], color=["#4c72b0", "#55a868"])
    right.axhline(result["targets"]["peak_rss_mib"], color="red", linestyle="--", label="target")
    right.set_ylabel("peak RSS (MiB)")
    right.set_title("memory")
    right.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def fleet(results: list[dict[str, Any]], out: Path) -> None:
    def reads(cell: dict[str, Any], mode: str) -> int:
        reqs = (cell.get(f"storm_{mode}") or {"requests": {}})["requests"]
        return sum(v for k, v in reqs.items() if k.startswith(("get clusterbasemodels", "list clusterbasemodels")))

    labels = [f"N={r['agents']}\nM={r['models']}" for r in results]
    x = range(len(results))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(results)), 3.8))
    width = 0.38
    ax.bar(
        [i - width / 2 for i in x], [reads(r, "get_per_candidate") for r in results], width, label="GET per candidate"
    )
    ax.bar([i + width / 2 for i in x], [reads(r, "coalesced") for r in results], width, label="coalesced LIST")
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("confirmation reads in a storm (log)")
    ax.set_title("A DELETED for every model on every agent")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def download(rows: list[dict[str, Any]], out: Path) -> None:
    """GB/s (median of the verified runs) per tool, one panel per workload x destination of W1-W3."""
    import statistics

    panels = [
        (w, d)
        for w in ("W1", "W2", "W3")
        for d in ("tmpfs", "disk")
        if any(r["workload"] == w and r["dest"] == d for r in rows)
    ]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 4.2), squeeze=False)
    for ax, (workload, dest) in zip(axes[0], panels, strict=True):
        speeds: dict[str, list[float]] = {}
        for r in rows:
            if r["workload"] == workload and r["dest"] == dest:
                speeds.setdefault(r["tool"], []).extend([r["gb_s"]] if r["verified"] else [])
        tools = sorted(speeds, key=lambda t: -(statistics.median(speeds[t]) if speeds[t] else 0))
        medians = [statistics.median(speeds[t]) if speeds[t] else 0 for t in tools]
        colors = ["#c44e52" if t.startswith("agent-") else "#4c72b0" for t in tools]
        ax.barh(tools, medians, color=colors)
        ax.invert_yaxis()
        ax.set_xlabel("GB/s (median)")
        ax.set_title(f"{workload} {dest}")
    fig.suptitle("Download throughput on one local nginx origin (agent in red)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    results = BENCH / "results"
    runs = [json.loads(p.read_text()) for p in results.glob("startup-*.json")]
    if runs:
        startup(max(runs, key=lambda r: r["models"]), BENCH / "startup.png")
    fleet_json = results / "fleet.json"
    if fleet_json.exists():
        fleet(json.loads(fleet_json.read_text()), BENCH / "fleet.png")


if __name__ == "__main__":
    main()
