"""Full verification: re-hash every file of a manifest, throttled, and report the damaged ones.

The fast check (stat: size and mtime) runs on every reconcile; this is the slow, thorough one, run by
``model-agent verify`` and by the scheduled pass (``--verify-interval``). Reads are throttled to
``rate_bytes_s`` so a pass over terabytes of weights does not starve inference pods of disk bandwidth.
A damaged file is reported by relative path; :func:`mark_damaged` records it in the manifest (mtime -1), so
the next reconcile sees it, turns the model ``Updating`` and fetches exactly those files again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from pathlib import Path

from model_agent.local.manifest import Manifest

CHUNK = 4 * 1024 * 1024


class _Throttle:
    def __init__(self, rate_bytes_s: float | None) -> None:
        self.rate = rate_bytes_s
        self.start = time.monotonic()
        self.done = 0

    def consumed(self, n: int) -> None:
        if not self.rate:
            return
        self.done += n
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


def verify_manifest(
    manifest: Manifest, *, rate_bytes_s: float | None = None, stop: threading.Event | None = None
) -> list[str]:
    """Relative paths of files that are missing, resized or whose bytes no longer match their hash."""
    damaged: list[str] = []
    throttle = _Throttle(rate_bytes_s)
    dest = Path(manifest.dest)
    for f in manifest.files:
        if stop is not None and stop.is_set():
            break
        path = dest / f.path
        try:
            if path.stat().st_size != f.size:
                damaged.append(f.path)
                continue
            if not f.sha256 and not f.git_sha1:
                continue  # the source published no hash: size is all there is to check
            sha = hashlib.sha256()
            git = hashlib.sha1(f"blob {f.size}\0".encode(), usedforsecurity=False)
            with path.open("rb") as fh:
                while block := fh.read(CHUNK):
                    sha.update(block)
                    git.update(block)
                    throttle.consumed(len(block))
        except OSError:
            damaged.append(f.path)
            continue
        if (f.sha256 and sha.hexdigest() != f.sha256) or (f.git_sha1 and git.hexdigest() != f.git_sha1):
            damaged.append(f.path)
    return damaged


def mark_damaged(manifest: Manifest, damaged: list[str]) -> Manifest:
    """A copy of the manifest whose damaged files fail the fast check (and are not reused by a fetch).

    The mtime each damaged file was recorded with is kept in ``damaged``: a publication of the same copy on a
    shared root is then recognised as the damaged one (``agent.shared_root.check_publication``).
    """
    bad = set(damaged)
    marks = dict(manifest.damaged)
    for f in manifest.files:
        if f.path in bad and f.mtime_ns != -1:
            marks[f.path] = f.mtime_ns
    files = [dataclasses.replace(f, mtime_ns=-1) if f.path in bad else f for f in manifest.files]
    return dataclasses.replace(manifest, files=files, damaged=marks)
