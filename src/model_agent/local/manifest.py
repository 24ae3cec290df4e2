"""Manifests: the agent's durable record of each model it holds on this node.

A manifest is written only after every file of a fetch was verified, fsynced and renamed into place, so
its existence means "these exact bytes were complete and verified at publish time". It records the model
identity (key and UID), the source (URI and resolved revision), the destination, whether the agent owns
the files (it fetched them, so it may quarantine them), every file with size, hash and mtime, and the
metadata parsed from the files (so a restart needs no re-parse). It also carries two facts for the one
destructive path: ``reserved`` (the object had ``models.ome/reserve-model-artifact`` when it was last
published Ready, so its weights are kept even once the object is gone) and ``removing`` (a removal was
decided and has begun: the durable intent a restart finds and completes after confirming again).

Contract: writes are atomic (temp file, fsync, rename, fsync of the directory); a garbled manifest reads as
absent-with-a-problem, never as an exception out of :meth:`ManifestStore.load`. Fields a manifest lacks take
their defaults (older manifests load); fields this version does not know are ignored (newer ones load). A
fast check compares size and mtime of every recorded file with the disk (no hashing); full verification
re-hashes. :meth:`ManifestStore.count` is cheap (no file is read: one ``stat`` of each manifests
directory, and a listing of its names only when that directory changed) and current: the delete breaker
takes it as the denominator of every decision, and on a shared root without ``--state-dir`` the manifests
directory is written by every node's agent. A count cached from this process's own saves and deletes alone
would miss the peers' deletes and stay too high, and a breaker dividing by too many models opens too late
(a storm that removes most of the remaining models reads as a small share of a count that no longer exists).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import socket
import threading
import time
import types
import typing
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from model_agent.local.layout import Layout, Root, token_for
from model_agent.model import json_text

MANIFEST_VERSION = 1
# A directory listing taken this long after the directory's mtime cannot have missed a change that kept that
# mtime (coarse timestamps tick in at most a second; the margin also covers a small clock skew to a file server).
_SETTLED_NS = 2_000_000_000


@dataclass(frozen=True)
class FileRecord:
    """One published file: what the fast check compares (size, mtime) and the hashes a full verification uses."""

    path: str  # relative, posix
    size: int
    sha256: str | None = None
    git_sha1: str | None = None
    mtime_ns: int = 0
    # The source's version tag of the object the file came from (an S3 ETag), when it has one: lets the
    # next fetch reuse the file without hashing it. Manifests written before this field load with None.
    etag: str | None = None


@dataclass
class Manifest:
    """The durable record of one published model (see the module contract)."""

    key: str
    uid: str
    storage_uri: str
    dest: str
    revision: str = ""
    generation: int = 0
    source_type: str = ""
    owned: bool = True
    files: list[FileRecord] = field(default_factory=list)
    metadata: dict[str, Any] | None = None
    published_at: float = 0.0
    verified_at: float = 0.0
    version: int = MANIFEST_VERSION
    # ``models.ome/reserve-model-artifact`` as last published Ready: a removal keeps these weights even when
    # the object is already gone (a plain delete leaves nothing else to read it from). Absent in old manifests.
    reserved: bool = False
    # Non-empty once a removal of this model was decided (why): the intent, written before the label goes.
    removing: str = ""
    # Who fetched these files (agent.ownership.Owner.fingerprint: namespace, URI, Secret name, parameters):
    # a trashed copy is restored only to its owner. "" in manifests written before it (own key only).
    owner: str = ""
    # Files a re-hash found damaged -> the mtime they had then (``local.verify.mark_damaged``): a shared root's
    # publication that still describes that very file is never adopted in place of a refetch. Empty once a
    # fetch records the repaired files.
    damaged: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """The model's size on disk as published: the sum of its files."""
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        """The on-disk form: sorted keys, so two saves of one manifest are the same bytes."""
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Read a saved manifest, ignoring fields this version does not know (a newer agent's manifests load).

        ValueError or TypeError for any text that is not a manifest: not JSON, not an object, or a known field of
        another type than declared (see :func:`_known_fields`); the callers treat either as an unreadable record.
        """
        raw = json_text.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"a manifest is a JSON object, not {type(raw).__name__}")
        files = raw.pop("files", [])
        if not isinstance(files, list):
            raise TypeError(f"manifest files: a list, not {type(files).__name__}")
        return cls(files=[FileRecord(**_known_fields(FileRecord, f)) for f in files], **_known_fields(cls, raw))

    def fast_check(self) -> list[str]:
        """Problems found by stat alone (missing file, size or mtime changed); empty when intact."""
        problems: list[str] = []
        dest = Path(self.dest)
        for f in self.files:
            try:
                st = (dest / f.path).stat()
            except (OSError, ValueError):  # ValueError: a path no file can have (a NUL, a lone surrogate)
                problems.append(f"{f.path}: missing")
                continue
            if st.st_size != f.size:
                problems.append(f"{f.path}: size {st.st_size} != {f.size}")
            elif f.mtime_ns and st.st_mtime_ns != f.mtime_ns:
                problems.append(f"{f.path}: modified")
        return problems


_INT64_LIMIT = 2**63


def _declared_types(cls: type[Any]) -> dict[str, tuple[type, ...]]:
    """Each field of a dataclass with the JSON types it takes (``X | None`` is both, ``list[...]`` a list)."""
    hints = typing.get_type_hints(cls)
    declared: dict[str, tuple[type, ...]] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        declared[f.name] = tuple(typing.get_origin(m) or m for m in members)
    return declared


_DECLARED: dict[type[Any], dict[str, tuple[type, ...]]] = {c: _declared_types(c) for c in (Manifest, FileRecord)}


def _fits(value: object, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # an int to isinstance, never one to a reader
        return bool in kinds
    if isinstance(value, int):  # a float field takes an integer literal too
        return (int in kinds or float in kinds) and -_INT64_LIMIT <= value < _INT64_LIMIT
    if isinstance(value, float):
        return float in kinds and math.isfinite(value)
    return isinstance(value, kinds)


def _known_fields(cls: type[Any], doc: object) -> dict[str, Any]:
    """The fields of ``doc`` (a decoded JSON object) that ``cls`` declares; unknown ones are dropped (a newer
    version's). TypeError when ``doc`` is not an object or a known field is not of its declared type (a bool
    where an int belongs, an integer beyond int64, a non-finite float, a list where a string belongs...)."""
    if not isinstance(doc, dict):
        raise TypeError(f"a {cls.__name__} is a JSON object, not {type(doc).__name__}")
    declared = _DECLARED[cls]
    known: dict[str, Any] = {}
    for name, value in doc.items():
        kinds = declared.get(name)
        if kinds is None:
            continue
        if not _fits(value, kinds):
            expected = " | ".join(k.__name__ for k in kinds)
            raise TypeError(f"{cls.__name__}.{name}: {type(value).__name__} is not {expected}")
        known[name] = value
    return known


def file_digest(path: Path, chunk: int = 8 * 1024 * 1024) -> tuple[str, str]:
    """(sha256, git blob sha1) of one file, read once."""
    sha = hashlib.sha256()
    size = path.stat().st_size
    git = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            sha.update(block)
            git.update(block)
    return sha.hexdigest(), git.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable: without it a crash may forget the directory entry."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a reader (or a restart) sees the old bytes or the new, never a mix."""
    # The host name too: on a models root shared by many nodes, each node's agent may well be pid 1; and the
    # thread, since two worker threads of one agent may write one record at once (the last rename wins whole).
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    fsync_dir(path.parent)


class ManifestStore:
    """All manifests across the allowed roots, addressed by model key."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.problems: dict[str, str] = {}  # file -> why it could not be read
        # Per manifests directory: (its mtime when listed, the manifest names then). Valid while the directory's
        # mtime is unchanged: any create, rename or unlink in it — by this process or by another node's agent
        # on a shared root — changes it. Guarded: count may be asked from worker threads too.
        self._listings: dict[Path, tuple[int, frozenset[str]]] = {}
        self._names_lock = threading.Lock()

    def _file(self, root: Root, key: str) -> Path:
        return root.manifests / f"{token_for(key)}.json"

    def load(self, key: str) -> Manifest | None:
        """The manifest of ``key`` from whichever root holds it, or None (an unreadable one too: see ``problems``)."""
        for root in self.layout.roots:
            path = self._file(root, key)
            if path.exists():
                return self._read(path)
        return None

    def _read(self, path: Path) -> Manifest | None:
        try:
            manifest = Manifest.from_json(path.read_text())
        except (OSError, ValueError, TypeError, KeyError) as exc:
            self.problems[str(path)] = f"unreadable manifest: {exc}"
            return None
        self.problems.pop(str(path), None)
        return manifest

    def save(self, manifest: Manifest, root: Root) -> None:
        """Write ``manifest`` atomically under ``root``, and drop any copy in another root: one record per model."""
        for other in self.layout.roots:  # a model moved between roots keeps one record
            if other != root:
                with contextlib.suppress(FileNotFoundError):
                    self._file(other, manifest.key).unlink()
        if not manifest.published_at:
            manifest.published_at = time.time()
        write_atomic(self._file(root, manifest.key), manifest.to_json().encode())

    def delete(self, key: str) -> None:
        """Forget ``key`` in every root, durably; deleting what is not there is harmless."""
        for root in self.layout.roots:
            path = self._file(root, key)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                fsync_dir(path.parent)

    def count(self) -> int:
        """How many models have a manifest now (unreadable ones included), without reading any.

        Current whoever wrote the directory (see the module contract): a listing is reused only while its
        directory's mtime is unchanged and was taken clearly after that mtime, since on a filesystem with
        coarse timestamps a change within the same tick as the listing keeps the mtime it had.
        """
        names: set[str] = set()
        with self._names_lock:
            for root in self.layout.roots:
                names |= self._listing(root.manifests)
        return len(names)

    def _listing(self, directory: Path) -> frozenset[str]:
        try:
            mtime = directory.stat().st_mtime_ns
        except OSError:
            self._listings.pop(directory, None)
            return frozenset()
        cached = self._listings.get(directory)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        listed_at = time.time_ns()
        try:
            names = frozenset(e.name for e in os.scandir(directory) if e.name.endswith(".json") and e.is_file())
        except OSError:
            return frozenset()
        if listed_at - mtime > _SETTLED_NS:
            self._listings[directory] = (mtime, names)
        else:  # changed within the racy window: list again next time rather than trust this mtime
            self._listings.pop(directory, None)
        return names

    def all(self) -> Iterator[Manifest]:
        """Every readable manifest of every root; unreadable ones are skipped and listed in ``problems``."""
        for root in self.layout.roots:
            if not root.manifests.is_dir():
                continue
            for path in sorted(root.manifests.glob("*.json")):
                manifest = self._read(path)
                if manifest is not None:
                    yield manifest
