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
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from model_agent.kube.resources import LEASES
from model_agent.model.keys import node_label_key
from model_agent.peers import DEFAULT_AUDIENCE
from testbed import netns
from testbed.agent_process import AgentProcess
from testbed.models import tiny_llama
from testbed.ports import free_port
from testbed.proxies.countingproxy import CountingProxy
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
    lag = agent.metric("model_agent_event_loop_lag_max_seconds")  # the worst of the last minute: the attack's
    print(f"doors e2e: worst event-loop lag during the slow-headers attack {lag * 1000:.0f} ms")


FLOOD_S = 60.0
LEASE_S = 6  # the origin slot Leases' duration here: renewed every 2 s, so a 60 s flood sees about 30 renewals


async def test_a_flood_of_random_bearer_tokens_costs_no_token_review_slows_nothing_and_lapses_no_lease(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str, tmp_path: Path
) -> None:
    """5 attacker addresses x 32 concurrent requests with random bearer tokens at the peer port for 60 s (a flood
    that, with one TokenReview per token from the agent's one API budget, would slow every write the agent makes and
    let its Leases lapse). Meanwhile a slow download (paced at the mirror) holds an origin slot Lease and a small
    model is created. Asserted: no TokenReview is sent for any of them (the bound is 0.5 a second per source after a
    burst of 5, and these sources are no node's address, so they never reach it); each address is shut out once it
    spends its refusal budget, so few of its requests are even parsed; the small model is Ready within
    1.2 x its time without the flood; the held Lease is renewed throughout (no gap between renewals reaches its
    duration, and its holder never changes). Reported: requests, refusals, the agent's peak RSS and its worst
    event-loop lag before and during the flood."""
    node = f"node-{unique}-flood"
    token = await mint_token(kube, tmp_path, DEFAULT_AUDIENCE, "token-flood", node)
    peer_port = free_port()
    slow_repo = f"acme/flood-{unique}-slow"
    await asyncio.to_thread(create_model_repo, mirrors_root, slow_repo, tiny_llama(90, padding_bytes=64 * MiB))
    with CountingProxy(olah.endpoint) as hub:
        hub.pace(f"/{slow_repo}/resolve/", 64 * 1024)  # 64 KiB/s a request: it holds its slot through the flood
        agent = await make_agent(
            node=node,
            env={**peer_env(token, peer_port), "HF_ENDPOINT": hub.endpoint},
            args=("--max-concurrent-origin-fetches", "2", "--origin-lease-seconds", str(LEASE_S)),
        )
        await kube.label_node(node, {"door-test": node})
        repos = [f"acme/flood-{unique}-{n}" for n in ("calm", "attacked", "warm")]
        for seed, repo in enumerate(repos):
            await asyncio.to_thread(create_model_repo, mirrors_root, repo, tiny_llama(95 + seed))
        slow = f"slow-{unique}"
        dest = str(agent.models_root / slow)
        await kube.apply(cbm(slow, f"hf://{slow_repo}", dest, nodeSelector={"door-test": node}))

        async def slot_held() -> dict[str, object] | None:
            leases = (await kube.c.request("GET", LEASES.path("ome")))["items"]
            mine = [x for x in leases if (x.get("spec") or {}).get("holderIdentity") == node]
            return mine[0] if mine and hub.in_flight(f"/{slow_repo}/resolve/") else None

        held = await eventually(slot_held, timeout=60, what="the slow download holding its origin slot")
        assert held is not None
        lease_name = str(held["metadata"]["name"])  # type: ignore[index]
        renewals: list[tuple[str, str]] = []  # (holder, renewTime), each change seen
        lags: dict[str, list[float]] = {"calm": [], "flood": []}
        phase = ["calm"]
        stop = asyncio.Event()

        async def watch_lease() -> None:  # through both phases, so each is measured under the same watch
            while not stop.is_set():
                spec = (await kube.c.request("GET", LEASES.path("ome", lease_name)))["spec"]
                seen = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""))
                if not renewals or renewals[-1] != seen:
                    renewals.append(seen)
                lag = await asyncio.to_thread(agent.metric, "model_agent_event_loop_lag_max_seconds")
                lags[phase[0]].append(lag)
                await asyncio.sleep(0.5)

        watcher = asyncio.create_task(watch_lease())
        # A first model warms what the first fetch does once (its API budget's burst among it): the two measured
        # ones then find the same conditions, but for the flood.
        await ready_in(kube, agent, f"warm-{unique}", repos[2])
        calm = await ready_in(kube, agent, f"calm-{unique}", repos[0])  # the same conditions, without the flood
        phase[0] = "flood"
        # The attacker is its own process at the lowest CPU priority: a real one does not share the node's cores.
        flood = await asyncio.create_subprocess_exec(
            "nice", "-n", "19", sys.executable, "-m", "testbed.token_flood", str(peer_port), str(FLOOD_S),
            *(f"127.0.2.{i + 1}" for i in range(5)), stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        started = time.monotonic()
        try:
            under_attack = await ready_in(kube, agent, f"attacked-{unique}", repos[1])

            async def flood_ran() -> bool:
                assert agent.alive(), agent.tail()
                return time.monotonic() - started >= FLOOD_S

            await eventually(flood_ran, timeout=FLOOD_S + 60, what=f"{FLOOD_S:.0f} s of flood", interval=0.5)
        finally:
            out, _ = await asyncio.wait_for(flood.communicate(), FLOOD_S + 60)
            stop.set()
            await asyncio.gather(watcher, return_exceptions=True)
        sent = [int(json.loads(out)["requests"])]
        elapsed = time.monotonic() - started
        status = json.loads(agent.http("/status")[1])["peers"]
        rss = peak_rss(agent)
        penalties = agent.metric("model_agent_listener_connections_refused_total", listener="peer", why="penalty")
        gaps = [b - a for a, b in zip(_times(renewals), _times(renewals)[1:], strict=False)]
        print(
            f"doors e2e: {sent[0]} requests with random tokens in {elapsed:.0f} s from 5 addresses: "
            f"{status['tokenReviews']} TokenReviews, {status['tokensRefusedUnreviewed']} refused unreviewed, "
            f"{penalties:.0f} connections shut out; model "
            f"Ready in {calm:.2f} s calm, {under_attack:.2f} s under the flood; origin Lease {lease_name} renewed "
            f"{len(renewals) - 1} times, longest gap {max(gaps, default=0):.1f} s (duration {LEASE_S} s); peak RSS "
            f"{rss / MiB:.0f} MiB; event-loop lag max {max(lags['calm']) * 1000:.0f} ms calm, "
            f"{max(lags['flood']) * 1000:.0f} ms "
            "under the flood"
        )
        assert sent[0] >= 5 * 20  # every address spent at least its burst (then it is held, 32 connections at a time)
        assert status["tokenReviews"] == 0
        # Each address spends its refusal budget (a burst of 20, then 2 a second) and is shut out for 30 s at a time:
        # the rest of its requests end at the accept, never parsed.
        assert status["tokensRefusedUnreviewed"] <= 5 * (20 + 2 * elapsed + 2 * 48), status
        assert penalties > 0
        assert under_attack <= 1.2 * max(calm, 1.0), (calm, under_attack)
        assert {holder for holder, _ in renewals} == {node}, renewals  # held by this node throughout
        assert len(renewals) >= FLOOD_S / LEASE_S, renewals  # renewed every third of the duration, all along
        assert max(gaps) < LEASE_S, gaps  # never a gap in which another node could have taken it over
        assert agent.alive()
        await kube.delete_model(CBM, slow)


def _times(renewals: list[tuple[str, str]]) -> list[float]:
    """The renewTimes seen, as seconds (the holder's clock: only their differences are used)."""
    return [datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp() for _, t in renewals]


FLOOD_SCRIPT = """
import concurrent.futures, sys, urllib.error, urllib.request
def post(_):
    try:
        with urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="POST"), timeout=10) as r:
            return str(r.status)
    except urllib.error.HTTPError as e:
        return str(e.code)
    except OSError:
        return "closed"
with concurrent.futures.ThreadPoolExecutor(20) as pool:
    print(" ".join(pool.map(post, range(20))))
"""


async def test_verify_answers_only_the_operator_and_one_pass_at_a_time(
    kube: Kube, olah: OlahServer, mirrors_root: Path, make_agent: AgentFactory, unique: str
) -> None:
    """20 concurrent ``POST /verify`` from another host's address (a network namespace of the test's own, across a
    private bridge) are refused, and no pass starts; from the operator's path (the loopback address, where
    ``model-agent verify`` runs) a pass starts, and a second ``POST`` while it runs gets 409 with its progress."""
    repo = f"acme/verify-{unique}"
    await asyncio.to_thread(create_model_repo, mirrors_root, repo, tiny_llama(98, padding_bytes=16 * MiB))
    agent = await make_agent(args=("--verify-rate", "2000000"))  # 2 MB/s: a pass over 16 MiB lasts about 8 s
    name = f"verify-{unique}"
    await kube.apply(cbm(name, f"hf://{repo}", str(agent.models_root / name), nodeSelector=_on(agent.node)))

    async def ready() -> bool:
        return (await kube.node_labels(agent.node)).get(node_label_key(CBM, "", name)) == "Ready"

    await eventually(ready, timeout=60, what="the model Ready")
    verified_before = _verified_at(agent, name)
    bridge = netns.Bridge(f"mv{secrets.token_hex(2)}", f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}")
    await asyncio.to_thread(bridge.up)
    try:
        other = await asyncio.to_thread(bridge.add_node, 0, node_cap=100_000_000)
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", other.netns, sys.executable, "-c", FLOOD_SCRIPT,
            f"http://{bridge.address}:{agent.port}/verify", stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await asyncio.to_thread(bridge.teardown)
    answers = out.decode().split()
    assert len(answers) == 20 and set(answers) <= {"403", "closed"} and "403" in answers, answers
    assert _verified_at(agent, name) == verified_before, "a pass ran for a request from outside"

    first = asyncio.get_running_loop().run_in_executor(None, _post_verify, agent.port)

    async def running() -> bool:
        return json.loads(agent.http("/status")[1]).get("verifying") is not None

    await eventually(running, timeout=30, what="the operator's pass running")
    refused = await asyncio.to_thread(_post_verify, agent.port, 5.0)
    assert refused[0] == 409, refused
    assert json.loads(refused[1])["running"]["models"] >= 1, refused  # the running pass's progress
    status, body = await asyncio.wait_for(first, 120)
    assert status == 200, (status, body)
    assert _verified_at(agent, name) > verified_before  # the operator's pass ran
    print(f"verify e2e: 20 POSTs from {other.address}: {' '.join(sorted(set(answers)))}; a second pass: {refused}")


def _verified_at(agent: AgentProcess, name: str) -> float:
    rows = json.loads(agent.http("/status")[1])["models"]
    return float(next(r for r in rows if r["name"] == name)["manifest"]["verifiedAt"])


def _post_verify(port: int, timeout: float = 120.0) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/verify", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}
