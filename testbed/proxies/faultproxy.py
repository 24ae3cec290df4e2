"""A fault-injecting HTTP proxy between a Kubernetes client and a real kube-apiserver, for end-to-end tests.

Role: the "Faults" component of docs/design.md#10-real-components-in-tests. The agent (or any :class:`KubeClient`)
talks to this
proxy instead of the API server; the proxy forwards every request to the real server and, when a test
asks for it, answers 5xx/429/404 itself, stalls or drops requests, ends watches early, strips items from
LIST answers or writes extra events (e.g. ``DELETED``) into open watches. Nothing else is faked: every
forwarded request is answered by the real API server.

Contract:

* Listening side: plain HTTP on ``127.0.0.1:<port>`` without authentication (loopback only).
  :meth:`FaultProxy.write_kubeconfig` writes a kubeconfig with ``server: http://127.0.0.1:<port>`` and no
  credentials, which the kubernetes_asyncio 36.1 loader (and so :meth:`KubeClient.connect`) accepts: it
  reads TLS fields only for ``https`` servers. Upstream side: the proxy connects to the real server over
  TLS, verifies it with the given CA and presents the given client certificate itself (the admin one,
  ``O=system:masters``), so authentication and authorisation at the API server stay real - but every
  proxied request is the admin's, whatever the client would have presented. An ``http://`` upstream (or
  an explicit ``ssl_context``) is accepted too, for unit tests.
* Pass-through is faithful: method, path and query bytes, request headers (minus hop-by-hop ones and
  ``Host``) and body go up; status, headers and body bytes come back, compressed bodies unchanged.
  Nothing is buffered: plain answers are forwarded chunk by chunk, watch answers line by line as each
  line completes (a partial line waits for its newline, so injected events never split a real one).
* Every request is recorded (:class:`RequestRecord`) before anything else happens to it, with the verb
  classified as the API server does (:func:`classify`); :meth:`~FaultProxy.requests`,
  :meth:`~FaultProxy.count` and :meth:`~FaultProxy.reset` read and clear the records.
* Faults are :class:`Rule` objects added with :meth:`~FaultProxy.add_rule` (which returns a
  :class:`RuleHandle`) and removed with :meth:`RuleHandle.remove` or :meth:`~FaultProxy.clear_rules`.
  The first active rule matching a request (in the order added) fires and consumes one of its ``times``;
  at most one rule fires per request. Actions: :func:`respond`, :func:`stall`, :func:`drop`,
  :func:`cut_watch_after` (matches watch requests only), :func:`strip_list_items` (matches LIST requests
  only). aiohttp clients resend an idempotent request once after a disconnect, so a dropped GET fails
  for the caller only if the rule also drops the retry. :meth:`~FaultProxy.inject_watch_event` /
  :meth:`~FaultProxy.inject_deleted` write into the watches open *now* and return how many received
  the line. :meth:`~FaultProxy.stats` counts firings.
* Threads: the proxy runs in its own thread and event loop, so blocking tests and async tests on any
  loop can drive it. Every public method is thread-safe; the blocking ones (``start``, ``stop``,
  ``inject_*``, ``wait_*``) have ``a``-prefixed coroutine twins that do not block the caller's loop.
  ``wait_for`` / ``await_for`` wait on a condition the proxy signals on every change (no polling).
* ``stop()`` closes every open connection (open watches end abruptly for the client), records still
  pending get the outcome ``"stopped"``, and the thread ends. ``with FaultProxy(...) as proxy:`` and
  ``async with`` start and stop it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import ssl
import threading
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar, Unpack

import aiohttp
import yaml
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from testbed.proxies.hop_by_hop import HOP_BY_HOP_HEADERS
from testbed.proxies.loop_thread import LoopThread, serve_on_loopback
from testbed.servers.service import ManagedService

JSON = dict[str, Any]
T = TypeVar("T")

CALL_TIMEOUT_S = 10.0
_REQUEST_SKIP = HOP_BY_HOP_HEADERS | {"host"}

Outcome = Literal["pending", "forwarded", "responded", "dropped", "cut", "client-gone", "upstream-error", "stopped"]


# ----------------------------------------------------------------------------------------------- verbs


@dataclasses.dataclass(frozen=True)
class RequestInfo:
    """What the API server's RequestInfoFactory makes of a request (the parts tests care about)."""

    verb: str
    is_resource: bool = False
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""


