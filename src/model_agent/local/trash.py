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
from model_agent.model import json_text


@dataclass
class TrashEntry:
    """One quarantined model: its manifest as it was, when and why it was moved, and where its data waits."""

    id: str
    root: Root
    manifest: Manifest
    quarantined_at: float
    reason: str

    @property
    def directory(self) -> Path:
        """The entry's own directory: ``entry.json`` and ``data/``."""
        return self.root.trash / self.id

    @property
    def data(self) -> Path:
        """The quarantined model directory, renamed here whole."""
        return self.directory / "data"

    def to_json(self) -> dict[str, Any]:
        """The entry as ``/status`` and ``model-agent trash list`` show it."""
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


PURGING = "purging"  # <id>/purging: data being deleted by a purge (no longer restorable)


@dataclass(frozen=True)
class _Summary:
    """What :meth:`Trash.find_restorable` filters on, remembered per entry so a decision reads no entry file."""

    stamp: tuple[int, int, int]  # entry.json's (inode, mtime_ns, size): a rewritten or reused entry re-reads
    storage_uri: str
    dest: str
    revision: str
    quarantined_at: float


class Trash:
    """The trash of every root (see the module contract): quarantine, restore, and purge after the grace period."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._summaries: dict[Path, _Summary] = {}  # entry directory -> summary

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
        """Every entry of every root with a readable ``entry.json``, in name order within a root."""
        for root in self.layout.roots:
            if not root.trash.is_dir():
                continue
            for directory in sorted(root.trash.iterdir()):
                entry = self._load(root, directory)
                if entry is not None:
                    yield entry

    @staticmethod
    def _load(root: Root, directory: Path) -> TrashEntry | None:
        try:
            raw = json_text.loads((directory / "entry.json").read_text())
            manifest = Manifest.from_json(json.dumps(raw["manifest"]))
            return TrashEntry(directory.name, root, manifest, float(raw["quarantinedAt"]), str(raw["reason"]))
        except (OSError, ValueError, KeyError, TypeError, OverflowError):  # garbled: not an entry
            return None

    def _candidates(self, storage_uri: str, dest: str) -> list[tuple[float, Root, Path]]:
        """Entries whose summary names this source and destination, newest first.

        Cost per call: one directory listing and one ``stat`` per entry; an entry file is read only when it
        is new or changed (a reconcile decision asks this for every model, and entry files hold whole
        manifests). A summary can be stale only by naming a wrong entry, which the caller's fresh load
        rejects: it never makes a wrong entry restorable.
        """
        found: list[tuple[float, Root, Path]] = []
        seen: set[Path] = set()
        for root in self.layout.roots:
            try:
                names = os.listdir(root.trash)
            except OSError:
                continue
            for name in names:
                directory = root.trash / name
                seen.add(directory)
                summary = self._summary(root, directory)
                if summary is not None and summary.storage_uri == storage_uri and summary.dest == dest:
                    found.append((summary.quarantined_at, root, directory))
        for gone in set(self._summaries) - seen:
            del self._summaries[gone]
        found.sort(key=lambda c: c[0], reverse=True)
        return found

    def _summary(self, root: Root, directory: Path) -> _Summary | None:
        try:
            st = (directory / "entry.json").stat()
        except OSError:
            self._summaries.pop(directory, None)
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._summaries.get(directory)
        if known is not None and known.stamp == stamp:
            return known
        entry = self._load(root, directory)
        if entry is None:
            return None
        m = entry.manifest
        summary = _Summary(stamp, m.storage_uri, m.dest, m.revision or "", entry.quarantined_at)
        self._summaries[directory] = summary
        return summary

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
        for _, root, directory in self._candidates(storage_uri, dest):
            entry = self._load(root, directory)  # fresh: the summary only chose where to look
            if entry is None:
                continue
            m = entry.manifest
            if m.storage_uri != storage_uri or m.dest != dest or not entry.data.exists():
                continue
            if accept is not None and not accept(m):
                continue
            if revision is not None and m.revision != revision:
                continue
            return entry
        return None

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
        """Delete an entry for good. Safe to run in a thread while the event loop restores entries.

        The data is first renamed to ``<id>/purging`` (atomic): from then on a restore cannot find it
        (``find_restorable`` checks ``data`` exists, and a restore's rename fails), and a restore that won the
        race has already moved it out, so this rename fails and nothing restored is touched — a plain rmtree of
        ``data`` could go on deleting files in a directory renamed back to its destination mid-walk. Then the
        data is deleted, the entry file last: a kill in between leaves an entry without data (or a half-deleted
        ``purging``), which the next purge removes.
        """
        doomed = entry.directory / PURGING
        with contextlib.suppress(FileNotFoundError):  # restored meanwhile, or a purge interrupted after this
            os.rename(entry.data, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (entry.directory / "entry.json").unlink()
        shutil.rmtree(entry.directory, ignore_errors=True)

    def purge_expired(
        self, grace_s: float, now: float | None = None, *, keep_going: Callable[[], bool] | None = None
    ) -> list[TrashEntry]:
        """Purge every entry older than ``grace_s``; blocking (whole models), so callers run it in a thread.

        ``keep_going`` is asked before each entry; False stops the pass (the delete breaker opened).
        """
        now = time.time() if now is None else now
        purged = []
        for entry in self.entries():
            if now - entry.quarantined_at < grace_s:
                continue
            if keep_going is not None and not keep_going():
                break
            self.purge(entry)
            purged.append(entry)
        return purged
