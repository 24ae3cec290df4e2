"""Where things live on the node's disk, and which paths the agent may touch.

Each allowed root (``--models-root-dir`` plus any ``--allowed-root``) carries the agent's private area
``<root>/.model-agent/``:

* ``manifests/`` — one record per model: what was fetched, verified and published (see ``manifest``);
* ``staging/``   — downloads in progress, on the same filesystem as their destination so publishing is a
  rename;
* ``trash/``     — quarantined weights awaiting purge (delete safety).

``--state-dir`` moves the primary root's records (``manifests/``) elsewhere, so a read-only root of
pre-provisioned ``local://`` models needs no write access (OME issue #787); staging and trash stay in the
root because a publish and a quarantine are renames on the destination's filesystem.

:func:`confine` is the single gate for model destinations: a destination must be absolute, normalised
(no ``.``/``..`` segments), strictly inside an allowed root after resolving symlinks of every existing
ancestor, and never the root itself or the agent's private area; at most 4096 bytes long with no
component over 255 bytes; no control characters. Anything else raises :class:`PathRefused` with a reason
fit for a ``Failed`` status. Validation happens long before anything is written, so the publish step
re-checks the destination without following symlinks right before each rename
(:func:`model_agent.sources.base.publish`).

Roots never nest: :class:`Layout` refuses (:class:`RootsRefused`) an allowed root equal to, inside, or
containing another one, because :meth:`Layout.root_of` would confine a path to the outer root and its
private area would then cover the inner root (start-up fails with that message).

:meth:`Layout.check_local` gates ``local://`` paths, which are read in place and never written. A
ClusterBaseModel (an admin's) may name any host path; a tenant's (a namespaced BaseModel) only a path
inside an allowed root, checked as written before anything is resolved, so the refusal tells a tenant
nothing about the host outside the roots.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PRIVATE_DIR = ".model-agent"
# Linux's PATH_MAX and NAME_MAX: longer paths cannot be created, and their errors are worse than ours.
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255


class PathRefused(Exception):
    """A destination path outside what the agent may write; the message is the reason shown to users."""


class RootsRefused(ValueError):
    """The configured roots overlap; the message names both (a start-up configuration error)."""


class StateUnwritable(RuntimeError):
    """The agent's records area cannot be written; the message names the fix (a start-up error)."""


@dataclass(frozen=True)
class Root:
    """One allowed root and its private area.

    ``state`` (``--state-dir``, primary root only) moves the records (manifests) out of the root, so a
    read-only root of pre-provisioned ``local://`` models needs no write access at all: staging and trash
    stay under ``<root>/.model-agent`` because they must share the destination's filesystem (a rename).
    """

    path: Path
    state: Path | None = None

    @property
    def private(self) -> Path:
        return self.path / PRIVATE_DIR

    @property
    def records(self) -> Path:
        """Where the agent's records of this root live: ``--state-dir`` or the private area."""
        return self.state if self.state is not None else self.private

    @property
    def manifests(self) -> Path:
        return self.records / "manifests"

    @property
    def staging(self) -> Path:
        return self.private / "staging"

    @property
    def trash(self) -> Path:
        return self.private / "trash"

    def ensure(self) -> None:
        """Create the records area (it must be writable) and, where the root allows, staging and trash.

        A read-only root is not an error: nothing is fetched into it (a fetch fails with its reason), and its
        ``local://`` models are adopted in place; but its records must be writable somewhere
        (:class:`StateUnwritable` names ``--state-dir`` otherwise).
        """
        try:
            self.manifests.mkdir(parents=True, exist_ok=True)
            # A name of this process's own: on a shared root many agents probe the same directory at once,
            # and one removing another's probe between its create and its unlink failed that agent's start.
            fd, probe_name = tempfile.mkstemp(prefix=".write-probe-", dir=self.manifests)
            os.close(fd)
            Path(probe_name).unlink()
        except OSError as exc:
            raise StateUnwritable(
                f"the agent's records directory {str(self.manifests)!r} is not writable ({exc.strerror}); a "
                "read-only models root needs --state-dir naming a writable directory (a hostPath, so records "
                "survive a restart)"
            ) from None
        for d in (self.staging, self.trash):
            with contextlib.suppress(OSError):  # a read-only root: only fetches into it need these
                d.mkdir(parents=True, exist_ok=True)

    def read_only(self) -> bool:
        """Whether the root itself refuses writes (a read-only mount): fetches into it cannot work."""
        return not os.access(self.path, os.W_OK)


