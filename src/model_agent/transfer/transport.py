"""Blocking HTTP(S) GETs for the ranged engine: one keep-alive connection per part slot, proxies, TLS trust.

Role: the transport under :mod:`model_agent.transfer.job`. Each part slot of a downloader owns one
:class:`SlotTransport`, used by one worker thread at a time, so a connection is reused from part to part
without locks or a shared pool. It is stdlib ``http.client`` on purpose: its response ``readinto`` fills a
caller's buffer straight from the socket (no allocation per chunk), which is what makes a Python data path
run at disk speed on two cores (``bench/ranged.py``).

Decisions, stated once:

* TLS: certificates are always verified. The trust store is, in order, the ``ca_bundle`` the caller gives,
  ``AWS_CA_BUNDLE``, ``REQUESTS_CA_BUNDLE`` (each *replaces* the system roots, as in the AWS SDKs and
  requests), else the system roots, which OpenSSL itself lets ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` override.
* Proxies: ``HTTP_PROXY`` / ``HTTPS_PROXY`` (either case) as read by :mod:`urllib.request`; ``NO_PROXY`` as curl
  and Go read it, CIDR ranges included (:func:`no_proxy_matches`). A peer session (``use_proxy=False``) never
  uses a proxy.
  A plain-HTTP URL is sent to the proxy in absolute form; an HTTPS URL goes through a ``CONNECT`` tunnel, so
  the origin's certificate is still verified end to end. ``user:password@`` in the proxy URL becomes
  ``Proxy-Authorization: Basic``.
* A reused connection that the server had closed while idle fails before any response byte; the request is
  then sent once more on a fresh connection, not counted as a failure.
* Tenant models (:mod:`model_agent.sources.egress`): a fetch sets :data:`CONNECT_GUARD` around its engine
  session; every direct connection of a transport made in that context is opened by the guard, which checks
  the resolved address and connects to exactly that address. A proxy from the environment is the admin's:
  connections to it are not checked (the origin's host was checked against the allow-list by the source).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import http.client
import ipaddress
import os
import socket
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from model_agent.transfer.addresses import parse_ip

# Opens a connection instead of socket.create_connection (address, timeout, source address), for tenant models.
ConnectFn = Callable[[tuple[str, int], float | None, tuple[str, int] | None], socket.socket]
CONNECT_GUARD: contextvars.ContextVar[ConnectFn | None] = contextvars.ContextVar("connect_guard", default=None)

# A request that failed on a reused keep-alive connection before any response byte: the server had closed it.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def tls_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """A verifying client context with the trust store described in the module docstring."""
    bundle = ca_bundle or os.environ.get("AWS_CA_BUNDLE") or os.environ.get("REQUESTS_CA_BUNDLE") or None
    return ssl.create_default_context(cafile=bundle)


@dataclass(frozen=True)
class Route:
    """Where to connect for one URL and what to put on the request line."""

    scheme: str
    host: str  # the origin's host (Host header, TLS server name)
    port: int
    target: str  # path?query, or the absolute URL when a plain-HTTP proxy is used
    proxy: tuple[str, int] | None  # connect here instead (and tunnel for HTTPS)
    proxy_headers: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> tuple[str, str, int, tuple[str, int] | None]:
        return (self.scheme, self.host, self.port, self.proxy)


_Proxy = tuple[tuple[str, int] | None, tuple[tuple[str, str], ...]]  # where to connect instead, and its headers


def no_proxy_matches(host: str, port: int, no_proxy: str) -> bool:
    """Does ``NO_PROXY`` (comma-separated) exempt ``host:port``? As curl and Go read it: ``*``; a domain or a
    ``.domain`` (the host or any subdomain), optionally with ``:port``; an IP address; and a CIDR range
    (``10.0.0.0/8``, ``fd00::/8``), which Python's own ``proxy_bypass`` ignores."""
    name = host.strip("[]").lower().rstrip(".")
    address = parse_ip(name)
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            try:
                if address is not None and address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry_host, entry_port = entry, ""
        if entry.startswith("["):  # [v6]:port
            entry_host, _, rest = entry[1:].partition("]")
            entry_port = rest.removeprefix(":")
        elif entry.count(":") == 1:
            entry_host, _, entry_port = entry.partition(":")
        if entry_port and entry_port != str(port):
            continue
        entry_host = entry_host.lstrip("*").lstrip(".").rstrip(".")
        if address is not None:
            if address == parse_ip(entry_host):
                return True
            continue
        if name == entry_host or name.endswith("." + entry_host):
            return True
    return False


