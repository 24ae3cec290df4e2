"""A minimal OCI image writer: files in, an ``oci-archive`` tarball out (for images no tool needs to build).

Role: the test bed's node needs a sandbox ("pause") image, and no registry is reachable. This writes a
single-layer image as an OCI image layout packed in one tar (what ``ctr images import`` and
``buildah pull oci-archive:`` read), with the ``org.opencontainers.image.ref.name`` annotation carrying
the tag so an import names it.

Contract: deterministic output for the same input (fixed mtimes, sorted entries, no gzip timestamps), so
the cached archive is only rewritten when its content changes. Only regular files and directories.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class LayerFile:
    """One file of a layer: its path inside the image, its bytes and mode."""

    path: str
    data: bytes
    mode: int = 0o755


def _layer_tar(files: Sequence[LayerFile]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        seen_dirs: set[str] = set()
        for f in sorted(files, key=lambda f: f.path):
            parts = f.path.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in seen_dirs:
                    seen_dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode, info.mtime = len(f.data), f.mode, 0
            tar.addfile(info, io.BytesIO(f.data))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def write_archive(
    target: Path,
    *,
    ref: str,
    files: Sequence[LayerFile],
    entrypoint: Sequence[str],
    user: str = "65535:65535",
) -> str:
    """Write a one-layer linux/amd64 image tagged ``ref`` to ``target``; return the manifest digest."""
    layer = _layer_tar(files)
    layer_gz = gzip.compress(layer, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "User": user},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }
    config_bytes = _canonical(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": _digest(layer_gz), "size": len(layer_gz)}],
    }
    manifest_bytes = _canonical(manifest)
    manifest_digest = _digest(manifest_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"org.opencontainers.image.ref.name": ref, "io.containerd.image.name": ref},
            }
        ],
    }
    blobs = {_digest(b): b for b in (layer_gz, config_bytes, manifest_bytes)}
    entries: list[tuple[str, bytes]] = [
        ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
        ("index.json", _canonical(index)),
    ]
    entries += [(f"blobs/sha256/{d.removeprefix('sha256:')}", b) for d, b in sorted(blobs.items())]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(target)
    return manifest_digest
