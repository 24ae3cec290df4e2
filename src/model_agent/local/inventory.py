"""What is on the disk that no manifest explains: reported, never deleted.

:func:`unmanaged_directories` walks each allowed root (a few levels deep) and returns directories that are
neither a model destination recorded by a manifest nor an ancestor of one — weights copied by hand, left
by another tool, or by an older agent. They show in ``model-agent status`` and the
``model_agent_unmanaged_directories`` metric; removing them is an operator's decision.

:func:`stale_staging` lists staging areas that belong to no known model and no running download (left by a
kill during a fetch of a model that has since gone): staging is the agent's own scratch space, so those are
safe to delete. On a shared root the staging areas are every node's, and this node knows only its own jobs: an
area there is discarded only once :func:`idle_s` says no node has written into it for a long while. The caller
decides on the event loop, from facts of that instant, and :func:`discard` moves each one out of ``staging/`` at
once (one rename: a download starting a moment later finds no half-deleted directory under its name); the slow
delete of what was moved (:func:`delete_discarded`, also whatever a kill left there) runs in a thread.
Everything here but :func:`discard` walks or deletes trees: call it off the loop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from model_agent.local.layout import PRIVATE_DIR, Layout, Root

DISCARD_DIR = "discard"  # <root>/.model-agent/discard: staging areas being deleted


OME_PRIVATE_DIR = ".ome"  # OME's agents' records at a models root: left alone, never reported as a model


def unmanaged_directories(layout: Layout, dests: Iterable[str], *, max_depth: int = 3) -> list[Path]:
    """Directories under the roots (to ``max_depth``) that no manifest explains: reported, never removed.

    Neither a destination in ``dests`` nor an ancestor of one; the agent's private area is skipped, and so are
    OME's own (:data:`OME_PRIVATE_DIR`: the integrity manifests its newer agents keep at a root, never a model)
    and what cannot be read (an unreadable directory is not evidence of anything).
    """
    wanted = {Path(d) for d in dests}
    ancestors = {p for d in wanted for p in d.parents}
    found: list[Path] = []
    for root in layout.roots:
        frontier = [(root.path, 0)]
        while frontier:
            directory, depth = frontier.pop()
            try:
                children = sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink())
            except OSError:
                continue
            for child in children:
                if directory == root.path and child.name in (PRIVATE_DIR, OME_PRIVATE_DIR):
                    continue
                if child in wanted:
                    continue
                if child in ancestors and depth + 1 < max_depth:
                    frontier.append((child, depth + 1))
                elif child not in ancestors:
                    found.append(child)
    return sorted(found)


def stale_staging(layout: Layout, keep_tokens: set[str]) -> list[tuple[Root, Path]]:
    """Staging areas whose token is not kept, with the root they are in (one directory listing per root)."""
    stale: list[tuple[Root, Path]] = []
    for root in layout.roots:
        if not root.staging.is_dir():
            continue
        stale.extend((root, p) for p in sorted(root.staging.iterdir()) if p.name not in keep_tokens)
    return stale


def idle_s(path: Path, now: float) -> float:
    """How long nothing in the tree at ``path`` changed (its newest mtime); 0 for what cannot be read or is gone.

    A running fetch writes its files and part maps every few seconds, so a staging area idle for much longer than
    a fetch Lease has no live writer on any node.
    """
    newest = 0.0
    try:
        newest = path.stat().st_mtime
        for directory, _dirs, files in os.walk(path):
            for name in [*files, *_dirs]:
                with contextlib.suppress(OSError):
                    newest = max(newest, os.lstat(os.path.join(directory, name)).st_mtime)
    except OSError:
        return 0.0
    return max(0.0, now - newest)


def discard(root: Root, staging: Path) -> Path | None:
    """Move one staging area into ``<private>/discard/`` (a rename, same filesystem); None if it is gone."""
    area = root.private / DISCARD_DIR
    area.mkdir(parents=True, exist_ok=True)
    target = area / f"{staging.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(staging, target)
    except FileNotFoundError:
        return None
    return target


def delete_discarded(layout: Layout) -> list[Path]:
    """Delete everything in every root's discard area (blocking); the paths deleted."""
    deleted: list[Path] = []
    for root in layout.roots:
        area = root.private / DISCARD_DIR
        if not area.is_dir():
            continue
        for path in sorted(area.iterdir()):
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    return deleted
