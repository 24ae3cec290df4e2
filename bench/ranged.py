"""Loopback benchmark of the ranged download engine against nginx: throughput, CPU and memory per configuration.

Reproduce: ``.venv/bin/python -m bench.ranged`` (defaults: 2 GiB file, 3 rounds, tmpfs and disk, the grid
below). Needs ``nginx`` (Debian ``nginx-light``); it is started as a child on a free loopback port with
``sendfile on; access_log off; worker_processes 1;`` and a prefix directory in a temporary directory, serving
one random file warmed into the page cache. Each run is a fresh child process that downloads the file with
:class:`model_agent.transfer.RangedDownloader` (sha256 inline, default ``durable`` i.e. fdatasync before
each part is recorded and fsync at the end) and reports its own ``getrusage`` around the download: CPU is
the client's user+sys only (nginx excluded), ``idle_rss_mib`` is the child's RSS before the download and
``maxrss_mib`` its peak. Destinations: ``shm`` (``/dev/shm``: network and CPU only) and ``disk`` (a directory
on the root filesystem: end to end, with fsync). Rounds are interleaved (round-robin over the grid) and the
summary gives median and min-max per configuration, plus ``uptime`` load (other work shares the 2 cores).

Ceilings are measured at the start: ``dd ... conv=fsync`` of the same size to the disk destination, and
``curl`` from the same nginx to ``/dev/null`` (one stream). ``--resume`` adds the kill test: a child is
SIGKILLed at 50 % and a second child resumes; the bytes served for the file are counted by a second nginx
server (same files) that logs ``$body_bytes_sent``, and the refetched bytes are reported.
Writes ``bench/results/ranged.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024

# One download in a child process; prints one JSON line with its own measurements.
CHILD = r"""
import asyncio, json, os, resource, sys, time
from pathlib import Path
# --src: measure the model_agent of another checkout (an older tree, for the A/B rows of RANGED_HISTORY.md);
# first on the path, so it wins over the installed one.
sys.path.insert(0, sys.argv[1])
from model_agent.transfer import Expected, RangedConfig, RangedDownloader

url, dest, size, sha = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
part, conc, buf, durable = int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), sys.argv[9] == "1"
progress = sys.argv[10] == "1"
if sys.argv[11] == "release-at-completion":  # A/B only: the pre-change slot release (resume bound not kept)
    from model_agent.transfer import job
    async def _not_waiting(self, i):
        return None
    job.Job._recorded = _not_waiting

def rss_mib():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

async def main():
    cfg = RangedConfig(part_size=part, concurrency=conc, write_buffer=buf, durable=durable)
    written = 0
    def on_bytes(n):
        nonlocal written
        written += n
        if progress:
            print(written, flush=True)
    idle = rss_mib()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if hasattr(RangedDownloader, "__aenter__"):
        async with RangedDownloader(None, cfg) as dl:
            got = await dl.download(url, dest, Expected(size, {"sha256": sha}), on_bytes=on_bytes)
    else:  # the engine before the threaded transport (--src of an older tree) needs an aiohttp session
        import aiohttp
        async with aiohttp.ClientSession() as session:
            got = await RangedDownloader(session, cfg).download(url, dest, Expected(size, {"sha256": sha}), on_bytes=on_bytes)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    assert got.digests["sha256"] == sha
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "idle_rss_mib": idle, "maxrss_mib": r1.ru_maxrss / 1024,
                      "fetched": got.fetched_bytes, "resumed": got.resumed_bytes}), flush=True)

