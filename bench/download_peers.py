"""The download benchmark's peers: for each tool, the command that fetches one workload's files into a folder.

Role: one :class:`Peer` per tool configuration, each saying which face of the origin it talks to, how to
check it is installed, its version string (recorded in every result), and the argv + environment of a
run that fetches every file of a bucket into ``out``. Every peer is run with the tool's defaults except
where the benchmark design names options (aria2c ``-x8 -s8``). Where a tool can check a hash it is given
the one the origin publishes (aria2c ``checksum=sha-256``); what each tool verifies on its own is in
REPORT.md. Anonymous access everywhere; the S3 region is ``us-east-1``.

Peers: curl (plain, one stream per file, sequential), aria2c defaults and ``-x8 -s8`` (plain), s5cmd and
rclone (S3), boto3 classic ``download_file`` and obstore single GET (S3, small inline scripts), ``hf
download`` (Hub), and the agent (bench/agent_fetch.py: S3 source, Hub source, raw ranged engine).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.download_data import DataFile

BENCH = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
AGENT_FETCH = "bench.agent_fetch"  # run as a module: the benchmark runs from the repository root


@dataclass(frozen=True)
class Job:
    """One run's inputs: where the origin (or the proxy in front of it) is, which bucket, where to write."""

    base_url: str
    bucket: str
    files: list[DataFile]
    out: Path
    scratch: Path  # per-run folder for input lists (never verified, never timed as output)


Command = tuple[list[str], dict[str, str]]


@dataclass(frozen=True)
class Peer:
    name: str
    face: str  # plain | s3 | hub
    binary: str  # checked with shutil.which (or a path)
    command: Callable[[Job], Command]
    version: Callable[[], str]
    resumes: bool = False  # documented ability to continue a killed download (for the W4 table)
    workloads: tuple[str, ...] | None = None  # the workloads it takes part in (None: all)


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _py_version(module: str) -> Callable[[], str]:
    return lambda: module + " " + _first_line([sys.executable, "-c", f"import {module}; print({module}.__version__)"])


def _agent_version() -> str:
    """The commit of the tree the agent's runs import (``-dirty`` with uncommitted changes), and that tree when it is
    not the benchmark's own: an A/B through ``PYTHONPATH`` must name ``<tree>/src``, or the editable install wins and
    both sides run the same code (found on 12-06; the results now show which tree ran)."""
    where = "import model_agent, pathlib; print(pathlib.Path(model_agent.__file__).resolve().parents[2])"
    tree = _first_line([sys.executable, "-c", where])
    commit = _first_line(["git", "-C", tree, "describe", "--always", "--dirty", "--abbrev=7"])
    elsewhere = "" if Path(tree) == BENCH.parent else f" from {tree}"
    return f"model-agent {commit}{elsewhere} (python {sys.version.split()[0]})"


# ------------------------------------------------------------------------------------------- commands


def _curl(job: Job) -> Command:
    argv = ["curl", "-sS", "--fail", "-C", "-"]
    for f in job.files:
        argv += ["-o", str(job.out / f.path), f"{job.base_url}/plain/{job.bucket}/{f.path}"]
    return argv, {}


def _aria2c(extra: list[str]) -> Callable[[Job], Command]:
    def command(job: Job) -> Command:
        listing = job.scratch / "aria2c.txt"
        listing.write_text(
            "".join(
                f"{job.base_url}/plain/{job.bucket}/{f.path}\n  out={f.path}\n  checksum=sha-256={f.sha256}\n"
                for f in job.files
            )
        )
        argv = ["aria2c", "-q", "-c", "--allow-overwrite=true", "--auto-file-renaming=false"]
        return [*argv, *extra, "-d", str(job.out), "-i", str(listing)], {}

    return command


def _s5cmd(job: Job) -> Command:
    argv = [str(VENV_BIN / "s5cmd"), "--no-sign-request", "--endpoint-url", job.base_url]
    return [*argv, "cp", f"s3://{job.bucket}/*", f"{job.out}/"], {"AWS_REGION": "us-east-1"}


def _rclone(job: Job) -> Command:
    remote = f":s3,provider=Other,endpoint='{job.base_url}',env_auth=false:{job.bucket}"
    return ["rclone", "copy", "--config", "/dev/null", remote, str(job.out)], {}


def _hf(job: Job) -> Command:
    argv = [str(VENV_BIN / "hf"), "download", f"bench/{job.bucket}", "--local-dir", str(job.out), "--quiet"]
    return argv, {"HF_ENDPOINT": job.base_url, "HF_HUB_DISABLE_XET": "1"}


BOTO3_CLASSIC = """
import sys, boto3, botocore
from boto3.s3.transfer import TransferConfig
endpoint, bucket, out = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=botocore.config.Config(signature_version=botocore.UNSIGNED))
config = TransferConfig(preferred_transfer_client="classic")
for key in sys.argv[4:]:
    s3.download_file(bucket, key, f"{out}/{key}", Config=config)
"""