_API_PREFIXES = frozenset({"api", "apis"})
_GROUPLESS_PREFIXES = frozenset({"api"})
_SPECIAL_VERBS = frozenset({"proxy", "watch"})
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_FIELD_NAME = re.compile(r"^metadata\.name==?([^,=!]+)$")


def _parse_bool(value: str | None) -> bool:
    return value is not None and value in ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool


def classify(method: str, path: str, query: Mapping[str, str] | None = None) -> RequestInfo:
    """Classify a request like the API server (k8s.io/apiserver ``RequestInfoFactory``).

    Resource requests get ``get``/``list``/``watch``/``create``/``update``/``patch``/``delete``/
    ``deletecollection`` (or ``proxy``); other paths (``/version``, ``/api``, ``/apis/<group>/<version>``)
    are non-resource requests whose verb is the lower-case HTTP method. ``path`` may carry a query
    string; ``query`` wins if both are given.
    """
    method = method.upper()
    path, _, raw_query = path.partition("?")
    if query is None:
        query = {k: v for k, _, v in (p.partition("=") for p in raw_query.split("&") if p)}
    parts = [p for p in path.split("/") if p]
    nonresource = RequestInfo(verb=method.lower())
    if len(parts) < 3 or parts[0] not in _API_PREFIXES:
        return nonresource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix not in _GROUPLESS_PREFIXES:
        if len(parts) < 3:
            return nonresource
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    if parts[0] in _SPECIAL_VERBS:
        if len(parts) < 2:
            return nonresource
        verb, parts = parts[0], parts[1:]
    else:
        verb = _METHOD_VERBS.get(method, "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) >= 2 else ""
    subresource = parts[2] if len(parts) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        verb = "watch" if _parse_bool(query.get("watch")) else "list"
        selected = _FIELD_NAME.match(query.get("fieldSelector", ""))
        if selected:
            name = selected[1]
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestInfo(verb, True, group, version, namespace, resource, subresource, name)


# ----------------------------------------------------------------------------------------------- records


@dataclasses.dataclass
class RequestRecord:
    """One request the proxy received, as the client made it, and what became of it.

    ``outcome``: ``pending`` (still open, e.g. a running watch), ``forwarded`` (the upstream's answer
    went through), ``responded`` (a rule answered), ``dropped`` (connection closed without an answer),
    ``cut`` (a watch ended by a rule), ``client-gone``, ``upstream-error`` (502, or the upstream broke a
    stream) or ``stopped`` (the proxy stopped). ``status`` is 0 until a status line was sent.
    ``events`` counts watch lines forwarded from the upstream, ``injected`` lines written by the proxy,
    ``stripped`` LIST items removed.
    """

    method: str
    path: str
    query: dict[str, str]
    verb: str
    resource: str
    is_watch: bool
    status: int = 0
    outcome: Outcome = "pending"
    rule: str | None = None
    events: int = 0
    injected: int = 0
    stripped: int = 0


# ----------------------------------------------------------------------------------------------- actions


@dataclasses.dataclass(frozen=True)
class Respond:
    """Answer the request here with this status, body and headers; the API server never sees it."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Stall:
    """Hold the request for ``seconds`` (None: until the client leaves), then forward it or drop the connection."""

    seconds: float | None
    then: Literal["forward", "drop"]


@dataclasses.dataclass(frozen=True)
class Drop:
    """Close the client's connection without an answer: a transport failure as the agent sees it."""

    pass


@dataclasses.dataclass(frozen=True)
class CutWatch:
    """End a watch after ``events`` upstream lines or ``seconds``; ``abrupt`` aborts it instead of ending it cleanly."""

    events: int | None
    seconds: float | None
    abrupt: bool


@dataclasses.dataclass(frozen=True)
class StripListItems:
    """Forward a LIST but remove the items ``predicate`` matches: an object vanishing from a relist."""

    predicate: Callable[[JSON], bool]


Action = Respond | Stall | Drop | CutWatch | StripListItems

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, reason: str | None = None, message: str | None = None, details: JSON | None = None) -> JSON:
    """A ``Status`` object as the API server sends with an error (``reason`` defaults from ``code``)."""
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message if message is not None else f"injected by faultproxy: HTTP {code}",
        "reason": reason if reason is not None else _REASONS.get(code, ""),
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def object_not_found(resource: str, name: str, group: str = "") -> JSON:
    """The exact 404 ``Status`` the API server sends for a GET of a missing object."""
    qualified = f"{resource}.{group}" if group else resource
    details: JSON = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return status_body(404, "NotFound", f'{qualified} "{name}" not found', details)


