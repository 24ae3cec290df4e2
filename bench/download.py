"""Download benchmark: the agent against s5cmd, rclone, aria2c, curl, boto3, obstore and `hf download`.

Reproduce everything: ``make bench-download`` (= ``python -m bench.download run``, from the repository root): installs the Debian
tools when root (nginx-light, aria2, rclone, iperf3, fio), generates and warms the data set, starts one
nginx origin on loopback, measures the ceilings, runs W1-W6 x destinations x tools for ``--rounds``
rounds (round-robin, order rotated every round), measures the ceilings again, appends JSON lines to
``bench/results/download.jsonl`` and writes ``bench/REPORT.md`` + ``bench/download.png``.
``python -m bench.download report`` regenerates the report from the JSON lines. ``--smoke`` (or the
``smoke`` subcommand) is W1 + W4 + W5, 1 round, a 256 MiB file, with its outputs under the work dir: it
gates CI through tests/e2e/test_download_bench.py.

Workloads (docs/performance.md#85-workloads): W1 the large file; W2 the whole model; W3 the 20
small files; W4 SIGKILL once the origin has sent half of the large file (``--kill-at``; 75 % when the
file is small against the ranges in flight, as in the smoke run, see ``main``), then the same command again
(re-fetched bytes from the proxy's counter); W5 one byte of the large file flipped in transit; W6 ``429``
with ``Retry-After`` for the first GETs of the large file. W4-W6 run on disk through the fault proxy.
The module docs of download_data, download_origin, testbed.proxies.streamfaultproxy, download_peers, download_measure,
download_ceilings and download_report say how each part works.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import download_ceilings, download_report
from bench.download_data import DataFile, DataSet, generate, warm
from bench.download_measure import Measured, check, run_timed
from bench.download_origin import NginxOrigin, ensure_debian_packages
from bench.download_peers import PEERS, Job, Peer, available
from model_agent.transfer import RangedConfig
from testbed.proxies.streamfaultproxy import Faults, HttpFaultProxy

BENCH = Path(__file__).resolve().parent

MiB = 1024 * 1024
PEER_PACKAGES = {"aria2c": "aria2", "rclone": "rclone", "iperf3": "iperf3", "fio": "fio"}
RETRY_AFTER_S = 2
# The smoke run keeps W4/W5 to the agent and three peers, to stay near a minute on a quiet box.
SMOKE_FAULT_TOOLS = ("curl", "aria2c", "s5cmd", "agent-s3", "agent-hf", "agent-ranged")
WINDOW_GRACE_S = 0.05


@dataclass(frozen=True)
class Workload:
    name: str
    bucket: str
    dests: tuple[str, ...]
    fault: str = ""  # "", kill, flip, 429


WORKLOADS = {
    "W1": Workload("W1", "w1", ("tmpfs", "disk")),
    "W2": Workload("W2", "w2", ("tmpfs", "disk")),
    "W3": Workload("W3", "w3", ("tmpfs", "disk")),
    "W4": Workload("W4", "w1", ("disk",), "kill"),
    "W5": Workload("W5", "w1", ("disk",), "flip"),
    "W6": Workload("W6", "w1", ("disk",), "429"),
}


class Bench:
    def __init__(self, args: argparse.Namespace, data: DataSet, origin: NginxOrigin, proxy: HttpFaultProxy) -> None:
        self.args = args
        self.data = data
        self.origin = origin
        self.proxy = proxy
        self.suite = args.suite_id
        self.dest_roots = {"tmpfs": args.tmpfs, "disk": args.work_dir / "dest"}
        self.env = {
            **os.environ,
            "HF_HOME": str(args.work_dir / "hf-home"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_XET": "1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        # Loopback plain HTTP only. rclone refuses to start when AWS_CA_BUNDLE is set and the endpoint is http.
        for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "HF_ENDPOINT", "AWS_CA_BUNDLE"):
            self.env.pop(name, None)
        self.versions: dict[str, str] = {}

    def version(self, peer: Peer) -> str:
        if peer.name not in self.versions:
            self.versions[peer.name] = peer.version()
        return self.versions[peer.name]

    def _prepare(self, peer: Peer, dest: str) -> tuple[Path, Path, Path]:
        root = self.dest_roots[dest] / peer.name
        shutil.rmtree(root, ignore_errors=True)
        out = root / "out"
        if peer.name not in ("agent-s3", "agent-hf"):  # the sources publish by renaming staging into place
            out.mkdir(parents=True)
        root.mkdir(parents=True, exist_ok=True)
        scratch = self.args.work_dir / "scratch" / peer.name
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        return root, out, scratch

    def _run(self, peer: Peer, job: Job, root: Path, dest: str, log: Path, **kw: Any) -> Measured:
        argv, extra = peer.command(job)
        return run_timed(argv, {**self.env, **extra}, log, fsync_dir=root if dest == "disk" else None, **kw)

    def one(self, workload: Workload, dest: str, peer: Peer, round_no: int) -> dict[str, Any]:
        files = self.data.bucket(workload.bucket)
        size = sum(f.size for f in files)
        root, out, scratch = self._prepare(peer, dest)
        via_proxy = bool(workload.fault)
        job = Job(self.proxy.url if via_proxy else self.origin.url, workload.bucket, files, out, scratch)
        log = scratch / "output.log"
        big = self.data.big
        extra: dict[str, Any] = {}
        load1 = round(os.getloadavg()[0], 2)
        if workload.fault == "kill":
            self.proxy.reset()
            kill_at = int(self.data.by_path(big).size * self.args.kill_at)
            first = self._run(
                peer, job, root, dest, log, kill_when=lambda: self.proxy.counters.by_suffix(big) > kill_at
            )
            sent_first = self.proxy.counters.by_suffix(big)
            self.proxy.reset()
            measured = self._run(peer, job, root, dest, scratch / "output-rerun.log")
            sent = sent_first + self.proxy.counters.by_suffix(big)
            extra = {
                "killed_first": first.killed,
                "first_wall_s": round(first.wall_s, 3),
                "sent_first_bytes": sent_first,
                "refetched_bytes": sent - self.data.by_path(big).size,
                "rerun_bytes": sent - sent_first,
            }
        elif workload.fault == "flip":
            self.proxy.reset(Faults(flip_suffix=big, flip_offset=self.data.by_path(big).size // 2 + 4097))
            measured = self._run(peer, job, root, dest, log)
            extra = {"flipped": self.proxy.counters.flipped}
        elif workload.fault == "429":
            self.proxy.reset(Faults(reply_429=3, reply_429_suffix=big, retry_after_s=RETRY_AFTER_S))
            measured = self._run(peer, job, root, dest, log)
            answered_429 = self.proxy.counters.replied_429
            window = 0
            if answered_429:
                last = answered_429[-1]
                window = sum(
                    1
                    for r in self.proxy.counters.requests
                    if last + WINDOW_GRACE_S < r.at < last + RETRY_AFTER_S and r.status != 429
                )
            extra = {"replied_429": len(answered_429), "requests_in_window": window}
        else:
            measured = self._run(peer, job, root, dest, log)
        if via_proxy:
            extra["requests"] = len(self.proxy.counters.requests)
        checked = check(out, files)
        cpu = measured.user_s + measured.sys_s
        fetch_cpu = _agent_fetch_cpu(measured.output) if peer.name.startswith("agent-") else None
        if fetch_cpu is not None:
            extra["fetch_cpu_s_per_gb"] = round(fetch_cpu / (size / 1e9), 3)
        fetch_doc = _agent_fetch_line(measured.output) if peer.name.startswith("agent-") else None
        if fetch_doc is not None and fetch_doc.get("fetch_wall_s"):
            # A running agent never pays interpreter start-up per model: this is the rate a node sees.
            extra["fetch_gb_s"] = round(size / float(fetch_doc["fetch_wall_s"]) / 1e9, 4)
        row: dict[str, Any] = {
            "kind": "run",
            "suite": self.suite,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "round": round_no,
            "workload": workload.name,
            "dest": dest,
            "tool": peer.name,
            "face": peer.face,
            "version": self.version(peer),
            "bytes": size,
            "files": len(files),
            "wall_s": round(measured.wall_s, 4),
            "user_s": round(measured.user_s, 3),
            "sys_s": round(measured.sys_s, 3),
            "cpu_s_per_gb": round(cpu / (size / 1e9), 3),
            "maxrss_mib": round(measured.maxrss_mib, 1),
            "gb_s": round(size / measured.wall_s / 1e9, 4),
            "rc": measured.rc,
            "verified": checked.verified and measured.rc == 0,
            "missing": checked.missing,
            "corrupt": checked.corrupt,
            "load1": load1,
            **extra,
        }
        if workload.fault == "flip":
            row["outcome"] = _flip_outcome(measured, checked.corrupt, checked.missing, files)
        if not row["verified"] and workload.fault not in ("flip",):
            row["output_tail"] = measured.output[-600:]
        if workload.fault == "flip" and row["outcome"] == "not caught":
            row["output_tail"] = measured.output[-300:]
        shutil.rmtree(root, ignore_errors=True)
        return row


def _flip_outcome(measured: Measured, corrupt: list[str], missing: list[str], files: list[DataFile]) -> str:
    failed = measured.rc != 0
    if corrupt:
        return "caught, corrupt file left" if failed else "not caught"
    if failed:
        return "caught, nothing published" if len(missing) == len(files) else "caught, nothing corrupt published"
    return "no corruption seen (retried clean?)"


def _machine() -> dict[str, Any]:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next(
            (
                line.split(":", 1)[1].strip()
                for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")
            ),
            "",
        )
    mem_kib = 0
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        mem_kib = int(meminfo.read_text().split("MemTotal:")[1].split()[0])
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }


def _tool_limits(specs: list[str]) -> dict[str, set[str]]:
    limits: dict[str, set[str]] = {}
    for spec in specs:
        workload, _, tools = spec.partition(":")
        limits[workload] = set(tools.split(","))
    return limits


def _agent_fetch_line(output: str) -> dict[str, Any] | None:
    """agent_fetch.py's JSON line: the fetch itself (start-up and imports excluded)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{") and "fetch_user_s" in line:
            try:
                doc: dict[str, Any] = json.loads(line)
                return doc
            except ValueError:
                return None
    return None


