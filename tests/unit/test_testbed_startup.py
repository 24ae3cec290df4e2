"""The test bed's start-up check: a component is alive while it is ours, or in the instant its image is replaced."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from testbed.servers.controlplane import _running_or_ours


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_running_component_is_ours_by_its_command_line_and_a_zombie_is_not() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "/state/dir"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while "/state/dir" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace"):
            assert time.monotonic() < deadline, "the child never showed its command line"
        assert _running_or_ours(proc.pid, "/state/dir")
        assert not _running_or_ours(proc.pid, "/another/dir")  # a command line that does not name it: not ours
        assert proc.stdin is not None
        proc.stdin.close()  # it exits; not reaped yet, it stays a zombie with an empty command line
        while _state(proc.pid) != "Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
        assert not _running_or_ours(proc.pid, "/state/dir")
    finally:
        proc.wait()
    assert not _running_or_ours(0, "/state/dir")  # no pid