OBSTORE_GET = """
import sys, obstore
from obstore.store import S3Store
endpoint, bucket, out = sys.argv[1:4]
store = S3Store(bucket, endpoint=endpoint, region="us-east-1", skip_signature=True,
                virtual_hosted_style_request=False, client_options={"allow_http": True})
for key in sys.argv[4:]:
    with open(f"{out}/{key}", "wb") as fh:
        for chunk in obstore.get(store, key):
            fh.write(chunk)
"""


# docs/performance.md#3-the-minimal-ranged-reader: the "minimal Python ranged reader" (stdlib http.client, 4 threads, 16 MiB ranges,
# readinto a reused 4 MiB buffer, os.pwrite; no hashing, no resume): the per-byte cost of this machine today.
MINIMAL_READER = """
import http.client, os, sys, threading, urllib.parse
base, bucket, out = sys.argv[1:4]
host = urllib.parse.urlsplit(base)
PART = 16 << 20
for key in sys.argv[4:]:
    path = f"/plain/{bucket}/{key}"
    conn = http.client.HTTPConnection(host.hostname, host.port)
    conn.request("HEAD", path)
    resp = conn.getresponse()
    resp.read()
    size = int(resp.getheader("Content-Length"))
    fd = os.open(f"{out}/{key}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    starts = list(range(0, size, PART))
    lock = threading.Lock()
    def work():
        conn = http.client.HTTPConnection(host.hostname, host.port)
        view = memoryview(bytearray(4 << 20))
        while True:
            with lock:
                if not starts:
                    return
                start = starts.pop(0)
            end = min(size, start + PART)
            conn.request("GET", path, headers={"Range": f"bytes={start}-{end - 1}"})
            resp = conn.getresponse()
            pos = start
            while pos < end:
                n = resp.readinto(view[: min(len(view), end - pos)])
                if not n:
                    raise SystemExit("short body")
                os.pwrite(fd, view[:n], pos)
                pos += n
    threads = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    os.close(fd)
"""


def _inline(script: str) -> Callable[[Job], Command]:
    def command(job: Job) -> Command:
        argv = [sys.executable, "-c", script, job.base_url, job.bucket, str(job.out)]
        return [*argv, *(f.path for f in job.files)], {}

    return command


def _agent(mode: str, *flags: str) -> Callable[[Job], Command]:
    def command(job: Job) -> Command:
        argv = [sys.executable, "-m", AGENT_FETCH, mode, "--dest", str(job.out), *flags]
        if mode == "s3":
            argv += ["--endpoint", job.base_url, "--bucket", job.bucket]
        elif mode == "hf":
            argv += ["--endpoint", job.base_url, "--repo", f"bench/{job.bucket}"]
        else:
            listing = job.scratch / "listing.json"
            listing.write_text(
                "[" + ",".join(f'{{"path":"{f.path}","size":{f.size},"sha256":"{f.sha256}"}}' for f in job.files) + "]"
            )
            argv += ["--base-url", f"{job.base_url}/plain/{job.bucket}", "--listing", str(listing)]
        return argv, {}

    return command


PEERS: tuple[Peer, ...] = (
    Peer("curl", "plain", "curl", _curl, lambda: _first_line(["curl", "--version"]), resumes=True),
    Peer("aria2c", "plain", "aria2c", _aria2c([]), lambda: _first_line(["aria2c", "--version"]), resumes=True),
    Peer(
        "aria2c-x8s8",
        "plain",
        "aria2c",
        _aria2c(["-x8", "-s8"]),
        lambda: _first_line(["aria2c", "--version"]),
        resumes=True,
    ),
    Peer(
        "s5cmd",
        "s3",
        str(VENV_BIN / "s5cmd"),
        _s5cmd,
        lambda: "s5cmd " + _first_line([str(VENV_BIN / "s5cmd"), "version"]),
    ),
    Peer("rclone", "s3", "rclone", _rclone, lambda: _first_line(["rclone", "version"])),
    Peer("boto3-classic", "s3", sys.executable, _inline(BOTO3_CLASSIC), _py_version("boto3")),
    Peer("obstore", "s3", sys.executable, _inline(OBSTORE_GET), _py_version("obstore")),
    Peer(
        "py-minimal-reader",
        "plain",
        sys.executable,
        _inline(MINIMAL_READER),
        lambda: f"python {sys.version.split()[0]} (bench/download_peers.py)",
        workloads=("W1",),
    ),
    Peer("hf-download", "hub", str(VENV_BIN / "hf"), _hf, _py_version("huggingface_hub")),
    Peer("agent-s3", "s3", sys.executable, _agent("s3"), _agent_version, resumes=True),
    Peer("agent-hf", "hub", sys.executable, _agent("hf"), _agent_version),
    Peer("agent-ranged", "plain", sys.executable, _agent("ranged"), _agent_version, resumes=True),
    # The engine with hashing stubbed out: the "transfer alone" CPU target only (W1), never a throughput peer.
    Peer(
        "agent-ranged-nohash",
        "plain",
        sys.executable,
        _agent("ranged", "--no-hash"),
        _agent_version,
        workloads=("W1",),
    ),
)
AGENT_PEERS = tuple(p.name for p in PEERS if p.name.startswith("agent-"))


def available(peer: Peer) -> bool:
    return shutil.which(peer.binary) is not None