def respond(
    status: int,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    *,
    retry_after: int | None = None,
) -> Respond:
    """Answer with ``status`` instead of forwarding.

    ``body``: a JSON value (sent as ``application/json``), ``str`` or ``bytes``; ``None`` sends a
    :func:`status_body` for the code. ``retry_after`` sets the ``Retry-After`` header and, for the
    default body, ``details.retryAfterSeconds`` as the API server does for 429.
    """
    all_headers = dict(headers or {})
    if retry_after is not None:
        all_headers.setdefault("Retry-After", str(retry_after))
    if body is None:
        body = status_body(status, details={"retryAfterSeconds": retry_after} if retry_after is not None else None)
    if isinstance(body, bytes):
        raw = body
    elif isinstance(body, str):
        raw = body.encode()
        all_headers.setdefault("Content-Type", "text/plain; charset=utf-8")
    else:
        raw = json.dumps(body).encode() + b"\n"
        all_headers.setdefault("Content-Type", "application/json")
    return Respond(status, raw, tuple(all_headers.items()))


def stall(seconds: float | None, then: Literal["forward", "drop"] = "forward") -> Stall:
    """Hold the request ``seconds`` without answering (``None``: until the client leaves or the proxy
    stops), then forward it or drop the connection."""
    if seconds is not None and seconds < 0:
        raise ValueError("stall seconds must be >= 0")
    if then not in ("forward", "drop"):
        raise ValueError("then must be 'forward' or 'drop'")
    return Stall(seconds, then)


def drop() -> Drop:
    """Close the connection without an answer (the client sees a disconnect).

    aiohttp (so :class:`KubeClient`) sends an idempotent request (GET, HEAD, PUT, DELETE...) once more after
    a disconnect: to make one call fail, the rule must drop twice (``times=2``).
    """
    return Drop()


def cut_watch_after(*, events: int | None = None, seconds: float | None = None, abrupt: bool = False) -> CutWatch:
    """Forward a watch but end it after ``events`` lines from the upstream or ``seconds``, whichever first.

    The end is clean (the chunked stream terminates, as when the server closes a watch) unless
    ``abrupt``, which aborts the connection mid-stream. Injected lines do not count as events.
    """
    if events is None and seconds is None:
        raise ValueError("give events=N or seconds=S")
    if (events is not None and events < 0) or (seconds is not None and seconds < 0):
        raise ValueError("events and seconds must be >= 0")
    return CutWatch(events, seconds, abrupt)


def strip_list_items(predicate: Callable[[JSON], bool]) -> StripListItems:
    """Forward a LIST and remove the ``items`` for which ``predicate(item)`` is true from a 200 JSON answer."""
    return StripListItems(predicate)


def by_name(*names: str) -> Callable[[JSON], bool]:
    """A :func:`strip_list_items` predicate: the item's ``metadata.name`` is one of ``names``."""
    wanted = frozenset(names)

    def predicate(item: JSON) -> bool:
        metadata = item.get("metadata")
        return isinstance(metadata, dict) and metadata.get("name") in wanted

    return predicate


# ----------------------------------------------------------------------------------------------- rules


