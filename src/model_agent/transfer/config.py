"""What a transfer is asked to do and what it reports: the engine's tuning, the source's promise, the result.

Role: the vocabulary every other module of :mod:`model_agent.transfer` and every source speaks. Plain frozen
data, no I/O. The defaults and the measurements they rest on are in ``bench/RANGED_HISTORY.md``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MiB = 1024 * 1024
DEFAULT_PART_SIZE = 16 * MiB
DEFAULT_CONCURRENCY = 8
DEFAULT_WRITE_BUFFER = 4 * MiB

# Where a file's bytes come from: a fixed URL, or one computed per request (a presigned URL renewed, a CDN
# location looked up again), plain or async.
UrlSource = str | Callable[[], str] | Callable[[], Awaitable[str]]
# Extra request headers: fixed, or computed per request from its URL (request signing, e.g. OCI's).
HeaderSource = Mapping[str, str] | Callable[[str], Mapping[str, str]]


@dataclass(frozen=True)
class RangedConfig:
    """Tuning of the engine; the defaults were chosen on loopback (``bench/ranged.py``, ``bench/RANGED_HISTORY.md``)."""

    part_size: int = DEFAULT_PART_SIZE
    concurrency: int = DEFAULT_CONCURRENCY
    write_buffer: int = DEFAULT_WRITE_BUFFER
    max_attempts: int = 8  # consecutive failures of one part without progress
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    retry_after_cap_s: float = 300.0
    connect_timeout_s: float = 30.0
    read_timeout_s: float = 60.0
    durable: bool = True  # fdatasync before a part is recorded as complete
    ca_bundle: str | None = None  # PEM file of trusted CAs for HTTPS (else AWS_CA_BUNDLE, ...: see transport)
    splice: bool = True  # zero-copy receive of plain-HTTP bodies where possible (transfer.splice); False: copy
    use_proxy: bool = True  # the environment's proxy (HTTP(S)_PROXY, NO_PROXY); False: always direct (peers)

    def __post_init__(self) -> None:
        if self.part_size < 1 or self.concurrency < 1 or self.write_buffer < 1 or self.max_attempts < 1:
            raise ValueError("part_size, concurrency, write_buffer and max_attempts must be positive")


@dataclass(frozen=True)
class Expected:
    """What the source promises about the file: its size, checksums (lowercase hex) and a validator.

    ``checksums`` maps an algorithm of :data:`~model_agent.transfer.hashing.SUPPORTED_CHECKSUMS` to its hex
    digest (``crc32``: 8 hex digits, big-endian). ``validator`` (e.g. an ETag, quotes included) is sent as
    ``If-Match`` and stored in the part map: progress recorded under another validator is discarded. With
    ``validator`` set, the answer's own checksums (``checksums_from_answer``) describe the validated object.
    """

    size: int
    checksums: Mapping[str, str] = field(default_factory=dict)
    validator: str | None = None
    # Checksums the answer itself states (e.g. an object store's x-amz-checksum-* headers on a GET), from its
    # headers, for a file fetched in one request (:func:`~model_agent.transfer.fetched_in_one_request`): the
    # first answer's are added to ``checksums`` (those given win) before a byte of its body is hashed.
    checksums_from_answer: Callable[[Mapping[str, str]], Mapping[str, str]] | None = None


@dataclass(frozen=True)
class Downloaded:
    """One verified file on disk and what it cost: the caller's manifest record and its metrics come from here."""

    path: Path
    size: int
    digests: dict[str, str]  # sha256 always, plus every algorithm of Expected.checksums
    fetched_bytes: int  # body bytes written in this call
    resumed_bytes: int  # bytes taken from an earlier, interrupted call
    requests: int  # HTTP requests made in this call
