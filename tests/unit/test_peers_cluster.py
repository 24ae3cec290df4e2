"""The peers' cluster side: tokens re-read on rotation, reviews that cannot be made refuse, holders from Nodes, bans."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from model_agent.agent.settings import Settings
from model_agent.kube.client import ApiUnavailable
from model_agent.model.keys import node_label_key
from model_agent.peers import PEER_ADDRESS_ANNOTATION, PeerConfig
from model_agent.peers.auth import REVIEWS_PER_SOURCE_BURST, TokenFile, TokenReviewer
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
        if path == "/api/v1/namespaces/ome/configmaps":  # the status ConfigMaps' metadata: the agents' addresses
            assert method == "GET" and "PartialObjectMetadataList" in kw["accept"]
            self.queries.append("configmaps")
            return {"items": [n["_configmap"] for n in self.nodes if "_configmap" in n]}
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


def _node(name: str, labels: dict[str, str], address: str | None, *, agent: bool = True) -> dict[str, Any]:
    """A Node; with ``agent`` its address is on the node's status ConfigMap (where an agent advertises), without
    it only on the Node (what its kubelet, or anyone who may patch the Node, can write)."""
    annotations = {PEER_ADDRESS_ANNOTATION: address} if address else {}
    node: dict[str, Any] = {"metadata": {"name": name, "labels": labels, "annotations": {} if agent else annotations}}
    if agent and address:
        node["_configmap"] = {"metadata": {"name": name, "annotations": annotations}}
    return node


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
    assert len(api.queries) == 3  # one LIST per label key for both lists, and one of the addresses
    assert await directory.relaying(uri) == ["10.0.0.4:8090"]  # fetching it: relays its durable parts
    assert await directory.holders(uri) == ["10.0.0.2:8090", "10.0.0.3:8090", "10.0.0.7:8090"]
    assert len(api.queries) == 3  # cached for the files of one fetch
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
    assert len(api.queries) == len(names) + 1  # one lookup for the four callers (and one LIST of the addresses)
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


async def test_a_node_that_only_claims_a_model_on_its_node_object_is_never_a_holder() -> None:
    """A kubelet (or anyone who may patch a Node) labels its Node Ready for the model and annotates a peer address
    there. No agent of that node advertises it in the node's status ConfigMap: it is never asked, so it never sees
    a token or a digest, and cannot stall fetches."""
    uri = "hf://acme/m"
    models = {"ClusterBaseModel": [{"metadata": {"name": "m"}, "spec": {"storage": {"storageUri": uri}}}]}
    key = node_label_key("ClusterBaseModel", "", "m")
    api = NodesApi(
        [
            _node("rogue", {key: "Ready"}, "10.9.9.9:8090", agent=False),
            _node("agent", {key: "Ready"}, "10.0.0.2:8090"),
        ]
    )
    directory = PeerDirectory(api, "me", lambda: models)  # type: ignore[arg-type]
    assert await directory.holders(uri) == ["10.0.0.2:8090"]
    assert await directory.addresses() == {"agent": "10.0.0.2:8090"}


def jwt(node: str = "a", *, sub: str = "me", aud: str = "aud", expires_in: float = 86400.0, salt: str = "") -> str:
    """A token shaped as the API server issues them (its signature is never checked here: the review does that).

    Made when the tests are collected, which can be half an hour before they run: valid for a day by default."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    claims: dict[str, Any] = {"sub": sub, "aud": [aud], "exp": time.time() + expires_in, "jti": salt}
    if node:
        claims["kubernetes.io"] = {"namespace": "ome", "node": {"name": node, "uid": "u"}}
    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


class ReviewApi:
    """TokenReview answers: a token whose claims name a node is the agent's, bound to it; ``forged`` tokens are
    refused by the API server (a signature it did not make)."""

    def __init__(self, forged: set[str] | None = None) -> None:
        self.forged = forged or set()
        self.reviews = 0

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.reviews += 1
        token = kw["body"]["spec"]["token"]
        if token in self.forged:
            return {"status": {"authenticated": False}}
        payload = token.split(".")[1]
        node = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["kubernetes.io"]["node"][
            "name"
        ]
        extra = {"authentication.kubernetes.io/node-name": [node]}
        return {"status": {"authenticated": True, "audiences": ["aud"], "user": {"username": "me", "extra": extra}}}


async def _advertised() -> dict[str, str]:
    return {"a": "10.0.0.2:8090", "c": "[::1]:8090"}


FORGED = jwt("a", salt="forged")


@pytest.mark.parametrize(
    ("token", "remote", "status", "reviewed"),
    [
        (jwt("a"), "10.0.0.2", 200, True),  # from the node it names
        (jwt("a"), "::ffff:10.0.0.2", 200, True),  # the same address, v4-mapped
        (jwt("c"), "::1", 200, True),
        (FORGED, "10.0.0.2", 403, True),  # well-formed, from the right address: only the review can refuse it
        (jwt("a"), "10.9.9.9", 403, False),  # replayed from anywhere else (a harvested token): no review
        (jwt("a"), None, 403, False),
        (jwt("b"), "10.0.0.3", 403, False),  # node b advertises no address
        (jwt(""), "10.0.0.2", 403, False),  # no node claim: not pod- or node-bound
        (jwt("a", sub="system:serviceaccount:x:y"), "10.0.0.2", 403, False),
        (jwt("a", aud="https://kubernetes.default.svc"), "10.0.0.2", 403, False),
        (jwt("a", expires_in=-1), "10.0.0.2", 403, False),
        ("random-" + "x" * 40, "10.0.0.2", 403, False),  # not a JWT at all
        ("a.b.c", "10.0.0.2", 403, False),
    ],
)
async def test_a_token_is_admitted_only_from_the_node_it_names_and_cheap_refusals_need_no_review(
    token: str, remote: str | None, status: int, reviewed: bool
) -> None:
    api = ReviewApi({FORGED})
    reviewer = TokenReviewer(api, "aud", "me", addresses=_advertised)  # type: ignore[arg-type]
    assert (await reviewer.check(f"Bearer {token}", remote)).status == status
    assert api.reviews == (1 if reviewed else 0)


async def test_reviews_per_source_are_bounded_and_random_tokens_cost_none() -> None:
    """A flood of distinct well-formed tokens from an advertised address: at most the burst is reviewed at once,
    the rest get 429; random tokens from anywhere are refused without a review."""
    api = ReviewApi()
    reviewer = TokenReviewer(api, "aud", "me", addresses=_advertised)  # type: ignore[arg-type]
    random_tokens = [f"Bearer {os.urandom(24).hex()}" for _ in range(500)]
    verdicts = await asyncio.gather(*(reviewer.check(t, "10.0.0.66") for t in random_tokens))
    assert {v.status for v in verdicts} == {403} and api.reviews == 0
    flood = [f"Bearer {jwt('a', salt=str(i))}" for i in range(50)]
    verdicts = await asyncio.gather(*(reviewer.check(t, "10.0.0.2") for t in flood))
    assert api.reviews == REVIEWS_PER_SOURCE_BURST
    assert sorted(v.status for v in verdicts) == [200] * REVIEWS_PER_SOURCE_BURST + [429] * (
        50 - REVIEWS_PER_SOURCE_BURST
    )
    assert (await reviewer.check(flood[0], "10.0.0.2")).status == 200  # a reviewed token is cached: no budget
