"""The Kubernetes client adapter: the only module that may import kubernetes_asyncio.

Role: turn a kubeconfig (or the in-cluster service account) into an authenticated HTTP session, and
offer three primitives on it that the rest of the agent is built from:

* ``request``: one JSON request/response with a mandatory deadline;
* ``watch_lines``: a streaming GET (a watch) yielding decoded JSON events, with a read timeout so a dead
  stream is noticed;
* typed errors: every failure is an :class:`ApiError` with the HTTP status and the decoded ``Status``
  body (so callers can tell the object's own NotFound from a missing resource type), or an
  :class:`ApiUnavailable` for transport failures and deadlines.

Contract: no request is ever sent without a deadline. Credentials come from
:mod:`model_agent.kube.kubeconfig` (in-cluster service account, certificates, tokens); only a kubeconfig that
needs the Kubernetes client library (``exec`` or ``auth-provider`` plugins, basic auth, ``tls-server-name``,
``proxy-url``, a merged ``$KUBECONFIG``) imports ``kubernetes_asyncio``, lazily, for configuration loading and
its connection pool — that import alone is about 35 MiB of RSS, which an agent in a pod never pays. Either way
requests go through one aiohttp session (up to 100 connections, proxies from the environment, a 2 MiB read
buffer for large watch events). Everything above this layer works on plain ``dict`` objects and the small
views in ``model/``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from model_agent.kube import kubeconfig as _kubeconfig

JSON = dict[str, Any]


async def _nothing() -> None:
    """A view's close: the connection pool belongs to the client it was made from."""


DEFAULT_TIMEOUT_S = 10.0
# Accept for a LIST of objects' metadata only (PartialObjectMetadataList): a ConfigMap's annotations without its data.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"

# The session the library would build: its connection limit, and a read buffer large enough for a watch event
# carrying a big object (etcd accepts requests up to 1.5 MiB).
POOL_CONNECTIONS = 100
READ_BUFFER_BYTES = 2**21

# Called after every request with (verb, resource, status code or 0, seconds); metrics hook in here.
RequestObserver = Callable[[str, str, int, float], None]


class ApiError(Exception):
    """The API server answered with an HTTP error status."""

    def __init__(self, status: int, body: JSON | None, method: str, path: str) -> None:
        self.status = status
        self.body = body or {}
        self.method = method
        self.path = path
        self.reason = str(self.body.get("reason", ""))
        self.message = str(self.body.get("message", ""))
        details = self.body.get("details")
        self.details: JSON = details if isinstance(details, dict) else {}
        super().__init__(f"{method} {path}: HTTP {status} {self.reason}: {self.message}".strip())

    @property
    def retry_after_s(self) -> float | None:
        """The server's ``retryAfterSeconds`` hint (429, 503), to wait at least that long; None when it gave none."""
        value = self.details.get("retryAfterSeconds")
        return float(value) if isinstance(value, (int, float)) else None

    def is_object_not_found(self, name: str, plural: str | None = None) -> bool:
        """True only for the object's own NotFound, not for a missing resource type or endpoint.

        The API server answers a GET of a vanished object with a ``Status`` whose reason is ``NotFound``
        and whose ``details.name`` is the object's name. A resource type that is gone (its CRD was deleted)
        answers 404 with a plain body or without the name: that is not proof the object is gone.
        """
        if plural is not None and self.details.get("kind") not in (None, plural):
            return False  # a NotFound about some other resource (a misrouted request) proves nothing here
        return self.status == 404 and self.reason == "NotFound" and self.details.get("name") == name


class ApiUnavailable(Exception):
    """No answer: connection refused or reset, TLS failure, or the deadline passed."""


@dataclass(frozen=True)
class Response:
    """A decoded answer whose status the caller needs too (a 201 Created against a 200 OK, say)."""

    status: int
    body: JSON


