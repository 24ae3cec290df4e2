"""Quarantine: weights are never deleted in one step.

A confirmed removal renames the model directory into ``<root>/.model-agent/trash/<id>/data`` (same
filesystem: atomic, no copy) next to ``<id>/entry.json``, which keeps the model's manifest and the time it
was quarantined. Within the grace period a model that comes back with the same source is restored by
renaming the directory back; after it, :meth:`Trash.purge_expired` deletes it for real.

Contract: the entry file is written before the rename of the data and removed after the rename back, so a
kill at any instant leaves either the data in place, or the data in the trash with its entry (an entry
whose data is missing is cleaned up by purge).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_agent.local.layout import Layout, PathRefused, Root, token_for
from model_agent.local.manifest import Manifest, fsync_dir, write_atomic


@dataclass
class TrashEntry:
    id: str
    root: Root
    manifest: Manifest
    quarantined_at: float
    reason: str

    @property
    def directory(self) -> Path:
        return self.root.trash / self.id

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "key": self.manifest.key,
            "uid": self.manifest.uid,
            "storageUri": self.manifest.storage_uri,
            "dest": self.manifest.dest,
            "revision": self.manifest.revision,
            "bytes": self.manifest.total_bytes,
            "quarantinedAt": self.quarantined_at,
            "reason": self.reason,
        }


class Trash:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def _confined(self, dest: Path) -> None:
        """Re-check, right before a rename, that no directory above ``dest`` became a symlink out of the roots.

        ``rename`` does not follow a symlink in its last component, but it does in the directories above it;
        validation happened earlier, so the check is repeated here to narrow the window to this instant.
        """
        self.layout.confine(str(dest.parent / "x"))
        if dest.parent.resolve() != dest.parent:
            raise PathRefused(f"{dest.parent} resolves elsewhere ({dest.parent.resolve()}); not moving through it")

    def quarantine(self, manifest: Manifest, root: Root, reason: str) -> TrashEntry | None:
        """Move ``manifest.dest`` into the trash; None when there was nothing on disk to move."""
        dest = Path(manifest.dest)
        self._confined(dest)
        if not dest.exists() and not dest.is_symlink():
            return None
        now = time.time()
        base = f"{int(now)}-{token_for(manifest.key)[:12]}"
        for n in itertools.count():
            # The same model can be quarantined twice within one second (superseded, then removed).
            entry = TrashEntry(base if n == 0 else f"{base}-{n}", root, manifest, now, reason)
            try:
                entry.directory.mkdir(parents=True, exist_ok=False)
                break
            except FileExistsError:
                continue
        record = {"manifest": json.loads(manifest.to_json()), "quarantinedAt": now, "reason": reason}
        write_atomic(entry.directory / "entry.json", json.dumps(record).encode())
        os.rename(dest, entry.data)
        fsync_dir(dest.parent)
        fsync_dir(entry.directory)
        return entry

    def entries(self) -> Iterator[TrashEntry]:
        for root in self.layout.roots:
            if not root.trash.is_dir():
                continue
            for directory in sorted(root.trash.iterdir()):
                try:
                    raw = json.loads((directory / "entry.json").read_text())
                    manifest = Manifest.from_json(json.dumps(raw["manifest"]))
                    yield TrashEntry(directory.name, root, manifest, float(raw["quarantinedAt"]), str(raw["reason"]))
                except (OSError, ValueError, KeyError, TypeError):
                    continue

    def find_restorable(
        self,
        storage_uri: str,
        dest: str,
        revision: str | None = None,
        *,
        accept: Callable[[Manifest], bool] | None = None,
    ) -> TrashEntry | None:
        """The newest entry holding this source for this destination, with its data present.

        With ``accept``, only an entry whose manifest it accepts (the reconciler restores only to the owner
        that fetched the copy: :func:`model_agent.agent.ownership.may_restore`).
        """
        best: TrashEntry | None = None
        for entry in self.entries():
            m = entry.manifest
            if m.storage_uri != storage_uri or m.dest != dest or not entry.data.exists():
                continue
            if accept is not None and not accept(m):
                continue
            if revision is not None and m.revision != revision:
                continue
            if best is None or entry.quarantined_at > best.quarantined_at:
                best = entry
        return best

    def restore(self, entry: TrashEntry) -> None:
        """Rename the data back to its destination (which must not exist) and drop the entry."""
        dest = Path(entry.manifest.dest)
        self._confined(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._confined(dest)
        os.rename(entry.data, dest)
        fsync_dir(dest.parent)
        shutil.rmtree(entry.directory, ignore_errors=True)

    def purge(self, entry: TrashEntry) -> None:
        # Remove the data first, the entry last: a kill in between leaves an entry without data,
        # which the next purge removes.
        if entry.data.exists():
            shutil.rmtree(entry.data, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (entry.directory / "entry.json").unlink()
        shutil.rmtree(entry.directory, ignore_errors=True)

    def purge_expired(self, grace_s: float, now: float | None = None) -> list[TrashEntry]:
        now = time.time() if now is None else now
        purged = []
        for entry in self.entries():
            if now - entry.quarantined_at >= grace_s:
                self.purge(entry)
                purged.append(entry)
        return purged
