"""What serving a Ready file to peers costs this node: CPU-seconds per GB sent by the peer server.

Reproduce: ``flock /tmp/heavy.lock nice .venv/bin/python -m bench.peer_serve`` (defaults: one 1 GiB random file
in ``/dev/shm``, 3 rounds of each variant interleaved, median reported). Each run is a fresh child process
(``python -m bench.peer_serve child ...``) that starts one :class:`~model_agent.peers.server.PeerServer` on
loopback with the file recorded Ready in a manifest, lets ``curl`` take it, and reports its own CPU (the server's:
``RUSAGE_SELF``; curl is its child and counted apart) around the transfers only. Variants:

* ``whole``: one ``curl`` takes the whole file;
* ``parts``: eight ``curl`` at once each take an eighth by ``Range`` (as a fetching peer's engine asks);
* ``capped``: ``whole`` with the upload cap at 256 MiB/s (``--peer-upload-rate``: the token bucket and the kernel's
  pacing in play).

TokenReviews are answered by a fake of the API server's endpoint (``ReviewAnswerer``: every token is the agent's;
the real one runs in the e2e tests): one review per run, cached by the server, not what is measured. ``--src A
--src B`` compares source trees (e.g. a checkout of the commit before a change; variant names end in ``@0``,
``@1``). Writes ``bench/results/peer_serve.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
GB = 1e9
AUDIENCE = "model-agent-peer"
AGENT = "system:serviceaccount:bench:model-agent"
CAPPED_RATE = 256 * MiB
VARIANTS = ("whole", "parts", "capped")


class ReviewAnswerer:
    """A fake of the API server's TokenReview endpoint: every token is the agent's, for the peer audience."""

    async def request(self, method: str, path: str, **_kw: Any) -> dict[str, Any]:
        assert method == "POST" and path.endswith("/tokenreviews")
        return {"status": {"authenticated": True, "user": {"username": AGENT}, "audiences": [AUDIENCE]}}


def _curl(url: str, byte_range: str | None) -> subprocess.Popen[bytes]:
    cmd = ["curl", "-sS", "--fail", "-o", "/dev/null", "-H", "Authorization: Bearer bench", url]
    if byte_range:
        cmd += ["-r", byte_range]
    return subprocess.Popen(cmd)


def child(path: Path, sha: str, variant: str, src: Path) -> dict[str, Any]:
    sys.path.insert(0, str(src))  # the tree this child measures
    from model_agent.local.manifest import FileRecord, Manifest
    from model_agent.peers.auth import TokenReviewer
    from model_agent.peers.server import BlobIndex, PeerServer

    size = path.stat().st_size
    record = FileRecord(path.name, size, sha, None, path.stat().st_mtime_ns)
    manifest = Manifest(key="k", uid="u", storage_uri="hf://bench/m", dest=str(path.parent), files=[record])

    async def run() -> dict[str, Any]:
        server = PeerServer(
            BlobIndex(lambda: [manifest], lambda: [path.parent.parent]),
            TokenReviewer(ReviewAnswerer(), AUDIENCE, AGENT),  # type: ignore[arg-type]
            host="127.0.0.1",
            port=0,
            upload_rate=CAPPED_RATE if variant == "capped" else 0,
            max_per_peer=16,
        )
        await server.start()
        url = f"http://127.0.0.1:{server.port}/blobs/sha256/{sha}"
        try:
            if variant == "parts":
                step = -(-size // 8)
                ranges: list[str | None] = [f"{a}-{min(a + step, size) - 1}" for a in range(0, size, step)]
            else:
                ranges = [None]
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            curls = [_curl(url, r) for r in ranges]
            codes = [await asyncio.to_thread(c.wait) for c in curls]
            wall = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        finally:
            await server.stop()
        assert codes == [0] * len(codes), codes
        assert server.uploaded == size, (server.uploaded, size)
        return {
            "wall_s": wall,
            "server_cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
            "client_cpu_s": (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime),
            "bytes": size,
        }

    return asyncio.run(run())


def _row(run: dict[str, Any]) -> dict[str, float]:
    gb = run["bytes"] / GB
    return {
        "GB/s": gb / run["wall_s"],
        "server cpu/GB": run["server_cpu_s"] / gb,
        "curl cpu/GB": run["client_cpu_s"] / gb,
    }


def main() -> None:
    from bench.ranged import write_random_file

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--src", type=Path, action="append", help="source tree(s) to compare (default: this one's src)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "peer_serve.json")
    args = ap.parse_args()
    trees = [p.resolve() for p in args.src or [ROOT / "src"]]
    variants = [f"{v}@{i}" if len(trees) > 1 else v for v in args.variants.split(",") for i in range(len(trees))]
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    load_before = Path("/proc/loadavg").read_text().strip()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        model = Path(root) / "m"
        model.mkdir()
        path = model / "w.bin"
        sha = write_random_file(path, args.size_mib)
        for _ in range(args.rounds):
            for variant in variants:
                mode, _, tree = variant.partition("@")
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.peer_serve",
                        "child",
                        str(path),
                        sha,
                        mode,
                        str(trees[int(tree or 0)]),
                    ],
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                    text=True,
                )
                run = json.loads(out.stdout.strip().splitlines()[-1])
                results[variant].append(run)
                print(variant, json.dumps({k: round(v, 3) for k, v in _row(run).items()}), flush=True)
    load_after = Path("/proc/loadavg").read_text().strip()
    print(f"loadavg before: {load_before}  after: {load_after}")
    summary = {}
    for variant, runs in results.items():
        rows = [_row(r) for r in runs]
        summary[variant] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"{variant:12s}", "  ".join(f"{k} {v:.3f}" for k, v in summary[variant].items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"trees": [str(t) for t in trees], "load": [load_before, load_after], "summary": summary, "runs": results},
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        print(json.dumps(child(Path(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5]))))
    else:
        main()
