"""The two data paths considered for ``gs://`` / ``az://``, side by side against the local emulators.

Reproduce: ``.venv/bin/python -m bench.cloud [--size-mib 256] [--rounds 2] [--dest /dev/shm] [--part-mib 16]
[--concurrency 8]``.
One random object is uploaded to fake-gcs-server and to Azurite; each round fetches it with

* ``engine``: :class:`model_agent.sources.cloud.CloudSource` (obstore lists and signs, the ranged engine
  moves the bytes: parallel ranges, part map, sha256 and MD5 beside the transfer), and
* ``obstore-get``: ``obstore.get_async`` streamed into a file with sha256 (what a source without the engine
  would do: no parallel ranges, no part map, no resume),

and prints one JSON line per run (path, store, seconds, MB/s, client CPU-s) plus the peak RSS; results go to
``bench/results/cloud.json``. The emulators are the bottleneck (Azurite is Node, fake-gcs-server keeps
objects in memory and copies them per request), so this compares the paths' overheads against the same
origin, not real-cloud throughput; measure throughput against nginx (``bench/ranged.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from model_agent.sources.base import FetchRequest
from model_agent.sources.cloud import CloudSource, settings_for
from model_agent.transfer import RangedConfig
from testbed.servers import azurite as az
from testbed.servers import fakegcs

ROOT = Path(__file__).resolve().parents[1]

MiB = 1024 * 1024


ENGINE = RangedConfig()


async def engine_fetch(uri: str, endpoint: str, secret: dict[str, str], dest: Path) -> str:
    request = FetchRequest(
        storage_uri=uri,
        dest=dest / "model",
        staging=dest / "staging",
        previous=None,
        parameters={"endpoint": endpoint},
        secret=secret,
    )
    result = await CloudSource(ranged=ENGINE).fetch(request)
    sha256 = result.files[0].sha256
    assert sha256 is not None  # the engine hashes every file it fetches
    return sha256


async def obstore_get(uri: str, endpoint: str, secret: dict[str, str], dest: Path) -> str:
    import obstore

    request = FetchRequest(
        storage_uri=uri, dest=dest, staging=dest, previous=None, parameters={"endpoint": endpoint}, secret=secret
    )
    settings = settings_for(request)
    store = CloudSource().store(settings)
    sha = hashlib.sha256()
    result = await obstore.get_async(store, settings.prefix + "blob.bin")
    with (dest / "blob.bin").open("wb") as fh:
        async for chunk in result.stream(min_chunk_size=4 * MiB):
            data = memoryview(chunk)
            sha.update(data)
            fh.write(data)
    return sha.hexdigest()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dest", default="/dev/shm")
    parser.add_argument("--part-mib", type=int, default=16, help="engine part size")
    parser.add_argument("--concurrency", type=int, default=8, help="engine ranges in flight")
    args = parser.parse_args()
    global ENGINE
    ENGINE = RangedConfig(part_size=args.part_mib * MiB, concurrency=args.concurrency)
    data = os.urandom(args.size_mib * MiB)
    want = hashlib.sha256(data).hexdigest()
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as state,
        fakegcs.FakeGcsServer(Path(state) / "gcs") as gcs,
        az.AzuriteServer(Path(state) / "az") as azurite,
    ):
        fakegcs.create_bucket(gcs.endpoint, "bench")
        fakegcs.upload_objects(gcs.endpoint, "bench", {"m/blob.bin": data})
        az.create_container(azurite.endpoint, "bench")
        az.upload_blobs(azurite.endpoint, "bench", {"m/blob.bin": data})
        stores = {
            "fake-gcs-server": ("gs://bench/m", gcs.endpoint, {"serviceAccountKey": fakegcs.service_account_key()}),
            "azurite": (f"az://{az.ACCOUNT}/bench/m", azurite.endpoint, {"accountKey": az.ACCOUNT_KEY}),
        }
        for _ in range(args.rounds):
            for store, (uri, endpoint, secret) in stores.items():
                for name, path in (("engine", engine_fetch), ("obstore-get", obstore_get)):
                    with tempfile.TemporaryDirectory(dir=args.dest) as dest:
                        r0 = resource.getrusage(resource.RUSAGE_SELF)
                        t0 = time.perf_counter()
                        got = await path(uri, endpoint, secret, Path(dest))
                        seconds = time.perf_counter() - t0
                        r1 = resource.getrusage(resource.RUSAGE_SELF)
                    assert got == want, (name, store)
                    run = {
                        "path": name if name != "engine" else f"engine {args.part_mib}MiBx{args.concurrency}",
                        "store": store,
                        "size_mib": args.size_mib,
                        "seconds": round(seconds, 2),
                        "mb_per_s": round(len(data) / seconds / 1e6, 1),
                        "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2),
                    }
                    runs.append(run)
                    print(json.dumps(run), flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"peak RSS of the client process: {peak} MiB (includes the {args.size_mib} MiB object held to upload)")
    out = ROOT / "bench" / "results" / "cloud.json"
    out.write_text(json.dumps({"runs": runs, "peak_rss_mib": peak}, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
