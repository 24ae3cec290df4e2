"""Admin-listed directories where tenants' ``local://`` models may also live (``--tenant-local-allow``).

Role: a namespaced ``BaseModel``'s ``local://`` path must lie strictly inside an allowed root
(``local/layout.py``, ``check_local(tenant=True)``). Some clusters pre-provision weights for tenants somewhere
else (a read-only share mounted at ``/shared/models``); the admin lists such directories with
``--tenant-local-allow`` (chart value ``tenancy.tenantLocalAllow``).

Contract: :func:`admin_allows` is a pure decision over the path as written and as resolved. It says yes only
when the written path is absolute, normalised (no ``.``/``..``) and strictly inside a listed directory, *and*
its resolved form is strictly inside that directory's resolved form — a symlink inside the listed directory
that leads out of it is refused. A path it allows is then checked as an admin's would be (absolute, no control
characters, never a root or the agent's private area) and still falls under the ownership rule (never another
model's directory). Anything it does not allow gets the tenant rule, whose refusal reveals nothing of the host.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath


def _strictly_inside(path: PurePosixPath, directory: PurePosixPath) -> bool:
    return directory in path.parents


def admin_allows(raw: str, allowed: Sequence[str], realpath: Callable[[str], str] = os.path.realpath) -> bool:
    """Whether ``raw`` (a tenant's ``local://`` path) lies inside one of the admin's ``allowed`` directories."""
    if not raw or not allowed or not raw.startswith("/"):
        return False
    if any(part in (".", "..") for part in raw.split("/")):
        return False
    written = PurePosixPath(raw)
    resolved: PurePosixPath | None = None
    for directory in allowed:
        listed = PurePosixPath(directory)
        if not listed.is_absolute() or not _strictly_inside(written, listed):
            continue
        if resolved is None:
            resolved = PurePosixPath(realpath(raw))
        if _strictly_inside(resolved, PurePosixPath(realpath(directory))):
            return True
    return False
