"""The peers' cluster side: tokens re-read on rotation, reviews that cannot be made refuse, holders from Nodes, bans."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.settings import Settings
from model_agent.kube.client import ApiUnavailable
from model_agent.model.keys import node_label_key
from model_agent.peers import PEER_ADDRESS_ANNOTATION, PeerConfig
from model_agent.peers.auth import TokenFile, TokenReviewer
from model_agent.peers.bans import Bans
from model_agent.peers.directory import PARALLEL_LISTS, PeerDirectory, model_label_keys
from tests.support.waiting import until


def test_token_file_is_read_again_when_the_kubelet_rotates_it(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    tokens = TokenFile(str(path))
    assert tokens.token() == "first"
    path.write_text("second-token\n")
    os.utime(path, ns=(1, 2))  # a new mtime whatever the clock's resolution
    assert tokens.token() == "second-token"
    path.unlink()
    assert tokens.token() == ""  # unreadable: no token, so peers are not asked


class DownApi:
    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.called = asyncio.Event()

    async def request(self, *_a: Any, **_kw: Any) -> dict[str, Any]:
        self.calls += 1
        self.called.set()
        await self.gate.wait()
        raise ApiUnavailable("connection refused")


async def test_a_review_that_cannot_be_made_refuses_and_is_not_cached() -> None:
    api = DownApi()
    reviewer = TokenReviewer(api, "aud", "me")  # type: ignore[arg-type]
    waiting = [asyncio.create_task(reviewer.check("Bearer t")) for _ in range(5)]
    await api.called.wait()  # the first review is in flight; the other four found it (same loop turn)
    api.gate.set()
    verdicts = await asyncio.gather(*waiting)
    assert {v.status for v in verdicts} == {503} and api.calls == 1  # one review for five requests at once
    assert (await reviewer.check("Bearer t")).status == 503 and api.calls == 2  # not cached
    assert (await reviewer.check("Basic abc")).status == 401 and api.calls == 2


class NodesApi:
    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.queries: list[str] = []

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        assert method == "GET" and path == "/api/v1/nodes"
        selector = kw["query"]["labelSelector"]
        self.queries.append(selector)
        if " in (" in selector:  # <key> in (v1,v2)
            key, values = selector.split(" in (")
            wanted = set(values.rstrip(")").split(","))
        else:
            key, value = selector.split("=")
            wanted = {value}
        return {"items": [n for n in self.nodes if n["metadata"].get("labels", {}).get(key) in wanted]}


def _node(name: str, labels: dict[str, str], address: str | None) -> dict[str, Any]:
    annotations = {PEER_ADDRESS_ANNOTATION: address} if address else {}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


async def test_holders_are_other_nodes_ready_for_a_model_of_the_source_with_an_address() -> None:
    uri = "hf://acme/m"
    models = {
        "ClusterBaseModel": [{"metadata": {"name": "m"}, "spec": {"storage": {"storageUri": uri}}}],
        "BaseModel": [
            {"metadata": {"namespace": "team", "name": "m2"}, "spec": {"storage": {"storageUri": uri}}},
            {"metadata": {"namespace": "team", "name": "other"}, "spec": {"storage": {"storageUri": "hf://x/y"}}},
        ],
    }
    cluster_key = node_label_key("ClusterBaseModel", "", "m")
    tenant_key = node_label_key("BaseModel", "team", "m2")
    assert model_label_keys(uri, models) == sorted([cluster_key, tenant_key])
    api = NodesApi(
        [
            _node("me", {cluster_key: "Ready"}, "10.0.0.1:8090"),  # this node: never its own peer
            _node("a", {cluster_key: "Ready"}, "10.0.0.2:8090"),
            _node("b", {tenant_key: "Ready"}, "10.0.0.3:8090"),  # another tenant's model, same source
            _node("c", {cluster_key: "Updating"}, "10.0.0.4:8090"),
            _node("d", {cluster_key: "Ready"}, None),  # no peer service
            _node("e", {cluster_key: "Failed"}, "10.0.0.6:8090"),
            _node("f", {cluster_key: "Updating", tenant_key: "Ready"}, "10.0.0.7:8090"),  # Ready for one: Ready
        ]
    )
    directory = PeerDirectory(api, "me", lambda: models)  # type: ignore[arg-type]
    assert await directory.holders(uri) == ["10.0.0.2:8090", "10.0.0.3:8090", "10.0.0.7:8090"]
    assert len(api.queries) == 2  # one LIST per label key for both lists
    assert await directory.relaying(uri) == ["10.0.0.4:8090"]  # fetching it: relays its durable parts
    assert await directory.holders(uri) == ["10.0.0.2:8090", "10.0.0.3:8090", "10.0.0.7:8090"]
    assert len(api.queries) == 2  # cached for the files of one fetch
    assert await directory.holders("hf://nobody/holds") == []


async def test_callers_share_a_running_lookup_and_its_lists_run_at_once() -> None:
    uri = "hf://acme/m"
    names = [f"m{i}" for i in range(6)]  # six models of one source: six label keys, six LISTs per lookup
    models = {"ClusterBaseModel": [{"metadata": {"name": n}, "spec": {"storage": {"storageUri": uri}}} for n in names]}
    key = node_label_key("ClusterBaseModel", "", "m3")
    api = NodesApi([_node("a", {key: "Updating"}, "10.0.0.2:8090")])
    gate = asyncio.Event()
    in_flight, most = 0, 0
    answer = api.request

    async def slow(method: str, path: str, **kw: Any) -> dict[str, Any]:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await gate.wait()
            return await answer(method, path, **kw)
        finally:
            in_flight -= 1

    api.request = slow  # type: ignore[method-assign]
    directory = PeerDirectory(api, "me", lambda: models)  # type: ignore[arg-type]
    # the four files of one fetch ask at once, the cache empty
    asking = [asyncio.ensure_future(directory.relaying(uri)) for _ in range(4)]
    await until(lambda: in_flight == PARALLEL_LISTS, "the first LISTs in flight together")
    gate.set()
    assert await asyncio.wait_for(asyncio.gather(*asking), 5) == [["10.0.0.2:8090"]] * 4
    assert len(api.queries) == len(names)  # one lookup for the four callers
    assert most == PARALLEL_LISTS  # several LISTs at once, never more than the bound


def test_bans_expire_and_count() -> None:
    seen: list[str] = []
    bans = Bans(10, on_ban=seen.append)
    bans.ban("a", now=100)
    assert bans.banned("a", now=105) and not bans.banned("b", now=105)
    assert not bans.banned("a", now=111)
    assert bans.total == 1 and seen == ["a"]


def test_config_from_flags_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("MODEL_AGENT_PEER_")]:
        monkeypatch.delenv(name)
    assert not Settings(NODE_NAME="n").peer_config().enabled
    monkeypatch.setenv("MODEL_AGENT_PEER_ENABLED", "true")
    monkeypatch.setenv("MODEL_AGENT_PEER_PORT", "9000")
    config = Settings(NODE_NAME="n").peer_config()
    assert config.enabled and config.port == 9000 and config.ban_s == 600
    assert Settings(NODE_NAME="n", peer_ban_seconds=5).peer_config().ban_s == 5  # a flag
    assert PeerConfig(advertise_address="h:1").advertised() == "h:1"
