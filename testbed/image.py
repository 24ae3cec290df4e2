"""The agent's container image, built from the real Dockerfile on a base bootstrapped here (``make image``).

Role: no container registry is reachable on the test machines, so the Dockerfile's ``PYTHON_IMAGE`` base
is made locally: ``mmdebstrap --variant=minbase`` of Debian bookworm with Debian's Python 3.11 (the
Python the Dockerfile's default base carries), from the apt sources this machine is configured with.
``buildah bud`` then builds the unmodified build stages of ``Dockerfile`` on it (chroot isolation and
host networking: pip reaches the package index exactly as a ``docker build`` would) and exports an
``oci-archive`` that containerd imports. The sandbox image the node needs is written by
:mod:`testbed.oci` around the ``pause`` binary built from ``tools/controlplane/pause``.

Contract:

* Every product is cached under ``<cache>/image/`` by a key over its inputs (the build context files
  the ``.dockerignore`` lets through, the Dockerfile, the base's key); a second call with the same
  inputs does nothing.
* buildah's storage is a throw-away directory per build inside the cache (vfs driver: no mounts are
  left behind), removed afterwards; nothing is written to ``/var/lib/containers``.
* Errors a person can fix are :class:`ImageError` with one line saying what to do.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from testbed import oci
from testbed.servers.controlplane import _noop, cache_root, repo_root
from testbed.servers.service import last_line, run_step

Echo = Callable[[str], None]

SUITE = "bookworm"
# Debian's python3.11 is what the Dockerfile's default base (python:3.11-slim-bookworm) carries; the venv
# module is needed by the build stage, ca-certificates by every HTTPS store the agent talks to.
BASE_PACKAGES = ("python3.11", "python3.11-venv", "python-is-python3", "ca-certificates")
BASE_REF = "localhost/testbed-python:3.11-bookworm"
IMAGE_REPOSITORY = "testbed.local/model-agent"
PAUSE_REF = "testbed.local/pause:3.10"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
APT_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
BUILD_TIMEOUT_S = 30 * 60
# What .dockerignore lets into the build context (kept in step with it; a unit test checks both agree).
CONTEXT_PATHS = ("pyproject.toml", "README.md", "LICENSE", "src", "deploy/docker/constraints.txt")


class ImageError(Exception):
    """A failure a person can act on; the message is one line that says what to do."""


@dataclass(frozen=True)
class Image:
    """An image archive in the cache and the name it is imported under."""

    archive: Path
    ref: str


def image_dir() -> Path:
    return cache_root() / "image"


def _run(argv: list[str], what: str, *, cwd: Path | None = None, log: Path | None = None) -> str:
    try:
        proc = run_step(argv, what, ImageError, timeout_s=BUILD_TIMEOUT_S, cwd=cwd)
    except FileNotFoundError as exc:
        raise ImageError(f"{argv[0]} is not installed: apt-get install mmdebstrap buildah") from exc
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        where = f" (full log: {log})" if log else ""
        raise ImageError(f"{what} failed: {last_line(proc.stderr)}{where}")
    return proc.stdout


def _hash_files(h: hashlib._Hash, root: Path, relative: Iterable[str]) -> None:
    for rel in relative:
        path = root / rel
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if "__pycache__" in f.parts or f.suffix in {".pyc", ".pyo"} or ".egg-info" in str(f):
                continue
            h.update(str(f.relative_to(root)).encode() + b"\0")
            h.update(f.read_bytes() if f.is_file() else b"<missing>")
            h.update(b"\0")


def base_key() -> str:
    h = hashlib.sha256()
    h.update(f"{SUITE}\0{','.join(BASE_PACKAGES)}\0".encode())
    h.update(APT_SOURCES.read_bytes() if APT_SOURCES.is_file() else b"default mirror")
    return h.hexdigest()[:16]


def build_base(*, echo: Echo = _noop) -> Path:
    """The bootstrapped base root file system as a tar (cached by its package list and apt sources)."""
    target = image_dir() / f"base-{SUITE}-{base_key()}.tar"
    if target.is_file():
        echo(f"base image: using cached {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # mmdebstrap picks its output format from the name: the partial file must end in .tar too.
    tmp = target.with_name(f"{target.stem}.{os.getpid()}.partial.tar")
    tmp.unlink(missing_ok=True)
    mirror = [str(APT_SOURCES)] if APT_SOURCES.is_file() else []
    echo(f"bootstrapping the base image ({SUITE} minbase + {' '.join(BASE_PACKAGES)}) with mmdebstrap")
    started = time.monotonic()
    _run(
        [
            "mmdebstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            "--aptopt=Acquire::Languages none",
            # Documentation and translations are not needed in a container.
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            SUITE,
            str(tmp),
            *mirror,
        ],
        "mmdebstrap",
        log=image_dir() / "base.log",
    )
    tmp.replace(target)
    echo(f"base image bootstrapped in {time.monotonic() - started:.0f}s ({target.stat().st_size >> 20} MiB)")
    return target


def agent_key(context: Path) -> str:
    h = hashlib.sha256(base_key().encode())
    _hash_files(h, context, ("Dockerfile", *CONTEXT_PATHS))
    return h.hexdigest()[:16]


def build_agent_image(context: Path | None = None, *, echo: Echo = _noop) -> Image:
    """Build ``Dockerfile`` from ``context`` (default: this checkout) on the local base; cached by inputs."""
    # TESTBED_IMAGE_CONTEXT: build another tree (e.g. a clean `git archive` of HEAD) instead of this one.
    context = (context or Path(os.environ.get("TESTBED_IMAGE_CONTEXT") or repo_root())).resolve()
    key = agent_key(context)
    ref = f"{IMAGE_REPOSITORY}:{key}"
    target = image_dir() / f"model-agent-{key}.oci.tar"
    if target.is_file():
        echo(f"agent image: using cached {target} ({ref})")
        return Image(target, ref)
    base = build_base(echo=echo)
    # Its own storage per build: two builds at once (two checkouts, two engineers) never share one.
    image_dir().mkdir(parents=True, exist_ok=True)
    storage = Path(tempfile.mkdtemp(prefix="buildah-", dir=image_dir()))
    buildah = [
        "buildah",
        "--root",
        str(storage / "root"),
        "--runroot",
        str(storage / "run"),
        "--storage-driver",
        "vfs",
    ]
    log = image_dir() / f"model-agent-{key}.build.log"
    started = time.monotonic()
    try:
        container = _run([*buildah, "from", "scratch"], "buildah from scratch").strip()
        _run([*buildah, "add", container, str(base), "/"], "buildah add (base root file system)")
        _run(
            [
                *buildah,
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                container,
            ],
            "buildah config",
        )
        _run([*buildah, "commit", "--rm", container, BASE_REF], "buildah commit (base)")
        echo("building the agent image from Dockerfile with buildah (pip installs the pinned wheels)")
        _run(
            [
                *buildah,
                "bud",
                "--isolation",
                "chroot",
                "--network",
                "host",
                "--layers=false",
                # The host's trust store for pip's HTTPS (a TLS-inspecting egress proxy's CA lives there);
                # a build-time mount only, never part of an image layer.
                *(["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if Path(HOST_CA_BUNDLE).is_file() else []),
                "--build-arg",
                f"PYTHON_IMAGE={BASE_REF}",
                "--tag",
                ref,
                "--file",
                str(context / "Dockerfile"),
                str(context),
            ],
            "buildah bud",
            log=log,
        )
        tmp = target.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        _run([*buildah, "push", ref, f"oci-archive:{tmp}:{ref}"], "buildah push (oci-archive)")
        tmp.replace(target)
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    info = {"ref": ref, "build_seconds": round(time.monotonic() - started, 1), "bytes": target.stat().st_size}
    (image_dir() / f"model-agent-{key}.json").write_text(json.dumps(info, indent=2))
    echo(f"agent image {ref} built in {info['build_seconds']:.0f}s ({target.stat().st_size >> 20} MiB)")
    return Image(target, ref)


def build_pause_image(pause_binary: Path, *, echo: Echo = _noop) -> Image:
    """The node's sandbox image: the ``pause`` binary alone, as an OCI archive (cached by its digest)."""
    data = pause_binary.read_bytes()
    key = hashlib.sha256(data).hexdigest()[:16]
    target = image_dir() / f"pause-{key}.oci.tar"
    if not target.is_file():
        oci.write_archive(target, ref=PAUSE_REF, files=[oci.LayerFile("pause", data)], entrypoint=["/pause"])
        echo(f"pause image written to {target}")
    return Image(target, PAUSE_REF)


