"""Loopback benchmark of the ranged download engine: throughput and CPU per part size x concurrency.

Reproduce: ``.venv/bin/python bench/ranged.py [--size-mib 1024] [--rounds 2] [--dest /dev/shm]``.
The origin is a separate process (aiohttp ``FileResponse``, i.e. ``sendfile`` from the page cache) serving
one random file; the client is :class:`model_agent.sources.ranged.RangedDownloader` in this process, writing
to ``--dest`` (tmpfs by default: network + CPU only), hashing sha256 as it goes, ``durable`` off unless
``--durable``. Prints one JSON line per run (part size, concurrency, GB/s, client CPU-s per GB, peak RSS) and
a summary table; writes ``bench/results/ranged.json``. Rounds are interleaved (round-robin over the grid).
This measures the engine, not the origin: for comparisons with other tools use the nginx origin of
``shared/reference/performance.md`` section 8.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from model_agent.sources.ranged import Expected, RangedConfig, RangedDownloader  # noqa: E402

MiB = 1024 * 1024
ORIGIN = """
import sys
from aiohttp import web
async def handle(request):
    return web.FileResponse(sys.argv[1], chunk_size=1024 * 1024)
app = web.Application()
app.router.add_get("/file", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _one(url: str, dest: Path, size: int, sha: str, part_mib: int, conc: int, durable: bool) -> dict[str, float]:
    cfg = RangedConfig(part_size=part_mib * MiB, concurrency=conc, durable=durable)
    dest.unlink(missing_ok=True)
    Path(f"{dest}.parts.json").unlink(missing_ok=True)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        got = await RangedDownloader(session, cfg).download(url, dest, Expected(size, {"sha256": sha}))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    assert got.digests["sha256"] == sha
    return {
        "part_mib": part_mib,
        "concurrency": conc,
        "gb_s": round(size / wall / 1e9, 3),
        "cpu_s_per_gb": round(cpu / (size / 1e9), 2),
        "maxrss_mib": round(r1.ru_maxrss / 1024, 1),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dest", default="/dev/shm")
    ap.add_argument("--durable", action="store_true")
    ap.add_argument("--parts", default="4,8,16,32,64")
    ap.add_argument("--concurrency", default="2,4,8,16")
    args = ap.parse_args()
    size = args.size_mib * MiB
    with tempfile.TemporaryDirectory(dir=args.dest) as tmp:
        src = Path(tmp) / "origin.bin"
        sha = hashlib.sha256()
        with src.open("wb") as fh:
            for _ in range(args.size_mib):
                block = os.urandom(MiB)
                sha.update(block)
                fh.write(block)
        port = _free_port()
        origin = subprocess.Popen([sys.executable, "-c", ORIGIN, str(src), str(port)])
        try:
            url = f"http://127.0.0.1:{port}/file"
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            grid = [(int(p), int(c)) for p in args.parts.split(",") for c in args.concurrency.split(",")]
            results = []
            for _ in range(args.rounds):
                for part_mib, conc in grid:
                    row = await _one(url, Path(tmp) / "out.bin", size, sha.hexdigest(), part_mib, conc, args.durable)
                    print(json.dumps(row), flush=True)
                    results.append(row)
        finally:
            origin.terminate()
            origin.wait(10)
    out = ROOT / "bench" / "results" / "ranged.json"
    out.write_text(json.dumps({"size_mib": args.size_mib, "durable": args.durable, "runs": results}, indent=1))
    print("\npart MiB | conc | GB/s (runs) | CPU-s/GB")
    for part_mib, conc in grid:
        rows = [r for r in results if r["part_mib"] == part_mib and r["concurrency"] == conc]
        speeds = " / ".join(str(r["gb_s"]) for r in rows)
        cpus = " / ".join(str(r["cpu_s_per_gb"]) for r in rows)
        print(f"{part_mib:8} | {conc:4} | {speeds} | {cpus}")


if __name__ == "__main__":
    asyncio.run(main())