def _resource_of(path: str) -> str:
    """The resource name of an API path, for metrics (``/api/v1/nodes/x`` -> ``nodes``)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    if len(parts) >= 2 and parts[0] == "namespaces":
        parts = parts[2:] if len(parts) > 2 else ["namespaces"]
    return parts[0] if parts else "unknown"


class KubeClient:
    """An authenticated session to one API server. Create with :meth:`connect`; close with :meth:`close`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        host: str,
        authorization: Callable[[], Awaitable[str | None]],
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._session = session
        self._authorization = authorization
        self._close = close or session.close
        self.host: str = host.rstrip("/")
        self.observers: list[RequestObserver] = []
        # Optional async gate taken before every request (the client-side rate limiter hooks in here).
        self.before_request: Callable[[], Awaitable[None]] | None = None

    def with_budget(self, before_request: Callable[[], Awaitable[None]] | None) -> KubeClient:
        """This client (same connection pool, credentials and observers) drawing on another budget: requests through
        it take ``before_request`` instead of this client's gate. Close the original, not this view."""
        view = KubeClient(self._session, self.host, self._authorization, close=_nothing)
        view.observers = self.observers
        view.before_request = before_request
        return view

    @classmethod
    async def connect(cls, kubeconfig: str | Path | None = None, *, context: str | None = None) -> KubeClient:
        """Load credentials: an explicit kubeconfig, else in-cluster, else ``$KUBECONFIG`` / ``~/.kube/config``."""
        creds: _kubeconfig.Credentials | _kubeconfig.NeedsLibrary | None
        if kubeconfig is not None:
            creds = _kubeconfig.load(Path(kubeconfig), context)
        else:
            creds = _kubeconfig.in_cluster()
            if creds is None:
                default = _kubeconfig.default_kubeconfig()
                creds = (
                    _kubeconfig.load(default, context)
                    if default is not None
                    else _kubeconfig.NeedsLibrary("$KUBECONFIG lists several files")
                )
        if isinstance(creds, _kubeconfig.NeedsLibrary):
            return await cls._connect_with_library(kubeconfig, context)
        tls = _kubeconfig.ssl_context(creds) if creds.host.startswith("https") else None
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=POOL_CONNECTIONS, ssl=tls if tls is not None else True),
            trust_env=True,
            read_bufsize=READ_BUFFER_BYTES,
        )
        tokens = _kubeconfig.TokenSource(creds)

        async def authorization() -> str | None:
            """The token header, re-read from its file when a minute old (a rotated projected token)."""
            return tokens.header()

        return cls(session, creds.host, authorization)

    @classmethod
    async def _connect_with_library(cls, kubeconfig: str | Path | None, context: str | None) -> KubeClient:
        """The Kubernetes client library's loader, for the kubeconfig features kube/kubeconfig.py leaves to it."""
        from kubernetes_asyncio import config as k8s_config
        from kubernetes_asyncio.client import ApiClient, Configuration

        cfg = Configuration()
        if kubeconfig is not None:
            await k8s_config.load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=cfg)
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            except k8s_config.ConfigException:
                await k8s_config.load_kube_config(context=context, client_configuration=cfg)
        api = ApiClient(configuration=cfg)
        session: aiohttp.ClientSession = api.rest_client.pool_manager

        async def authorization() -> str | None:
            # kubernetes_asyncio keeps the bearer token (and refreshes exec/in-cluster ones) under "BearerToken".
            token: str | None = await cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
            return token

        return cls(session, str(cfg.host or ""), authorization, close=api.close)

    async def close(self) -> None:
        """Close the connection pool; the client cannot be used afterwards."""
        await self._close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _headers(self, content_type: str | None, accept: str = "application/json") -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": "model-agent"}
        if content_type:
            headers["Content-Type"] = content_type
        token = await self._authorization()
        if token:
            headers["Authorization"] = token
        return headers

    def _observe(self, method: str, path: str, status: int, started: float) -> None:
        elapsed = time.monotonic() - started
        resource = _resource_of(path)
        for observer in self.observers:
            observer(method, resource, status, elapsed)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        accept: str = "application/json",
    ) -> JSON:
        """Send one request and return the decoded JSON body; raise ApiError / ApiUnavailable.

        ``accept``: e.g. :data:`METADATA_LIST`, a LIST of the objects' metadata only."""
        if self.before_request is not None:
            await self.before_request()
        data = None if body is None else json.dumps(body).encode()
        if data is not None and content_type is None:
            content_type = "application/json"
        url = self.host + path
        started = time.monotonic()
        status = 0
        try:
            async with self._session.request(
                method,
                url,
                params=dict(query) if query else None,
                data=data,
                headers=await self._headers(content_type, accept),
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                status = resp.status
                raw = await resp.read()
        except TimeoutError as exc:
            self._observe(method, path, 0, started)
            raise ApiUnavailable(f"{method} {path}: no answer within {timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            self._observe(method, path, 0, started)
            raise ApiUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        self._observe(method, path, status, started)
        decoded = _decode(raw)
        if status >= 400:
            raise ApiError(status, decoded, method, path)
        return decoded

    async def watch_lines(
        self,
        path: str,
        *,
        query: Mapping[str, str | int],
        connect_timeout: float = DEFAULT_TIMEOUT_S,
        read_timeout: float,
    ) -> AsyncGenerator[JSON, None]:
        """Stream a watch: yield each decoded event; end when the server closes the stream.

        ``read_timeout`` bounds the silence between two lines (bookmarks arrive about once a minute), so a
        stream that died without a FIN is noticed and raised as ApiUnavailable.
        """
        if self.before_request is not None:
            await self.before_request()
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        try:
            async with self._session.get(
                self.host + path,
                params={k: str(v) for k, v in query.items()},
                headers=await self._headers(None),
                timeout=timeout,
            ) as resp:
                self._observe("WATCH", path, resp.status, started)
                if resp.status >= 400:
                    raise ApiError(resp.status, _decode(await resp.read()), "WATCH", path)
                async for line in resp.content:
                    if line.strip():
                        event = _decode(line)
                        if event:
                            yield event
        except TimeoutError as exc:
            raise ApiUnavailable(f"WATCH {path}: silent for {read_timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            raise ApiUnavailable(f"WATCH {path}: {type(exc).__name__}: {exc}") from exc


def _decode(raw: bytes) -> JSON:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"message": raw[:500].decode(errors="replace")}
    return value if isinstance(value, dict) else {"items": value}


def qs(value: str) -> str:
    """Quote one path segment (names are DNS labels, but never trust input in a URL)."""
    return quote(value, safe="")
