"""The fleet fetch benchmark's plot (PNG): time until every node is Ready and origin egress, per mode and N.

Drawn from the JSON ``bench/fleet_fetch.py`` writes (``cells`` with ``mode``, ``agents``, ``seconds``,
``origin_bytes``; ``single_node_s`` and ``model_bytes``); matplotlib is in the bench extra, headless here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LABELS = {
    "a": "(a) every node from the origin",
    "b": "(b) Lease origin slots",
    "c": "(c) peer distribution",
    "d": "(d) shared root",
}


def draw(doc: dict[str, Any], out: Path) -> None:
    """Two panels: seconds until all Ready (with one node alone and the 1.5x target), origin bytes / model size."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    size = doc["model_bytes"]
    for mode, label in LABELS.items():
        cells = [r for r in doc["cells"] if r["mode"] == mode and "seconds" in r]
        if not cells:
            continue
        ns = [r["agents"] for r in cells]
        left.plot(ns, [r["seconds"] for r in cells], marker="o", label=label)
        right.plot(ns, [r["origin_bytes"] / size for r in cells], marker="o", label=label)
    single = doc.get("single_node_s")
    if single:
        left.axhline(single, linestyle=":", color="grey", label="one node alone")
        left.axhline(1.5 * single, linestyle="--", color="red", linewidth=0.8, label="1.5 x one node (target, c)")
    right.axhline(1.1, linestyle="--", color="red", linewidth=0.8, label="1.1 x model (target, c and d)")
    left.set_xlabel("nodes")
    left.set_ylabel("s until every node Ready")
    left.set_title("time to a Ready fleet")
    right.set_xlabel("nodes")
    right.set_ylabel("origin egress / model size")
    right.set_yscale("log")
    right.set_title("origin egress")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
