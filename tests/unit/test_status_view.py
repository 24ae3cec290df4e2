"""The /status document is shaped from plain facts: stable keys, odd entries tolerated, rows sorted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console

from model_agent.cli.status import bytes_from, render
from model_agent.ops.status_view import Download, ModelFacts, model_row, status_view
from tests.support.hostile_json import DEEP

KEY = "ClusterBaseModel//llama"


def _row(**overrides: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {"key": KEY, "label": None, "raw_entry": None, "manifest": None, "download": None}
    facts.update(overrides)
    return model_row(ModelFacts(**facts))


@pytest.mark.parametrize(
    ("raw_entry", "status", "reason"),
    [
        (None, None, None),
        ("", None, None),
        (json.dumps({"status": "Ready"}), "Ready", None),
        (json.dumps({"status": "Failed", "reason": "UnsafePath"}), "Failed", "UnsafePath"),
        ("{not json", None, None),  # someone else's write: shown as no entry, never an error
        ("[1, 2]", None, None),
        pytest.param(DEEP, None, None, id="nested past any recursion limit"),
    ],
)
def test_entry_status_and_reason(raw_entry: str | None, status: str | None, reason: str | None) -> None:
    row = _row(raw_entry=raw_entry)
    assert (row["entry"], row["reason"]) == (status, reason)


def test_identity_label_and_download() -> None:
    row = _row(label="Updating", download=Download("downloading", 10, 100))
    assert row["kind"] == "ClusterBaseModel" and row["namespace"] == "" and row["name"] == "llama"
    assert row["label"] == "Updating"
    assert row["progress"] == {"phase": "downloading", "completedBytes": 10, "totalBytes": 100}
    assert row["manifest"] is None


def test_document_keys_and_sorted_models() -> None:
    models = [ModelFacts(k, None, None, None, None) for k in ("BaseModel/b/x", "BaseModel/a/y", KEY)]
    doc = status_view(
        node="n1",
        synced=True,
        breaker={"open": False, "pending": 0, "trips": 0},
        trash=[],
        configmap={"bytes": 0},
        unmanaged=["/models/stray"],
        unresolved=[{"where": "label", "key": "k", "why": "truncated"}],
        models=models,
    )
    assert list(doc) == ["node", "synced", "breaker", "trash", "configmap", "unmanaged", "unresolved", "models"]
    assert [m["key"] for m in doc["models"]] == ["BaseModel/a/y", "BaseModel/b/x", KEY]


def test_where_the_bytes_came_from_is_read_from_the_entry() -> None:
    entry = '{"name":"llama","status":"Ready","bytesBySource":{"origin":30,"peer":970,"sharedRoot":0}}'
    assert _row(raw_entry=entry)["bytesBySource"] == {"origin": 30, "peer": 970, "sharedRoot": 0}
    assert _row(raw_entry='{"name":"llama","status":"Ready"}')["bytesBySource"] is None  # not recorded
    odd = '{"name":"llama","status":"Ready","bytesBySource":"lots"}'  # someone else's field: shown as none
    assert _row(raw_entry=odd)["bytesBySource"] is None


@pytest.mark.parametrize(
    ("sources", "shown"),
    [
        (None, "-"),
        ({"origin": 0, "peer": 0, "sharedRoot": 0}, "-"),
        ({"origin": 30, "peer": 970, "sharedRoot": 0}, "peer 97% origin 3%"),
        ({"origin": 0, "peer": 0, "sharedRoot": 5}, "shared root 100%"),
        ({"origin": 10}, "origin 100%"),
    ],
)
def test_the_status_command_shows_the_share_of_each_source(sources: dict[str, int] | None, shown: str) -> None:
    assert bytes_from(sources) == shown


def test_the_status_table_has_a_from_column() -> None:
    row = _row(raw_entry='{"name":"llama","status":"Ready","bytesBySource":{"origin":1,"peer":3,"sharedRoot":0}}')
    console = Console(record=True, width=250)
    render({"node": "n1", "models": [row]}, console)
    text = console.export_text()
    assert "from" in text and "peer 75% origin 25%" in text