# --------------------------------------------------------------------------------------- inspection


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    if member is None:
        raise ImageError(f"blob {digest} missing from the archive")
    return member.read()


def read_manifest(archive: Path) -> tuple[dict[str, object], dict[str, object], list[bytes]]:
    """(manifest, config, layer tars uncompressed) of the single image in an OCI archive."""
    with tarfile.open(archive) as tar:
        index = json.loads(_blob_or_file(tar, "index.json"))
        manifest = json.loads(_blob(tar, index["manifests"][0]["digest"]))
        config = json.loads(_blob(tar, manifest["config"]["digest"]))
        layers = []
        for layer in manifest["layers"]:
            raw = _blob(tar, layer["digest"])
            layers.append(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return manifest, config, layers


def _blob_or_file(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    if member is None:
        raise ImageError(f"{name} missing from the archive")
    return member.read()


def file_list(layers: Iterable[bytes]) -> set[str]:
    """Paths in the image's final file system, with OCI whiteouts applied (``.wh.`` files, opaque dirs)."""
    paths: set[str] = set()
    for layer in layers:
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            for member in tar.getmembers():
                name = "/" + member.name.strip("./").lstrip("/")
                base = name.rsplit("/", 1)
                if base[-1] == ".wh..wh..opq":
                    parent = base[0] + "/"
                    paths = {p for p in paths if not p.startswith(parent)}
                elif base[-1].startswith(".wh."):
                    gone = base[0] + "/" + base[-1].removeprefix(".wh.")
                    paths = {p for p in paths if p != gone and not p.startswith(gone + "/")}
                else:
                    paths.add(name)
    return paths