def _agent_fetch_cpu(output: str) -> float | None:
    """CPU seconds of the fetch itself, from agent_fetch.py's JSON line (start-up and imports excluded)."""
    doc = _agent_fetch_line(output)
    try:
        return None if doc is None else float(doc["fetch_user_s"]) + float(doc["fetch_sys_s"])
    except (KeyError, TypeError, ValueError):
        return None


def _idle_rss(bench: Bench) -> dict[str, float]:
    """Peak RSS of each agent mode set up but not transferring (its memory baseline)."""
    out: dict[str, float] = {}
    for peer in PEERS:
        if not peer.name.startswith("agent-"):
            continue
        root, dest_out, scratch = bench._prepare(peer, "tmpfs")
        argv, extra = peer.command(Job(bench.origin.url, "w1", bench.data.bucket("w1"), dest_out, scratch))
        measured = run_timed([*argv, "--idle"], {**bench.env, **extra}, scratch / "idle.log")
        out[peer.name] = round(measured.maxrss_mib, 1)
        shutil.rmtree(root, ignore_errors=True)
    return out


def run_suite(args: argparse.Namespace) -> int:
    work: Path = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    needed = {"nginx": "nginx-light", "/usr/bin/time": "time"}
    missing_pkgs = ensure_debian_packages({**needed, **(PEER_PACKAGES if args.install_peers else {})})
    if set(needed.values()) & set(missing_pkgs):
        print("missing: run `apt-get install -y nginx-light time` as root (Debian)", file=sys.stderr)
        return 2
    tools = [p for p in PEERS if not args.tools or p.name in args.tools.split(",")]
    missing_tools = [p.name for p in tools if not available(p)]
    tools = [p for p in tools if available(p)]
    workloads = [WORKLOADS[w] for w in args.workloads.split(",")]
    dests = args.dests.split(",")
    print(f"== data set under {work}/data", flush=True)
    data = generate(work, big_mib=args.big_mib, shard_mib=args.shard_mib, shards=args.shards)
    warm(data)
    results: Path = args.results
    results.parent.mkdir(parents=True, exist_ok=True)
    suite: dict[str, Any] = {
        "kind": "suite",
        "suite": args.suite_id,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": os.path.relpath(results, BENCH.parent) if results.is_relative_to(BENCH.parent) else str(results),
        "machine": _machine(),
        "config": {
            "rounds": args.rounds,
            "big_mib": args.big_mib,
            "shard_mib": args.shard_mib,
            "shards": args.shards,
            "workloads": args.workloads,
            "dests": args.dests,
            "tmpfs": str(args.tmpfs),
            "disk": str(work / "dest"),
            "smoke": args.smoke,
            "kill_at": args.kill_at,
        },
        "ranged_config": {"part_size": RangedConfig().part_size, "concurrency": RangedConfig().concurrency},
        "missing_tools": missing_tools,
    }
    big_file = data.root / data.big
    try:
        _measure_all(args, suite, data, tools, workloads, dests, big_file)
    finally:
        shutil.rmtree(args.tmpfs, ignore_errors=True)
    found = download_report.write(results, args.report, args.suite_id)
    print(f"== {args.report}")
    for v in found:
        mark = "PASS" if v["pass"] else "FAIL" if v["pass"] is False else "n/a "
        print(f"{mark} {v['target']} [{v['subject']}]: {v['measured']}")
    return 0


