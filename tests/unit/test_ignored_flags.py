"""OME flags accepted for compatibility but without effect here: set, they are warned about (agent/ignored_flags.py).

``--download-retry`` and ``--concurrency`` were accepted and silently never read: an operator who tuned them
had no way to know. Now each one that is set (flag or environment) is one warning at start-up, through
``model-agent run`` itself, and a default is no choice and warns about nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs
from typer.testing import CliRunner

from model_agent.agent.ignored_flags import IGNORED, ignored_flags, warn_ignored
from model_agent.agent.settings import Settings, flag_name
from model_agent.cli import run as run_mod
from model_agent.cli.main import app


def settings(**values: Any) -> Settings:
    return Settings(NODE_NAME="node-1", **values)


def test_defaults_warn_about_nothing() -> None:
    assert ignored_flags(settings()) == []


@pytest.mark.parametrize(("field", "flag"), [("download_retry", "--download-retry"), ("concurrency", "--concurrency")])
def test_a_set_flag_is_reported_with_its_value_and_what_governs_it(field: str, flag: str) -> None:
    found = ignored_flags(settings(**{field: 7}))
    assert [(f.flag, f.value) for f in found] == [(flag, 7)]
    assert found[0].instead  # says what does that job here


def test_the_default_value_given_explicitly_is_still_a_choice() -> None:
    assert [f.flag for f in ignored_flags(settings(download_retry=3, concurrency=4))] == [
        "--download-retry",
        "--concurrency",
    ]


def test_the_environment_counts_as_setting_a_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_AGENT_CONCURRENCY", "2")
    assert [(f.flag, f.value) for f in ignored_flags(settings())] == [("--concurrency", 2)]


def test_every_ignored_field_is_a_flag_of_run() -> None:
    assert set(IGNORED) <= set(Settings.model_fields)
    assert [flag_name(field) for field in IGNORED] == [
        "--download-retry",
        "--concurrency",
        "--same-path-wait-timeout",
    ]


def test_warn_ignored_logs_one_warning_per_flag() -> None:
    with capture_logs() as logs:
        warn_ignored(settings(download_retry=9))
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["flag"], e["value"]) for e in warnings] == [("--download-retry", 9)]
    assert "ignored" in warnings[0]["event"]


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def test_model_agent_run_warns_when_an_ignored_flag_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent itself does not start: its main coroutine and the final os._exit are replaced, so only the
    # command's configuration step (settings, layout, logging, the warning) runs for real.
    seen: list[list[str]] = []

    async def no_agent(_settings: Settings) -> int:
        return 0

    def fake_exit(code: int) -> None:
        raise _Exited(code)

    def record(found_settings: Settings) -> Any:
        found = warn_ignored(found_settings)
        seen.append([f.flag for f in found])
        return found

    monkeypatch.setattr(run_mod, "_main", no_agent)
    monkeypatch.setattr(run_mod, "warn_ignored", record)
    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.setenv("NODE_NAME", "node-1")
    root = tmp_path / "models"
    root.mkdir()
    try:
        result = CliRunner().invoke(
            app, ["run", "--models-root-dir", str(root), "--concurrency", "2", "--download-retry", "5"]
        )
    finally:
        structlog.reset_defaults()
    assert isinstance(result.exception, _Exited) and result.exception.code == 0, result.output
    assert seen == [["--download-retry", "--concurrency"]]
