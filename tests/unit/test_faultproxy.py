"""The fault proxy against a tiny aiohttp upstream that serves a fake ConfigMap collection over plain HTTP.

The upstream's watch streams exactly the lines the test pushes into it, so every step waits on an event
(the upstream saw the watch, the proxy opened it, the client read a line), never on a sleep.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from model_agent.kube.client import ApiError, ApiUnavailable, KubeClient
from testbed.ports import free_port
from testbed.proxies.faultproxy import (
    FaultProxy,
    Rule,
    by_name,
    classify,
    cut_watch_after,
    drop,
    object_not_found,
    respond,
    stall,
    strip_list_items,
)
from tests.support.waiting import eventually

WAIT_S = 5.0
CM_PATH = "/api/v1/configmaps"
NS_PATH = "/api/v1/namespaces/default/configmaps"


def configmap(name: str, rv: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv), "uid": f"uid-{name}"},
        "data": {"k": name},
    }


def event_line(kind: str, name: str, rv: int) -> bytes:
    return json.dumps({"type": kind, "object": configmap(name, rv)}).encode() + b"\n"


class Upstream:
    """A fake API server: LIST/watch of configmaps, GET/POST of one, /version; counts what reaches it."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, str]] = []
        self.items = [configmap(n) for n in ("a", "b", "c")]
        self.initial_lines: list[bytes] = []  # written at once when a watch opens
        self.watches: list[asyncio.Queue[bytes | None]] = []
        self.watch_opened = asyncio.Event()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(CM_PATH, self.collection)
        app.router.add_get(NS_PATH + "/{name}", self.get)
        app.router.add_post(NS_PATH, self.create)
        app.router.add_get("/version", self.version)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        for queue in self.watches:
            queue.put_nowait(None)
        if self.runner is not None:
            await self.runner.cleanup()

    def push(self, line: bytes | None) -> None:
        """Send ``line`` on every open watch (``None`` ends them)."""
        for queue in self.watches:
            queue.put_nowait(line)

    async def collection(self, request: web.Request) -> web.StreamResponse:
        self.hits.append((request.method, request.path_qs))
        if request.query.get("watch") != "true":
            return web.json_response(
                {"kind": "ConfigMapList", "metadata": {"resourceVersion": "7"}, "items": self.items}
            )
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.watches.append(queue)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            for first in self.initial_lines:
                await response.write(first)
            self.watch_opened.set()
            while (line := await queue.get()) is not None:
                await response.write(line)
            await response.write_eof()
        except ConnectionError:
            pass
        finally:
            self.watches.remove(queue)
        return response

    async def get(self, request: web.Request) -> web.Response:
        self.hits.append((request.method, request.path_qs))
        return web.json_response(configmap(request.match_info["name"]), headers={"Audit-Id": "audit-1"})

    async def create(self, request: web.Request) -> web.Response:
        self.hits.append((request.method, request.path_qs))
        return web.json_response(await request.json(), status=201)

    async def version(self, request: web.Request) -> web.Response:
        self.hits.append((request.method, request.path_qs))
        return web.json_response({"major": "1", "minor": "36", "gitVersion": "v1.36.3"})


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = Upstream()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def proxy(upstream: Upstream) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(upstream.url) as p:
        yield p


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:
        yield session