asyncio.run(main())
"""

NGINX_CONF = """
worker_processes 1;
daemon off;
{user}
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 256; }}
http {{
    sendfile on;
    tcp_nopush on;
    access_log off;
    keepalive_requests 100000;
    client_body_temp_path {prefix}/tmp;
    proxy_temp_path {prefix}/tmp;
    fastcgi_temp_path {prefix}/tmp;
    uwsgi_temp_path {prefix}/tmp;
    scgi_temp_path {prefix}/tmp;
    log_format sent '$body_bytes_sent';
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
    server {{
        listen 127.0.0.1:{count_port};
        root {root};
        access_log {prefix}/sent.log sent;
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nginx did not listen on {port}")


def write_random_file(path: Path, size_mib: int) -> str:
    """Fill ``path`` with ``size_mib`` MiB of random bytes, a MiB at a time (the writer stays small: children
    inherit its peak RSS); their sha256."""
    sha = hashlib.sha256()
    with path.open("wb") as fh:
        for _ in range(size_mib):
            block = os.urandom(MiB)
            sha.update(block)
            fh.write(block)
    return sha.hexdigest()


def start_nginx(root: Path, prefix: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    port, count_port = _free_port(), _free_port()
    # As root, nginx workers would switch to "nobody", who cannot read a private temporary directory.
    user = f"user {pwd.getpwuid(os.getuid()).pw_name};" if os.geteuid() == 0 else ""
    conf = prefix / "nginx.conf"
    conf.write_text(NGINX_CONF.format(user=user, prefix=prefix, port=port, count_port=count_port, root=root))
    proc = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(conf)])
    _wait_port(port)
    _wait_port(count_port)
    return proc, port, count_port


def run_child(
    src: Path,
    url: str,
    dest: Path,
    size: int,
    sha: str,
    part: int,
    conc: int,
    buf: int,
    durable: bool,
    variant: str = "default",
) -> dict[str, Any]:
    dest.unlink(missing_ok=True)
    Path(f"{dest}.parts.json").unlink(missing_ok=True)
    args = [sys.executable, "-c", CHILD, str(src), url, str(dest), str(size), sha, str(part), str(conc), str(buf)]
    out = subprocess.run(
        [*args, "1" if durable else "0", "0", variant],
        check=True,
        capture_output=True,
        text=True,
    )
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    dest.unlink(missing_ok=True)
    Path(f"{dest}.parts.json").unlink(missing_ok=True)
    return row


def measure_resume(
    src: Path, url: str, dest: Path, size: int, sha: str, part: int, conc: int, buf: int, log: Path
) -> dict[str, Any]:
    """SIGKILL a child at 50 %, resume in a second child; bytes served counted from nginx's log."""
    dest.unlink(missing_ok=True)
    Path(f"{dest}.parts.json").unlink(missing_ok=True)
    log.write_text("")
    args = [sys.executable, "-c", CHILD, str(src), url, str(dest), str(size), sha, str(part), str(conc), str(buf)]
    child = subprocess.Popen([*args, "1", "1", "default"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    for line in child.stdout:
        if line.strip().isdigit() and int(line) >= size // 2:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    time.sleep(0.5)  # nginx writes the log line when it notices the closed connection
    first = sum(int(x) for x in log.read_text().split())
    out = subprocess.run([*args, "1", "0", "default"], check=True, capture_output=True, text=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    time.sleep(0.2)
    total = sum(int(x) for x in log.read_text().split())
    dest.unlink(missing_ok=True)
    Path(f"{dest}.parts.json").unlink(missing_ok=True)
    return {
        "part_mib": part / MiB,
        "concurrency": conc,
        "first_run_bytes": first,
        "resumed_bytes": row["resumed"],
        "refetched_bytes": total - size,
        "bound_bytes": conc * part,
    }


def ceilings(dest_disk: Path, size: int, port: int) -> dict[str, float]:
    probe = dest_disk / "dd.bin"
    t0 = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={probe}", "bs=16M", f"count={size // (16 * MiB)}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    disk = size / (time.perf_counter() - t0) / 1e9
    probe.unlink()
    t0 = time.perf_counter()
    subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/origin.bin"], check=True)
    curl = size / (time.perf_counter() - t0) / 1e9
    return {"disk_write_fsync_gb_s": round(disk, 3), "curl_one_stream_gb_s": round(curl, 3)}


PEERS = {
    "aria2c -x8 -s8 -k20M": [
        "aria2c",
        "-q",
        "-x8",
        "-s8",
        "-k20M",
        "--file-allocation=none",
        "-d",
        "{dir}",
        "-o",
        "out.bin",
    ],
    "curl": ["curl", "-s", "-o", "{dir}/out.bin"],
}


def run_peer(argv: list[str], url: str, workdir: Path, size: int) -> dict[str, Any]:
    """One download by another tool (no hashing, no fsync): wall, and its user+sys and peak RSS via wait4."""
    (workdir / "out.bin").unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen([a.format(dir=workdir) for a in argv] + [url])
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0 and (workdir / "out.bin").stat().st_size == size
    (workdir / "out.bin").unlink()
    return {
        "gb_s": round(size / wall / 1e9, 3),
        "cpu_s_per_gb": round((usage.ru_utime + usage.ru_stime) / (size / 1e9), 2),
        "maxrss_mib": round(usage.ru_maxrss / 1024, 1),
    }


def uptime() -> str:
    return Path("/proc/loadavg").read_text().strip()


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(r: dict[str, Any]) -> tuple[str, int, int, int, str]:
        return (r["dest"], r["part_mib"], r["concurrency"], r["buffer_kib"], r["variant"])

    table = []
    for dest, part, conc, buf, variant in sorted({key(r) for r in results}):
        rows = [r for r in results if key(r) == (dest, part, conc, buf, variant)]
        gbs = [r["gb_s"] for r in rows]
        cpus = [r["cpu_s_per_gb"] for r in rows]
        table.append(
            {
                "dest": dest,
                "part_mib": part,
                "concurrency": conc,
                "buffer_kib": buf,
                "variant": variant,
                "runs": len(rows),
                "gb_s_median": round(statistics.median(gbs), 3),
                "gb_s_min_max": [min(gbs), max(gbs)],
                "cpu_s_per_gb_median": round(statistics.median(cpus), 2),
                "cpu_s_per_gb_min_max": [min(cpus), max(cpus)],
                "maxrss_mib_max": max(r["maxrss_mib"] for r in rows),
                "rss_over_idle_mib_max": max(r["rss_over_idle_mib"] for r in rows),
            }
        )
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dests", default="shm,disk")
    ap.add_argument("--disk-dir", default="/var/tmp")
    ap.add_argument("--parts", default="8,16,32,64", help="part sizes in MiB")
    ap.add_argument("--concurrency", default="2,4,8")
    ap.add_argument("--buffers", default="4096", help="write buffer sizes in KiB")
    ap.add_argument("--src", default=str(ROOT / "src"), help="the model_agent source tree to measure")
    ap.add_argument(
        "--variants",
        default="default",
        help="default, and/or release-at-completion (A/B: what holding a slot until its part is recorded costs)",
    )
    ap.add_argument("--resume", action="store_true", help="also measure SIGKILL at 50 %% and resume")
    ap.add_argument("--peers", action="store_true", help="also run aria2c and curl (tmpfs only) each round")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ranged.json"))
    args = ap.parse_args()
    size = args.size_mib * MiB
    dests = {"shm": Path("/dev/shm"), "disk": Path(args.disk_dir)}
    chosen = {name: dests[name] for name in args.dests.split(",")}
    with tempfile.TemporaryDirectory(dir=args.disk_dir, prefix="ranged-bench-") as tmp_name:
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o755)
        root = tmp / "www"
        root.mkdir()
        src = root / "origin.bin"
        sha = write_random_file(src, args.size_mib)
        with src.open("rb") as fh:  # warm the page cache
            while fh.read(16 * MiB):
                pass
        nginx, port, count_port = start_nginx(root, tmp / "nginx")
        workdirs = {name: Path(tempfile.mkdtemp(dir=base, prefix="ranged-bench-dst-")) for name, base in chosen.items()}
        try:
            url = f"http://127.0.0.1:{port}/origin.bin"
            info: dict[str, Any] = {"load_start": uptime()}
            info.update(ceilings(Path(args.disk_dir), size, port))
            print(json.dumps(info), flush=True)
            grid = [
                (d, int(p), int(c), int(b), v)
                for d in chosen
                for p in args.parts.split(",")
                for c in args.concurrency.split(",")
                for b in args.buffers.split(",")
                for v in args.variants.split(",")
            ]
            results: list[dict[str, Any]] = []
            peers: list[dict[str, Any]] = []
            for rnd in range(args.rounds):
                for dest_name, part_mib, conc, buf_kib, variant in grid:
                    got = run_child(
                        Path(args.src),
                        url,
                        workdirs[dest_name] / "out.bin",
                        size,
                        sha,
                        part_mib * MiB,
                        conc,
                        buf_kib * 1024,
                        True,
                        variant,
                    )
                    row = {
                        "round": rnd,
                        "dest": dest_name,
                        "part_mib": part_mib,
                        "concurrency": conc,
                        "buffer_kib": buf_kib,
                        "variant": variant,
                        "gb_s": round(size / got["wall_s"] / 1e9, 3),
                        "cpu_s_per_gb": round(got["cpu_s"] / (size / 1e9), 2),
                        "maxrss_mib": round(got["maxrss_mib"], 1),
                        "rss_over_idle_mib": round(got["maxrss_mib"] - got["idle_rss_mib"], 1),
                        "load": uptime(),
                    }
                    print(json.dumps(row), flush=True)
                    results.append(row)
                if args.peers:
                    for name, argv in PEERS.items():
                        if shutil.which(argv[0]) is None:
                            continue
                        peer = {"round": rnd, "peer": name, "dest": "shm", **run_peer(argv, url, workdirs["shm"], size)}
                        peer["load"] = uptime()
                        print(json.dumps(peer), flush=True)
                        peers.append(peer)
            resume = []
            if args.resume:
                for dest_name in chosen:
                    for part_mib, conc in ((16, 4), (8, 4)):
                        r = measure_resume(
                            Path(args.src),
                            f"http://127.0.0.1:{count_port}/origin.bin",
                            workdirs[dest_name] / "out.bin",
                            size,
                            sha,
                            part_mib * MiB,
                            conc,
                            1024 * 1024,
                            tmp / "nginx" / "sent.log",
                        )
                        r["dest"] = dest_name
                        print(json.dumps(r), flush=True)
                        resume.append(r)
            info["load_end"] = uptime()
        finally:
            nginx.terminate()
            nginx.wait(10)
            for d in workdirs.values():
                shutil.rmtree(d, ignore_errors=True)
    table = summarize(results)
    doc = {
        "size_mib": args.size_mib,
        "origin": "nginx-light, sendfile, 1 worker, 127.0.0.1, file in page cache",
        "client": "RangedDownloader in a child process, sha256 inline, durable (fdatasync per record, fsync at end)",
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip(),
        "resource_note": f"peak RSS from getrusage in the child; page size {resource.getpagesize()}",
        **info,
        "summary": table,
        "resume": resume,
        "peers": peers,
        "runs": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print("\ndest | part MiB | conc | buf KiB | variant | GB/s median (min-max) | CPU-s/GB median (min-max) | peak RSS")
    for t in table:
        print(
            f"{t['dest']:4} | {t['part_mib']:8} | {t['concurrency']:4} | {t['buffer_kib']:7} | {t['variant']} | "
            f"{t['gb_s_median']} ({t['gb_s_min_max'][0]}-{t['gb_s_min_max'][1]}) | "
            f"{t['cpu_s_per_gb_median']} ({t['cpu_s_per_gb_min_max'][0]}-{t['cpu_s_per_gb_min_max'][1]}) | "
            f"{t['maxrss_mib_max']}"
        )


if __name__ == "__main__":
    main()
