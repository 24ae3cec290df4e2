"""The agent's listeners, bounded: what anyone on the pod network can make the agent hold is capped up front.

Role: both listeners (the health port, :mod:`.http`, and the peer port, :mod:`model_agent.peers.server`) start
through :func:`serve`, each with :class:`Limits` sized for its protocol. aiohttp's defaults are a server's for
the open internet behind a proxy (no connection cap, no deadline for a request head, 128 headers of 8 KiB each,
keep-alive for an hour): 700 half-sent heads from one address took a peer server from 48 MB to 1.47 GB.

Guarantees, per listener:

* at most ``max_connections`` connections at once, and at most ``per_source`` from one address; a connection
  past either is aborted the moment it is accepted (never read, never buffered), counted
  (``on_refused(why)``) and logged at most once per :data:`LOG_EVERY_S` with the count since the last line;
* a request head must be complete within ``head_timeout_s`` of the connection or of the previous answer (the
  same clock closes idle keep-alive connections): a slow or endless head is closed, counted as ``slow-head``;
* at most ``max_headers`` header lines of at most ``max_field_size`` bytes each, a request line of at most
  ``max_line_size`` (aiohttp answers 400/431 and closes beyond them), and reads of at most ``read_bufsize`` at a
  time (the socket's reads too, not asyncio's 256 KiB): a connection holds at most about
  ``max_headers * max_field_size + read_bufsize`` bytes, so a listener holds at most ``max_connections`` times
  that, whatever the clients do. A refused head is counted as ``bad-head`` and logged at the same rate, never
  one traceback per request.

* a refusal budget per source, where the listener's application reports its refusals (:meth:`Gate.refused_request`:
  the peer port's authentication refusals): past ``refusals_per_s`` on average (bursts of ``refusal_burst``) an
  address is shut out for ``penalty_s`` — its open connections are closed after the refused answer, and new ones
  (within its caps) are held unread until the head deadline closes them, counted as ``penalty``. A flood of requests
  no one could accept then costs the agent one ``accept`` per connection per head deadline, not a parsed request
  and an answer each (closed at once, a tight reconnect loop would make it thousands of ``accept`` a second). At
  most :data:`MAX_TRACKED_SOURCES` addresses are remembered (the oldest forgotten first).

The caps are per listener, not per request: a long answer (a peer streaming a file) holds its connection, which
is why the peer port's total is sized for the fleet's concurrent transfers and its per-source cap for one
node's (:data:`PEER_LIMITS`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

log = structlog.get_logger(__name__)

LOG_EVERY_S: Final = 10.0
MAX_TRACKED_SOURCES: Final = 4096


@dataclass(frozen=True)
class Limits:
    """What one listener admits (see the module guarantees)."""

    max_connections: int
    per_source: int
    head_timeout_s: float
    max_headers: int = 32
    max_field_size: int = 8190
    max_line_size: int = 8190
    read_bufsize: int = 16 * 1024
    # The per-source refusal budget (0: none): refusals a second on average, the burst, and the shut-out.
    refusals_per_s: float = 0.0
    refusal_burst: float = 0.0
    penalty_s: float = 0.0

    def handler_args(self) -> dict[str, Any]:
        """aiohttp's request-handler settings for these limits."""
        return {
            "keepalive_timeout": self.head_timeout_s,
            "max_headers": self.max_headers,
            "max_field_size": self.max_field_size,
            "max_line_size": self.max_line_size,
            "read_bufsize": self.read_bufsize,
        }


# The kubelet's probes and Prometheus: a few connections, short requests.
HEALTH_LIMITS: Final = Limits(max_connections=64, per_source=16, head_timeout_s=10.0)
# Peers: each node fetching takes up to a few dozen connections (files x parts at once, plus probes).
# A node's own peer requests are refused only when its token is (expired, rotated): two a second after a burst of 20
# is far above that, and far below a flood's thousands.
PEER_LIMITS: Final = Limits(
    max_connections=256, per_source=48, head_timeout_s=15.0, refusals_per_s=2.0, refusal_burst=20.0, penalty_s=30.0
)


