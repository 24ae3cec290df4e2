"""The flags are defined once, on the Settings fields (agent/settings.py); help, README and docs follow from them.

README.md's flags table is generated (agent/flags.py); it fails here when someone edits a field and not the
table, or the table and not the field. docs/ome-compatibility.md's comparison of OME's flags is prose with
OME's side in it, so it is hand-written, but every flag it names must exist with the default it gives.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.flags import REGENERATE, TABLE_END, TABLE_START, markdown_table, replace_table, run_flags
from model_agent.agent.ignored_flags import IGNORED
from model_agent.agent.settings import Settings, flag_name, flag_of
from model_agent.peers import PeerConfig

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_table_is_the_generated_one() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert replace_table(readme) == readme, f"README.md's flags table is stale: run `{REGENERATE}`"


def test_replace_table_touches_only_what_lies_between_the_markers() -> None:
    document = f"before\n{TABLE_START}\n| old | table |\n{TABLE_END}\nafter\n"
    assert replace_table(document) == f"before\n{TABLE_START}\n{markdown_table()}{TABLE_END}\nafter\n"
    with pytest.raises(ValueError, match="markers"):
        replace_table("no table here\n")


def test_a_row_per_flag_with_its_environment_variable_and_default() -> None:
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in markdown_table().splitlines()[2:]}
    assert len(rows) == len(run_flags())
    assert "| `MODEL_AGENT_DOWNLOAD_TIMEOUT_S` | `0` |" in rows["`--download-timeout`"]
    assert "| `MODEL_AGENT_ORIGIN_LEASE_S` | `30` |" in rows["`--origin-lease-seconds`"]
    assert "| `LOG_LEVEL` | `info` |" in rows["`--log-level`"]
    assert "(comma-separated or JSON)" in rows["`--trusted-namespace`"]
    assert "| `off` |" in rows["`--shared-root` / `--no-shared-root`"]
    assert "&lt;models-root&gt;/.model-agent" in rows["`--state-dir`"]  # not an HTML tag


@pytest.mark.parametrize("field", sorted(IGNORED))
def test_an_ignored_flag_says_so_in_help_and_table(field: str) -> None:
    [flag] = [f for f in run_flags() if f.field == field]
    assert "ignored" in flag.help
    assert "Accepted for OME compatibility and ignored" in flag.meaning and IGNORED[field] in flag.meaning


def test_flag_names_come_from_the_field_unless_given() -> None:
    assert flag_name("port") == "--port"
    assert flag_name("verify_rate_bytes_s") == "--verify-rate"
    assert flag_of("hf_endpoint") is None  # environment only
    with pytest.raises(KeyError):
        flag_name("hf_endpoint")


def test_every_help_names_its_default_and_environment() -> None:
    for flag in run_flags():
        assert f"Default: {flag.default}." in flag.help, flag.option
        assert f"Environment: {flag.env}." in flag.help, flag.option


def test_the_peer_config_takes_every_peer_setting() -> None:
    values: dict[str, Any] = {
        "peer_enabled": True,
        "peer_port": 1234,
        "peer_bind_address": "127.0.0.2",
        "peer_advertise_address": "10.0.0.1:1234",
        "peer_token_file": "/t",
        "peer_audience": "aud",
        "peer_allowed_username": "user",
        "peer_upload_rate": 5.0,
        "peer_max_per_peer": 6,
        "peer_ban_seconds": 7.0,
        "peer_downstreams_per_file": 2,
        "peer_relay_part_size": 65536,
    }
    assert set(values) == {name for name in Settings.model_fields if name.startswith("peer_")}
    config = Settings(NODE_NAME="n", **values).peer_config()
    assert config == PeerConfig(
        enabled=True,
        port=1234,
        bind_address="127.0.0.2",
        advertise_address="10.0.0.1:1234",
        token_file="/t",
        audience="aud",
        allowed_username="user",
        upload_rate=5.0,
        max_per_peer=6,
        ban_s=7.0,
        downstreams_per_file=2,
        relay_part_size=65536,
    )


def _ome_table_rows() -> list[tuple[str, str]]:
    text = (REPO / "docs" / "ome-compatibility.md").read_text(encoding="utf-8")
    section = text[text.index("### 11.3 Flags") :]
    section = section[: section.index("\n## ")]
    return re.findall(r"^\| `(--[a-z-]+)` \| ([^|]+) \|", section, flags=re.MULTILINE)


def test_the_ome_flags_table_names_real_flags_with_their_defaults() -> None:
    by_option = {flag.option: flag for flag in run_flags()}
    rows = _ome_table_rows()
    assert len(rows) >= 8
    for option, default in rows:
        assert option in by_option, f"docs/ome-compatibility.md 11.3 names {option}, which model-agent run lacks"
        shown = default.strip().strip("`")
        flag = by_option[option]
        if flag.default_is_value:
            assert shown == flag.default, option
