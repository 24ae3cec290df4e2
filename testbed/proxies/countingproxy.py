"""A counting HTTP reverse proxy for the local test servers (olah, moto): what did the clients really fetch?

Role: the measuring instrument in front of an origin. Tests and benchmarks point clients at
:attr:`CountingProxy.endpoint` instead of the origin and then read, per request, the method, path, status,
body bytes sent, the client's User-Agent and when it started and ended. That is how "bytes fetched again
after a kill", "at most two nodes fetching at once" and "three Hub API calls" are measured *at the server*,
not taken from the client's word.

Contract:

* The proxy runs aiohttp in its own thread and event loop, so it keeps serving while the caller blocks.
  ``start`` returns the port; ``stop`` stops the loop. Requests are forwarded with their headers (minus
  hop-by-hop ones) and body; responses are streamed back without decompression.
* A request is recorded before it is forwarded and its body bytes are added before they are written to the
  client, so the counters are complete as soon as a client call returns. A client that goes away mid-body
  leaves ``bytes_sent`` at what was offered to it.
* ``rewrite`` may map a request to another upstream path (olah needs one route shimmed); records keep the
  path the client asked for.
* ``pace(fragment, bytes_per_s)`` slows the bodies of requests whose path contains ``fragment`` to that rate
  (each request on its own, in 16 KiB steps), for tests that need a download to still be running when they act;
  ``in_flight(fragment)`` counts such requests not yet ended (ended: sent in full, failed, or left by the client).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web
from yarl import URL

from testbed.proxies.hop_by_hop import HOP_BY_HOP_HEADERS
from testbed.proxies.loop_thread import LoopThread, serve_on_loopback

_CHUNK = 256 * 1024
_PACED_STEP = 16 * 1024


@dataclasses.dataclass
class ServedRequest:
    """One request the origin answered through the proxy, as the client made it."""

    method: str
    path: str
    status: int = 0
    bytes_sent: int = 0
    # Timing and identity, not part of equality (tests compare what was served).
    client: str = dataclasses.field(default="", compare=False)  # the User-Agent (the agent puts its node there)
    started: float = dataclasses.field(default=0.0, compare=False)  # monotonic seconds
    ended: float = dataclasses.field(default=0.0, compare=False)


def max_concurrent_clients(records: list[ServedRequest], path_contains: str) -> int:
    """The most distinct clients (User-Agents) that had a request in flight for matching paths at once."""
    events: list[tuple[float, int, str]] = []
    for r in records:
        if path_contains in r.path and r.ended:
            events.append((r.started, 1, r.client))
            events.append((r.ended, -1, r.client))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    active: dict[str, int] = {}
    best = 0
    for _, delta, client in events:
        active[client] = active.get(client, 0) + delta
        if active[client] == 0:
            del active[client]
        best = max(best, len(active))
    return best


class CountingProxy(LoopThread):
    """A reverse proxy to ``upstream`` (``http://host:port``) that records every request; see the module doc."""

    thread_name = "counting-proxy"

    def __init__(self, upstream: str = "", *, rewrite: Callable[[web.Request], str] | None = None) -> None:
        self.upstream = upstream  # may be set after construction, before the first request
        self._rewrite = rewrite
        self._lock = threading.Lock()
        self._records: list[ServedRequest] = []
        self._paces: dict[str, float] = {}
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        """The URL clients use instead of the origin's."""
        return f"http://127.0.0.1:{self.port}"

    # -- stats
    def records(self) -> list[ServedRequest]:
        """A copy of every request recorded so far, safe to read while the proxy serves."""
        with self._lock:
            return [dataclasses.replace(r) for r in self._records]

    def reset(self) -> None:
        """Forget the records, to measure the next phase of a test from zero."""
        with self._lock:
            self._records.clear()

    def bytes_sent(self, path_contains: str = "") -> int:
        """Body bytes sent to clients for requests whose path contains ``path_contains`` (all when empty)."""
        with self._lock:
            return sum(r.bytes_sent for r in self._records if path_contains in r.path)

    def pace(self, path_contains: str, bytes_per_s: float | None) -> None:
        """Slow the bodies of requests whose path contains ``path_contains`` to ``bytes_per_s`` (None: full speed)."""
        with self._lock:
            if bytes_per_s is None:
                self._paces.pop(path_contains, None)
            else:
                self._paces[path_contains] = bytes_per_s

    def in_flight(self, path_contains: str = "") -> int:
        """Requests whose path contains ``path_contains`` that started and have not ended."""
        with self._lock:
            return sum(1 for r in self._records if path_contains in r.path and not r.ended)

    def _rate_for(self, path: str) -> float | None:
        with self._lock:
            rates = [rate for fragment, rate in self._paces.items() if fragment in path]
        return min(rates) if rates else None

    # -- lifecycle (start, stop and the with block: LoopThread)
    async def _setup(self) -> int:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300),
        )
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        return await serve_on_loopback(self._runner)

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        record = ServedRequest(
            method=request.method,
            path=request.raw_path,
            client=request.headers.get("User-Agent", ""),
            started=time.monotonic(),
        )
        with self._lock:
            self._records.append(record)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP_HEADERS}
        body = await request.read()
        path = self._rewrite(request) if self._rewrite is not None else request.raw_path
        url = URL(self.upstream + path, encoded=True)
        try:
            async with self._session.request(
                request.method, url, headers=headers, data=body or None, allow_redirects=False
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() == "location" and value.startswith(self.upstream):
                        # Host is forwarded, so redirects usually name the proxy already; this is a backstop.
                        value = f"{request.scheme}://{request.host}{value[len(self.upstream) :]}"
                    if name.lower() not in HOP_BY_HOP_HEADERS:
                        response.headers.add(name, value)
                if upstream.content_length is not None:
                    response.content_length = upstream.content_length
                with self._lock:
                    record.status = upstream.status
                await response.prepare(request)
                try:
                    if request.method != "HEAD":
                        async for chunk in upstream.content.iter_chunked(_CHUNK):
                            rate = self._rate_for(request.raw_path)
                            steps = [chunk] if rate is None else _slices(chunk, _PACED_STEP)
                            for step in steps:
                                with self._lock:
                                    record.bytes_sent += len(step)
                                await response.write(step)
                                if rate is not None:
                                    await asyncio.sleep(len(step) / rate)
                    await response.write_eof()
                except ConnectionResetError:  # the client went away; bytes_sent keeps what was offered
                    pass
                finally:
                    with self._lock:
                        record.ended = time.monotonic()
                return response
        except aiohttp.ClientError as exc:
            if record.status:  # failed mid-body: the client must see a broken transfer, not a 502
                raise
            with self._lock:
                record.status = 502
            return web.Response(status=502, text=f"origin unreachable: {exc}\n")


def _slices(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]
