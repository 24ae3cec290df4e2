"""This box's ceilings for the download benchmark, measured at the start and end of every suite.

Role: the physical limits the targets are stated against — loopback TCP (``iperf3`` one stream, 127.0.0.1
only, a one-off server), disk write (``fio``, 1 MiB sequential writes: O_DIRECT at queue depth 16, and
buffered with a final fsync) in the disk destination's file system, and the CPU cost of sha256 per GB (to
estimate the agent's transfer-only CPU, since its engine always hashes inline). For the buffered + fsync
figure the fio process's wall time is used (size / wall, fsync included, fio's start-up too: conservative),
because fio's own bandwidth figure may leave out the final fsync. iperf3 and fio are Debian packages
(installed like nginx when root); a missing tool gives ``None``, not an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.download_origin import free_port

MiB = 1024 * 1024


def loopback_tcp_gbs(seconds: int) -> float | None:
    if shutil.which("iperf3") is None:
        return None
    port = free_port()
    server = subprocess.Popen(
        ["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(50):
            out = subprocess.run(
                ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J"], capture_output=True, text=True
            )
            try:
                received = float(json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"])
                return round(received / 8e9, 3)
            except (ValueError, KeyError):
                time.sleep(0.1)  # the one-off server may not listen yet (iperf3 reports an "error" then)
        return None
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(10)


def disk_write_gbs(folder: Path, size_mib: int, *, direct: bool) -> float | None:
    if shutil.which("fio") is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "fio.tmp"
    argv = ["fio", "--name=w", f"--filename={target}", "--rw=write", "--bs=1M", f"--size={size_mib}M"]
    if direct:
        argv += ["--direct=1", "--ioengine=libaio", "--iodepth=16"]
    else:
        argv += ["--direct=0", "--end_fsync=1"]
    try:
        t0 = time.perf_counter()
        out = subprocess.run([*argv, "--output-format=json"], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            return None
        if direct:
            return round(float(json.loads(out.stdout)["jobs"][0]["write"]["bw_bytes"]) / 1e9, 3)
        return round(size_mib * MiB / wall / 1e9, 3)
    finally:
        target.unlink(missing_ok=True)


def sha256_cpu_s_per_gb(path: Path) -> float:
    """CPU seconds per GB of hashlib sha256 over a file already in page cache (read cost included)."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    h = hashlib.sha256()
    buf = bytearray(2 * MiB)
    view = memoryview(buf)
    size = 0
    with path.open("rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
            size += n
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return round(cpu / (size / 1e9), 3)


def measure(disk_folder: Path, *, fio_mib: int, iperf_s: int, hash_sample: Path) -> dict[str, Any]:
    return {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load1": round(os.getloadavg()[0], 2),
        "loopback_tcp_gbs": loopback_tcp_gbs(iperf_s),
        "disk_direct_gbs": disk_write_gbs(disk_folder, fio_mib, direct=True),
        "disk_buffered_fsync_gbs": disk_write_gbs(disk_folder, fio_mib, direct=False),
        "sha256_cpu_s_per_gb": sha256_cpu_s_per_gb(hash_sample),
        "fio_mib": fio_mib,
    }
