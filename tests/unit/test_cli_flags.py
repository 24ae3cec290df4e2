"""``model-agent run``'s flags: the exact set (names, types, repeatable, bool switches) and where each value lands.

The flag set is OME's contract plus this project's knobs; DaemonSets, the chart, the test bed and benchmarks
pass them by name. The table below was taken from ``model-agent run`` before its options were generated from
the Settings model, so a generator that drops, renames or retypes a flag fails here. The second half runs the
real command (the agent itself replaced) and checks which Settings field each flag sets, that an unset flag
leaves ``MODEL_AGENT_<FIELD>`` and the default in charge, and the special cases (``NODE_NAME``, ``LOG_LEVEL``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import typer.core
import typer.main
from typer.testing import CliRunner

from model_agent.agent.settings import Settings
from model_agent.cli import run as run_mod
from model_agent.cli.main import app
from model_agent.ops import logging as agent_logging
from model_agent.sources import egress

# flag -> (type as --help shows it, repeatable, bool switch with a --no- form). Captured from the command as
# it was before generation; not derived from the code under test.
EXPECTED_FLAGS: dict[str, tuple[str, bool, bool]] = {
    "--models-root-dir": ("Path", False, False),
    "--allowed-root": ("list[Path]", True, False),
    "--state-dir": ("Path", False, False),
    "--node-name": ("str", False, False),
    "--namespace": ("str", False, False),
    "--port": ("int", False, False),
    "--num-download-worker": ("int", False, False),
    "--download-retry": ("int", False, False),
    "--node-label-retry": ("int", False, False),
    "--concurrency": ("int", False, False),
    "--multipart-concurrency": ("int", False, False),
    "--multipart-part-size": ("str", False, False),
    "--log-level": ("str", False, False),
    "--disk-reserve": ("str", False, False),
    "--kubeconfig": ("Path", False, False),
    "--download-timeout": ("float", False, False),
    "--download-min-rate": ("float", False, False),
    "--download-min-rate-window": ("float", False, False),
    "--confirm-timeout": ("float", False, False),
    "--trash-grace": ("float", False, False),
    "--delete-breaker-ratio": ("float", False, False),
    "--delete-breaker-min": ("int", False, False),
    "--delete-breaker-window": ("float", False, False),
    "--delete-settle": ("float", False, False),
    "--resync-interval": ("float", False, False),
    "--verify-interval": ("float", False, False),
    "--verify-rate": ("float", False, False),
    "--workers": ("int", False, False),
    "--model-verification-concurrency": ("int", False, False),
    "--num-high-priority-worker": ("int", False, False),
    "--same-path-wait-timeout": ("str", False, False),
    "--startup-jitter": ("float", False, False),
    "--confirm-batch-threshold": ("int", False, False),
    "--confirm-debounce": ("float", False, False),
    "--api-qps": ("float", False, False),
    "--api-burst": ("int", False, False),
    "--max-concurrent-origin-fetches": ("int", False, False),
    "--origin-lease-seconds": ("int", False, False),
    "--lease-max-hold": ("float", False, False),
    "--shared-root": ("bool", False, True),
    "--trusted-namespace": ("list[str]", True, False),
    "--tenant-endpoint-allow": ("list[str]", True, False),
    "--cluster-cidr": ("list[str]", True, False),
    "--tenant-address-allow": ("list[str]", True, False),
    "--tenant-local-allow": ("list[str]", True, False),
    "--max-failed-per-namespace": ("int", False, False),
    "--max-models-per-namespace": ("int", False, False),
    "--peer-enabled": ("bool", False, True),
    "--peer-port": ("int", False, False),
    "--peer-bind-address": ("str", False, False),
    "--peer-advertise-address": ("str", False, False),
    "--peer-token-file": ("str", False, False),
    "--peer-audience": ("str", False, False),
    "--peer-allowed-username": ("str", False, False),
    "--peer-upload-rate": ("float", False, False),
    "--peer-max-per-peer": ("int", False, False),
    "--peer-ban-seconds": ("float", False, False),
    "--peer-downstreams-per-file": ("int", False, False),
    "--peer-relay-part-size": ("int", False, False),
}


def _run_options() -> dict[str, Any]:
    command = typer.main.get_command(app)
    assert isinstance(command, typer.core.TyperGroup)
    return {param.opts[0]: param for param in command.commands["run"].params}


def test_run_has_exactly_the_flags_it_had() -> None:
    found = {
        flag: (param.bare_type(), bool(param.multiple), bool(param.is_flag)) for flag, param in _run_options().items()
    }
    assert found == EXPECTED_FLAGS


def test_every_flag_defaults_to_unset_and_bool_flags_have_a_no_form() -> None:
    for flag, param in _run_options().items():
        assert param.default is None, flag  # unset: the environment variable or the field's default decides
        assert not param.required, flag
        assert param.help, flag
        if param.is_flag:
            assert param.secondary_opts == [f"--no-{flag[2:]}"], flag


def test_help_lists_every_flag() -> None:
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for flag in EXPECTED_FLAGS:
        assert flag in result.output, flag


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _settings_from(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings ``model-agent run <argv>`` builds; the agent, logging set-up and the final os._exit replaced."""
    seen: list[Settings] = []

    async def no_agent(settings: Settings) -> int:
        seen.append(settings)
        return 0

    def fake_exit(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(run_mod, "_main", no_agent)
    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.setattr(agent_logging, "configure", lambda level: None)
    monkeypatch.setattr(egress, "configure", lambda policy: None)
    result = CliRunner().invoke(app, ["run", *argv])
    assert isinstance(result.exception, _Exited) and result.exception.code == 0, result.output
    return seen[0]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MODEL_AGENT_") or name in {"NODE_NAME", "LOG_LEVEL", "HF_ENDPOINT"}:
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_each_flag_sets_its_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, other, state = tmp_path / "models", tmp_path / "other", tmp_path / "state"
    for directory in (root, other, state):
        directory.mkdir()
    argv: list[str] = []
    expected: dict[str, Any] = {}

    def given(flag: str, field: str, value: Any, *texts: str) -> None:
        for text in texts or [str(v) for v in (value if isinstance(value, list) else [value])]:
            argv.extend([flag, text])
        expected[field] = value

    given("--models-root-dir", "models_root_dir", root)
    given("--allowed-root", "allowed_roots", [other])
    given("--state-dir", "state_dir", state)
    given("--node-name", "node_name", "node-from-flag")
    given("--namespace", "namespace", "ns-x")
    given("--port", "port", 9001)
    given("--num-download-worker", "num_download_worker", 7)
    given("--download-retry", "download_retry", 8)
    given("--node-label-retry", "node_label_retry", 9)
    given("--concurrency", "concurrency", 11)
    given("--multipart-concurrency", "multipart_concurrency", 12)
    given("--multipart-part-size", "multipart_part_size", "4Mi")
    given("--log-level", "log_level", "debug")
    given("--disk-reserve", "disk_reserve", "5%")
    given("--kubeconfig", "kubeconfig", tmp_path / "kubeconfig")
    given("--download-timeout", "download_timeout_s", 13.5)
    given("--download-min-rate", "download_min_rate", 14.5)
    given("--download-min-rate-window", "download_min_rate_window_s", 15.5)
    given("--confirm-timeout", "confirm_timeout_s", 16.5)
    given("--trash-grace", "trash_grace_s", 17.5)
    given("--delete-breaker-ratio", "delete_breaker_ratio", 0.25)
    given("--delete-breaker-min", "delete_breaker_min", 18)
    given("--delete-breaker-window", "delete_breaker_window_s", 19.5)
    given("--delete-settle", "delete_settle_s", 20.5)
    given("--resync-interval", "resync_interval_s", 21.5)
    given("--verify-interval", "verify_interval_s", 22.5)
    given("--verify-rate", "verify_rate_bytes_s", 23.5)
    given("--workers", "workers", 24)
    given("--model-verification-concurrency", "model_verification_concurrency", 4)
    given("--num-high-priority-worker", "num_high_priority_worker", 2)
    given("--same-path-wait-timeout", "same_path_wait_timeout", "1h30m")
    given("--startup-jitter", "startup_jitter_s", 25.5)
    given("--confirm-batch-threshold", "confirm_batch_threshold", -1)
    given("--confirm-debounce", "confirm_debounce_s", 26.5)
    given("--api-qps", "api_qps", 27.5)
    given("--api-burst", "api_burst", 28)
    given("--max-concurrent-origin-fetches", "max_concurrent_origin_fetches", 29)
    given("--origin-lease-seconds", "origin_lease_s", 31)
    given("--lease-max-hold", "lease_max_hold_s", 7200.0)
    given("--trusted-namespace", "trusted_namespaces", ["team-a", "team-b"])
    given("--tenant-endpoint-allow", "tenant_endpoint_allow", ["https://s3.example.test"])
    given("--cluster-cidr", "cluster_cidrs", ["10.0.0.0/8", "192.168.0.0/16"])
    given("--tenant-address-allow", "tenant_address_allow", ["10.1.0.0/16"])
    given("--tenant-local-allow", "tenant_local_allow", ["/srv/tenant"])
    given("--max-failed-per-namespace", "max_failed_per_namespace", 32)
    given("--max-models-per-namespace", "max_models_per_namespace", 7)
    given("--peer-port", "peer_port", 9002)
    given("--peer-bind-address", "peer_bind_address", "127.0.0.1")
    given("--peer-advertise-address", "peer_advertise_address", "10.2.3.4:9002")
    given("--peer-token-file", "peer_token_file", "/var/run/token")
    given("--peer-audience", "peer_audience", "aud-x")
    given("--peer-allowed-username", "peer_allowed_username", "system:serviceaccount:x:y")
    given("--peer-upload-rate", "peer_upload_rate", 33.5)
    given("--peer-max-per-peer", "peer_max_per_peer", 34)
    given("--peer-ban-seconds", "peer_ban_seconds", 35.5)
    given("--peer-downstreams-per-file", "peer_downstreams_per_file", 2)
    given("--peer-relay-part-size", "peer_relay_part_size", 65536)
    argv += ["--shared-root", "--peer-enabled"]
    expected |= {"shared_root": True, "peer_enabled": True}
    # every value flag is exercised (the bool switches are the two added above)
    assert {argv[i] for i in range(0, len(argv) - 2, 2)} | {"--shared-root", "--peer-enabled"} == set(EXPECTED_FLAGS)

    settings = _settings_from(argv, monkeypatch)
    assert {field: getattr(settings, field) for field in expected} == expected
    assert settings.model_fields_set >= set(expected)


@pytest.mark.usefixtures("clean_env")
def test_an_unset_flag_leaves_the_environment_and_the_default_in_charge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-1")
    monkeypatch.setenv("MODEL_AGENT_PORT", "9100")
    monkeypatch.setenv("MODEL_AGENT_TRUSTED_NAMESPACES", "team-a,team-b")
    monkeypatch.setenv("MODEL_AGENT_SHARED_ROOT", "true")
    monkeypatch.setenv("LOG_LEVEL", "warning")
    settings = _settings_from(["--models-root-dir", str(tmp_path), "--workers", "3"], monkeypatch)
    assert (settings.port, settings.trusted_namespaces, settings.shared_root) == (9100, ["team-a", "team-b"], True)
    assert settings.log_level == "warning"
    assert (settings.workers, settings.namespace, settings.peer_enabled) == (3, "ome", False)
    assert "download_retry" not in settings.model_fields_set  # so no ignored-flag warning for a default


@pytest.mark.usefixtures("clean_env")
def test_a_flag_beats_the_environment_and_no_form_turns_a_switch_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-1")
    monkeypatch.setenv("MODEL_AGENT_PORT", "9100")
    monkeypatch.setenv("MODEL_AGENT_SHARED_ROOT", "true")
    monkeypatch.setenv("LOG_LEVEL", "warning")
    argv = ["--models-root-dir", str(tmp_path), "--port", "9200", "--no-shared-root", "--log-level", "error"]
    settings = _settings_from(argv, monkeypatch)
    assert (settings.port, settings.shared_root, settings.log_level) == (9200, False, "error")


@pytest.mark.usefixtures("clean_env")
def test_node_name_env_wins_over_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-from-env")
    settings = _settings_from(["--models-root-dir", str(tmp_path), "--node-name", "node-from-flag"], monkeypatch)
    assert settings.node_name == "node-from-env"


@pytest.mark.usefixtures("clean_env")
def test_bad_configuration_exits_2(tmp_path: Path) -> None:
    no_node = CliRunner().invoke(app, ["run", "--models-root-dir", str(tmp_path)])
    assert no_node.exit_code == 2 and "NODE_NAME" in no_node.output
    bad_workers = CliRunner().invoke(
        app, ["run", "--models-root-dir", str(tmp_path), "--node-name", "n", "--workers", "0"]
    )
    assert bad_workers.exit_code == 2 and "invalid configuration" in bad_workers.output
    not_a_number = CliRunner().invoke(app, ["run", "--node-name", "n", "--port", "x"])
    assert not_a_number.exit_code == 2