class RequestFilters(TypedDict, total=False):
    """The filters :meth:`FaultProxy.requests` and :meth:`FaultProxy.count` take (None, like leaving one out: any)."""

    method: str | None
    path_contains: str | None
    verb: str | None
    resource: str | None


@dataclasses.dataclass(frozen=True)
class Rule:
    """When a request matches, apply ``action``.

    ``path`` is a regular expression searched in the request path (no query; ``""`` matches all); the rest are
    keywords: ``method`` (HTTP, any case), ``watch`` (is it a watch) and ``verb`` (see :func:`classify`) narrow
    it when given. ``times`` is how often the rule may fire (``None``: unlimited). ``name`` keys
    :meth:`FaultProxy.stats` (default ``rule-<n>``).
    """

    path: str
    action: Action
    _: dataclasses.KW_ONLY
    method: str | None = None
    watch: bool | None = None
    verb: str | None = None
    times: int | None = None
    name: str | None = None


class RuleHandle:
    """A rule added to a proxy: its live counters, and :meth:`remove`."""

    def __init__(self, proxy: FaultProxy, rule: Rule, name: str) -> None:
        self.rule = rule
        self.name = name
        self._proxy = proxy
        self._pattern = re.compile(rule.path)
        self._remaining = rule.times
        self._fired = 0
        self._active = True

    @property
    def fired(self) -> int:
        """How many requests this rule has acted on so far."""
        with self._proxy._cond:
            return self._fired

    @property
    def remaining(self) -> int | None:
        """How many more requests it will act on (None: no limit)."""
        with self._proxy._cond:
            return self._remaining

    @property
    def active(self) -> bool:
        """Still added (not removed); it may have used up its ``times``."""
        with self._proxy._cond:
            return self._active

    def remove(self) -> None:
        """Take the rule out; requests from now on are forwarded unless another rule matches."""
        self._proxy._remove_rule(self)

    def _matches(self, method: str, path: str, info: RequestInfo) -> bool:
        rule, action = self.rule, self.rule.action
        if self._remaining is not None and self._remaining <= 0:
            return False
        if rule.method is not None and rule.method.upper() != method:
            return False
        if rule.watch is not None and rule.watch != (info.verb == "watch"):
            return False
        if rule.verb is not None and rule.verb != info.verb:
            return False
        if isinstance(action, CutWatch) and info.verb != "watch":
            return False
        if isinstance(action, StripListItems) and (info.verb != "list" or method != "GET"):
            return False
        return self._pattern.search(path) is not None

    def __repr__(self) -> str:
        return f"RuleHandle({self.name!r}, fired={self._fired}, remaining={self._remaining})"


# ----------------------------------------------------------------------------------------------- proxy


class _ClientGone(Exception):
    """Writing to the client failed: it closed the connection."""


@dataclasses.dataclass(eq=False)
class _OpenWatch:
    path: str
    record: RequestRecord
    response: web.StreamResponse
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    closed: bool = False


