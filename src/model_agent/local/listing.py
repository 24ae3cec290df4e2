"""What a ``local://`` directory held when it was adopted: a bounded listing for its manifest.

The agent never owns ``local://`` files, but a label says ``Ready`` only while the weights are there, so the
manifest records the files found (relative path, size, mtime; no hash — nothing is read) and the fast check
(:meth:`~model_agent.local.manifest.Manifest.fast_check`) notices a vanished directory or removed files on
the next reconcile, as it does for fetched models.

Contract: :func:`list_local_files` walks the tree below ``dest`` in sorted order without following
directory symlinks (a symlinked file is recorded by what it points at), skips names starting with ``.``
(tool caches such as ``.cache/huggingface`` change on their own), and stops after ``max_files`` files or
``max_dirs`` directories, so a model pointed at a huge tree costs a bounded walk. Unreadable entries are
skipped. It never raises for a missing or unreadable ``dest``: the listing is then empty.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from model_agent.local.manifest import FileRecord

MAX_FILES = 2000
MAX_DIRS = 2000


def list_local_files(dest: Path, *, max_files: int = MAX_FILES, max_dirs: int = MAX_DIRS) -> list[FileRecord]:
    """The bounded listing of an adopted ``local://`` tree (see the module contract); never raises."""
    records: list[FileRecord] = []
    pending: list[str] = [""]  # relative directories still to read, depth first in sorted order
    dirs_read = 0
    while pending and len(records) < max_files and dirs_read < max_dirs:
        rel_dir = pending.pop()
        dirs_read += 1
        try:
            with os.scandir(dest / rel_dir if rel_dir else dest) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs: list[str] = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(rel)
                    continue
                st = entry.stat(follow_symlinks=True)
            except OSError:
                continue  # a broken symlink or a file that went away while listing
            if not stat.S_ISREG(st.st_mode):
                continue
            records.append(FileRecord(path=rel, size=st.st_size, mtime_ns=st.st_mtime_ns))
            if len(records) >= max_files:
                break
        pending.extend(reversed(subdirs))  # pop() takes them in sorted order
    return records
