"""Disk capacity: refuse a download that cannot fit, counting what other downloads in flight will still write.

Role: before a source writes a byte it asks :data:`REGISTRY` for a :class:`Reservation` of the bytes it still
has to put on disk. The registry is process-wide and keyed by filesystem (``st_dev``), so two models fetched
at once into the same filesystem cannot both count the same free space.

Contract:

* :meth:`CapacityRegistry.reserve` succeeds only when ``free - reserved_by_others - nbytes >= reserve``, where
  ``free`` is what an unprivileged writer may use (``f_bavail``), and ``reserve`` is the configured safety
  margin (``--disk-reserve``: a share of the filesystem's size, default 10 %, or an absolute byte count).
  Otherwise it raises ``SourceError("InsufficientDisk", ...)`` (retryable: space may be freed) with the
  numbers in the message. The check and the bookkeeping happen under one lock, so concurrent callers see
  each other.
* A reservation shrinks as its bytes become allocated on disk (:meth:`Reservation.consume`; e.g. after a
  preallocation), because from then on ``f_bavail`` already accounts for them, and is released when the
  download ends (``release`` or ``with``). Releasing twice is harmless.
* Nothing here deletes anything: a disk that fills up anyway (another writer) surfaces as ENOSPC in the
  writer, which maps it to the same ``InsufficientDisk`` reason and keeps its partial data for resume.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from model_agent.model.errors import SourceError
from model_agent.model.reasons import Reason

DEFAULT_RESERVE_FRACTION = 0.10

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes of ``"50GiB"``, ``"16Mi"``, ``"20G"``, ``"1073741824"``: decimal units (``k``, ``M``, ``G``, ``T``,
    with or without ``B``) are powers of 1000, binary ones (``Ki``, ``Mi``, ``Gi``, ``Ti``) powers of 1024."""
    m = _SIZE.fullmatch(text)
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ValueError(f"invalid size {text!r}: expected e.g. '16MiB', '50G' or a number of bytes")
    return int(float(m.group(1)) * unit)


@dataclass(frozen=True)
class DiskReserve:
    """Space to leave free on a filesystem: ``fraction`` of its size, or ``absolute`` bytes when set."""

    fraction: float = DEFAULT_RESERVE_FRACTION
    absolute: int | None = None

    def bytes_for(self, fs_size: int) -> int:
        """The bytes to keep free on a filesystem of ``fs_size`` bytes."""
        if self.absolute is not None:
            return self.absolute
        return int(fs_size * self.fraction)

    @classmethod
    def parse(cls, text: str) -> DiskReserve:
        """``"10%"`` (share of the filesystem), ``"0"``, ``"50GiB"``, ``"20G"``, ``"1073741824"``.

        Decimal units (``k``, ``M``, ``G``, ``T``, with or without ``B``) are powers of 1000, binary ones (``Ki``,
        ``Mi``, ``Gi``, ``Ti``, with or without ``B``) powers of 1024, as in Kubernetes quantities.
        """
        raw = text.strip()
        if raw.endswith("%"):
            try:
                pct = float(raw[:-1])
            except ValueError:
                raise ValueError(f"invalid disk reserve {text!r}: expected e.g. '10%'") from None
            if not 0 <= pct < 100:
                raise ValueError(f"invalid disk reserve {text!r}: a percentage must be in [0, 100)")
            return cls(fraction=pct / 100)
        try:
            return cls(absolute=parse_size(raw))
        except ValueError:
            expected = "expected a percentage ('10%') or a size ('50GiB')"
            raise ValueError(f"invalid disk reserve {text!r}: {expected}") from None

    def __str__(self) -> str:
        return f"{self.absolute} bytes" if self.absolute is not None else f"{self.fraction * 100:g}%"


@dataclass(frozen=True)
class DiskUsage:
    """One filesystem's size and the space a download may use, from ``statvfs``."""

    device: int
    size: int  # bytes of the filesystem
    free: int  # bytes an unprivileged writer may still use


def disk_usage(path: Path) -> DiskUsage:
    """Usage of the filesystem holding ``path``, or its nearest existing ancestor."""
    probe = _existing(path)
    st = os.statvfs(probe)
    return DiskUsage(os.stat(probe).st_dev, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


def allocated_bytes(path: Path) -> int:
    """Bytes the filesystem has allocated for ``path`` (0 when it does not exist)."""
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def _existing(path: Path) -> Path:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


class Reservation:
    """Bytes one download still has to write on one filesystem; see :meth:`CapacityRegistry.reserve`."""

    def __init__(self, registry: CapacityRegistry, device: int, nbytes: int, owner: str) -> None:
        self._registry = registry
        self.device = device
        self.remaining = nbytes
        self.owner = owner
        self.released = False

    def consume(self, nbytes: int) -> None:
        """``nbytes`` of this reservation are now allocated on disk (and so counted by the free space)."""
        self._registry._adjust(self, -max(0, nbytes))

    def release(self) -> None:
        """Give back what is left of the reservation; releasing twice is harmless."""
        self._registry._release(self)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class CapacityRegistry:
    """Process-wide bookkeeping of bytes promised to downloads in flight, per filesystem."""

    def __init__(self, reserve: DiskReserve | None = None, usage: Callable[[Path], DiskUsage] = disk_usage) -> None:
        self.reserve_policy = reserve or DiskReserve()
        self._usage = usage
        self._lock = threading.Lock()
        self._active: set[Reservation] = set()

    def configure(self, reserve: DiskReserve) -> None:
        """Set the safety margin (the ``--disk-reserve`` flag)."""
        self.reserve_policy = reserve

    def reserved(self, path: Path) -> int:
        """Bytes reserved by downloads in flight on the filesystem of ``path``."""
        device = self._usage(path).device
        with self._lock:
            return sum(r.remaining for r in self._active if r.device == device)

    def reserve(self, path: Path, nbytes: int, owner: str) -> Reservation:
        """Reserve ``nbytes`` on the filesystem of ``path`` for ``owner``, or raise ``InsufficientDisk``."""
        usage = self._usage(path)
        margin = self.reserve_policy.bytes_for(usage.size)
        with self._lock:
            others = sum(r.remaining for r in self._active if r.device == usage.device)
            if nbytes > 0 and usage.free - others - nbytes < margin:
                raise SourceError(
                    Reason.INSUFFICIENT_DISK,
                    f"{owner}: needs {_human(nbytes)} on the filesystem of {path}, which has {_human(usage.free)}"
                    f" free, {_human(others)} of it promised to other downloads, and keeps a reserve of"
                    f" {_human(margin)} ({self.reserve_policy})",
                )
            reservation = Reservation(self, usage.device, max(0, nbytes), owner)
            self._active.add(reservation)
            return reservation

    def _adjust(self, reservation: Reservation, delta: int) -> None:
        with self._lock:
            reservation.remaining = max(0, reservation.remaining + delta)

    def _release(self, reservation: Reservation) -> None:
        with self._lock:
            reservation.released = True
            reservation.remaining = 0
            with contextlib.suppress(KeyError):
                self._active.remove(reservation)


REGISTRY = CapacityRegistry()
"""The process-wide registry every source uses; the CLI configures its reserve from ``--disk-reserve``."""


def is_disk_full(exc: OSError) -> bool:
    """ENOSPC or EDQUOT: the write failed for lack of space, not for a broken disk."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)
