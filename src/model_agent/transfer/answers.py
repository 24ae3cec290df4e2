"""What an HTTP answer means for a transfer: read its body, retry, or fail with a reason.

Role: the engine's decisions about one response, kept apart from the I/O that acts on them.
:func:`check_answer` classifies status and headers (206 with the exact ``Content-Range`` asked for, 200
for a whole-file request, 408/429/5xx retried, 429/503 with ``Retry-After``, 412/416 the file changed,
401/403/404 final, a redirect :class:`Redirected`); :data:`TRANSIENT` is what the engine retries from the
last byte written.
"""

from __future__ import annotations

import email.utils
import http.client
import re
import time
from dataclasses import dataclass

from model_agent.model.errors import SourceError


class Retry(Exception):
    """A transient answer: retried with backoff, or after ``retry_after`` seconds when the server said so."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RangeIgnored(Exception):
    """The server answered a ranged GET with the whole body."""


class Stopped(Exception):
    """A worker thread saw its request's cancellation flag."""


class Redirected(SourceError):
    """The server answered with a redirect, which the engine never follows (guarantee 6): the caller may look
    the location up itself (through its own checks) and ask again. ``status`` is the 3xx code."""

    def __init__(self, label: str, status: int) -> None:
        super().__init__("HttpError", f"{label}: unexpected HTTP {status} (a redirect: not followed)")
        self.status = status


_REDIRECTS = frozenset((301, 302, 303, 307, 308))


# Failures of one request that are retried: answers asking for a retry, network and protocol errors. Disk errors
# never reach here as OSError (they become SourceError where they happen).
TRANSIENT = (Retry, OSError, http.client.HTTPException)


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def describe(exc: BaseException) -> str:
    """One short line for a failure, for a message (never a URL: none of the exceptions raised here has one)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


@dataclass(frozen=True)
class Answer:
    """The facts of one response that decide what happens to it (status line and three headers)."""

    status: int
    content_range: str | None = None
    content_length: int | None = None  # None: unknown (chunked, or read to the end of the connection)
    retry_after: str | None = None

    @classmethod
    def of(cls, resp: http.client.HTTPResponse) -> Answer:
        return cls(resp.status, resp.getheader("Content-Range"), resp.length, resp.getheader("Retry-After"))


def check_answer(answer: Answer, label: str, size: int, first: int, end: int, *, whole: bool) -> None:
    """Whether the answer to a GET of bytes ``[first, end)`` of a ``size``-byte file may be read as its body.

    Returns when it may; raises :class:`Retry` for an answer worth retrying, :class:`RangeIgnored` for a
    whole body sent to a ranged request, and :class:`~model_agent.model.errors.SourceError` for the rest.
    ``whole``: the request asked for the whole file (no ``Range`` header).
    """
    status = answer.status
    if status == 206:
        m = _CONTENT_RANGE.fullmatch((answer.content_range or "").strip())
        if m is None:
            raise SourceError("BadResponse", f"{label}: 206 without a usable Content-Range")
        got_first, got_last, total = int(m[1]), int(m[2]), m[3]
        if total != "*" and int(total) != size:
            raise SourceError("SourceChanged", f"{label}: the remote file is {total} bytes now, {size} were listed")
        if got_first != first or got_last != end - 1:
            raise SourceError("BadResponse", f"{label}: asked for bytes {first}-{end - 1}, got {got_first}-{got_last}")
        return
    if status == 200:
        if not whole:
            raise RangeIgnored()
        length = answer.content_length
        if length is not None and length != size:
            raise SourceError("SourceChanged", f"{label}: the remote file is {length} bytes now, {size} were listed")
        return
    if status in (429, 503):
        raise Retry(f"HTTP {status}", parse_retry_after(answer.retry_after))
    if status == 408 or status >= 500:
        raise Retry(f"HTTP {status}")
    if status in (412, 416):
        raise SourceError("SourceChanged", f"{label}: the remote file changed since it was listed (HTTP {status})")
    if status in (401, 403):
        raise SourceError("AccessDenied", f"{label}: access denied (HTTP {status})")
    if status == 404:
        raise SourceError("ObjectNotFound", f"{label}: not found (HTTP 404)")
    if status in _REDIRECTS:
        raise Redirected(label, status)
    raise SourceError("HttpError", f"{label}: unexpected HTTP {status}")