def _abort(request: web.BaseRequest) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def _send(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
    except ConnectionError as exc:
        raise _ClientGone from exc


async def _send_eof(response: web.StreamResponse) -> None:
    try:
        await response.write_eof()
    except ConnectionError as exc:
        raise _ClientGone from exc


def _kubeconfig_path(value: Any, base: Path) -> Path:
    if not isinstance(value, str) or not value:
        raise ValueError("the kubeconfig must name the CA, client certificate and key as files (not *-data)")
    path = Path(value)
    return path if path.is_absolute() else base / path


class FaultProxy(LoopThread, ManagedService):
    """The proxy. ``FaultProxy(upstream_url, ca, cert, key)``, then :meth:`start` (or ``with``/``async with``)."""

    def __init__(
        self,
        upstream: str,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        if ssl_context is None and self.upstream.startswith("https://"):
            ssl_context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
            if cert is not None:
                ssl_context.load_cert_chain(str(cert), str(key) if key is not None else None)
        self._ssl = ssl_context
        self._cond = threading.Condition()  # guards every field below that the proxy thread changes
        self._records: list[RequestRecord] = []
        self._rules: list[RuleHandle] = []
        self._retired: list[RuleHandle] = []  # removed rules, kept in stats() until reset()
        self._rule_seq = 0
        self._watches: list[_OpenWatch] = []
        self._active: dict[int, web.BaseRequest] = {}  # in-flight requests by id(); loop-only
        self._stopping = False
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | Path, *, context: str | None = None) -> FaultProxy:
        """A proxy in front of the server of a kubeconfig's context, with its CA and client certificate."""
        path = Path(kubeconfig)
        doc = yaml.safe_load(path.read_text())
        ctx_name = context or doc["current-context"]
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
        base = path.resolve().parent
        server: str = cluster["server"]
        if not server.startswith("https://"):
            return cls(server)
        return cls(
            server,
            _kubeconfig_path(cluster.get("certificate-authority"), base),
            _kubeconfig_path(user.get("client-certificate"), base),
            _kubeconfig_path(user.get("client-key"), base),
        )

    # -- addresses
    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: what clients use."""
        if not self.port:
            raise RuntimeError("the fault proxy is not running: call start() first")
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: str | Path) -> Path:
        """Write a kubeconfig for the proxy (``server: http://127.0.0.1:<port>``, no credentials)."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "faultproxy", "cluster": {"server": self.url}}],
            "users": [{"name": "faultproxy", "user": {}}],
            "contexts": [{"name": "faultproxy", "context": {"cluster": "faultproxy", "user": "faultproxy"}}],
            "current-context": "faultproxy",
        }
        target = Path(path)
        target.write_text(yaml.safe_dump(doc, sort_keys=False))
        return target

    # -- records
    def requests(
        self,
        method: str | None = None,
        path_contains: str | None = None,
        verb: str | None = None,
        resource: str | None = None,
    ) -> list[RequestRecord]:
        """The recorded requests (copies) in arrival order, optionally filtered."""
        with self._cond:
            return [
                dataclasses.replace(r, query=dict(r.query))
                for r in self._records
                if (method is None or r.method == method.upper())
                and (path_contains is None or path_contains in r.path)
                and (verb is None or r.verb == verb)
                and (resource is None or r.resource == resource)
            ]

    def count(self, **filters: Unpack[RequestFilters]) -> int:
        """How many recorded requests match all the given filters (``requests`` with the same arguments, counted)."""
        return len(self.requests(**filters))

    def reset(self) -> None:
        """Forget the records and the stats of removed rules (added rules keep theirs)."""
        with self._cond:
            self._records.clear()
            self._retired.clear()

    # -- rules
    def add_rule(self, rule: Rule) -> RuleHandle:
        """Add ``rule`` after the existing ones and return its handle; rule names are unique until ``reset``."""
        with self._cond:
            self._rule_seq += 1
            name = rule.name or f"rule-{self._rule_seq}"
            if any(h.name == name for h in (*self._rules, *self._retired)):
                raise ValueError(f"a rule named {name!r} exists: remove it and reset(), or pick another name")
            handle = RuleHandle(self, rule, name)
            self._rules.append(handle)
            return handle

    def rules(self) -> list[RuleHandle]:
        """The active rules, in the order they are matched."""
        with self._cond:
            return list(self._rules)

    def clear_rules(self) -> None:
        """Deactivate every rule (their handles keep their counts); traffic is forwarded untouched from now on."""
        with self._cond:
            for handle in self._rules:
                handle._active = False
            self._retired.extend(self._rules)
            self._rules.clear()

    def _remove_rule(self, handle: RuleHandle) -> None:
        with self._cond:
            if handle in self._rules:
                self._rules.remove(handle)
                handle._active = False
                self._retired.append(handle)

    def stats(self) -> dict[str, int]:
        """How many times each rule fired: the added ones and those removed since the last reset()."""
        with self._cond:
            return {h.name: h._fired for h in (*self._retired, *self._rules)}

    def _take_rule(self, method: str, path: str, info: RequestInfo, record: RequestRecord) -> RuleHandle | None:
        with self._cond:
            for handle in self._rules:
                if handle._matches(method, path, info):
                    if handle._remaining is not None:
                        handle._remaining -= 1
                    handle._fired += 1
                    record.rule = handle.name
                    self._cond.notify_all()
                    return handle
        return None

    # -- watches
    def open_watches(self, path: str | None = None) -> int:
        """How many watches are streaming to a client now (``path``: a regex searched in their path)."""
        pattern = re.compile(path) if path is not None else None
        with self._cond:
            return sum(1 for w in self._watches if not w.closed and (pattern is None or pattern.search(w.path)))

    def inject_watch_event(self, path: str, event: JSON, *, timeout: float = CALL_TIMEOUT_S) -> int:
        """Write ``event`` as one JSON line into every open watch whose path matches the regex ``path``.

        Returns how many watches received it. The line goes between two upstream lines, never inside one.
        """
        return self._call(self._inject(re.compile(path), event), timeout)

    async def ainject_watch_event(self, path: str, event: JSON, *, timeout: float = CALL_TIMEOUT_S) -> int:
        """:meth:`inject_watch_event` for async tests, without blocking their loop."""
        return await self._acall(self._inject(re.compile(path), event), timeout)

    def inject_deleted(self, path: str, obj: JSON, *, timeout: float = CALL_TIMEOUT_S) -> int:
        """Inject ``{"type": "DELETED", "object": obj}`` into the matching open watches; return how many."""
        return self.inject_watch_event(path, {"type": "DELETED", "object": obj}, timeout=timeout)

    async def ainject_deleted(self, path: str, obj: JSON, *, timeout: float = CALL_TIMEOUT_S) -> int:
        """:meth:`inject_deleted` for async tests: a forged DELETED, the rumour the agent must confirm."""
        return await self.ainject_watch_event(path, {"type": "DELETED", "object": obj}, timeout=timeout)

    async def ainject_watch_events(self, path: str, events: list[JSON], *, timeout: float = CALL_TIMEOUT_S) -> int:
        """Write all ``events`` into every matching open watch in one burst (one write per watch)."""
        return await self._acall(self._inject(re.compile(path), events), timeout)

    async def _inject(self, pattern: re.Pattern[str], event: JSON | list[JSON]) -> int:
        events = event if isinstance(event, list) else [event]
        line = b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in events)
        with self._cond:
            targets = [w for w in self._watches if pattern.search(w.path)]
        reached = 0
        for watch in targets:
            async with watch.lock:
                if watch.closed:
                    continue
                try:
                    await _send(watch.response, line)
                except _ClientGone:
                    continue
                reached += 1
                self._update(watch.record, injected=watch.record.injected + 1)
        return reached

    # -- waiting
    def wait_for(self, predicate: Callable[[], bool], *, timeout: float = CALL_TIMEOUT_S, what: str = "") -> None:
        """Block until ``predicate()`` is true; it is re-checked whenever the proxy's state changes.

        Raises AssertionError after ``timeout`` seconds. The predicate may call this proxy's methods.
        """
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what or 'a fault proxy condition'}")

    async def await_for(
        self, predicate: Callable[[], bool], *, timeout: float = CALL_TIMEOUT_S, what: str = ""
    ) -> None:
        """:meth:`wait_for` for async tests: until ``predicate`` holds over the proxy's state, or ``timeout``."""
        await asyncio.to_thread(self.wait_for, predicate, timeout=timeout, what=what)

    def wait_watches(self, n: int = 1, path: str | None = None, *, timeout: float = CALL_TIMEOUT_S) -> None:
        """Block until at least ``n`` watches (matching ``path``) are open."""
        self.wait_for(lambda: self.open_watches(path) >= n, timeout=timeout, what=f"{n} open watch(es) on {path}")

    async def await_watches(self, n: int = 1, path: str | None = None, *, timeout: float = CALL_TIMEOUT_S) -> None:
        """:meth:`wait_watches` for async tests: wait until ``n`` watches (matching ``path``) are open."""
        await asyncio.to_thread(self.wait_watches, n, path, timeout=timeout)

    # -- lifecycle
    def start(self) -> int:
        """Start listening on a free loopback port; return it."""
        if self._thread is not None:
            return self.port
        self._stopping = False
        return self._start_thread("faultproxy")

    def stop(self) -> None:
        """Close every connection (open watches included) and end the thread. Idempotent."""
        self._stop_thread()

    async def astart(self) -> int:
        """:meth:`start` in a worker thread; returns the port."""
        return await asyncio.to_thread(self.start)

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        loop = self._loop
        if loop is None or self._thread is None:
            coro.close()
            raise RuntimeError("the fault proxy is not running: call start() first")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking fault proxy call from the proxy's own thread")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    async def _acall(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the fault proxy is not running: call start() first")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    async def _setup(self) -> int:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True, limit=0),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that goes away cancels its handler (a stall, a watch).
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=2.0
        )
        return await serve_on_loopback(self._runner)

    async def _cleanup(self) -> None:
        self._stopping = True
        with self._cond:
            for watch in self._watches:
                watch.closed = True
        for request in list(self._active.values()):
            _abort(request)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- request handling (proxy thread)
    def _update(self, record: RequestRecord, **changes: Any) -> None:
        with self._cond:
            for field, value in changes.items():
                setattr(record, field, value)
            self._cond.notify_all()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        info = classify(request.method, request.path, query)
        record = RequestRecord(
            method=request.method,
            path=request.path,
            query=query,
            verb=info.verb,
            resource=info.resource,
            is_watch=info.verb == "watch",
        )
        with self._cond:
            self._records.append(record)
            self._cond.notify_all()
        handle = self._take_rule(request.method, request.path, info, record)
        self._active[id(request)] = request
        try:
            return await self._dispatch(request, info, record, handle.rule.action if handle else None)
        except asyncio.CancelledError:
            if record.outcome == "pending":
                self._update(record, outcome="stopped" if self._stopping else "client-gone")
            raise
        finally:
            self._active.pop(id(request), None)

    async def _dispatch(
        self, request: web.Request, info: RequestInfo, record: RequestRecord, action: Action | None
    ) -> web.StreamResponse:
        if isinstance(action, Respond):
            response = web.Response(status=action.status, body=action.body, headers=CIMultiDict(action.headers))
            self._update(record, status=action.status, outcome="responded")
            return response
        if isinstance(action, Stall):
            if action.seconds is None:
                await asyncio.Event().wait()  # until cancelled: the client left or the proxy stops
            else:
                await asyncio.sleep(action.seconds)
            if action.then == "drop":
                return self._drop(request, record)
            return await self._forward(request, info, record, None)
        if isinstance(action, Drop):
            return self._drop(request, record)
        return await self._forward(request, info, record, action)

    def _drop(self, request: web.Request, record: RequestRecord) -> web.StreamResponse:
        self._update(record, outcome="dropped")
        _abort(request)
        return web.Response(status=503)  # never sent: writing to the aborted connection fails quietly

    async def _forward(
        self, request: web.Request, info: RequestInfo, record: RequestRecord, action: CutWatch | StripListItems | None
    ) -> web.StreamResponse:
        assert self._session is not None
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _REQUEST_SKIP]
        if isinstance(action, StripListItems):  # the body must be readable JSON
            headers = [(k, v) for k, v in headers if k.lower() != "accept-encoding"] + [("Accept-Encoding", "identity")]
        body = await request.read()
        url = URL(self.upstream + request.raw_path, encoded=True)
        response = web.StreamResponse()
        try:
            async with self._session.request(
                request.method, url, headers=headers, data=body or None, allow_redirects=False
            ) as upstream:
                if isinstance(action, StripListItems) and upstream.status == 200:
                    return await self._strip(upstream, record, action)
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in HOP_BY_HOP_HEADERS:
                        response.headers.add(name, value)
                streaming_watch = info.verb == "watch" and upstream.status == 200
                if upstream.content_length is not None and not streaming_watch:
                    response.content_length = upstream.content_length
                # Records change before the bytes that complete the answer go out, so a client that has its
                # answer sees the record final.
                self._update(record, status=upstream.status)
                expect_body = request.method != "HEAD" and upstream.status not in (204, 304)
                if not streaming_watch and (not expect_body or upstream.content_length == 0):
                    self._update(record, outcome="forwarded")
                try:
                    await response.prepare(request)
                except ConnectionError as exc:
                    raise _ClientGone from exc
                if streaming_watch:
                    cut = action if isinstance(action, CutWatch) else None
                    await self._stream_watch(request, upstream, response, record, cut)
                    return response
                if expect_body:
                    left = upstream.content_length
                    async for chunk in upstream.content.iter_any():
                        if left is not None:
                            left -= len(chunk)
                            if left <= 0:
                                self._update(record, outcome="forwarded")
                        await _send(response, chunk)
                if record.outcome == "pending":
                    self._update(record, outcome="forwarded")
                await _send_eof(response)
                return response
        except _ClientGone:
            self._update(record, outcome="client-gone")
            return response
        except (aiohttp.ClientError, OSError) as exc:
            self._update(record, outcome="upstream-error")
            if response.prepared:  # broken mid-body: the client must see a broken transfer too
                _abort(request)
                return response
            self._update(record, status=502)
            body_json = status_body(502, "ServiceUnavailable", f"faultproxy: upstream unreachable: {exc}")
            return web.json_response(body_json, status=502)

    async def _strip(
        self, upstream: aiohttp.ClientResponse, record: RequestRecord, action: StripListItems
    ) -> web.StreamResponse:
        raw = await upstream.read()
        stripped = 0
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("items"), list):
            items: list[Any] = doc["items"]
            kept = [item for item in items if not (isinstance(item, dict) and action.predicate(item))]
            stripped = len(items) - len(kept)
            doc["items"] = kept
            raw = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
        headers = CIMultiDict(
            (k, v)
            for k, v in upstream.headers.items()
            if k.lower() not in HOP_BY_HOP_HEADERS and k.lower() != "content-encoding"
        )
        response = web.Response(status=upstream.status, reason=upstream.reason, body=raw, headers=headers)
        self._update(record, status=upstream.status, stripped=stripped, outcome="forwarded")
        return response

    async def _stream_watch(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        response: web.StreamResponse,
        record: RequestRecord,
        cut: CutWatch | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        watch = _OpenWatch(request.path, record, response)
        with self._cond:
            self._watches.append(watch)
            self._cond.notify_all()
        deadline = loop.time() + cut.seconds if cut is not None and cut.seconds is not None else None
        limit = cut.events if cut is not None else None
        events = 0
        buffer = bytearray()
        try:
            while True:
                if limit is not None and events >= limit:
                    return await self._cut(request, watch, cut)
                timeout = None if deadline is None else deadline - loop.time()
                if timeout is not None and timeout <= 0:
                    return await self._cut(request, watch, cut)
                try:
                    chunk = await asyncio.wait_for(upstream.content.readany(), timeout)
                except TimeoutError:
                    return await self._cut(request, watch, cut)
                if not chunk:
                    break
                buffer += chunk
                lines: list[bytes] = []
                while (limit is None or events < limit) and (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[: end + 1])
                    del buffer[: end + 1]
                    lines.append(line)
                    if line.strip():
                        events += 1
                if lines:
                    async with watch.lock:
                        if watch.closed:
                            return
                        await _send(response, b"".join(lines))
                    self._update(record, events=events)
            async with watch.lock:
                watch.closed = True
                self._update(record, outcome="forwarded")
                if buffer:
                    await _send(response, bytes(buffer))
                await _send_eof(response)
        finally:
            with self._cond:
                watch.closed = True
                self._watches.remove(watch)
                self._cond.notify_all()

    async def _cut(self, request: web.Request, watch: _OpenWatch, cut: CutWatch | None) -> None:
        async with watch.lock:
            watch.closed = True
            self._update(watch.record, outcome="cut")
            if cut is not None and cut.abrupt:
                _abort(request)
            else:
                await _send_eof(watch.response)
