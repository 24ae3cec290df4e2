"""One shape for the local helper servers (mirror, S3, GCS, Azure, fault proxy): start/stop, sync and async.

A subclass implements blocking :meth:`start` and :meth:`stop`; this mixin adds ``astart``/``astop`` (run in
a worker thread so an event loop is never blocked) and both context-manager protocols, stopping on exit
however the block ends. :class:`LocalProcess` is that shape for a program on a free loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from testbed.ports import free_port


def wait_until_answering(
    proc: subprocess.Popen[bytes], url: str, deadline: float, *, poll_s: float = 0.05
) -> int | None:
    """Poll ``url`` until any HTTP answer (None), or until ``proc`` exits (its exit code).

    Raises TimeoutError at ``deadline`` (monotonic). Waiting on the process doubles as the poll interval, so
    an exit is noticed at once.
    """
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return None
        except urllib.error.HTTPError:
            return None  # any status means the server is up
        except (urllib.error.URLError, OSError):
            pass
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(url)
        try:
            return proc.wait(timeout=min(poll_s, remaining))
        except subprocess.TimeoutExpired:
            continue


def send_create_request(request: urllib.request.Request, *, timeout: float = 30.0) -> None:
    """Send a request that creates a bucket or container; 409 Conflict (it exists) counts as done.

    The emulators' fill helpers are idempotent this way, so a test can set up the same bucket twice.
    """
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            pass
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise


class ManagedService:
    """The start/stop shape of every helper server: blocking ``start``/``stop``, async twins, both ``with`` forms."""

    def start(self) -> object:
        """Start the server and return once it answers; what it returns is the subclass's (a port, an endpoint)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the server; harmless when it is not running."""
        raise NotImplementedError

    async def astart(self) -> object:
        """:meth:`start` in a worker thread, so a test's event loop keeps running while the server boots."""
        return await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        """:meth:`stop` in a worker thread."""
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await self.astart()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.astop()


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Send ``sig``, then SIGKILL after ``timeout`` seconds; nothing when the process already ended."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def run_step(
    argv: list[str],
    what: str,
    error: type[Exception],
    *,
    timeout_s: float,
    on_timeout: str = "retry on an idle machine",
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one build or install step of the test bed to its end, output captured, and return it (any status).

    A step that outlives ``timeout_s`` raises ``error`` with one line a person can act on: ``{what} took over
    {timeout_s}s; {on_timeout}``. The caller judges the exit status (with :func:`last_line` for the message).
    """
    try:
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise error(f"{what} took over {timeout_s}s; {on_timeout}") from exc


def last_line(output: str) -> str:
    """The last line of a tool's output, what a one-line error quotes; ``(no output)`` when there is none."""
    return (output.strip().splitlines() or ["(no output)"])[-1]


def spawn_logged(argv: list[str], *, cwd: Path, log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start ``argv`` in ``cwd`` with its output appended to ``log_path``; return its pid, not waiting for it.

    It runs in a session of its own, so a Ctrl-C meant for the test does not reach it: stopping it is the
    owner's job, by pid, from this or another process (the control plane's and the node's ``down``).
    """
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
            env=env,
        )
    return proc.pid


class LocalProcess(ManagedService):
    """A server program on a free loopback port, output in ``<state_dir>/<name>.log``.

    Subclasses give :meth:`argv` (for a port) and ``ready_path``, and where needed :meth:`prepare` (install
    or build the program first) and :meth:`env`; ``start`` returns once that URL answers HTTP (any status),
    tries another port up to three times when the process exits early because its port was taken ("in use"
    in its output), and raises ``error`` otherwise; ``stop`` sends ``stop_signal`` (SIGTERM), then SIGKILL
    after ``stop_timeout``. Idempotent both ways. :attr:`endpoint` is what a test hands its clients.
    """

    name = "server"
    error: type[Exception] = RuntimeError
    stop_signal = signal.SIGTERM
    # What follows ``http://127.0.0.1:<port>`` in :attr:`endpoint` (Azurite: the account) and in the URL
    # polled until the server answers (a cheap request it serves once ready).
    endpoint_path = ""
    ready_path = "/"

    def __init__(self, state_dir: Path, *, start_timeout: float = 60.0, stop_timeout: float = 10.0) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def argv(self, port: int) -> list[str]:
        """The command line that runs the server on ``port``."""
        raise NotImplementedError

    def ready_url(self) -> str:
        """A URL that answers HTTP once the server is up (any status counts): ``ready_path`` on its port."""
        return f"http://127.0.0.1:{self.port}{self.ready_path}"

    def prepare(self) -> None:
        """Make sure the program exists (install or build it into the cache); runs before every start."""

    def env(self) -> dict[str, str] | None:
        """The program's whole environment; None (the default) passes this process's on."""
        return None

    @property
    def endpoint(self) -> str:
        """The base URL clients are given; raises ``error`` when the server is not running (no port yet)."""
        if not self.port:
            raise self.error(f"{self.name} is not running: call start() first")
        return f"http://127.0.0.1:{self.port}{self.endpoint_path}"

    @property
    def log_path(self) -> Path:
        """Where the server's stdout and stderr go; error messages point here."""
        return self.state_dir / f"{self.name}.log"

    def log_size(self) -> int:
        """The log's length now: an offset for :meth:`log_since`, so a restart reads only its own output."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        """What the server wrote to its log after byte ``offset`` ("" when there is no log yet)."""
        with contextlib.suppress(FileNotFoundError), self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")
        return ""

    @property
    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the program on a free port and wait until it answers (see the class); idempotent."""
        if self._proc is not None:
            return
        self.prepare()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # the free port picked can be taken by someone else before the program binds it
            self.port = free_port()
            offset = self.log_size()
            with self.log_path.open("ab") as log:
                self._proc = subprocess.Popen(
                    self.argv(self.port),
                    cwd=self.state_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env(),
                    start_new_session=True,
                )
            try:
                code = wait_until_answering(self._proc, self.ready_url(), time.monotonic() + self.start_timeout)
            except TimeoutError:
                self.stop()
                raise self.error(
                    f"{self.name} did not answer within {self.start_timeout:.0f}s: see {self.log_path}"
                ) from None
            except BaseException:  # interrupted while waiting: leave no half-started server behind
                self.stop()
                raise
            if code is None:
                return
            self._proc = None
            output = self.log_since(offset).strip()
            if "in use" not in output.lower():  # not a lost race for the port: say why it stopped
                last = output.splitlines()[-1][:300] if output else "no output"
                raise self.error(f"{self.name} exited with code {code} during start-up: {last} (log: {self.log_path})")
        self.stop()
        raise self.error(f"{self.name} exited during start-up three times: see {self.log_path}")

    def stop(self) -> None:
        """Stop the program (``stop_signal``, then SIGKILL) and forget its port; idempotent."""
        proc, self._proc = self._proc, None
        stop_process(proc, self.stop_signal, self.stop_timeout)
        self.port = 0
