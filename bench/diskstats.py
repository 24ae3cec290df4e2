"""Sample a block device's write traffic while something else runs: how deep the disk queue is kept.

Role: the measurement behind the engine's choice to leave writeback to the kernel (``ranged.py`` docstring):
every ``--interval`` seconds one line with the write throughput, write requests per second, the mean request
size, the requests in flight, and the page cache's Dirty and Writeback totals, from ``/proc/diskstats`` and
``/proc/meminfo``. Lines with no write traffic and nothing dirty are left out. Runs until interrupted.

    python -m bench.diskstats vda > /tmp/disk.log &
    python -m bench.download run --rounds 1 --workloads W2 --dests disk --tools agent-hf,rclone --no-ceilings
    kill %1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import NamedTuple


class Sample(NamedTuple):
    at: float
    writes: int  # write requests completed
    sectors: int  # 512-byte sectors written
    in_flight: int


def sample(device: str) -> Sample:
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        if fields[2] == device:
            return Sample(time.time(), int(fields[7]), int(fields[9]), int(fields[11]))
    raise SystemExit(f"no device {device!r} in /proc/diskstats")


def page_cache_mib() -> tuple[int, int]:
    """(Dirty, Writeback) in MiB."""
    info = {line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()}
    return info["Dirty"] // 1024, info["Writeback"] // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", help="a name from /proc/diskstats, e.g. vda or nvme0n1")
    parser.add_argument("--interval", type=float, default=0.5)
    args = parser.parse_args()
    prev = sample(args.device)
    while True:
        time.sleep(args.interval)
        cur = sample(args.device)
        dirty, writeback = page_cache_mib()
        dt = cur.at - prev.at
        writes, written = cur.writes - prev.writes, (cur.sectors - prev.sectors) * 512
        if written or dirty:
            mean_kib = written / 1024 / writes if writes else 0.0
            print(
                f"{cur.at:.2f} {written / dt / 1e6:7.1f} MB/s {writes / dt:6.0f} writes/s {mean_kib:6.0f} KiB/write "
                f"in-flight {cur.in_flight:3d} dirty {dirty} MiB writeback {writeback} MiB",
                flush=True,
            )
        prev = cur


if __name__ == "__main__":
    main()
