"""The contract every storage source implements, and the publish step they share.

A source turns a :class:`FetchRequest` into verified files in a staging directory and returns the list of
:class:`~model_agent.local.manifest.FileRecord` it produced. It never writes outside ``staging``; the shared
:func:`publish` then renames each staged file into the destination (same filesystem), fsyncs, and removes
files the previous manifest owned that the new revision no longer has. The caller writes the manifest last.

Errors are :class:`SourceError` with a short machine ``reason`` (``RepositoryNotFound``, ``SecretNotFound``,
``VerificationFailed``, ...) and a human message; both end up in the model's ``Failed`` status and Event.
Sources must be cancellable: between files at the least.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from model_agent.local.manifest import FileRecord, Manifest, fsync_dir


class SourceError(Exception):
    def __init__(self, reason: str, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retryable = retryable


@dataclass
class Progress:
    phase: str = "scanning"
    total_bytes: int = 0
    completed_bytes: int = 0
    total_files: int = 0
    completed_files: int = 0


ProgressFn = Callable[[Progress], None]


@dataclass
class FetchRequest:
    storage_uri: str
    dest: Path
    staging: Path
    previous: Manifest | None
    token: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    on_progress: ProgressFn = lambda _p: None


@dataclass
class FetchResult:
    revision: str
    files: list[FileRecord]
    # Files already present in ``dest`` (reused from the previous manifest) are listed in ``files`` too.
    staged: list[str] = field(default_factory=list)


class Source(Protocol):
    async def fetch(self, request: FetchRequest) -> FetchResult: ...


def publish(request: FetchRequest, result: FetchResult) -> list[FileRecord]:
    """Move staged files into place and return the final records (with the published mtimes).

    When the destination does not exist yet, the whole staging directory (every file verified) is renamed
    into place in one step, so the model appears complete or not at all; otherwise file by file.
    """
    dest = request.dest
    touched_dirs: set[Path] = set()
    if not dest.exists() and not dest.is_symlink() and len(result.staged) == len(result.files):
        shutil.rmtree(request.staging / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(request.staging, dest)
        fsync_dir(dest.parent)
        return [_published(dest, f) for f in result.files]
    dest.mkdir(parents=True, exist_ok=True)
    for rel in result.staged:
        src = request.staging / rel
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, target)
        touched_dirs.add(target.parent)
    wanted = {f.path for f in result.files}
    if request.previous is not None and Path(request.previous.dest) == dest:
        for old in request.previous.files:
            if old.path not in wanted:
                with contextlib.suppress(FileNotFoundError):
                    (dest / old.path).unlink()
                    touched_dirs.add((dest / old.path).parent)
    for d in touched_dirs:
        fsync_dir(d)
    final = [_published(dest, f) for f in result.files]
    shutil.rmtree(request.staging, ignore_errors=True)
    return final


def _published(dest: Path, f: FileRecord) -> FileRecord:
    st = (dest / f.path).stat()
    return FileRecord(f.path, f.size, f.sha256, f.git_sha1, st.st_mtime_ns)
