"""Where a small file's time goes: a bare loop, a thread hop per file, and the engine, at 1-8 files at once.

Reproduce: ``flock /tmp/heavy.lock .venv/bin/python -m bench.small_files`` (the download benchmark's W3 files,
20 of 1-500 KiB, about 5 MB, from its nginx origin on loopback to ``/dev/shm``; 15 rounds of each variant, the
median printed). Every variant writes, hashes (sha256, checked against the data set), fsyncs and records each
file; they differ in how the work reaches a thread:

* ``batch``: ``N`` threads each take the next file themselves and fetch it over their own keep-alive
  connection (stdlib ``http.client``, ``readinto`` a reused buffer, ``pwrite``) until none is left: one thread
  call for many files, the floor of a Python fetch here.
* ``hop``: the same work, one executor call per file, at most ``N`` in flight (an ``asyncio.Semaphore``): what
  a per-file thread hand-off costs on this machine.
* ``engine``: :class:`model_agent.transfer.RangedDownloader` (its defaults), one ``download`` per file, at most
  ``N`` at once, one engine for the round.

What it showed (docs/performance.md section 5.3, 2026-12-06): the hop costs about 0.3 ms a file on this VM and
more threads than cores cost more than they give when the origin answers in a tenth of a millisecond.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import hashlib
import http.client
import json
import os
import shutil
import statistics
import threading
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench.download_data import DataFile, generate, warm
from bench.download_origin import NginxOrigin
from model_agent.transfer import Expected, RangedConfig, RangedDownloader

DEST = Path("/dev/shm/model-agent-small-files")
WORK = Path.home() / ".cache" / "model-agent-bench"


def _fetch_one(base: urllib.parse.SplitResult, bucket: str, f: DataFile, local: threading.local) -> None:
    """Worker thread: GET one file on this thread's connection, write, hash, check, fsync, record."""
    conn = getattr(local, "conn", None) or http.client.HTTPConnection(base.hostname or "", base.port)
    local.conn = conn
    buf = getattr(local, "buf", None) or memoryview(bytearray(4 << 20))
    local.buf = buf
    conn.request("GET", f"/plain/{bucket}/{f.path}")
    resp = conn.getresponse()
    fd = os.open(DEST / f.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        digest, pos = hashlib.sha256(), 0
        while pos < f.size:
            n = resp.readinto(buf[: f.size - pos])
            if not n:
                raise RuntimeError(f"{f.path}: short body")
            os.pwrite(fd, buf[:n], pos)
            digest.update(buf[:n])
            pos += n
        resp.read()
        if digest.hexdigest() != f.sha256:
            raise RuntimeError(f"{f.path}: sha256 mismatch")
        os.fsync(fd)
    finally:
        os.close(fd)
    (DEST / f".{f.path}.json").write_text(json.dumps({"sha256": f.sha256, "complete": True}))


async def _batch(url: str, bucket: str, files: list[DataFile], n: int) -> None:
    base, local, left = urllib.parse.urlsplit(url), threading.local(), list(files)

    def worker() -> None:
        while True:
            try:
                f = left.pop()
            except IndexError:
                return
            _fetch_one(base, bucket, f, local)

    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        await asyncio.gather(*(loop.run_in_executor(pool, worker) for _ in range(n)))


async def _hop(url: str, bucket: str, files: list[DataFile], n: int) -> None:
    base, local, gate = urllib.parse.urlsplit(url), threading.local(), asyncio.Semaphore(n)
    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:

        async def each(f: DataFile) -> None:
            async with gate:
                await loop.run_in_executor(pool, _fetch_one, base, bucket, f, local)

        await asyncio.gather(*(each(f) for f in files))


async def _engine(url: str, bucket: str, files: list[DataFile], n: int) -> None:
    gate = asyncio.Semaphore(n)
    async with RangedDownloader(config=RangedConfig()) as engine:

        async def each(f: DataFile) -> None:
            async with gate:
                await engine.download(
                    f"{url}/plain/{bucket}/{f.path}",
                    DEST / f.path,
                    Expected(f.size, {"sha256": f.sha256}),
                    state_path=DEST / ".parts" / f"{f.path}.json",
                )

        await asyncio.gather(*(each(f) for f in files))


VARIANTS: dict[str, Callable[[str, str, list[DataFile], int], Coroutine[Any, Any, None]]] = {
    "batch": _batch,
    "hop": _hop,
    "engine": _engine,
}


def _round(variant: str, url: str, files: list[DataFile], n: int) -> tuple[float, float]:
    shutil.rmtree(DEST, ignore_errors=True)
    DEST.mkdir(parents=True)
    wall, cpu = time.perf_counter(), time.process_time()
    asyncio.run(VARIANTS[variant](url, "w3", files, n))
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--at-once", default="1,2,8", help="files in flight, comma-separated")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    data = generate(WORK, big_mib=32, shard_mib=16, shards=1)  # the small files are the same at any size
    warm(data)
    files = data.bucket("w3")
    try:
        with NginxOrigin(data, WORK) as origin:
            for variant in args.variants.split(","):
                for n in (int(x) for x in args.at_once.split(",")):
                    runs = [_round(variant, origin.url, files, n) for _ in range(args.rounds)]
                    wall = statistics.median(r[0] for r in runs) * 1000
                    cpu = statistics.median(r[1] for r in runs) * 1000
                    print(f"{variant:7s} {n} at once: {wall:5.1f} ms wall, {cpu:5.1f} ms CPU ({len(files)} files)")
    finally:
        shutil.rmtree(DEST, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