@pytest.fixture
async def kube(proxy: FaultProxy, tmp_path: Path) -> AsyncIterator[KubeClient]:
    client = await KubeClient.connect(proxy.write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield client
    finally:
        await client.close()


async def read_line(response: aiohttp.ClientResponse) -> bytes:
    return await asyncio.wait_for(response.content.readline(), WAIT_S)


# ----------------------------------------------------------------------------------------------- classify


@pytest.mark.parametrize(
    ("method", "path", "verb", "resource", "name"),
    [
        ("GET", "/version", "get", "", ""),
        ("GET", "/api/v1", "get", "", ""),
        ("GET", "/apis/ome.io/v1beta1", "get", "", ""),
        ("GET", "/api/v1/nodes", "list", "nodes", ""),
        ("GET", "/api/v1/nodes?watch=true&resourceVersion=5", "watch", "nodes", ""),
        ("GET", "/api/v1/nodes?watch=1", "watch", "nodes", ""),
        ("GET", "/api/v1/nodes?watch=false", "list", "nodes", ""),
        ("GET", "/api/v1/nodes/n1", "get", "nodes", "n1"),
        ("GET", "/api/v1/namespaces", "list", "namespaces", ""),
        ("GET", "/api/v1/namespaces/ome", "get", "namespaces", "ome"),
        ("GET", "/api/v1/namespaces/ome/configmaps?fieldSelector=metadata.name%3Dx", "list", "configmaps", ""),
        ("GET", "/apis/ome.io/v1beta1/namespaces/ns/basemodels", "list", "basemodels", ""),
        ("GET", "/apis/ome.io/v1beta1/clusterbasemodels?watch=true", "watch", "clusterbasemodels", ""),
        ("GET", "/api/v1/watch/namespaces/ns/configmaps", "watch", "configmaps", ""),
        ("POST", "/apis/ome.io/v1beta1/namespaces/ns/basemodels", "create", "basemodels", ""),
        ("PUT", "/apis/ome.io/v1beta1/clusterbasemodels/m/status", "update", "clusterbasemodels", "m"),
        ("PATCH", "/api/v1/nodes/n1", "patch", "nodes", "n1"),
        ("DELETE", "/api/v1/namespaces/ns/events/e1", "delete", "events", "e1"),
        ("DELETE", "/api/v1/namespaces/ns/events", "deletecollection", "events", ""),
        ("POST", "/api/v1/namespaces/ns/events", "create", "events", ""),
    ],
)
def test_classify_like_the_api_server(method: str, path: str, verb: str, resource: str, name: str) -> None:
    info = classify(method, path)
    assert (info.verb, info.resource, info.name) == (verb, resource, name)


def test_classify_field_selector_name_and_subresource() -> None:
    info = classify("GET", "/api/v1/namespaces/ns/configmaps", {"fieldSelector": "metadata.name=x", "watch": "true"})
    assert (info.verb, info.namespace, info.name) == ("watch", "ns", "x")
    status = classify("PUT", "/apis/ome.io/v1beta1/namespaces/ns/basemodels/m/status")
    assert (status.group, status.version, status.subresource) == ("ome.io", "v1beta1", "status")


# ----------------------------------------------------------------------------------------------- pass-through


async def test_pass_through_is_byte_exact_and_counted(
    proxy: FaultProxy, upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    for path in (CM_PATH, NS_PATH + "/x", "/version"):
        async with http.get(upstream.url + path) as direct:
            expected = (direct.status, direct.headers.get("Content-Type"), await direct.read())
        async with http.get(proxy.url + path) as proxied:
            got = (proxied.status, proxied.headers.get("Content-Type"), await proxied.read())
            if path.endswith("/x"):
                assert proxied.headers["Audit-Id"] == "audit-1"
        assert got == expected
    async with http.post(proxy.url + NS_PATH, json=configmap("new")) as created:
        assert created.status == 201
        assert (await created.json())["metadata"]["name"] == "new"

    records = proxy.requests()
    assert [(r.method, r.path, r.verb, r.status, r.outcome) for r in records] == [
        ("GET", CM_PATH, "list", 200, "forwarded"),
        ("GET", NS_PATH + "/x", "get", 200, "forwarded"),
        ("GET", "/version", "get", 200, "forwarded"),
        ("POST", NS_PATH, "create", 201, "forwarded"),
    ]
    assert proxy.count() == 4
    assert proxy.count(verb="list") == 1
    assert proxy.count(method="post") == 1
    assert proxy.count(path_contains="configmaps") == 3
    assert proxy.count(resource="configmaps", verb="get") == 1
    proxy.reset()
    assert proxy.count() == 0


async def test_watch_is_streamed_line_by_line(
    proxy: FaultProxy, upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with http.get(proxy.url + CM_PATH, params={"watch": "true", "resourceVersion": "7"}) as watch:
        assert watch.status == 200
        await asyncio.wait_for(upstream.watch_opened.wait(), WAIT_S)
        # Each line reaches the client while the upstream still holds the stream open: nothing is buffered.
        for rv, name in enumerate(("a", "b"), start=8):
            upstream.push(event_line("MODIFIED", name, rv))
            assert await read_line(watch) == event_line("MODIFIED", name, rv)
        # A line split across two upstream writes arrives whole.
        line = event_line("ADDED", "d", 10)
        upstream.push(line[:20])
        upstream.push(line[20:])
        assert await read_line(watch) == line
        upstream.push(None)
        assert await asyncio.wait_for(watch.content.read(), WAIT_S) == b""
    await proxy.await_for(lambda: proxy.requests()[0].outcome != "pending", timeout=WAIT_S)
    (record,) = proxy.requests()
    assert (record.verb, record.is_watch, record.query, record.events, record.outcome) == (
        "watch",
        True,
        {"watch": "true", "resourceVersion": "7"},
        3,
        "forwarded",
    )


# ----------------------------------------------------------------------------------------------- rules


async def test_respond_fires_exactly_n_times(
    proxy: FaultProxy, upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    handle = proxy.add_rule(Rule(CM_PATH + "$", respond(503), verb="list", times=2, name="unavailable"))
    statuses = []
    for _ in range(3):
        async with http.get(proxy.url + CM_PATH) as answer:
            statuses.append(answer.status)
            body = await answer.json()
    assert statuses == [503, 503, 200]
    assert body["kind"] == "ConfigMapList"
    assert upstream.hits == [("GET", CM_PATH)]
    assert (handle.fired, handle.remaining, proxy.stats()) == (2, 0, {"unavailable": 2})
    assert [r.rule for r in proxy.requests()] == ["unavailable", "unavailable", None]
    assert [r.outcome for r in proxy.requests()] == ["responded", "responded", "forwarded"]


async def test_respond_429_and_not_found_through_kube_client(
    proxy: FaultProxy, upstream: Upstream, kube: KubeClient
) -> None:
    assert kube.host == proxy.url  # the http kubeconfig without credentials loads
    proxy.add_rule(Rule(CM_PATH, respond(429, retry_after=3), method="GET", times=1))
    proxy.add_rule(Rule(NS_PATH + "/gone$", respond(404, object_not_found("configmaps", "gone"))))
    with pytest.raises(ApiError) as throttled:
        await kube.request("GET", CM_PATH)
    assert (throttled.value.status, throttled.value.reason, throttled.value.retry_after_s) == (
        429,
        "TooManyRequests",
        3,
    )
    with pytest.raises(ApiError) as missing:
        await kube.request("GET", NS_PATH + "/gone")
    assert missing.value.is_object_not_found("gone")
    assert missing.value.message == 'configmaps "gone" not found'
    assert (await kube.request("GET", NS_PATH + "/here"))["metadata"]["name"] == "here"
    assert proxy.stats() == {"rule-1": 1, "rule-2": 1}


async def test_rules_can_be_removed(proxy: FaultProxy, http: aiohttp.ClientSession) -> None:
    first = proxy.add_rule(Rule("", respond(500)))
    proxy.add_rule(Rule("/version", respond(418)))
    async with http.get(proxy.url + "/version") as answer:
        assert answer.status == 500  # the first matching rule wins
    first.remove()
    assert not first.active
    async with http.get(proxy.url + "/version") as answer:
        assert answer.status == 418
    proxy.clear_rules()
    async with http.get(proxy.url + "/version") as answer:
        assert answer.status == 200
    assert proxy.stats() == {"rule-1": 1, "rule-2": 1}
    with pytest.raises(ValueError, match="exists"):
        proxy.add_rule(Rule("", drop(), name="rule-1"))


async def test_strip_list_items_removes_exactly_the_chosen_items(
    proxy: FaultProxy, upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    handle = proxy.add_rule(Rule(CM_PATH + "$", strip_list_items(by_name("b"))))
    async with http.get(proxy.url + CM_PATH) as answer:
        raw = await answer.read()
        assert answer.headers["Content-Length"] == str(len(raw))
        stripped = json.loads(raw)
    assert [i["metadata"]["name"] for i in stripped["items"]] == ["a", "c"]
    assert stripped["metadata"] == {"resourceVersion": "7"}
    async with http.get(upstream.url + CM_PATH) as direct:
        assert [i["metadata"]["name"] for i in (await direct.json())["items"]] == ["a", "b", "c"]
    # A watch of the same path is no LIST: the rule does not fire for it.
    async with http.get(proxy.url + CM_PATH, params={"watch": "true"}) as watch:
        await proxy.await_watches(1, CM_PATH)
        upstream.push(event_line("ADDED", "b", 9))
        assert await read_line(watch) == event_line("ADDED", "b", 9)
    assert handle.fired == 1
    assert proxy.requests()[0].stripped == 1


async def test_cut_watch_after_two_events(proxy: FaultProxy, upstream: Upstream, http: aiohttp.ClientSession) -> None:
    upstream.initial_lines = [event_line("ADDED", n, rv) for rv, n in enumerate("abcde", start=8)]
    proxy.add_rule(Rule(CM_PATH, cut_watch_after(events=2), name="cut"))
    async with http.get(proxy.url + CM_PATH, params={"watch": "true"}) as watch:
        body = await asyncio.wait_for(watch.content.read(), WAIT_S)  # ends: the proxy closed the stream
    assert body.splitlines(keepends=True) == upstream.initial_lines[:2]
    await proxy.await_for(lambda: proxy.requests()[0].outcome == "cut", timeout=WAIT_S)
    assert proxy.requests()[0].events == 2
    assert proxy.stats() == {"cut": 1}


async def test_cut_watch_after_seconds_abruptly(
    proxy: FaultProxy, upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    upstream.initial_lines = [event_line("ADDED", "a", 8)]
    proxy.add_rule(Rule(CM_PATH, cut_watch_after(seconds=0.2, abrupt=True), watch=True))
    started = time.monotonic()
    async with http.get(proxy.url + CM_PATH, params={"watch": "true"}) as watch:
        assert await read_line(watch) == upstream.initial_lines[0]
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(watch.content.read(), WAIT_S)
    assert time.monotonic() - started >= 0.2


async def test_inject_deleted_reaches_an_open_watch(proxy: FaultProxy, upstream: Upstream, kube: KubeClient) -> None:
    upstream.initial_lines = [event_line("ADDED", "a", 8)]
    events = kube.watch_lines(CM_PATH, query={"watch": "true"}, read_timeout=WAIT_S)
    try:
        first = await asyncio.wait_for(anext(events), WAIT_S)
        assert first["type"] == "ADDED"
        await proxy.await_watches(1, CM_PATH)
        assert await proxy.ainject_deleted("/secrets$", configmap("a")) == 0
        assert await proxy.ainject_deleted(CM_PATH + "$", configmap("a", 8)) == 1
        assert await asyncio.wait_for(anext(events), WAIT_S) == {"type": "DELETED", "object": configmap("a", 8)}
        upstream.push(event_line("MODIFIED", "b", 9))  # the real stream goes on after the injected line
        assert (await asyncio.wait_for(anext(events), WAIT_S))["object"]["metadata"]["name"] == "b"
    finally:
        await events.aclose()

    # The proxy counts an event after writing it: the client may read it a moment before the count moves.
    async def counted() -> bool:
        (record,) = proxy.requests()
        return (record.injected, record.events) == (1, 2)

    await eventually(counted, timeout=WAIT_S, what="the proxy counted the injected and the real event")


async def test_stall_holds_the_request(proxy: FaultProxy, upstream: Upstream, http: aiohttp.ClientSession) -> None:
    proxy.add_rule(Rule("/version", stall(30.0), times=1))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with http.get(proxy.url + "/version", timeout=aiohttp.ClientTimeout(total=0.3)) as answer:
            await answer.read()
    assert time.monotonic() - started >= 0.3
    assert upstream.hits == []  # held: nothing reached the upstream
    # The client gave up, which ends the stall (the handler is cancelled).
    await proxy.await_for(lambda: proxy.requests()[0].outcome == "client-gone", timeout=WAIT_S)

    proxy.add_rule(Rule("/version", stall(0.2), times=1))  # a short stall, then forwarded
    started = time.monotonic()
    async with http.get(proxy.url + "/version") as answer:
        assert answer.status == 200
    assert time.monotonic() - started >= 0.2
    assert upstream.hits == [("GET", "/version")]


async def test_drop_and_stall_then_drop_close_the_connection(
    proxy: FaultProxy, upstream: Upstream, http: aiohttp.ClientSession, kube: KubeClient
) -> None:
    # aiohttp resends an idempotent request once after a disconnect, so each failed call costs two drops.
    proxy.add_rule(Rule("/version", drop(), times=2))
    proxy.add_rule(Rule("/version", stall(0.05, then="drop"), times=2))
    proxy.add_rule(Rule(CM_PATH, drop(), times=2))
    for _ in range(2):
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with http.get(proxy.url + "/version") as answer:
                await answer.read()
    with pytest.raises(ApiUnavailable, match="ServerDisconnectedError"):
        await kube.request("GET", CM_PATH)
    assert upstream.hits == []
    assert [r.outcome for r in proxy.requests()] == ["dropped"] * 6
    assert proxy.stats() == {"rule-1": 2, "rule-2": 2, "rule-3": 2}
    assert (await kube.request("GET", CM_PATH))["kind"] == "ConfigMapList"


async def test_stop_closes_open_watches(upstream: Upstream, http: aiohttp.ClientSession) -> None:
    proxy = FaultProxy(upstream.url)
    await proxy.astart()
    try:
        async with http.get(proxy.url + CM_PATH, params={"watch": "true"}) as watch:
            await proxy.await_watches(1)
            records = proxy.requests
            await proxy.astop()
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(watch.content.read(), WAIT_S)
        assert [r.outcome for r in records()] == ["stopped"]
        assert proxy.open_watches() == 0
    finally:
        await proxy.astop()


async def test_unreachable_upstream_is_a_502(http: aiohttp.ClientSession) -> None:
    async with FaultProxy(f"http://127.0.0.1:{free_port()}") as proxy:
        async with http.get(proxy.url + "/version") as answer:
            assert answer.status == 502
            assert (await answer.json())["kind"] == "Status"
        assert proxy.requests()[0].outcome == "upstream-error"
