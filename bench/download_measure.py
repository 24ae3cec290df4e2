"""How one benchmark run is timed, optionally killed part-way, and checked afterwards.

Role: start a peer's command in its own process group, and take wall time (monotonic, from just before
the spawn to the reaping of the process), user + system CPU from the child's rusage (``wait4``: the whole
tree the child waited for) and peak RSS from ``/usr/bin/time -f %M`` wrapped around the command. Not
from ``wait4``: a child's ``ru_maxrss`` starts at the RSS of the process that forked it (the benchmark's
own Python), which would hide any tool smaller than that. For the disk destination the command is wrapped
in ``sh -c`` so that, inside the timed region and the same for every tool, every file and folder written
is fsynced (``sync FILE...`` from coreutils) after the tool exits successfully: tools that fsync on their
own pay twice for nothing (the second fsync of clean pages is cheap), tools that do not are made to.
``kill_when`` is polled every few milliseconds and, once true, the whole process group gets SIGKILL (W4).
Verification (sha256 of every expected file) runs afterwards, outside the timed region.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.download_data import DataFile

POLL_S = 0.002  # adds at most this much to a wall time
RUN_TIMEOUT_S = 900.0
GNU_TIME = "/usr/bin/time"
FSYNC_WRAPPER = 'dir=$1; shift; "$@" || exit $?; find "$dir" -exec sync -- {} +'


@dataclass(frozen=True)
class Measured:
    wall_s: float
    user_s: float
    sys_s: float
    maxrss_mib: float
    rc: int
    killed: bool
    output: str  # the last lines of stdout + stderr


def run_timed(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    *,
    fsync_dir: Path | None = None,
    kill_when: Callable[[], bool] | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
) -> Measured:
    if fsync_dir is not None:
        argv = ["sh", "-c", FSYNC_WRAPPER, "sh", str(fsync_dir), *argv]
    rss_file = log.with_suffix(".maxrss")
    argv = [GNU_TIME, "-f", "%M", "-o", str(rss_file), *argv]
    killed = False
    with log.open("wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = t0 + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if not killed and ((kill_when is not None and kill_when()) or time.perf_counter() > deadline):
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
            time.sleep(POLL_S)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    with log.open("rb") as fh:
        fh.seek(max(0, log.stat().st_size - 2000))
        tail = fh.read().decode(errors="replace")
    return Measured(
        wall_s=wall,
        user_s=usage.ru_utime,
        sys_s=usage.ru_stime,
        maxrss_mib=_maxrss_kib(rss_file) / 1024,
        rc=proc.returncode,
        killed=killed,
        output=tail,
    )


def _maxrss_kib(path: Path) -> float:
    """The %M line GNU time wrote (absent when the run was killed)."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip().isdigit()]
    except OSError:
        return 0.0
    return float(lines[-1]) if lines else 0.0


def sha256_of(path: Path) -> str | None:
    try:
        h = hashlib.sha256()
        buf = bytearray(4 * 1024 * 1024)
        view = memoryview(buf)
        with path.open("rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                h.update(view[:n])
        return h.hexdigest()
    except OSError:
        return None


@dataclass(frozen=True)
class Checked:
    verified: bool  # every expected file present under its final name with the right sha256
    missing: list[str]
    corrupt: list[str]  # present under the final name, wrong content


def check(out: Path, files: list[DataFile]) -> Checked:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # hashlib releases the GIL: both cores
        digests = list(pool.map(lambda f: sha256_of(out / f.path), files))
    missing = [f.path for f, d in zip(files, digests, strict=True) if d is None]
    corrupt = [f.path for f, d in zip(files, digests, strict=True) if d is not None and d != f.sha256]
    return Checked(not missing and not corrupt, missing, corrupt)
