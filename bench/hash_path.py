"""Where the CPU of one verified download goes: receive, write, hash, event loop.

Reproduce: ``flock /tmp/heavy.lock nice .venv/bin/python -m bench.hash_path`` (defaults: one 1 GiB random
file, nginx on loopback as the origin (``bench.ranged.start_nginx``: sendfile, one worker), destination
``/dev/shm``, 3 rounds of each variant interleaved, median reported). Variants: ``verified`` (the engine as the
agent runs it, sha256 checked) and ``nohash`` (every hashing entry point of ``model_agent.transfer.hashing``
replaced by a no-op: the transfer alone); a ``-copy`` suffix (``verified-copy``, ``nohash-copy``) turns the
zero-copy receive off (``RangedConfig(splice=False)``: every body read into the slot's buffer). Each run is a fresh child process (``python -m bench.hash_path
child ...``) that times itself around the download only.

The split comes from the child itself: ``write`` and ``hash`` are the thread CPU time (``time.thread_time``)
spent inside the engine's file-write calls (``splice.write_from_pipe``, ``job._pwrite_all``) and its hash
calls (every public ``hash_*`` function of ``transfer.hashing``), ``loop`` is the main thread's CPU (from
``/proc/self/task``), ``receive`` is the rest of the process's CPU (socket reads/splices, HTTP, the part map).
``origin`` is nginx's CPU over the run, for context (it shares the same two cores). The load average at the
start and end is printed: other work may share the machine. ``--src A --src B`` compares source trees (e.g. a
checkout of the commit before a change): variant names then end in ``@0``, ``@1``, in that order. Writes ``bench/results/hash_path.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
GB = 1e9
CLK = os.sysconf("SC_CLK_TCK")


def _thread_cpu(native_id: int) -> float:
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime, stime (fields 14 and 15 of stat)


def _timed(fn: Callable[..., Any], totals: dict[str, float], key: str, lock: threading.Lock) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.thread_time() - t0
            with lock:
                totals[key] += spent

    return wrapper


def child(url: str, dest: Path, size: int, sha: str, variant: str, src: Path) -> dict[str, Any]:
    # --src: the A/B feature (as bench/ranged.py's): this child measures the engine of the tree it is given
    sys.path.insert(0, str(src))
    from model_agent.transfer import Expected, RangedConfig, RangedDownloader, hashing, job, splice

    totals = {"write": 0.0, "hash": 0.0}
    lock = threading.Lock()
    for name in [n for n in dir(hashing) if n.startswith("hash_") and callable(getattr(hashing, n))]:
        fn = (lambda *_a, **_k: None) if variant.startswith("nohash") else getattr(hashing, name)
        setattr(hashing, name, _timed(fn, totals, "hash", lock))
    splice.write_from_pipe = _timed(splice.write_from_pipe, totals, "write", lock)
    job._pwrite_all = _timed(job._pwrite_all, totals, "write", lock)
    checksums = {} if variant.startswith("nohash") else {"sha256": sha}
    config = RangedConfig(splice=not variant.endswith("-copy"))
    main_id = threading.get_native_id()

    async def run() -> dict[str, Any]:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        loop0 = _thread_cpu(main_id)
        t0 = time.perf_counter()
        async with RangedDownloader(config=config) as dl:
            got = await dl.download(url, dest, Expected(size, checksums))
            wall = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            loop_s = _thread_cpu(main_id) - loop0
        if not variant.startswith("nohash"):
            assert got.digests["sha256"] == sha
        user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
        rest = user + sys_ - totals["write"] - totals["hash"] - loop_s
        return {
            "wall_s": wall,
            "user_s": user,
            "sys_s": sys_,
            "write_s": totals["write"],
            "hash_s": totals["hash"],
            "loop_s": loop_s,
            "receive_s": rest,
            "maxrss_mib": r1.ru_maxrss / 1024,
        }

    return asyncio.run(run())


def _nginx_cpu(master_pid: int) -> float:
    total = 0.0
    for pid in [master_pid, *_children(master_pid)]:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / CLK
    return total


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _row(run: dict[str, Any], size: int) -> dict[str, float]:
    gb = size / GB
    cpu = run["user_s"] + run["sys_s"]
    return {
        "GB/s": gb / run["wall_s"],
        "cpu/GB": cpu / gb,
        "receive/GB": run["receive_s"] / gb,
        "write/GB": run["write_s"] / gb,
        "hash/GB": run["hash_s"] / gb,
        "loop/GB": run["loop_s"] / gb,
        "origin/GB": run["origin_s"] / gb,
        "rss_mib": run["maxrss_mib"],
    }


def main() -> None:
    from bench.ranged import start_nginx, write_random_file

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="verified,nohash")
    ap.add_argument("--src", type=Path, action="append", help="source tree(s) to compare (default: this one's src)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hash_path.json")
    args = ap.parse_args()
    size = args.size_mib * MiB
    trees = [p.resolve() for p in args.src or [ROOT / "src"]]
    variants = [f"{v}@{i}" if len(trees) > 1 else v for v in args.variants.split(",") for i in range(len(trees))]
    with tempfile.TemporaryDirectory(dir="/dev/shm") as origin_dir, tempfile.TemporaryDirectory() as prefix:
        root = Path(origin_dir) / "root"
        root.mkdir()
        sha = write_random_file(root / "f.bin", args.size_mib)
        nginx, port, _count_port = start_nginx(root, Path(prefix))
        url = f"http://127.0.0.1:{port}/f.bin"
        dest = Path(origin_dir) / "dest.bin"
        load_before = Path("/proc/loadavg").read_text().strip()
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        try:
            for _ in range(args.rounds):
                for variant in variants:
                    dest.unlink(missing_ok=True)
                    Path(f"{dest}.parts.json").unlink(missing_ok=True)
                    origin0 = _nginx_cpu(nginx.pid)
                    mode, _, tree = variant.partition("@")
                    src = trees[int(tree or 0)]
                    out = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "bench.hash_path",
                            "child",
                            url,
                            str(dest),
                            str(size),
                            sha,
                            mode,
                            str(src),
                        ],
                        cwd=ROOT,
                        check=True,
                        capture_output=True,
                        text=True,
                    )
                    run = json.loads(out.stdout.strip().splitlines()[-1])
                    run["origin_s"] = _nginx_cpu(nginx.pid) - origin0
                    results[variant].append(run)
                    print(variant, json.dumps({k: round(v, 3) for k, v in _row(run, size).items()}), flush=True)
        finally:
            nginx.terminate()
            nginx.wait()
            dest.unlink(missing_ok=True)
            Path(f"{dest}.parts.json").unlink(missing_ok=True)
    load_after = Path("/proc/loadavg").read_text().strip()
    summary = {}
    print(f"loadavg before: {load_before}  after: {load_after}")
    for variant, runs in results.items():
        rows = [_row(r, size) for r in runs]
        summary[variant] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"median {variant:9s} " + "  ".join(f"{k} {v:.3f}" for k, v in summary[variant].items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"size": size, "loadavg": [load_before, load_after], "runs": results, "median": summary}, indent=1)
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        url_, dest_, size_, sha_, variant_, src_ = sys.argv[2:8]
        print(json.dumps(child(url_, Path(dest_), int(size_), sha_, variant_, Path(src_))))
    else:
        main()
