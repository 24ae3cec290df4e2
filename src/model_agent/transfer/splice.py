"""Zero-copy receive of plain-HTTP bodies: ``splice(2)`` from the socket into the file through a pipe.

Role: the fast path of :mod:`model_agent.transfer.job` for a response on a plain TCP connection. The
``readinto`` + ``pwrite`` path copies every byte twice (socket → the slot's buffer, buffer → page cache);
here the kernel moves the received pages into a pipe by reference and copies them once, into the file's
page cache, and no byte passes through Python (the measured saving is in ``bench/RANGED_HISTORY.md``).

When it is used: Linux (``os.splice``), a connection without TLS (TLS bytes are decrypted in user space,
there is nothing to splice), a response with a ``Content-Length`` that is not chunked. Anything else, or a
file system that refuses ``splice`` writes (:class:`SpliceUnsupported`), takes the copying path.

Guarantees, the same as the copying path's: never a byte past the span (the socket is asked for at most
what the span still needs); ``span_pos`` advances only past bytes that are in the file; the stop flag is
seen between chunks and a thread blocked on the socket is woken by a shutdown of the socket (the caller's
abort); a read timeout is a :class:`TimeoutError` like a socket's. The pipe is left empty whatever happens,
so the slot can reuse it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import os
import select
import socket
import sys
import threading
from collections.abc import Callable

SUPPORTED = sys.platform.startswith("linux") and hasattr(os, "splice")
PIPE_BYTES = 1024 * 1024  # asked of the kernel; an unprivileged process may get less (fs.pipe-max-size)
_F_SETPIPE_SZ = 1031
_F_GETPIPE_SZ = 1032


class SpliceUnsupported(Exception):
    """The kernel refused to splice from this socket; nothing was moved: the caller copies instead."""


class FileWriteError(Exception):
    """Writing to the file failed (e.g. ENOSPC); a socket error stays an ``OSError`` (retried by the caller)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class SplicePipe:
    """The pipe of one part slot: used by one thread at a time, emptied after every use."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # too large for this user: keep the default size
            fcntl.fcntl(self.write_fd, _F_SETPIPE_SZ, PIPE_BYTES)
        self.capacity = int(fcntl.fcntl(self.write_fd, _F_GETPIPE_SZ))
        self.file_writes_ok = True  # False once the file system refused a splice write (then: copy)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def plain_socket(resp: http.client.HTTPResponse, sock: socket.socket | None) -> socket.socket | None:
    """``sock`` when the body of ``resp`` can be spliced from it (plain TCP, a known length), else None."""
    if not SUPPORTED or sock is None or resp.chunked or resp.length is None:
        return None
    if type(sock) is not socket.socket:  # an ssl.SSLSocket (or anything else) holds bytes we cannot splice
        return None
    return sock


def splice_body(
    sock: socket.socket,
    pipe: SplicePipe,
    fd: int,
    pos: int,
    count: int,
    *,
    write_lock: threading.Lock,
    stopped: Callable[[], bool],
    timeout_s: float,
    on_written: Callable[[int, int], None],
    before_wait: Callable[[], float] | None = None,
) -> int:
    """Move up to ``count`` body bytes from ``sock`` to ``fd`` at ``pos``; returns how many are in the file.

    Returns early (fewer than ``count``) when the peer closes the connection or ``stopped()`` turns true.
    ``on_written(pos, n)`` is called after every write to the file; ``before_wait()``, when the socket has nothing
    to read, before waiting: it returns how many seconds to wait for more before it is asked again (0: wait with the
    read timeout). Raises :class:`SpliceUnsupported` when the socket cannot be spliced (before any byte was moved).
    """
    moved = 0
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
    while moved < count and not stopped():
        try:
            # Non-blocking on the socket end (the socket has a timeout, so it is non-blocking anyway): a
            # quiet peer is waited for in poll(), with the read timeout.
            got = os.splice(sock.fileno(), pipe.write_fd, min(pipe.capacity, count - moved), flags=_NONBLOCK)
        except BlockingIOError:
            window = before_wait() if before_wait is not None else 0.0
            if window > 0:
                poller.poll(window * 1000)  # more within the window, or the window is over: splice (or ask) again
                continue
            if not poller.poll(timeout_s * 1000):
                raise TimeoutError("timed out waiting for the response body") from None
            continue
        except OSError as exc:
            if exc.errno == errno.EINVAL and moved == 0:
                raise SpliceUnsupported(str(exc)) from None
            raise
        if got == 0:
            break  # the peer closed the connection
        _drain(pipe, fd, pos + moved, got, write_lock)
        on_written(pos + moved, got)
        moved += got
    return moved


_NONBLOCK = 2  # SPLICE_F_NONBLOCK


def _drain(pipe: SplicePipe, fd: int, pos: int, count: int, write_lock: threading.Lock) -> None:
    """Write the ``count`` bytes waiting in the pipe to ``fd`` at ``pos``, one writer per file at a time."""
    # Concurrent writers to one file contend for its inode lock and the kernel spins on it (measured: a quarter
    # of all CPU with 4 writers); behind a Python lock the others sleep instead.
    with write_lock:
        while count:
            try:
                if pipe.file_writes_ok:
                    try:
                        n = write_from_pipe(pipe.read_fd, fd, count, pos)
                    except OSError as exc:
                        if exc.errno != errno.EINVAL:
                            raise
                        pipe.file_writes_ok = False  # this file system takes no splice writes: copy from now on
                        continue
                else:
                    n = _copy_out(pipe, fd, pos, count)
            except OSError as exc:
                _empty(pipe)
                raise FileWriteError(exc) from exc
            pos += n
            count -= n


def write_from_pipe(pipe_fd: int, fd: int, count: int, pos: int) -> int:
    """Move up to ``count`` bytes from the pipe into ``fd`` at ``pos`` (one ``splice``); how many moved."""
    return os.splice(pipe_fd, fd, count, offset_dst=pos)


def _empty(pipe: SplicePipe) -> None:
    """Discard what is left in the pipe, so the slot can reuse it."""
    os.set_blocking(pipe.read_fd, False)
    try:
        while os.read(pipe.read_fd, pipe.capacity):
            pass
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(pipe.read_fd, True)


def _copy_out(pipe: SplicePipe, fd: int, pos: int, count: int) -> int:
    data = os.read(pipe.read_fd, count)
    pwrite_all(fd, memoryview(data), pos)
    return len(data)


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``pwrite`` may write less than asked)."""
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
