"""W3 through the agent's own sources: a node's first model from an endpoint against its next ones.

Reproduce: ``flock /tmp/heavy.lock .venv/bin/python -m bench.w3_phases`` (the download benchmark's W3 files, 20 of
1-500 KiB, from its nginx origin on loopback to ``/dev/shm``). Two shapes:

* default: ``--processes`` fresh processes per face, each warmed as ``bench.agent_fetch`` warms it (a running
  agent's imports and botocore's service model; no client for this endpoint), then ``--fetches`` fetches of W3 in
  a row, each with its own ``asyncio.run`` like the agent's per-model work. The S3 face's source (and so its client
  for the endpoint) is kept, as the agent keeps one; the Hub face's HTTP client is process-wide in
  huggingface_hub. Between fetches every kept client's connections are closed, as an idle agent's would be by the
  time its next model arrives. Printed: per fetch in the row, the median of the S3 client, the listing, the Hub
  resolve and the whole fetch (ms).
* ``--loop N``: one process per face, N fetches after a first untimed one, the median printed: the in-process
  comparison of two trees (run each through ``PYTHONPATH=<tree>/src:<tree>``, alternating).

What it showed (docs/performance.md section 5.3, 2026-12-06): the first model from an endpoint costs 8-10 ms more
than the next; a running agent keeps its clients, so that is paid once per endpoint and credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from bench.download_data import generate, warm
from bench.download_origin import NginxOrigin

WORK = Path.home() / ".cache" / "model-agent-bench"
FACES = ("s3", "hf")

# The child: warmed as agent_fetch warms, then fetches timed phase by phase. A script (not a function) so that each
# process starts cold, as bench.agent_fetch's do.
_CHILD = r"""
import asyncio, json, shutil, sys, time
from pathlib import Path
import bench.agent_fetch as af

face, url, fetches, shm = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
af._warm_process(face, url)
source = None
rows = []

def timed(obj, name, row):
    original = getattr(obj, name)
    def wrapper(*args, **kwargs):
        started = time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            row[name.strip("_")] = round((time.monotonic() - started) * 1000, 2)
    setattr(obj, name, wrapper)
    return original

for i in range(fetches):
    dest = shm / f"w3-{i}"
    row = {}
    if face == "s3":
        source = af._S3_SOURCE
        params = {"endpoint": url, "anonymous": "true", "addressingStyle": "path", "region": "us-east-1"}
        request = af._request("s3://w3", dest, params)
        kept = [timed(source, "client", row), timed(source, "list_objects", row)]
    else:
        from model_agent.sources.hf import HuggingFaceSource
        source = HuggingFaceSource(url)
        request = af._request("hf://bench/w3", dest, {})
        timed(source, "_resolve", row)  # (a new source each fetch: nothing to undo)

    async def fetch():
        started = time.monotonic()
        await source.fetch(request)
        row["fetch"] = round((time.monotonic() - started) * 1000, 2)

    asyncio.run(fetch())
    rows.append(row)
    if face == "s3":  # the kept source: undo the wrappers, close the connections its clients hold
        source.client, source.list_objects = kept
        for client in source._clients.values():
            client.close()
    else:
        import huggingface_hub
        pool = getattr(getattr(huggingface_hub.get_session(), "_transport", None), "_pool", None)
        if pool is not None:  # httpx's pool: close its idle connections, keep the client
            for connection in list(pool.connections):
                connection.close()
    shutil.rmtree(dest.parent / f".staging-{dest.name}", ignore_errors=True)
    shutil.rmtree(dest, ignore_errors=True)
print(json.dumps(rows))
"""


def _child(face: str, url: str, fetches: int, shm: Path) -> list[dict[str, float]]:
    env = {
        **os.environ,
        "HF_HOME": str(shm / "hf-home"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, face, url, str(fetches), str(shm)], env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    rows: list[dict[str, float]] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=15)
    ap.add_argument("--fetches", type=int, default=3)
    ap.add_argument("--loop", type=int, default=0, help="one process per face, this many timed fetches")
    ap.add_argument("--faces", default=",".join(FACES))
    args = ap.parse_args()
    data = generate(WORK, big_mib=32, shard_mib=16, shards=1)
    warm(data)
    shm = Path("/dev/shm") / f"model-agent-w3-phases-{os.getpid()}"
    shm.mkdir(parents=True)
    try:
        with NginxOrigin(data, WORK) as origin:
            for face in args.faces.split(","):
                if args.loop:
                    rows = _child(face, origin.url, args.loop + 1, shm)[1:]
                    print(face, "median fetch ms over", args.loop, statistics.median(r["fetch"] for r in rows))
                    continue
                runs = [_child(face, origin.url, args.fetches, shm) for _ in range(args.processes)]
                for i in range(args.fetches):
                    keys = runs[0][i].keys()
                    medians = {k: statistics.median(run[i].get(k, 0.0) for run in runs) for k in keys}
                    print(face, f"fetch {i + 1}", json.dumps(medians))
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