@dataclass(eq=False)
class Gate:
    """The connection counts of one listener and its refusals (counted, logged at a rate)."""

    name: str
    limits: Limits
    on_refused: Callable[[str], None] = lambda _why: None
    open: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    clock: Callable[[], float] = time.monotonic
    _unlogged: int = 0
    _logged_at: float = 0.0
    # source -> (refusal tokens left, when last counted); source -> until when it is shut out
    _budget: dict[str, tuple[float, float]] = field(default_factory=dict)
    _shut_out: dict[str, float] = field(default_factory=dict)

    def admit(self, source: str) -> str:
        """Take a place for a connection from ``source``: why it is refused (``total``, ``per-source``: no place taken)
        or held (``penalty``: a place taken), or "" — :meth:`release` later whenever a place was taken."""
        if self.open >= self.limits.max_connections:
            return "total"
        if self.by_source.get(source, 0) >= self.limits.per_source:
            return "per-source"
        self.open += 1
        self.by_source[source] = self.by_source.get(source, 0) + 1
        return "penalty" if self.shut_out(source) else ""  # (a place taken: the connection is held unread)

    def shut_out(self, source: str) -> bool:
        """Is ``source`` serving a penalty for spending its refusal budget?"""
        until = self._shut_out.get(source)
        if until is None:
            return False
        if self.clock() < until:
            return True
        del self._shut_out[source]
        return False

    def refused_request(self, source: str) -> bool:
        """The application refused a request of ``source``; True when that spent its budget (it is shut out now)."""
        limits = self.limits
        if limits.refusals_per_s <= 0:
            return False
        if self.shut_out(source):  # a connection opened before the shut-out: it ends with this answer
            return True
        now = self.clock()
        tokens, then = self._budget.pop(source, (limits.refusal_burst, now))
        tokens = min(limits.refusal_burst, tokens + (now - then) * limits.refusals_per_s) - 1
        if tokens >= 0:
            self._budget[source] = (tokens, now)  # (re-inserted: the dict's order is the sources' recency)
            _forget_oldest(self._budget)
            return False
        self._shut_out[source] = now + limits.penalty_s
        _forget_oldest(self._shut_out)
        self.refuse("penalty", source)
        return True

    def release(self, source: str) -> None:
        self.open -= 1
        left = self.by_source.get(source, 0) - 1
        if left > 0:
            self.by_source[source] = left
        else:
            self.by_source.pop(source, None)

    def refuse(self, why: str, source: str) -> None:
        """Count a connection closed by a limit; log the count at most once per :data:`LOG_EVERY_S`."""
        self.refused += 1
        self._unlogged += 1
        self.on_refused(why)
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            log.warning(
                "connections closed by a listener limit",
                listener=self.name,
                why=why,
                source=source,
                closed=self._unlogged,
                open=self.open,
                limit={"total": self.limits.max_connections, "penalty": self.limits.refusal_burst}.get(
                    why, self.limits.per_source
                ),
            )
            self._logged_at, self._unlogged = now, 0


def _forget_oldest(table: dict[str, Any]) -> None:
    while len(table) > MAX_TRACKED_SOURCES:
        del table[next(iter(table))]


class _GuardedHandler(RequestHandler):
    """aiohttp's request handler, admitted by the listener's :class:`Gate` when its connection is made."""

    gate: Gate
    source: str | None = None
    held: bool = False  # a shut-out source's connection, held unread until the head deadline closes it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        why = self.gate.admit(source)
        super().connection_made(transport)
        if why == "penalty" and isinstance(transport, asyncio.ReadTransport):
            # Held, not closed: a source that is shut out and reconnects at once would otherwise make the agent accept
            # thousands of connections a second. Nothing of it is read; its place counts against its own caps.
            self.gate.refuse(why, source)
            self.source, self.held = source, True
            transport.pause_reading()
            return
        if why:
            if why == "penalty":
                self.gate.release(source)
            self.gate.refuse(why, source)
            if isinstance(transport, asyncio.Transport):
                transport.abort()  # closed at once: nothing of it is read or kept
            else:
                transport.close()
            return
        self.source = source
        # asyncio's selector transport reads up to 256 KiB per ready socket per loop turn, all allocated at once: a
        # few hundred connections sending heads together would hold that many buffers at the same instant.
        if hasattr(transport, "max_size"):
            transport.max_size = self.gate.limits.read_bufsize

    def force_close(self) -> None:
        if self.source is not None and self._request_count == 0 and not self._force_close and not self.held:
            self.gate.refuse("slow-head", self.source)  # (the keep-alive clock fired before a first head)
        super().force_close()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # A malformed or oversized head is the client's doing: counted and logged at a rate like the other refusals,
        # never one traceback per request (that would be a log flood anyone can start).
        if isinstance(kw.get("exc_info"), HttpProcessingError) or isinstance(sys.exc_info()[1], HttpProcessingError):
            self.gate.refuse("bad-head", self.source or "?")
            return
        super().log_exception(*args, **kw)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.source is not None:
            self.gate.release(self.source)
            self.source = None
        super().connection_lost(exc)


class _GuardedServer(web.Server):
    gate: Gate

    def __call__(self) -> RequestHandler:
        handler = _GuardedHandler(self, loop=self._loop, **self._kwargs)
        handler.gate = self.gate
        return handler


class _GuardedRunner(web.AppRunner):
    def __init__(self, app: web.Application, gate: Gate) -> None:
        super().__init__(app, access_log=None, **gate.limits.handler_args())
        self.gate = gate

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer  # (only its handler factory differs)
        assert isinstance(server, _GuardedServer)
        server.gate = self.gate
        return server


async def serve(
    app: web.Application, host: str, port: int, limits: Limits, *, name: str, on_refused: Callable[[str], None]
) -> tuple[web.AppRunner, int, Gate]:
    """Start ``app`` listening on ``host:port`` (port 0: any) within ``limits``; the runner, bound port and gate."""
    gate = Gate(name, limits, on_refused)
    runner = _GuardedRunner(app, gate)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = getattr(site, "_server", None)
    if port == 0 and server is not None and server.sockets:
        port = server.sockets[0].getsockname()[1]
    return runner, port, gate