def token_for(key: str) -> str:
    """A short filesystem-safe name derived from a model key (stable across restarts)."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def check_roots(models_root: Path, extra_roots: list[Path] | None = None) -> None:
    """Raise :class:`RootsRefused` when two roots (after resolving symlinks) are equal or nested."""
    named = [(f"the models root {str(models_root)!r}", models_root)]
    named += [(f"allowed root {str(r)!r}", r) for r in extra_roots or []]
    resolved = [(label, Path(os.path.realpath(r))) for label, r in named]
    for i, (label, path) in enumerate(resolved):
        for other_label, other in resolved[:i]:
            if path == other:
                relation = "is the same directory as"
            elif other in path.parents:
                relation = "is inside"
            elif path in other.parents:
                relation = "contains"
            else:
                continue
            raise RootsRefused(
                f"{label} {relation} {other_label}: roots must not nest (a path in the inner one would be "
                "confined to the outer one, whose private area would then hold the inner root); give "
                "each directory once, side by side"
            )


def resume_file(private: Path, node: str | None) -> Path:
    """The delete breaker's resume marker in a root's private area: ``resume.<node>`` for one node's breaker,
    ``resume`` (``node`` None) for every node's. A node name that is not a plain DNS name is hashed."""
    if node is None:
        return private / "resume"
    plain = node.replace(".", "").replace("-", "").isalnum() and node.isascii() and len(node) <= 253
    return private / f"resume.{node if plain else token_for(node)}"


def check_state_dir(state: Path, roots: list[Path]) -> None:
    """Raise :class:`RootsRefused` for a ``--state-dir`` inside a root (models could be written over it)."""
    for root in roots:
        if state == root or root in state.parents or state in root.parents:
            raise RootsRefused(
                f"--state-dir {str(state)!r} overlaps the allowed root {str(root)!r}: give a directory outside "
                f"every root (or leave it unset for {str(root / PRIVATE_DIR)!r})"
            )


