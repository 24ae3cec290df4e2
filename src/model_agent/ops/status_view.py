"""The node's status view: what ``model-agent status`` and ``GET /status`` show, built from plain facts.

Role: a pure function from what the agent knows at one instant (labels, ConfigMap entries, manifests,
downloads, breaker, trash) to the JSON document ``/status`` serves. The agent gathers the facts; this module
only shapes them, so the view is table-testable and the wire format lives in one place.

Contract: the document's keys are stable (``model-agent status`` and operators' scripts read them): ``node``,
``synced``, ``breaker``, ``trash``, ``configmap``, ``unmanaged``, ``unresolved``, ``models`` (sorted by key,
each with ``key``, ``kind``, ``namespace``, ``name``, ``label``, ``entry``, ``reason``, ``manifest``,
``progress``, ``bytesBySource``). An entry that is not valid JSON shows as no entry; nothing here raises on odd
input. ``bytesBySource`` is where the model's bytes came from (``origin``, ``peer``, ``sharedRoot``), as the
entry records it (model/entry.py): for the copy being fetched, or the Ready one; None when not recorded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from model_agent.local.manifest import Manifest
from model_agent.model import json_text
from model_agent.model.entry import ModelEntry
from model_agent.model.resources import ModelRef


@dataclass(frozen=True)
class Download:
    """A download in progress, as the status shows it (``queued`` while it waits for a slot)."""

    phase: str
    completed_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class ModelFacts:
    """What the agent knows of one model at this instant."""

    key: str
    label: str | None
    raw_entry: str | None
    manifest: Manifest | None
    download: Download | None


def model_row(facts: ModelFacts) -> dict[str, Any]:
    """One model's row: its identity, label, entry status and reason, local record and download."""
    ref = ModelRef.from_key(facts.key)
    entry: dict[str, Any] = {}
    if facts.raw_entry:
        with contextlib.suppress(ValueError):
            parsed = json_text.loads(facts.raw_entry)
            entry = parsed if isinstance(parsed, dict) else {}
    manifest = facts.manifest
    download = facts.download
    parsed_entry = ModelEntry.from_json(facts.raw_entry) if facts.raw_entry else None
    sources = parsed_entry.bytes_by_source if parsed_entry is not None else None
    return {
        "key": facts.key,
        "kind": ref.kind.value,
        "namespace": ref.namespace,
        "name": ref.name,
        "label": facts.label,
        "entry": entry.get("status"),
        "reason": entry.get("reason"),
        "manifest": None
        if manifest is None
        else {
            "revision": manifest.revision,
            "bytes": manifest.total_bytes,
            "files": len(manifest.files),
            "check": manifest.fast_check()[:3] or "ok",
            "verifiedAt": manifest.verified_at,
            "dest": manifest.dest,
        },
        "progress": None
        if download is None
        else {
            "phase": download.phase,
            "completedBytes": download.completed_bytes,
            "totalBytes": download.total_bytes,
        },
        "bytesBySource": None
        if sources is None
        else {"origin": sources.origin, "peer": sources.peer, "sharedRoot": sources.shared_root},
    }


def status_view(
    *,
    node: str,
    synced: bool,
    breaker: dict[str, Any],
    trash: list[dict[str, Any]],
    configmap: dict[str, Any],
    unmanaged: list[str],
    unresolved: list[dict[str, str]],
    models: list[ModelFacts],
) -> dict[str, Any]:
    """The whole ``/status`` document (see the module docstring for its keys)."""
    return {
        "node": node,
        "synced": synced,
        "breaker": breaker,
        "trash": trash,
        "configmap": configmap,
        "unmanaged": unmanaged,
        # Labels and ConfigMap keys of no known model: left alone (no read can prove them orphans).
        "unresolved": unresolved,
        "models": [model_row(m) for m in sorted(models, key=lambda m: m.key)],
    }
