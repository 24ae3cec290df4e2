"""``model-agent run`` as a real subprocess: what the tests, the benchmarks and the demo start and kill.

Role: the agent exactly as a node runs it — its own process and session, its own port, its log in a file —
so a test can SIGKILL it at any instant and start it again over the same models root. Nothing in-process is
shared with the caller.

Contract:

* The environment is the caller's minus every ``HF_*`` and ``MODEL_AGENT_*`` variable (a developer's token
  or mirror never leaks into a test), plus ``NODE_NAME``, a private ``HF_HOME`` and ``HF_ENDPOINT`` when
  given; ``env`` adds to that last.
* ``start`` picks a free loopback port for ``/healthz``, ``/readyz``, ``/metrics`` and ``/status``.
  ``wait_ready`` polls ``/readyz`` with a deadline and raises :class:`AgentProcessError` (with the log's
  tail) when the agent exits or the deadline passes; it never sleeps longer than one poll interval.
* ``stop`` sends SIGTERM and waits; an agent that ignores it is killed and, when ``must_stop`` holds (the
  default), reported as an error: a clean shutdown within the grace period is part of the contract.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import InitVar, dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from testbed.ports import free_port

POLL_S = 0.05


class AgentProcessError(AssertionError):
    """The agent exited, did not get ready, or ignored SIGTERM; the message ends with its log's tail.

    An ``AssertionError`` so that in a test it reads as the failed expectation it is.
    """


@dataclass(eq=False, kw_only=True)
class AgentProcess:
    """One ``model-agent run`` for one node, restartable over the same models root."""

    kubeconfig: Path
    node: str
    models_root: Path
    log_path: Path
    hf_endpoint: str | None = None
    hf_home: Path | None = None
    args: tuple[str, ...] = ()
    env: InitVar[dict[str, str] | None] = None
    log_level: str = "debug"
    extra_env: dict[str, str] = field(init=False)
    port: int = field(default=0, init=False)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    starts: int = field(default=0, init=False)

    def __post_init__(self, env: dict[str, str] | None) -> None:
        """The Hugging Face home defaults to one per node beside the log; ``env`` is added to the agent's."""
        self.hf_home = self.hf_home or self.log_path.parent / f"hf-home-{self.node}"
        self.extra_env = env or {}

    def start(self) -> None:
        """Start the agent in a new session (so signals to the test's group never reach it)."""
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODEL_AGENT_"))}
        env.update({"NODE_NAME": self.node, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"})
        env["HF_HOME"] = str(self.hf_home)
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
            self.log_level,
            *self.args,
        ]
        self.models_root.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        self.starts += 1

    @property
    def pid(self) -> int:
        """The running agent's pid, 0 before the first start."""
        return self.proc.pid if self.proc is not None else 0

    def http(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET ``path`` from the agent's port: (status, body); HTTP errors are answers, not exceptions."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 right now."""
        try:
            return self.http("/readyz", timeout=2)[0] == 200
        except OSError:
            return False

    def error(self, message: str) -> AgentProcessError:
        """An :class:`AgentProcessError` whose message ends with the last lines of the agent's log."""
        return AgentProcessError(f"{message}; last lines of {self.log_path}:\n{self.tail()}")

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Poll ``/readyz`` until 200; the seconds it took. Raises when the agent exits or time runs out."""
        started = time.monotonic()
        while not self.ready():
            if self.proc is not None and self.proc.poll() is not None:
                raise self.error(f"agent exited with {self.proc.returncode}")
            if time.monotonic() - started > timeout:
                raise self.error(f"agent not ready after {timeout:.0f}s")
            time.sleep(POLL_S)
        return time.monotonic() - started

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
        """One sample's value (0 when absent, as a counter never incremented is)."""
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        key = f"{name}{{{want}}}" if want else name
        return self.metrics().get(key, 0.0)

    def metric_line(self, prefix: str) -> str | None:
        """The exposition line starting with ``prefix`` (a metric name with its labels), if any."""
        try:
            _, text = self.http("/metrics")
        except OSError:
            return None
        return next((line for line in text.splitlines() if line.startswith(prefix + " ")), None)

    def stop(self, timeout: float = 15.0, *, must_stop: bool = True) -> float:
        """SIGTERM and wait; the seconds it took (0 when it was not running).

        An agent still running after ``timeout`` is killed; with ``must_stop`` that is an error.
        """
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return 0.0
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            if must_stop:
                raise self.error(f"agent ignored SIGTERM for {timeout}s") from None
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL, as a node crash or an OOM kill does; waits for the process to be gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def alive(self) -> bool:
        """Whether the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines of the log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:]) or "(empty log)"
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        """The whole log so far."""
        return self.log_path.read_text(errors="replace")
