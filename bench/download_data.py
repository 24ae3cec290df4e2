"""The fake model of the download benchmark: seeded random files, their manifest, and the per-workload buckets.

Role: write (once, cached by a parameter stamp) a directory of files shaped like a model repository —
``--shards`` x ``--shard-mib`` plus one ``--big-mib`` file named ``*.safetensors``, and 20 small JSON /
tokenizer files of 1-500 KiB — with a manifest of size, sha256, MD5 and git blob sha1 per file. Content
comes from a seeded generator, so digests are stable across machines and runs. Every workload gets its own
"bucket" (a directory of hard links into the data, so the page cache holds each byte once): ``w1`` the big
file, ``w2`` everything, ``w3`` the small files. :func:`warm` reads everything once so the origin serves
from page cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

MiB = 1024 * 1024
KiB = 1024
SMALL_FILE_NAMES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "preprocessor_config.json",
    "chat_template.json",
    "model.safetensors.index.json",
    "README.md",
    "LICENSE",
    "tokenizer.model.json",
    "processor_config.json",
    "quant_config.json",
    "params.json",
    "configuration.json",
    "trainer_state.json",
    "training_args.json",
)
BUCKETS = ("w1", "w2", "w3")


@dataclass(frozen=True)
class DataFile:
    path: str
    size: int
    sha256: str
    md5: str
    git_sha1: str
    lfs: bool  # published as an LFS file on the Hub face (sha256 as lfs.oid)


@dataclass(frozen=True)
class DataSet:
    root: Path  # the data directory (files by name)
    origin: Path  # the buckets: origin/<bucket>/<file> are hard links into root
    files: tuple[DataFile, ...]
    big: str  # name of the big file (W1, W4-W6)

    def bucket(self, name: str) -> list[DataFile]:
        if name == "w1":
            return [f for f in self.files if f.path == self.big]
        if name == "w3":
            return [f for f in self.files if not f.lfs]
        return list(self.files)

    def by_path(self, path: str) -> DataFile:
        return next(f for f in self.files if f.path == path)


def _random_file(path: Path, size: int, seed: int) -> DataFile:
    """Write ``size`` seeded random bytes; digests computed while writing."""
    rng = random.Random(seed)
    sha, md5, git = hashlib.sha256(), hashlib.md5(usedforsecurity=False), hashlib.sha1(usedforsecurity=False)
    git.update(f"blob {size}\0".encode())
    left = size
    with path.open("wb") as fh:
        while left:
            block = rng.randbytes(min(4 * MiB, left))
            for h in (sha, md5, git):
                h.update(block)
            fh.write(block)
            left -= len(block)
    return DataFile(path.name, size, sha.hexdigest(), md5.hexdigest(), git.hexdigest(), path.suffix == ".safetensors")


def _small_file(path: Path, size: int, seed: int) -> DataFile:
    """A JSON-ish text file of exactly ``size`` bytes (hex of seeded random data inside a JSON string)."""
    rng = random.Random(seed)
    head, tail = b'{"data": "', b'"}\n'
    body = rng.randbytes((size - len(head) - len(tail) + 1) // 2).hex().encode()[: size - len(head) - len(tail)]
    data = head + body + tail
    path.write_bytes(data)
    git = hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False)
    return DataFile(
        path.name,
        len(data),
        hashlib.sha256(data).hexdigest(),
        hashlib.md5(data, usedforsecurity=False).hexdigest(),
        git.hexdigest(),
        False,
    )


def generate(work: Path, *, big_mib: int, shard_mib: int, shards: int, seed: int = 20261129) -> DataSet:
    """Create (or reuse, when the stamp matches) the data set under ``work/data``; link the buckets."""
    root = work / "data"
    stamp = {"big_mib": big_mib, "shard_mib": shard_mib, "shards": shards, "seed": seed, "small": len(SMALL_FILE_NAMES)}
    manifest_path = root / "manifest.json"
    big = f"model-{shards + 1:05d}-of-{shards + 1:05d}.safetensors"
    files: list[DataFile] | None = None
    if manifest_path.exists():
        saved = json.loads(manifest_path.read_text())
        if saved.get("stamp") == stamp and all(
            (root / f["path"]).is_file() and (root / f["path"]).stat().st_size == f["size"] for f in saved["files"]
        ):
            files = [DataFile(**f) for f in saved["files"]]
    if files is None:
        root.mkdir(parents=True, exist_ok=True)
        for old in root.iterdir():
            old.unlink()
        files = []
        for i in range(shards):
            name = f"model-{i + 1:05d}-of-{shards + 1:05d}.safetensors"
            files.append(_random_file(root / name, shard_mib * MiB, seed + i))
        files.append(_random_file(root / big, big_mib * MiB, seed + 1000))
        small_rng = random.Random(seed + 2000)
        for j, name in enumerate(SMALL_FILE_NAMES):
            size = small_rng.randint(1 * KiB, 500 * KiB)
            files.append(_small_file(root / name, size, seed + 3000 + j))
        manifest_path.write_text(json.dumps({"stamp": stamp, "files": [asdict(f) for f in files]}, indent=1))
    data = DataSet(root=root, origin=work / "origin", files=tuple(files), big=big)
    _link_buckets(data)
    return data


def _link_buckets(data: DataSet) -> None:
    for bucket in BUCKETS:
        folder = data.origin / bucket
        folder.mkdir(parents=True, exist_ok=True)
        wanted = {f.path for f in data.bucket(bucket)}
        for old in folder.iterdir():
            if old.name not in wanted or not old.samefile(data.root / old.name):
                old.unlink()
        for name in wanted:
            if not (folder / name).exists():
                os.link(data.root / name, folder / name)


def warm(data: DataSet) -> None:
    """Read every file once so the origin serves from page cache."""
    buf = bytearray(8 * MiB)
    for f in data.files:
        with (data.root / f.path).open("rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
