"""Run ``model-agent run`` as a real subprocess for end-to-end tests (so it can be SIGKILLed)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class AgentProcess:
    def __init__(
        self,
        *,
        kubeconfig: Path,
        node: str,
        models_root: Path,
        log_path: Path,
        hf_endpoint: str | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.node = node
        self.models_root = models_root
        self.log_path = log_path
        self.hf_endpoint = hf_endpoint
        self.args = args
        self.extra_env = env or {}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODEL_AGENT_"))}
        env.update({"NODE_NAME": self.node, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"})
        env["HF_HOME"] = str(self.log_path.parent / f"hf-home-{self.node}")
        if self.hf_endpoint:
            env["HF_ENDPOINT"] = self.hf_endpoint
        env.update(self.extra_env)
        argv = [
            sys.executable,
            "-m",
            "model_agent",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--models-root-dir",
            str(self.models_root),
            "--port",
            str(self.port),
            "--log-level",
            "debug",
            *self.args,
        ]
        self.models_root.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.starts += 1

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def ready(self) -> bool:
        try:
            return self.http("/readyz")[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}; log:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"agent not ready after {timeout}s; log:\n{self.tail()}")
            time.sleep(0.05)

    def metrics(self) -> dict[str, float]:
        """Every sample as ``name{label="v",...}`` -> value (labels sorted)."""
        _, text = self.http("/metrics")
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def metric(self, name: str, /, **labels: str) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        key = f"{name}{{{want}}}" if want else name
        return self.metrics().get(key, 0.0)

    def stop(self, timeout: float = 15.0) -> float:
        """SIGTERM and wait; return seconds it took. Raises if it does not stop in time."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"agent ignored SIGTERM for {timeout}s; log:\n{self.tail()}") from None
        return time.monotonic() - started

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")