def _measure_all(
    args: argparse.Namespace,
    suite: dict[str, Any],
    data: DataSet,
    tools: list[Peer],
    workloads: list[Workload],
    dests: list[str],
    big_file: Path,
) -> None:
    work: Path = args.work_dir
    results: Path = args.results
    with NginxOrigin(data, work) as origin, HttpFaultProxy(origin.port) as proxy:
        suite["origin_version"] = origin.version()
        bench = Bench(args, data, origin, proxy)
        for peer in tools:  # versions once, before any timed run (the agent's is the commit at the start)
            bench.version(peer)
        ceiling_args = {"fio_mib": args.fio_mib, "iperf_s": args.iperf_s, "hash_sample": big_file}
        if not args.no_ceilings:
            print("== ceilings (start)", flush=True)
            suite["ceilings_start"] = download_ceilings.measure(work / "dest", **ceiling_args)
        suite["idle_rss_mib"] = _idle_rss(bench)
        rows: list[dict[str, Any]] = []
        limits = _tool_limits(args.limit)
        with results.open("a") as sink:
            for round_no in range(1, args.rounds + 1):
                shift = (round_no - 1) % len(tools)
                order = tools[shift:] + tools[:shift]
                for workload in workloads:
                    for dest in (d for d in workload.dests if d in dests):
                        for peer in order:
                            if args.smoke and workload.fault and peer.name not in SMOKE_FAULT_TOOLS:
                                continue
                            if peer.workloads is not None and workload.name not in peer.workloads:
                                continue
                            if workload.name in limits and peer.name not in limits[workload.name]:
                                continue
                            row = bench.one(workload, dest, peer, round_no)
                            rows.append(row)
                            sink.write(json.dumps(row) + "\n")
                            sink.flush()
                            flag = "ok" if row["verified"] else f"rc={row['rc']} {row.get('outcome', 'NOT VERIFIED')}"
                            print(
                                f"r{round_no} {workload.name} {dest:5} {peer.name:14} {row['gb_s']:.3f} GB/s "
                                f"{row['cpu_s_per_gb']:.2f} CPU-s/GB {row['maxrss_mib']:.0f} MiB {flag}",
                                flush=True,
                            )
            if not args.no_ceilings:
                print("== ceilings (end)", flush=True)
                suite["ceilings_end"] = download_ceilings.measure(work / "dest", **ceiling_args)
            suite["versions"] = bench.versions
            suite["load_end"] = [round(x, 2) for x in os.getloadavg()]
            if args.plot:
                try:
                    from bench import plots

                    plots.download(rows, args.plot)
                    suite["plot"] = os.path.relpath(args.plot, args.report.parent)
                except ImportError as exc:
                    print(f"no plot: {exc}", file=sys.stderr)
            sink.write(json.dumps(suite) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    default_work = Path(os.environ.get("MODEL_AGENT_BENCH_DIR", Path.home() / ".cache" / "model-agent-bench"))
    for name in ("run", "smoke"):
        p = sub.add_parser(name, help="run the suite" if name == "run" else "W1+W4+W5, 1 round, 256 MiB (< 1 min)")
        p.add_argument("--work-dir", type=Path, default=default_work, help="data, origin state, disk destination")
        p.add_argument("--tmpfs", type=Path, default=Path("/dev/shm") / f"model-agent-bench-{os.getpid()}")
        p.add_argument("--rounds", type=int)
        p.add_argument("--workloads")
        p.add_argument("--dests", default="tmpfs,disk")
        p.add_argument("--tools", default="", help="comma-separated subset of: " + ",".join(x.name for x in PEERS))
        p.add_argument(
            "--limit",
            action="append",
            default=[],
            metavar="W:TOOLS",
            help="run workload W with these tools only, e.g. W2:agent-hf,hf-download (repeatable)",
        )
        p.add_argument("--big-mib", type=int)
        p.add_argument("--shard-mib", type=int, default=1024)
        p.add_argument("--shards", type=int)
        p.add_argument("--fio-mib", type=int)
        p.add_argument("--iperf-s", type=int)
        p.add_argument("--no-ceilings", action="store_true")
        p.add_argument("--kill-at", type=float, help="W4: fraction of the large file sent by the origin (0.5)")
        p.add_argument("--no-install", dest="install_peers", action="store_false", help="do not apt-get the peers")
        p.add_argument("--results", type=Path)
        p.add_argument("--report", type=Path)
        p.add_argument("--smoke", action="store_true", default=name == "smoke")
    rep = sub.add_parser("report", help="regenerate the report from the JSON lines")
    rep.add_argument("--results", type=Path, default=BENCH / "results" / "download.jsonl")
    rep.add_argument("--report", type=Path, default=BENCH / "REPORT.md")
    rep.add_argument("--suite", default=None)
    args = ap.parse_args()
    if args.command == "report":
        found = download_report.write(args.results, args.report, args.suite)
        print(f"{args.report}: {sum(1 for v in found if v['pass'])}/{len(found)} verdicts pass")
        return 0
    smoke = args.smoke
    defaults = {
        "rounds": 1 if smoke else 3,
        "workloads": "W1,W4,W5" if smoke else "W1,W2,W3,W4,W5,W6",
        "big_mib": 256 if smoke else 2048,
        "shards": 0 if smoke else 4,
        "fio_mib": 256 if smoke else 2048,
        "iperf_s": 1 if smoke else 3,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.kill_at is None:
        # When the engine's ranges in flight (8 x 16 MiB) are a large share of the file (the smoke's 256 MiB: the
        # first half), the origin has sent 50 % as soon as the first wave sits in socket buffers, before any range
        # has completed, and a kill there tests nothing. 75 % means the client has asked for (so finished) several.
        ranged = RangedConfig()
        args.kill_at = 0.5 if 4 * ranged.concurrency * ranged.part_size <= args.big_mib * MiB else 0.75
    if smoke:
        args.results = args.results or args.work_dir / "download-smoke.jsonl"
        args.report = args.report or args.work_dir / "REPORT-smoke.md"
        args.plot = None
    else:
        args.results = args.results or BENCH / "results" / "download.jsonl"
        args.report = args.report or BENCH / "REPORT.md"
        args.plot = BENCH / "download.png"
    args.suite_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    return run_suite(args)


if __name__ == "__main__":
    sys.exit(main())