def _proxy_from_environment(scheme: str, host: str, port: int) -> _Proxy:
    proxies = urllib.request.getproxies_environment()
    proxy_url = proxies.get(scheme)
    if not proxy_url or no_proxy_matches(host, port, proxies.get("no", "")):
        return None, ()
    proxy = urllib.parse.urlsplit(proxy_url if "://" in proxy_url else f"http://{proxy_url}")
    if not proxy.hostname:
        return None, ()
    headers: tuple[tuple[str, str], ...] = ()
    if proxy.username is not None:
        user = urllib.parse.unquote(proxy.username)
        password = urllib.parse.unquote(proxy.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers = (("Proxy-Authorization", f"Basic {token}"),)
    return (proxy.hostname, proxy.port or 8080), headers


class Proxies:
    """The proxy (or none) of each origin, read from the environment once per engine session.

    The environment's lookup walks every variable of the process (65 us with 35 of them; a pod with service links
    has hundreds): per request it was a few percent of a small file's CPU. Its slots share one of these, so a
    session looks an origin up once; a changed environment is seen by the next session.
    """

    def __init__(self, from_environment: bool = True) -> None:
        self._by_origin: dict[tuple[str, str, int], _Proxy] = {}
        self._from_environment = from_environment  # False: every origin direct (a peer session)

    def of(self, scheme: str, host: str, port: int) -> _Proxy:
        if not self._from_environment:
            return None, ()
        found = self._by_origin.get((scheme, host, port))
        if found is None:  # (two threads may both look: the same answer)
            found = self._by_origin[(scheme, host, port)] = _proxy_from_environment(scheme, host, port)
        return found


def route_for(url: str, proxies: Proxies) -> Route:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL (scheme {scheme!r})")
    host = parts.hostname
    port = parts.port or (443 if scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    proxy, headers = proxies.of(scheme, host, port)
    if proxy is None:
        return Route(scheme, host, port, target, None)
    if scheme == "http":
        authority = host if port == 80 else f"{host}:{port}"
        target = f"http://{authority}{target}"
    return Route(scheme, host, port, target, proxy, headers)


class SlotTransport:
    """The connection(s) of one part slot; used by one thread at a time, aborted from any thread."""

    def __init__(
        self,
        tls: Callable[[], ssl.SSLContext],
        connect_timeout_s: float,
        read_timeout_s: float,
        proxies: Proxies | None = None,
    ) -> None:
        self._tls = tls
        self._proxies = proxies or Proxies()  # the engine's, shared by its slots
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s
        self._conns: dict[tuple[str, str, int, tuple[str, int] | None], http.client.HTTPConnection] = {}
        self._active: socket.socket | None = None
        self._lock = threading.Lock()
        self._connect = CONNECT_GUARD.get()  # made in the fetch's context (the engine makes slots there)
        self._last_route: tuple[str, Route] | None = None  # key_of then get for one request: one lookup

    def _route(self, url: str) -> Route:
        last = self._last_route
        if last is not None and last[0] == url:
            return last[1]
        route = route_for(url, self._proxies)
        self._last_route = (url, route)
        return route

    def get(self, url: str, headers: Mapping[str, str]) -> http.client.HTTPResponse:
        """Send ``GET url`` and return the response (headers read, body not yet)."""
        route = self._route(url)
        fresh = route.key not in self._conns
        try:
            conn = self._conns.get(route.key) or self._connection(route)
            self._conns[route.key] = conn
            try:
                return self._send(conn, route, headers)
            except _STALE:
                if fresh:
                    raise
                self.drop(route.key)
            conn = self._connection(route)  # the idle connection had been closed by the server: once more
            self._conns[route.key] = conn
            return self._send(conn, route, headers)
        except BaseException:
            self.drop(route.key)  # a connection in an unknown state is never reused
            raise

    def _connection(self, route: Route) -> http.client.HTTPConnection:
        host, port = route.proxy or (route.host, route.port)
        conn: http.client.HTTPConnection
        if route.scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=self._connect_timeout, context=self._tls())
            if route.proxy is not None:
                conn.set_tunnel(route.host, route.port, headers=dict(route.proxy_headers))
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self._connect_timeout)
        if self._connect is not None and route.proxy is None:
            conn._create_connection = self._connect  # type: ignore[attr-defined]  # both classes connect through it
        return conn

    def _send(
        self, conn: http.client.HTTPConnection, route: Route, headers: Mapping[str, str]
    ) -> http.client.HTTPResponse:
        if conn.sock is None:
            conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(self._read_timeout)
        with self._lock:
            self._active = conn.sock
        # skip_host/skip_accept_encoding: we send Host ourselves and never ask for a compressed body.
        conn.putrequest("GET", route.target, skip_host=True, skip_accept_encoding=True)
        default_port = 443 if route.scheme == "https" else 80
        conn.putheader("Host", route.host if route.port == default_port else f"{route.host}:{route.port}")
        if route.scheme == "http":
            for name, value in route.proxy_headers:
                conn.putheader(name, value)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        return conn.getresponse()

    def active_socket(self) -> socket.socket | None:
        """The socket of the request in progress (for reading its body without http.client)."""
        with self._lock:
            return self._active

    def key_of(self, url: str) -> tuple[str, str, int, tuple[str, int] | None]:
        return self._route(url).key

    def drop(self, key: tuple[str, str, int, tuple[str, int] | None]) -> None:
        """Close the connection for ``key`` (its response was not read to the end: it cannot be reused)."""
        conn = self._conns.pop(key, None)
        with self._lock:
            self._active = None
        if conn is not None:
            conn.close()

    def abort(self) -> None:
        """Wake a thread blocked on this slot's socket (called from another thread on cancellation)."""
        with self._lock:
            sock = self._active
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed or never connected: nothing to wake
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for key in list(self._conns):
            self.drop(key)
