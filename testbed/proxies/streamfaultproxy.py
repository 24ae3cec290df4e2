"""A byte-level HTTP/1.1 fault proxy between a download client and an origin (W4-W6 of the download benchmark).

Role: forward every request unchanged to the origin and stream the answer back, while counting requests
and response body bytes, and, when armed, injecting one kind of fault:

* ``flip``: flip one byte (XOR 0xFF) at a file offset of the responses whose path ends with a given name —
  the offset is mapped through ``Content-Range``, so ranged and whole-file answers are corrupted alike;
* ``cut_after``: abort the client connection once this many body bytes have passed (once);
* ``reply_429``: answer the next K requests matching a path suffix (and method) with ``429`` carrying
  ``Retry-After`` and the Hub's ``RateLimit`` / ``RateLimit-Policy`` headers, without forwarding them.

Why a third proxy beside :mod:`testbed.proxies.faultproxy` (the Kubernetes API one: verbs, watches, LIST
edits, re-sent through aiohttp) and :mod:`testbed.proxies.countingproxy` (aiohttp, per-request records):
a flip or a cut must land on an exact byte of a stream of several GB, so this one is a plain asyncio
stream pump that understands just enough HTTP (request heads, ``Content-Length``, ``Content-Range``,
keep-alive) to count and to inject. Its thread and event loop are the test bed's one
:class:`~testbed.proxies.loop_thread.LoopThread`; counters are read from the caller's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field

from testbed.proxies.loop_thread import LoopThread

PUMP_CHUNK = 256 * 1024
_CONTENT_RANGE = re.compile(rb"bytes (\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)


@dataclass
class RequestSeen:
    """One request the proxy received, as the client made it, and the status it was answered with."""

    at: float  # time.monotonic() when the request head arrived
    method: str
    path: str
    status: int = 0  # 0 until answered


@dataclass
class Faults:
    """What to inject into the next run (see the module doc); the default injects nothing."""

    flip_suffix: str | None = None
    flip_offset: int = 0
    cut_after: int | None = None
    reply_429: int = 0
    reply_429_suffix: str = ""
    reply_429_method: str = "GET"
    retry_after_s: int = 2


@dataclass
class Counters:
    """What passed through since the last :meth:`HttpFaultProxy.reset`."""

    requests: list[RequestSeen] = field(default_factory=list)
    body_bytes: int = 0
    flipped: int = 0
    cuts: int = 0
    replied_429: list[float] = field(default_factory=list)  # when each 429 was sent
    body_bytes_by_path: dict[str, int] = field(default_factory=dict)

    def by_suffix(self, suffix: str) -> int:
        """Body bytes sent for paths ending with ``suffix`` (one file, whatever face it was asked through)."""
        return sum(n for path, n in list(self.body_bytes_by_path.items()) if path.endswith(suffix))


class HttpFaultProxy(LoopThread):
    """The proxy in front of ``upstream_host:upstream_port``; :attr:`faults` arms it, :attr:`counters` reads it."""

    thread_name = "http-fault-proxy"

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.faults = Faults()
        self.counters = Counters()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """The URL clients use instead of the origin's."""
        return f"http://127.0.0.1:{self.port}"

    def reset(self, faults: Faults | None = None) -> None:
        """Arm ``faults`` (none when omitted) and count the next run from zero."""
        self.faults = faults or Faults()
        self.counters = Counters()

    # ------------------------------------------------------------------------------------ lifecycle
    # start, stop and the with block: LoopThread; stopping aborts the open client connections (_cleanup).

    async def _setup(self) -> int:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _cleanup(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._conns):
            writer.transport.abort()

    # ------------------------------------------------------------------------------------ pumping

    def _take_429(self, method: str, path: str) -> bool:
        f = self.faults
        if f.reply_429 > 0 and method == f.reply_429_method and path.endswith(f.reply_429_suffix):
            f.reply_429 -= 1
            return True
        return False

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream, limit=PUMP_CHUNK * 4)
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                method, target = _request_line(head)
                path = target.split("?", 1)[0]
                seen = RequestSeen(time.monotonic(), method, path)
                self.counters.requests.append(seen)
                length = _header_int(head, b"content-length") or 0
                body = await reader.readexactly(length) if length else b""
                if self._take_429(method, path):
                    self.counters.replied_429.append(time.monotonic())
                    seen.status = 429
                    ra = self.faults.retry_after_s
                    writer.write(
                        b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\nConnection: keep-alive\r\n"
                        + f'Retry-After: {ra}\r\nRateLimit: "resolvers";r=0;t={ra}\r\n'.encode()
                        + b'RateLimit-Policy: "fixed window";"resolvers";q=3000;w=300\r\n\r\n'
                    )
                    await writer.drain()
                    continue
                up_writer.write(head + body)
                await up_writer.drain()
                rhead = await up_reader.readuntil(b"\r\n\r\n")
                seen.status = int(rhead.split(b" ", 2)[1])
                writer.write(rhead)
                if method == "HEAD" or seen.status in (204, 304) or seen.status < 200:
                    await writer.drain()
                    continue
                if b"chunked" in (_header(rhead, b"transfer-encoding") or b"").lower():
                    await self._pump(up_reader, writer, None, path, 0)
                    return  # length unknown to us: end the connection after the body
                start = 0
                content_range = _header(rhead, b"content-range")
                if content_range and (m := _CONTENT_RANGE.match(content_range)):
                    start = int(m.group(1))
                if not await self._pump(up_reader, writer, _header_int(rhead, b"content-length") or 0, path, start):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            self._conns.discard(writer)
            for w in (writer, up_writer):
                if w is not None:
                    w.transport.abort()

    async def _pump(
        self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, left: int | None, path: str, offset: int
    ) -> bool:
        """Copy a body of ``left`` bytes (None: until EOF); False when the connection was cut."""
        f = self.faults
        flip = f.flip_suffix is not None and path.endswith(f.flip_suffix)
        while left is None or left > 0:
            data: bytes | bytearray = await up_reader.read(PUMP_CHUNK if left is None else min(PUMP_CHUNK, left))
            if not data:
                if left is None:
                    return True
                raise ConnectionError("upstream closed mid-body")
            if flip and offset <= f.flip_offset < offset + len(data):
                data = bytearray(data)
                data[f.flip_offset - offset] ^= 0xFF
                self.counters.flipped += 1
            offset += len(data)
            if left is not None:
                left -= len(data)
            counters = self.counters
            counters.body_bytes += len(data)
            counters.body_bytes_by_path[path] = counters.body_bytes_by_path.get(path, 0) + len(data)
            if f.cut_after is not None and self.counters.body_bytes >= f.cut_after:
                f.cut_after = None
                self.counters.cuts += 1
                writer.transport.abort()
                return False
            writer.write(data)
            await writer.drain()
        return True


def _request_line(head: bytes) -> tuple[str, str]:
    first = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    return first[0], first[1] if len(first) > 1 else "/"


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return None


def _header_int(head: bytes, name: bytes) -> int | None:
    value = _header(head, name)
    with contextlib.suppress(ValueError):
        return int(value) if value is not None else None
    return None
