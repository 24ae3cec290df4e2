"""The agent as a benchmark peer: fetch a model through the project's own source classes, as the agent does.

Role: one process per benchmark run, like every other peer. Modes:

* ``s3``: :class:`model_agent.sources.s3.S3Source` on ``s3://<bucket>`` with the parameters a BaseModel
  would carry (``endpoint``, ``anonymous: "true"``, ``addressingStyle: path``, ``region``), then the
  shared :func:`~model_agent.sources.base.publish` into ``--dest`` — the same ``FetchRequest`` shape as
  ``agent/reconciler.py`` builds (staging beside the destination, ``previous=None`` for a first fetch).
* ``hf``: :class:`model_agent.sources.hf.HuggingFaceSource` with the Hub endpoint on ``hf://<repo>``, then
  ``publish``. ``HF_HUB_DISABLE_XET=1`` is set before huggingface_hub is imported.
* ``ranged``: the raw engine :class:`model_agent.transfer.RangedDownloader` on plain HTTP URLs
  (``--base-url``/``<file>``), through its public API only (``RangedDownloader(session, config)``,
  ``RangedConfig``, ``Expected``, ``download()``), so a rewritten engine is picked up as is. Each file is
  downloaded into ``<dest>/.staging/`` with its sha256 as the expected checksum and renamed into ``--dest``
  once verified; up to 8 files at once (the S3 source's default), one engine (its slot pool is shared).

``--no-hash`` (``ranged`` only, a measurement aid, never how the agent runs): the engine's hashing is
replaced by a no-op, so the run measures the transfer alone (the CPU target "transfer alone <= 1.0 CPU-s/GB");
files are then published unverified.

A rerun with the same ``--dest`` resumes from the part maps left in staging (W4). With ``--idle`` the
process imports and builds everything a fetch needs, then exits without a transfer: its peak RSS is the
"idle" baseline of the memory target. Exit status: 0 fetched and verified, 3 ``VerificationFailed``,
2 any other source error. One JSON line on stdout says what happened, with ``fetch_user_s`` /
``fetch_sys_s``: this process's CPU from just before the fetch to its end (interpreter start-up and imports
excluded: a running agent pays those once, not per download). Also excluded, for the same reason, is the
once-per-process state a running agent has after its first model of the kind (:func:`_warm_process`):
huggingface_hub's HTTP client (about 25-40 ms to make) and botocore's S3 service model, loaded by one client
of the same ``S3Source`` for another endpoint (about 80-100 ms), and its first request (a listing of another
bucket, about 10 ms); the fetch still makes its own S3 client (about 4 ms) and connections. Per-model state (the resolve, the listing, the client for this endpoint) is never warmed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from model_agent.sources.base import FILES_AT_ONCE, FetchRequest, SourceError, publish

# Each mode imports only what the agent would load for that source (the agent imports sources lazily too),
# so start-up cost and idle memory are not inflated by the other sources' libraries.


def _request(uri: str, dest: Path, parameters: dict[str, str]) -> FetchRequest:
    return FetchRequest(
        storage_uri=uri, dest=dest, staging=dest.parent / f".staging-{dest.name}", previous=None, parameters=parameters
    )


async def fetch_s3(args: argparse.Namespace) -> int:
    from model_agent.sources.s3 import S3Source, settings_for

    params = {"endpoint": args.endpoint, "anonymous": "true", "addressingStyle": "path", "region": "us-east-1"}
    request = _request(f"s3://{args.bucket}", args.dest, params)
    source = _S3_SOURCE or S3Source()
    if args.idle:
        source.client(settings_for(request))  # boto3 imported and a client built, as before a first LIST
        return 0
    result = await source.fetch(request)
    files = await asyncio.to_thread(publish, request, result)
    return len(files)


async def fetch_hf(args: argparse.Namespace) -> int:
    from model_agent.sources.hf import HuggingFaceSource

    request = _request(f"hf://{args.repo}", args.dest, {})
    source = HuggingFaceSource(args.endpoint)
    if args.idle:
        return 0
    result = await source.fetch(request)
    files = await asyncio.to_thread(publish, request, result)
    return len(files)


async def fetch_ranged(args: argparse.Namespace) -> int:
    from model_agent.transfer import Expected, RangedConfig, RangedDownloader, hashing

    listing = json.loads(Path(args.listing).read_text())
    staging = args.dest / ".staging"
    if args.no_hash:
        # the transfer alone (see above): both ways the engine feeds its hashers, read back and from the buffer
        hashing.hash_mapped = lambda *_a: None
        hashing.hash_buffer = lambda *_a: None
    async with RangedDownloader(config=RangedConfig()) as engine:
        if args.idle:
            return 0
        staging.mkdir(parents=True, exist_ok=True)  # inside dest, which is created too
        gate = asyncio.Semaphore(FILES_AT_ONCE)  # as the sources

        async def one(entry: dict[str, object]) -> None:
            path = str(entry["path"])
            async with gate:
                await engine.download(
                    f"{args.base_url}/{path}",
                    staging / path,
                    Expected(
                        size=int(str(entry["size"])),
                        checksums={} if args.no_hash else {"sha256": str(entry["sha256"])},
                    ),
                    label=path,
                )
            os.replace(staging / path, args.dest / path)

        await asyncio.gather(*(one(e) for e in listing))
    shutil.rmtree(staging)  # the completed part maps
    return len(listing)


_S3_SOURCE: Any = None  # the S3 source of the process, made by _warm_process (as the agent has one)


def _warm_process(mode: str, endpoint: str = "") -> None:
    """What a running agent has before a download of this kind: the libraries the fetch imports lazily, and the
    process-wide state its first model of the kind made (see the module docstring); nothing of this model."""
    import importlib

    global _S3_SOURCE
    names = {
        "s3": ["model_agent.sources.s3", "boto3", "botocore.client"],
        "hf": ["model_agent.sources.hf", "huggingface_hub", "huggingface_hub.hf_api", "huggingface_hub.file_download"],
        "ranged": ["model_agent.transfer"],
    }[mode]
    for name in names:
        importlib.import_module(name)
    if mode == "s3":
        from model_agent.sources.s3 import S3Source, settings_for

        _S3_SOURCE = S3Source()
        # An earlier model: another bucket, listed through a client of its own (the same origin under another
        # name, so neither the client nor its connections are the ones the fetch uses). Its first request loads
        # what botocore loads once per process (paginators, parsers, endpoint rules: about 10 ms).
        other = endpoint.replace("127.0.0.1", "localhost") if "127.0.0.1" in endpoint else None
        params = {"endpoint": other or "http://127.0.0.1:9", "anonymous": "true", "addressingStyle": "path"}
        earlier = settings_for(_request("s3://w1", Path("/nonexistent"), {**params, "region": "us-east-1"}))
        client = _S3_SOURCE.client(earlier)
        if other is not None:
            _S3_SOURCE.list_objects(client, earlier)
    elif mode == "hf":
        from huggingface_hub import get_session

        get_session()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["s3", "hf", "ranged"])
    ap.add_argument("--dest", type=Path, required=True)
    ap.add_argument("--endpoint", help="S3 endpoint URL (s3) or Hub endpoint URL (hf)")
    ap.add_argument("--bucket", help="s3: the bucket (the whole bucket is fetched)")
    ap.add_argument("--repo", help="hf: the repository id")
    ap.add_argument("--base-url", help="ranged: URL prefix of the files")
    ap.add_argument("--listing", help="ranged: JSON list of {path, size, sha256}")
    ap.add_argument("--idle", action="store_true", help="set up everything, transfer nothing (memory baseline)")
    ap.add_argument("--no-hash", action="store_true", help="ranged: skip hashing (measures the transfer alone)")
    args = ap.parse_args()
    args.dest = args.dest.resolve()
    run = {"s3": fetch_s3, "hf": fetch_hf, "ranged": fetch_ranged}[args.mode]
    _warm_process(args.mode, args.endpoint or "")  # a running agent has these: the timed fetch below excludes them
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    try:
        count = asyncio.run(run(args))
    except SourceError as exc:
        print(json.dumps({"ok": False, "reason": exc.reason, "message": exc.message[:300]}))
        return 3 if exc.reason == "VerificationFailed" else 2
    after = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.monotonic() - started
    print(
        json.dumps(
            {
                "ok": True,
                "files": count,
                "maxrss_mib": round(after.ru_maxrss / 1024, 1),
                "fetch_user_s": round(after.ru_utime - before.ru_utime, 3),
                "fetch_sys_s": round(after.ru_stime - before.ru_stime, 3),
                # the fetch alone, as a running agent pays it (interpreter start-up and imports excluded)
                "fetch_wall_s": round(wall, 4),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
