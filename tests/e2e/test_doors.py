"""The agent's own doors under attack, end to end: half-sent request heads against both listeners.

One agent with the peer service on and 200 Ready models (``vendor://``: nothing to fetch, each a label and an
entry). The attack client is the test's own, on loopback addresses other than the one the test probes from
(127.0.1.x): 800 connections, each sending a request line and 127 header lines of 8 KB with no final CRLF
(a slow-headers attack: against aiohttp's defaults it takes the agent past 1.7 GiB), half of them at the peer port and
half at the health port, and then a second wave holding a head of 10 such lines open. Asserted: the agent's peak
RSS (VmHWM) stays below 256 MiB (the chart's memory request), it never exits, the connections past the caps are
counted, and a model created during the attack is Ready within twice its time without the attack.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path

import aiohttp
import pytest

from model_agent.model.keys import node_label_key
from model_agent.peers import DEFAULT_AUDIENCE
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.ports import free_port
from testbed.servers.olah import OlahServer, create_model_repo
from tests.e2e.conftest import AgentFactory
from tests.e2e.test_peers import mint_token, peer_env
from tests.e2e.test_tenancy import peak_rss
from tests.support.kube import Kube, cbm
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

CBM = "ClusterBaseModel"
MiB = 1 << 20
LINE = b"X-Fill: " + b"a" * 8000 + b"\r\n"


async def attack(port: int, connections: int, lines: int, sources: int = 20) -> list[asyncio.StreamWriter]:
    """Open ``connections`` to ``port`` from ``sources`` loopback addresses, each sending a head of ``lines`` 8 KB
    header lines with no final CRLF; the writers, held open (a refused one is simply closed by the agent)."""
    held: list[asyncio.StreamWriter] = []

    async def one(i: int) -> None:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(f"127.0.1.{i % sources + 1}", 0))
            writer.write(b"GET /blobs/sha256/" + b"0" * 64 + b" HTTP/1.1\r\nHost: x\r\n" + LINE * lines)
            await writer.drain()
            held.append(writer)
        except OSError:
            pass  # refused or reset at once: what the caps are for

    await asyncio.gather(*(one(i) for i in range(connections)))
    return held


async def ready_in(kube: Kube, agent: AgentProcess, name: str, repo: str) -> float:
    started = time.monotonic()
    await kube.apply(cbm(name, f"hf://{repo}", str(agent.models_root / name), nodeSelector={"door-test": agent.node}))

    async def ready() -> bool:
        return (await kube.node_labels(agent.node)).get(node_label_key(CBM, "", name)) == "Ready"

    await eventually(ready, timeout=120, what=f"{name} Ready", interval=0.05)
    return time.monotonic() - started


async def test_half_sent_heads_on_both_ports_leave_the_agent_small_and_serving(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    node = f"node-{unique}-doors"
    token = await mint_token(kube, tmp_path, DEFAULT_AUDIENCE, "token-doors", node)
    peer_port = free_port()
    agent = await make_agent(node=node, env=peer_env(token, peer_port))
    await kube.label_node(node, {"door-test": node})  # (the Node was created with its token, unlabelled)
    for i in range(200):
        await kube.apply(cbm(f"door-{unique}-{i}", "vendor://acme/models/m", nodeSelector={"door-test": node}))

    async def all_ready() -> bool:
        labels = await kube.node_labels(node)
        return sum(1 for k, v in labels.items() if k.startswith("models.ome.io/") and v == "Ready") >= 200

    await eventually(all_ready, timeout=180, what="200 models Ready")
    repos = [f"acme/doors-{unique}-{n}" for n in ("calm", "attacked")]
    for seed, repo in enumerate(repos):
        await asyncio.to_thread(create_model_repo, mirrors_root, repo, tiny_llama(90 + seed))
    calm = await ready_in(kube, agent, f"calm-{unique}", repos[0])
    before = peak_rss(agent)

    waves = [await attack(peer_port, 400, 127), await attack(agent.port, 400, 127)]
    attacked = asyncio.create_task(ready_in(kube, agent, f"attacked-{unique}", repos[1]))
    waves += [await attack(peer_port, 400, 10), await attack(agent.port, 400, 10)]  # heads held open
    under_attack = await attacked
    peak = peak_rss(agent)
    print(
        f"doors e2e: peak RSS {before / MiB:.0f} MiB before, {peak / MiB:.0f} MiB after 1,600 attack connections; "
        f"model Ready in {calm:.2f} s calm, {under_attack:.2f} s under attack"
    )
    for wave in waves:
        for writer in wave:
            writer.close()
    assert agent.alive()
    assert peak < 256 * MiB, peak
    assert under_attack <= 2 * max(calm, 1.0), (calm, under_attack)

    def refused(listener: str) -> float:  # (asked once the attack's connections are gone: the port has room)
        return sum(
            agent.metric("model_agent_listener_connections_refused_total", listener=listener, why=why)
            for why in ("total", "per-source", "slow-head", "bad-head")
        )

    async def counted() -> bool:
        return refused("peer") > 0 and refused("health") > 0

    await eventually(counted, timeout=30, what="the refusals counted on both listeners")


async def test_a_flood_of_random_bearer_tokens_costs_no_token_review_and_slows_nothing(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    """5 attacker addresses x 32 concurrent requests with random bearer tokens at the peer port for 20 s (a flood
    that, with one TokenReview per token from the agent's one API budget, would slow every write the agent makes):
    no TokenReview is sent for any of them, and a model created during the flood is Ready within 1.2 x its time
    without it."""
    node = f"node-{unique}-flood"
    token = await mint_token(kube, tmp_path, DEFAULT_AUDIENCE, "token-flood", node)
    peer_port = free_port()
    agent = await make_agent(node=node, env=peer_env(token, peer_port))
    await kube.label_node(node, {"door-test": node})
    repos = [f"acme/flood-{unique}-{n}" for n in ("calm", "attacked")]
    for seed, repo in enumerate(repos):
        await asyncio.to_thread(create_model_repo, mirrors_root, repo, tiny_llama(95 + seed))
    calm = await ready_in(kube, agent, f"calm-{unique}", repos[0])
    stop = asyncio.Event()
    sent = [0]

    async def flooder(source: str) -> None:
        connector = aiohttp.TCPConnector(local_addr=(source, 0), limit=32)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one() -> None:
                while not stop.is_set():
                    headers = {"Authorization": f"Bearer {secrets.token_urlsafe(600)}"}
                    try:
                        async with session.get(
                            f"http://127.0.0.1:{peer_port}/blobs/sha256/{'0' * 64}", headers=headers
                        ):
                            sent[0] += 1
                    except aiohttp.ClientError:
                        sent[0] += 1

            await asyncio.gather(*(one() for _ in range(32)))

    flood = [asyncio.create_task(flooder(f"127.0.2.{i + 1}")) for i in range(5)]
    started = time.monotonic()
    try:
        under_attack = await ready_in(kube, agent, f"attacked-{unique}", repos[1])

        async def twenty_seconds() -> bool:
            return time.monotonic() - started >= 20

        await eventually(twenty_seconds, timeout=60, what="20 s of flood", interval=0.5)
    finally:
        stop.set()
        await asyncio.gather(*flood, return_exceptions=True)
    status = json.loads(agent.http("/status")[1])["peers"]
    print(
        f"doors e2e: {sent[0]} requests with random tokens in {time.monotonic() - started:.0f} s from 5 addresses: "
        f"{status['tokenReviews']} TokenReviews, {status['tokensRefusedUnreviewed']} refused unreviewed; model "
        f"Ready in {calm:.2f} s calm, {under_attack:.2f} s under the flood"
    )
    assert sent[0] > 1000
    assert status["tokenReviews"] == 0 and status["tokensRefusedUnreviewed"] >= sent[0] * 0.9
    assert under_attack <= 1.2 * max(calm, 1.0), (calm, under_attack)
    assert agent.alive()
