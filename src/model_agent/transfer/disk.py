"""The file side of a transfer: reserving the space up front and naming disk failures for the caller.

Role: preallocation (so a full disk shows up before the transfer, not in the middle of it) and the one
mapping from an ``OSError`` on the target to the :class:`~model_agent.model.errors.SourceError` a source
reports: ``InsufficientDisk`` (ENOSPC/EDQUOT: the partial file and its map are kept for a resume once space
is freed) or ``WriteFailed``; and opening a file or part map whose folders may not exist yet, made on the
first write into them rather than checked for every file.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import sys
from pathlib import Path
from typing import Any

from model_agent.local.capacity import is_disk_full
from model_agent.model.errors import SourceError

_libc_fallocate: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc_fallocate = _libc.fallocate
        _libc_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _libc_fallocate.restype = ctypes.c_int


def preallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes of disk for ``fd`` and set its length; ENOSPC is raised as OSError.

    Uses ``fallocate(2)`` directly (not glibc's ``posix_fallocate``, which on filesystems without support
    emulates it by writing every block); falls back to ``ftruncate`` (a sparse file) when unsupported.
    """
    if size > 0 and _libc_fallocate is not None:
        if _libc_fallocate(fd, 0, 0, size) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise OSError(err, os.strerror(err))
    os.ftruncate(fd, size)


def disk_error(label: str, exc: OSError, what: str) -> SourceError:
    """The source error for a failed write, preallocation or map record of the file ``label``."""
    if is_disk_full(exc):
        return SourceError(
            "InsufficientDisk",
            f"{label}: the disk filled up while {what} ({exc.strerror}); the"
            " partial download is kept and resumes once space is freed",
        )
    return SourceError("WriteFailed", f"{label}: {what} failed: {exc}")


def open_making_folders(path: Path, flags: int) -> int:
    """``os.open`` of ``path``, making its folders first when they are missing."""
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, flags, 0o644)
