"""REPORT.md of the download benchmark: tables per workload x destination, ratios, ceilings and verdicts.

Role: read the JSON lines of one suite (its ``suite`` record plus one ``run`` record per run) and write the
Markdown report: for W1-W3 GB/s median [min-max], CPU-s per GB, peak RSS, verified runs, ratios against
the best non-agent peer and against ``hf download``; the W4 (resume), W5 (corruption) and W6 (429) tables;
the ceilings measured at the start and end; the machine and its load; and the verdicts of the issue's
targets, each computed from the same runs side by side. Verdicts are also returned (and saved as JSON) so
tests and CI can read them without parsing Markdown.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Row = dict[str, Any]
MiB = 1024 * 1024
THROUGHPUT_WORKLOADS = {"W1": "one large file", "W2": "whole model", "W3": "20 small files"}
AGENT_TRANSFER = ("agent-s3", "agent-hf", "agent-ranged")  # the ranged engine behind each face (S3, Hub, raw)
NO_HASH = "agent-ranged-nohash"  # the raw engine with hashing stubbed out: the transfer-alone CPU only


def load(results: Path, suite: str | None = None) -> tuple[Row, list[Row]]:
    """The suite record and run records of ``suite`` (default: the last suite in the file)."""
    records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    suites = [r for r in records if r.get("kind") == "suite"]
    if not suites:
        raise SystemExit(f"{results}: no suite record")
    chosen = next(s for s in reversed(suites) if suite is None or s["suite"] == suite)
    runs = [r for r in records if r.get("kind") == "run" and r["suite"] == chosen["suite"]]
    return chosen, runs


def _med(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _groups(runs: list[Row], workload: str) -> dict[tuple[str, str], list[Row]]:
    out: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in runs:
        if r["workload"] == workload:
            out[(r["dest"], r["tool"])].append(r)
    return out


def throughput(runs: list[Row], workload: str, dest: str, tool: str) -> float | None:
    """Median GB/s of the verified runs (a run that did not verify has no throughput)."""
    return _med(
        r["gb_s"]
        for r in runs
        if r["workload"] == workload and r["dest"] == dest and r["tool"] == tool and r["verified"]
    )


def cpu_per_gb(runs: list[Row], workload: str, dest: str, tool: str, key: str = "cpu_s_per_gb") -> float | None:
    return _med(
        r[key]
        for r in runs
        if r["workload"] == workload and r["dest"] == dest and r["tool"] == tool and r["verified"] and key in r
    )


def best_peer(runs: list[Row], workload: str, dest: str) -> tuple[str | None, float | None]:
    tools = {
        r["tool"]
        for r in runs
        if r["workload"] == workload and r["dest"] == dest and not r["tool"].startswith("agent-")
    }
    scored = [(t, s) for t in tools if (s := throughput(runs, workload, dest, t)) is not None]
    if not scored:
        return None, None
    tool, speed = max(scored, key=lambda ts: ts[1])
    return tool, speed


def _ceiling(suite: Row, key: str) -> float | None:
    values = [c.get(key) for c in (suite.get("ceilings_start"), suite.get("ceilings_end")) if c]
    values = [v for v in values if v is not None]
    return max(values) if values else None  # the box did at least this much


# ------------------------------------------------------------------------------------------- verdicts


def _verdict(target: str, subject: str, measured: str, ok: bool | None) -> Row:
    return {"target": target, "subject": subject, "measured": measured, "pass": ok}


def verdicts(suite: Row, runs: list[Row]) -> list[Row]:
    out: list[Row] = []
    cfg = suite.get("ranged_config", {})
    in_flight = cfg.get("concurrency", 0) * cfg.get("part_size", 0)
    dests = sorted({r["dest"] for r in runs})
    tcp, disk = _ceiling(suite, "loopback_tcp_gbs"), _ceiling(suite, "disk_buffered_fsync_gbs")
    for tool in AGENT_TRANSFER:
        if not any(r["tool"] == tool and r["workload"] == "W1" for r in runs):
            continue
        got = throughput(runs, "W1", "disk", tool)
        peer, best = best_peer(runs, "W1", "disk")
        if best is not None or got is not None:
            ok = None if got is None or best is None else got >= best
            ratio = (
                f"{got / best:.2f}x {peer} ({_fmt(got)} vs {_fmt(best)} GB/s)"
                if got and best
                else f"{_fmt(got)} GB/s, no peer"
            )
            out.append(_verdict("Single large file to disk+fsync >= 1.0x best peer", tool, ratio, ok))
        limit = min(v for v in (tcp, disk) if v is not None) if (tcp or disk) else None
        if got is not None and limit:
            out.append(
                _verdict(
                    "Single large file to disk+fsync >= 70% of min(loopback TCP, disk write+fsync)",
                    tool,
                    f"{got / limit:.0%} of {limit:.2f} GB/s (TCP {_fmt(tcp)}, disk+fsync {_fmt(disk)})",
                    got >= 0.7 * limit,
                )
            )
        for dest in dests:
            cpu = cpu_per_gb(runs, "W1", dest, tool)
            fetch_cpu = cpu_per_gb(runs, "W1", dest, tool, key="fetch_cpu_s_per_gb")
            if cpu is None:
                continue
            shown = f"{fetch_cpu:.2f} CPU-s/GB ({cpu:.2f} with process start-up)" if fetch_cpu else f"{cpu:.2f}"
            out.append(
                _verdict(
                    f"CPU <= 2.0 CPU-s/GB with inline sha256 (W1, {dest}; the fetch, start-up excluded)",
                    tool,
                    shown,
                    (fetch_cpu if fetch_cpu is not None else cpu) <= 2.0,
                )
            )
    reference = {d: cpu_per_gb(runs, "W1", d, "py-minimal-reader") for d in dests}
    for dest in dests:
        alone = cpu_per_gb(runs, "W1", dest, NO_HASH, key="fetch_cpu_s_per_gb")
        if alone is None:
            continue
        whole = cpu_per_gb(runs, "W1", dest, NO_HASH)
        ref = reference.get(dest)
        context = (
            f"; the minimal reader of docs/performance.md#3-the-minimal-ranged-reader: {ref:.2f} here" if ref else ""
        )
        out.append(
            _verdict(
                f"CPU <= 1.0 CPU-s/GB for transfer alone (W1, {dest}; the engine with hashing stubbed out)",
                NO_HASH,
                f"{alone:.2f} CPU-s/GB ({_fmt(whole)} with process start-up{context})",
                alone <= 1.0,
            )
        )
    for tool in AGENT_TRANSFER:
        idle = suite.get("idle_rss_mib", {}).get(tool)
        if idle is not None and in_flight:
            bound = idle + in_flight / MiB + 64
            for workload in ("W1", "W2"):
                for dest in dests:
                    peak = _med(
                        r["maxrss_mib"]
                        for r in runs
                        if r["workload"] == workload and r["dest"] == dest and r["tool"] == tool
                    )
                    if peak is not None:
                        out.append(
                            _verdict(
                                "Memory during transfer <= idle + ranges-in-flight x range size + 64 MiB",
                                f"{tool} {workload} {dest}",
                                f"peak {peak:.0f} MiB <= {bound:.0f} MiB (idle {idle:.0f})",
                                peak <= bound,
                            )
                        )
        w4 = [r for r in runs if r["workload"] == "W4" and r["tool"] == tool]
        for r in w4:
            refetched = r.get("refetched_bytes")
            resumed = r.get("rerun_bytes", r["bytes"]) < r["bytes"]  # a restart can pass the bound on a small file
            ok = bool(r.get("killed_first")) and r["verified"] and resumed and refetched is not None
            ok = ok and refetched <= in_flight
            kill_at = suite.get("config", {}).get("kill_at", 0.5)
            out.append(
                _verdict(
                    "Resume after SIGKILL at 50%: re-fetched <= ranges-in-flight x range size, file verifies",
                    f"{tool} (round {r['round']})",
                    f"killed at {kill_at:.0%}={r.get('killed_first')}, resumed={resumed}, re-fetched "
                    f"{(refetched or 0) / MiB:.1f} MiB <= {in_flight / MiB:.0f} MiB, verified={r['verified']}",
                    ok,
                )
            )
    for tool in ("agent-s3", "agent-ranged", "agent-hf"):
        for r in (r for r in runs if r["workload"] == "W5" and r["tool"] == tool):
            out.append(
                _verdict(
                    "Injected byte flip is caught: verification fails, nothing published",
                    f"{tool} (round {r['round']})",
                    f"rc={r['rc']}, flipped={r.get('flipped')}, outcome={r['outcome']}",
                    r["outcome"] == "caught, nothing published" and (r.get("flipped") or 0) > 0,
                )
            )
    agent_runs = [r for r in runs if r["tool"].startswith("agent-") and r["workload"] in ("W1", "W2", "W3", "W4")]
    if agent_runs:
        good = sum(1 for r in agent_runs if r["verified"])
        out.append(
            _verdict(
                "Every file the agent published verifies (sha256 of the source) ",
                "agent, W1-W4",
                f"{good}/{len(agent_runs)} runs verified",
                good == len(agent_runs),
            )
        )
    for dest in dests:
        got, hf = throughput(runs, "W2", dest, "agent-hf"), throughput(runs, "W2", dest, "hf-download")
        cpu, hf_cpu = cpu_per_gb(runs, "W2", dest, "agent-hf"), cpu_per_gb(runs, "W2", dest, "hf-download")
        if None not in (got, hf, cpu, hf_cpu):
            assert got is not None and hf is not None and cpu is not None and hf_cpu is not None
            out.append(
                _verdict(
                    "Whole model on the Hub face: >= 2.5x hf download throughput at <= 0.5x its CPU-s/GB",
                    f"agent-hf W2 {dest}",
                    f"{got / hf:.2f}x throughput, {cpu / hf_cpu:.2f}x CPU-s/GB",
                    got >= 2.5 * hf and cpu <= 0.5 * hf_cpu,
                )
            )
    out += verified_speed_verdicts(suite, runs)
    return out


def fetch_throughput(runs: list[Row], workload: str, dest: str, tool: str) -> float | None:
    """Median GB/s of the fetch alone (agent_fetch.py's own clock: no interpreter start-up, as in a running agent)."""
    return _med(
        r["fetch_gb_s"]
        for r in runs
        if r["workload"] == workload and r["dest"] == dest and r["tool"] == tool and r["verified"] and "fetch_gb_s" in r
    )


def verified_speed_verdicts(suite: Row, runs: list[Row]) -> list[Row]:
    """The download targets: verified speed when the disk is not the limit (tmpfs), small files, CPU per GB."""
    out: list[Row] = []
    tcp = _ceiling(suite, "loopback_tcp_gbs")
    sha_cpu = [c.get("sha256_cpu_s_per_gb") for c in (suite.get("ceilings_start"), suite.get("ceilings_end")) if c]
    sha_rates = [1.0 / v for v in sha_cpu if v]
    sha_rate = max(sha_rates) if sha_rates else None  # GB/s of one core's sha256 (the bound for one file)
    for workload in ("W1", "W2"):
        peer, best = best_peer(runs, workload, "tmpfs")
        for tool in AGENT_TRANSFER:
            got = throughput(runs, workload, "tmpfs", tool)
            if got is None or best is None:
                continue
            out.append(
                _verdict(
                    f"{workload} to tmpfs, every byte verified: >= 1.0x the best unverified peer",
                    tool,
                    f"{got / best:.2f}x {peer} ({_fmt(got)} vs {_fmt(best)} GB/s)",
                    got >= best,
                )
            )
            if workload == "W1" and tcp and sha_rate:
                bound = min(tcp, sha_rate)
                out.append(
                    _verdict(
                        "W1 to tmpfs, verified: >= 70% of min(loopback TCP, one core's sha256 rate)",
                        tool,
                        f"{got / bound:.0%} of {bound:.2f} GB/s (TCP {tcp:.2f}, sha256 {sha_rate:.2f})",
                        got >= 0.7 * bound,
                    )
                )
    peer, best = best_peer(runs, "W2", "disk")
    for tool in AGENT_TRANSFER:
        got = throughput(runs, "W2", "disk", tool)
        if got is not None and best is not None:
            out.append(
                _verdict(
                    "W2 to disk+fsync, verified: >= 1.0x the best peer",
                    tool,
                    f"{got / best:.2f}x {peer} ({_fmt(got)} vs {_fmt(best)} GB/s)",
                    got >= best,
                )
            )
    for dest in sorted({r["dest"] for r in runs if r["workload"] == "W3"}):
        curl = throughput(runs, "W3", dest, "curl")
        for tool in ("agent-hf", "agent-s3"):
            fetch = fetch_throughput(runs, "W3", dest, tool)
            whole = throughput(runs, "W3", dest, tool)
            if curl is None or fetch is None:
                continue
            out.append(
                _verdict(
                    f"W3 small files ({dest}): >= 0.5x curl (the fetch; a running agent starts no interpreter)",
                    tool,
                    f"{fetch / curl:.2f}x curl ({fetch:.3f} vs {curl:.3f} GB/s; {_fmt(whole, 3)} with process start-up)",
                    fetch >= 0.5 * curl,
                )
            )
    for tool in AGENT_TRANSFER:
        cpu = cpu_per_gb(runs, "W1", "tmpfs", tool, key="fetch_cpu_s_per_gb")
        if cpu is not None:
            out.append(
                _verdict(
                    "CPU <= 1.6 CPU-s/GB with verification (W1, tmpfs; the fetch)",
                    tool,
                    f"{cpu:.2f} CPU-s/GB",
                    cpu <= 1.6,
                )
            )
    alone = cpu_per_gb(runs, "W1", "tmpfs", NO_HASH, key="fetch_cpu_s_per_gb")
    if alone is not None:
        out.append(
            _verdict(
                "CPU <= 0.9 CPU-s/GB for the transfer alone (W1, tmpfs; hashing stubbed out)",
                NO_HASH,
                f"{alone:.2f} CPU-s/GB",
                alone <= 0.9,
            )
        )
    return out


# ------------------------------------------------------------------------------------------- markdown


def _throughput_table(runs: list[Row], workload: str, dest: str) -> list[str]:
    groups = _groups(runs, workload)
    tools = sorted(t for d, t in groups if d == dest)
    if not tools:
        return []
    peer, best = best_peer(runs, workload, dest)
    hf = throughput(runs, workload, dest, "hf-download")
    lines = [
        f"#### {workload} ({THROUGHPUT_WORKLOADS[workload]}), {dest}",
        "",
        f"Best peer: {peer or '-'} ({_fmt(best)} GB/s).",
        "",
        "| tool | GB/s median [min-max] | CPU-s/GB | peak RSS MiB | verified | x best peer | x hf download |",
        "|---|---|---|---|---|---|---|",
    ]
    for tool in sorted(tools, key=lambda t: -(throughput(runs, workload, dest, t) or 0)):
        rows = groups[(dest, tool)]
        good = [r for r in rows if r["verified"]]
        speeds = [r["gb_s"] for r in good]
        got = _med(speeds)
        span = f"{_fmt(got)} [{_fmt(min(speeds))}-{_fmt(max(speeds))}]" if speeds else "failed"
        lines.append(
            f"| {tool} | {span} | {_fmt(_med(r['cpu_s_per_gb'] for r in good))} | "
            f"{_fmt(_med(r['maxrss_mib'] for r in rows), 0)} | {len(good)}/{len(rows)} | "
            f"{_fmt(got / best if got and best else None)} | {_fmt(got / hf if got and hf else None)} |"
        )
    return [*lines, ""]


def _reference_warning(suite: Row) -> list[str]:
    """A loud line when this suite is not the issue's configuration (>= 3 rounds, 4 x 1 GiB + 2 GiB, all six)."""
    cfg = suite.get("config", {})
    reference = (
        cfg.get("rounds", 0) >= 3
        and cfg.get("big_mib") == 2048
        and cfg.get("shard_mib") == 1024
        and cfg.get("shards") == 4
        and cfg.get("workloads") == "W1,W2,W3,W4,W5,W6"
    )
    if reference:
        return []
    return [
        "**Not the reference configuration** (rounds, data set or workloads reduced): this report validates "
        "the harness; its numbers are not the comparison the targets ask for. Run `make bench-download` on a "
        "quiet machine for that.",
        "",
    ]


def markdown(suite: Row, runs: list[Row], found: list[Row]) -> str:
    cfg = suite.get("config", {})
    lines = [
        "# Download benchmark: the agent against peers on one local origin",
        "",
        "Generated by `bench/download.py` from `" + str(suite.get("results", "bench/results/download.jsonl")) + "` "
        f"(suite `{suite['suite']}`, {suite.get('started')}). Reproduce: `make bench-download` "
        "(or `python -m bench.download run`; `--smoke` for the one-minute subset). Design: "
        "docs/performance.md#8-the-download-benchmark.",
        "",
        *_reference_warning(suite),
        "## Set-up",
        "",
        f"- Machine: {suite.get('machine', {}).get('cpus')} CPUs ({suite.get('machine', {}).get('cpu_model')}), "
        f"{suite.get('machine', {}).get('mem_gib')} GiB, kernel {suite.get('machine', {}).get('kernel')}; "
        f"load (1 min) at start {suite.get('machine', {}).get('load_start')}, at end {suite.get('load_end')}; "
        f"per-run load is in the JSON lines (median {_fmt(_med(r['load1'] for r in runs))}).",
        f"- Rounds: {cfg.get('rounds')}; order round-robin, rotated every round. Data set: "
        f"{cfg.get('shards')} x {cfg.get('shard_mib')} MiB + 1 x {cfg.get('big_mib')} MiB `*.safetensors` "
        "(seeded random) + 20 small JSON/tokenizer files of 1-500 KiB, warmed into page cache.",
        f"- Origin: {suite.get('origin_version')} (`worker_processes 1`, `sendfile on`, `access_log off`) on "
        "127.0.0.1 serving plain HTTP, path-style S3 (pre-built ListObjectsV2, `x-amz-checksum-sha256` on HEAD and on whole GETs with checksum mode) "
        "and a Hub-shaped API (revision/tree JSON, `resolve` with `X-Repo-Commit`, `X-Linked-Etag` = sha256). "
        "W4-W6 go through a Python fault proxy (testbed/proxies/streamfaultproxy.py) in front of it.",
        f"- Destinations: tmpfs (`{cfg.get('tmpfs')}`) and disk (`{cfg.get('disk')}`). On disk every run "
        "ends with `sync FILE...` over everything it wrote, inside the timed region, for every tool (tools "
        "that fsync themselves pay a second, cheap fsync).",
        "- Timing: wall from spawn to reaping; user+sys CPU from the child's rusage and peak RSS from GNU "
        "`time -f %M` (the whole process tree, start-up and imports included; nginx and the proxy excluded). GB/s = bytes / wall "
        "(1 GB = 10^9 B). sha256 of every file checked after each run, outside the timed region; a run that "
        "does not verify gets no throughput.",
        "- Xet (`hf_xet`, the Hub's default transport) cannot be benchmarked offline: it needs the Hub's CAS "
        "service. `hf download` runs with `HF_HUB_DISABLE_XET=1` (plain HTTP).",
        "- The agent: `bench/agent_fetch.py` — `agent-s3` = `S3Source` + `publish`, `agent-hf` = "
        "`HuggingFaceSource` + `publish` (huggingface_hub resolves and lists; LFS files through the ranged engine, small files through the same engine, one GET each), `agent-ranged` = the raw "
        f"`RangedDownloader` on plain HTTP; engine defaults {suite.get('ranged_config')}.",
        "",
        "Versions:",
        "",
    ]
    lines += [f"- {tool}: `{version}`" for tool, version in sorted(suite.get("versions", {}).items())]
    lines += [
        "",
        "## Ceilings",
        "",
        "| when | loopback TCP GB/s (iperf3, 1 stream) | disk O_DIRECT QD16 GB/s | disk buffered+fsync GB/s | sha256 CPU-s/GB | load |",
        "|---|---|---|---|---|---|",
    ]
    for when in ("start", "end"):
        c = suite.get(f"ceilings_{when}") or {}
        lines.append(
            f"| {when} | {_fmt(c.get('loopback_tcp_gbs'))} | {_fmt(c.get('disk_direct_gbs'))} | "
            f"{_fmt(c.get('disk_buffered_fsync_gbs'))} | {_fmt(c.get('sha256_cpu_s_per_gb'))} | {c.get('load1', '-')} |"
        )
    lines += ["", "## Verdicts", "", "| target | subject | measured | verdict |", "|---|---|---|---|"]
    for v in found:
        mark = {True: "PASS", False: "FAIL", None: "n/a"}[v["pass"]]
        lines.append(f"| {v['target']} | {v['subject']} | {v['measured']} | {mark} |")
    lines += ["", "## Throughput (W1-W3)", ""]
    for workload in THROUGHPUT_WORKLOADS:
        for dest in ("tmpfs", "disk"):
            lines += _throughput_table(runs, workload, dest)
    lines += [
        "## What each tool checks on its own",
        "",
        "- curl, s5cmd, obstore: no content check (a byte flipped in transit is published as is).",
        "- aria2c: the whole-file sha256 it is given (`checksum=sha-256=`), after the download; on a mismatch "
        "it exits 32 and leaves the file in place.",
        "- rclone: size, and MD5 against the ETag when the ETag is an MD5; nginx ETags are not, so size only here.",
        "- boto3 `download_file` (classic): size. `hf download`: size (the LFS sha256 is not re-hashed).",
        "- agent-s3: size + `x-amz-checksum-sha256` (FULL_OBJECT) from HEAD; agent-hf: size + LFS sha256 / git "
        "blob sha1 from the tree listing; agent-ranged: size + the sha256 it is given. All before publishing.",
        "",
    ]
    w4 = [r for r in runs if r["workload"] == "W4"]
    if w4:
        lines += [
            "## W4: SIGKILL at 50 % of the large file, then the same command again (disk)",
            "",
            "Killed once the origin had sent "
            f"{cfg.get('kill_at', 0.5):.0%} of the file. Re-fetched = bytes of the file sent by the origin over "
            "both runs minus its size (proxy counter: bytes still in socket buffers at the kill count as "
            "fetched). Rerun = bytes sent for the second command (= the file size: it started over).",
            "",
            "| tool | round | killed | re-fetched MiB | rerun MiB | verified after rerun | rerun wall s | rc |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(w4, key=lambda r: (r["tool"], r["round"])):
            lines.append(
                f"| {r['tool']} | {r['round']} | {r.get('killed_first')} | {_fmt((r.get('refetched_bytes') or 0) / MiB, 1)} | "
                f"{_fmt((r.get('rerun_bytes') or 0) / MiB, 1)} | "
                f"{r['verified']} | {_fmt(r['wall_s'])} | {r['rc']} |"
            )
        lines.append("")
    w5 = [r for r in runs if r["workload"] == "W5"]
    if w5:
        lines += [
            "## W5: one byte of the large file flipped in transit (disk)",
            "",
            "| tool | round | rc | bytes flipped | outcome |",
            "|---|---|---|---|---|",
        ]
        for r in sorted(w5, key=lambda r: (r["tool"], r["round"])):
            lines.append(f"| {r['tool']} | {r['round']} | {r['rc']} | {r.get('flipped')} | {r['outcome']} |")
        lines.append("")
    w6 = [r for r in runs if r["workload"] == "W6"]
    if w6:
        lines += [
            "## W6: 429 with `Retry-After` for the first GETs of the large file (disk)",
            "",
            "Requests in window = requests that reached the proxy from 50 ms after the last 429 until "
            "`Retry-After` had elapsed (0 = honoured).",
            "",
            "| tool | round | rc | verified | 429s sent | requests in window | wall s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in sorted(w6, key=lambda r: (r["tool"], r["round"])):
            lines.append(
                f"| {r['tool']} | {r['round']} | {r['rc']} | {r['verified']} | {r.get('replied_429')} | "
                f"{r.get('requests_in_window')} | {_fmt(r['wall_s'])} |"
            )
        lines.append("")
    if suite.get("missing_tools"):
        lines += ["Not installed, so not run: " + ", ".join(suite["missing_tools"]) + ".", ""]
    if suite.get("plot"):
        lines += [f"![throughput]({suite['plot']})", ""]
    return "\n".join(lines)


def verdicts_path_for(results: Path) -> Path:
    """Where the verdicts of a results file are saved as JSON: ``<results stem>-verdicts.json`` beside it."""
    return results.with_name(results.stem + "-verdicts.json")


def write(results: Path, report: Path, suite_id: str | None = None) -> list[Row]:
    suite, runs = load(results, suite_id)
    verdicts_path = verdicts_path_for(results)
    found = verdicts(suite, runs)
    report.write_text(markdown(suite, runs, found))
    verdicts_path.write_text(json.dumps(found, indent=1))
    return found
