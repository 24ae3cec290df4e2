"""Where things live on the node's disk, and which paths the agent may touch.

Each allowed root (``--models-root-dir`` plus any ``--allowed-root``) carries the agent's private area
``<root>/.model-agent/``:

* ``manifests/`` — one record per model: what was fetched, verified and published (see ``manifest``);
* ``staging/``   — downloads in progress, on the same filesystem as their destination so publishing is a
  rename;
* ``trash/``     — quarantined weights awaiting purge (delete safety).

:func:`confine` is the single gate for model destinations: a destination must be absolute, normalised
(no ``.``/``..`` segments), strictly inside an allowed root after resolving symlinks of every existing
ancestor, and never the root itself or the agent's private area. Anything else raises
:class:`PathRefused` with a reason fit for a ``Failed`` status.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PRIVATE_DIR = ".model-agent"


class PathRefused(Exception):
    """A destination path outside what the agent may write; the message is the reason shown to users."""


@dataclass(frozen=True)
class Root:
    """One allowed root and its private area."""

    path: Path

    @property
    def private(self) -> Path:
        return self.path / PRIVATE_DIR

    @property
    def manifests(self) -> Path:
        return self.private / "manifests"

    @property
    def staging(self) -> Path:
        return self.private / "staging"

    @property
    def trash(self) -> Path:
        return self.private / "trash"

    def ensure(self) -> None:
        for d in (self.manifests, self.staging, self.trash):
            d.mkdir(parents=True, exist_ok=True)


def token_for(key: str) -> str:
    """A short filesystem-safe name derived from a model key (stable across restarts)."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


class Layout:
    def __init__(self, models_root: Path, extra_roots: list[Path] | None = None) -> None:
        roots = [models_root, *(extra_roots or [])]
        self.roots = [Root(Path(os.path.realpath(r))) for r in roots]

    @property
    def primary(self) -> Root:
        return self.roots[0]

    def ensure(self) -> None:
        for root in self.roots:
            root.ensure()

    def root_of(self, dest: Path) -> Root:
        for root in self.roots:
            if dest == root.path or root.path in dest.parents:
                return root
        raise PathRefused(f"{dest} is not under an allowed root ({', '.join(str(r.path) for r in self.roots)})")

    def record_root(self, dest: Path) -> Root:
        """The root whose private area keeps the record of ``dest`` (the primary one for outside paths)."""
        try:
            return self.root_of(dest)
        except PathRefused:
            return self.primary

    def confine(self, raw: str) -> tuple[Root, Path]:
        """Validate a destination from a model spec; return its root and the resolved absolute path."""
        if not raw:
            raise PathRefused("spec.storage.path is empty: set an absolute path under the models root")
        if "\x00" in raw or any(ord(c) < 32 for c in raw):
            raise PathRefused("spec.storage.path contains control characters")
        posix = PurePosixPath(raw)
        if not posix.is_absolute():
            raise PathRefused(f"spec.storage.path {raw!r} is not absolute")
        if any(part in (".", "..") for part in raw.split("/")):
            raise PathRefused(f"spec.storage.path {raw!r} contains '.' or '..' segments")
        # Resolve symlinks of the existing ancestors: a link planted inside the root must not lead out.
        resolved = Path(os.path.realpath(raw))
        root = self.root_of(resolved)
        if resolved == root.path:
            raise PathRefused(f"spec.storage.path {raw!r} is the models root itself")
        if resolved == root.private or root.private in resolved.parents:
            raise PathRefused(f"spec.storage.path {raw!r} is inside the agent's private area")
        return root, resolved