class Layout:
    def __init__(self, models_root: Path, extra_roots: list[Path] | None = None, state_dir: Path | None = None) -> None:
        check_roots(models_root, extra_roots)
        roots = [models_root, *(extra_roots or [])]
        self.roots = [Root(Path(os.path.realpath(r))) for r in roots]
        if state_dir is not None:
            state = Path(os.path.realpath(state_dir))
            if state != self.roots[0].private:
                check_state_dir(state, [r.path for r in self.roots])
                self.roots[0] = Root(self.roots[0].path, state)
        # Each root as configured, too (it may go through a symlink): a tenant's local path is first
        # checked as written, against these and the resolved ones.
        self._written_roots = [Path(_collapsed(str(r))) for r in roots if str(r).startswith("/")]

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
        """Validate a destination from a model spec; return its root and the resolved absolute path.

        Checks, in order, each with its own message: empty; control characters; longer than
        :data:`MAX_PATH_BYTES`; a component longer than :data:`MAX_NAME_BYTES`; not absolute; ``.``/``..``
        segments; outside every allowed root after resolving symlinks (a link planted inside a root must not
        lead out); the root itself; the agent's private area.
        """
        if not raw:
            raise PathRefused("spec.storage.path is empty: set an absolute path under the models root")
        if any(ord(c) < 32 or ord(c) == 127 for c in raw):
            raise PathRefused(f"spec.storage.path {_shown(raw)} contains control characters")
        size = len(raw.encode("utf-8", "surrogatepass"))
        if size > MAX_PATH_BYTES:
            raise PathRefused(f"spec.storage.path is {size} bytes long, over the {MAX_PATH_BYTES}-byte limit")
        for part in raw.split("/"):
            if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
                raise PathRefused(
                    f"spec.storage.path {_shown(raw)} has a component over the {MAX_NAME_BYTES}-byte limit"
                )
        posix = PurePosixPath(raw)
        if not posix.is_absolute():
            raise PathRefused(f"spec.storage.path {_shown(raw)} is not absolute")
        if any(part in (".", "..") for part in raw.split("/")):
            raise PathRefused(f"spec.storage.path {_shown(raw)} contains '.' or '..' segments")
        try:
            resolved = Path(os.path.realpath(raw))
        except (OSError, ValueError) as exc:
            raise PathRefused(f"spec.storage.path {_shown(raw)} cannot be resolved: {exc}") from None
        problem = _walk_problem(resolved)
        if problem is not None:
            raise PathRefused(f"spec.storage.path {_shown(raw)} {problem}")
        try:
            root = self.root_of(resolved)
        except PathRefused:
            roots = ", ".join(str(r.path) for r in self.roots)
            if resolved != Path("/" + raw.lstrip("/")):  # Path() collapses repeated and trailing slashes
                raise PathRefused(
                    f"spec.storage.path {_shown(raw)} resolves through a symlink to {str(resolved)!r}, outside "
                    f"the allowed roots ({roots})"
                ) from None
            raise PathRefused(f"spec.storage.path {_shown(raw)} is outside the allowed roots ({roots})") from None
        if resolved == root.path:
            raise PathRefused(f"spec.storage.path {_shown(raw)} is the models root itself")
        if resolved == root.private or root.private in resolved.parents:
            raise PathRefused(f"spec.storage.path {_shown(raw)} is inside the agent's private area")
        return root, resolved

    def check_local(self, raw: str, *, tenant: bool = False) -> Path:
        """Validate a ``local://`` source path; return it as given.

        Local weights are read in place, never written or deleted, so an admin's (``tenant=False``) may
        live outside the roots; but the path must still be absolute and normalised, free of control
        characters, and never the root itself or inside the agent's private area (its manifests, staging
        and trash are not a model). A tenant's (``tenant=True``: a namespaced BaseModel) must moreover be
        strictly inside an allowed root, both as written and after resolving symlinks.
        """
        if not raw:
            raise PathRefused("local path is empty")
        if any(ord(c) < 32 or ord(c) == 127 for c in raw):
            raise PathRefused(f"local path {_shown(raw)} contains control characters")
        if len(raw.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
            raise PathRefused(f"local path is over the {MAX_PATH_BYTES}-byte limit")
        if not PurePosixPath(raw).is_absolute():
            raise PathRefused(f"local path {_shown(raw)} is not absolute")
        if any(part in (".", "..") for part in raw.split("/")):
            raise PathRefused(f"local path {_shown(raw)} contains '.' or '..' segments")
        if tenant:
            self._check_tenant_local(raw)
        resolved = Path(os.path.realpath(raw))
        for root in self.roots:
            if resolved == root.path:
                raise PathRefused(f"local path {_shown(raw)} is the models root itself")
            for area in {root.private, root.records}:
                if resolved == area or area in resolved.parents:
                    raise PathRefused(f"local path {_shown(raw)} is inside the agent's private area")
        return Path(raw)

    def _check_tenant_local(self, raw: str) -> None:
        """A tenant's local path: inside an allowed root as written, and still inside one when resolved.

        The written form is checked first, with no file system access, so a path outside the roots is
        refused without revealing whether it exists or where its symlinks lead; the messages never show a
        resolved target.
        """
        written = Path(_collapsed(raw))
        inside = [r for r in self._written_roots + [r.path for r in self.roots] if r in written.parents]
        if not inside:
            if written in self._written_roots or any(written == r.path for r in self.roots):
                raise PathRefused(f"local path {_shown(raw)} is the models root itself")
            raise PathRefused(
                f"local path {_shown(raw)} is outside the allowed roots: a namespaced BaseModel may read "
                "local weights only inside them"
            )
        try:
            resolved = Path(os.path.realpath(raw))
        except (OSError, ValueError):
            raise PathRefused(f"local path {_shown(raw)} cannot be resolved") from None
        if not any(root.path in resolved.parents for root in self.roots):
            raise PathRefused(
                f"local path {_shown(raw)} resolves through a symlink outside the allowed roots (or to a root "
                "itself): a namespaced BaseModel may read local weights only inside them"
            )

    def writable(self, resolved: str) -> bool:
        """Whether a resolved, normalised path is strictly inside a root and outside its private area (no I/O).

        The string form of :meth:`confine`'s last checks, for paths already resolved (roots never nest, so
        the first root that contains it is its root).
        """
        for root in self.roots:
            base = str(root.path).rstrip("/") + "/"
            if resolved.startswith(base) and len(resolved) > len(base):
                private = str(root.private)
                return resolved != private and not resolved.startswith(private + "/")
        return False

    def resolve(self, raw: str) -> str:
        """``raw`` with every existing symlink resolved (as :func:`os.path.realpath`); ``raw`` on errors."""
        try:
            return os.path.realpath(raw)
        except (OSError, ValueError):
            return raw


def _walk_problem(path: Path) -> str | None:
    """What makes the existing part of a resolved ``path`` unusable as a directory, if anything.

    ``realpath`` leaves a symlink loop in place, and a regular file can stand where a directory must be.
    """
    for p in (*reversed(path.parents), path):
        try:
            mode = os.lstat(p).st_mode
        except FileNotFoundError:
            return None  # nothing below a missing component exists
        except NotADirectoryError:
            return f"goes through {str(p.parent)!r}, which is not a directory"
        except OSError as exc:
            return f"cannot be resolved ({exc.strerror})"
        if stat.S_ISLNK(mode):
            return "goes through a symlink that cannot be resolved"
        if not stat.S_ISDIR(mode):
            return f"goes through {str(p)!r}, which is not a directory" if p != path else "is not a directory"
    return None


def _collapsed(raw: str) -> str:
    """An absolute path with repeated and trailing slashes collapsed (``//a//b/`` -> ``/a/b``), no I/O."""
    return "/" + "/".join(part for part in raw.split("/") if part)


def _shown(raw: str) -> str:
    """A path as it should appear in a message: quoted, escaped, and bounded in length."""
    text = repr(raw)
    return text if len(text) <= 300 else text[:297] + "..."
